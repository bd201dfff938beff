#!/usr/bin/env bash
# Download every wheel the images need into ./wheels (or $1), for builds that reach no index:
#   docker/fetch-wheels.sh && docker build --build-arg PIP_NO_INDEX=1 -t gelu-serve .
# The wheels are for this machine's Python and platform (the images' are CPython 3.11, x86_64
# or aarch64 glibc); run it with PYTHON=python3.11 elsewhere. For Dockerfile.cuda (Ubuntu 24.04,
# CPython 3.12) add: PIP_DOWNLOAD_ARGS="--python-version 3.12 --only-binary=:all:" and EXTRAS=gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-wheels}
python=${PYTHON:-python3}
extras=${EXTRAS:-cpu,train,signing}
# The images install with uv, of the version the Dockerfile pins.
uv_version=$(sed -n 's/^ARG UV_VERSION=//p' Dockerfile)
# shellcheck disable=SC2086
"$python" -m pip download --quiet --dest "$dest" ${PIP_DOWNLOAD_ARGS:-} \
    ".[${extras}]" "locust>=2.20" setuptools wheel "uv==${uv_version}" \
    2> >(grep -v "^WARNING: Location" >&2)
# pip saves the project itself too; the images build it from source.
rm -f "$dest"/gelu[-_]serve-*
echo "$(find "$dest" -name '*.whl' | wc -l) wheels in $dest ($(du -sh "$dest" | cut -f1))"
