# gelu-serve, CPU image. Stages: build (the project's wheel) -> models (train and export the
# default models; torch lives only here) -> venv (the serving install) -> runtime (final).
#
#   docker build -t gelu-serve .                                  # from PyPI
#   docker build -t gelu-serve --build-arg PIP_NO_INDEX=1 .       # offline, from ./wheels
#
# ./wheels is searched in every case (PIP_FIND_LINKS); `docker/fetch-wheels.sh` fills it.
# The installs are uv's, given the PIP_* settings (workbench/uv.py), as `make` installs.
# The CUDA variant is Dockerfile.cuda. The load-test image is the `loadtest` target.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_FIND_LINKS=/wheels
ARG PIP_NO_INDEX=0
# Online builds take torch from PyPI (a CUDA build, several GB); PyTorch's CPU index is smaller:
# --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_INDEX_URL=${PIP_INDEX_URL} \
    PIP_FIND_LINKS=${PIP_FIND_LINKS} \
    PIP_NO_INDEX=${PIP_NO_INDEX} \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
# uv (the Makefile's UV_VERSION) for every stage's installs, run through workbench/uv.py so
# that it installs as pip is configured here; none of it reaches the runtime image.
ARG UV_VERSION=0.13.8
COPY wheels/ /wheels/
COPY workbench/uv.py /opt/uv/uv.py
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install "uv==${UV_VERSION}"

FROM base AS build
WORKDIR /src
COPY pyproject.toml README.md cli.py ./
COPY contract/ contract/
COPY models/ models/
COPY export/ export/
COPY service/ service/
COPY bench/ bench/
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install setuptools wheel \
    && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist .

# The training venv (torch) lives and goes within one RUN: the layer holds /models alone, and
# its gigabyte is neither byte-compiled nor committed to a layer (together 50-60 s of a build).
FROM base AS models
COPY --from=build /dist/ /dist/
RUN /opt/uv/bin/uv venv --quiet --python python3 /tmp/train \
    && /opt/uv/bin/python /opt/uv/uv.py pip install --python /tmp/train/bin/python \
        "$(ls /dist/gelu_serve-*.whl)[cpu,train]" \
    && /tmp/train/bin/gelu-serve models --repository /models --checkpoints /tmp/checkpoints \
    && rm -rf /tmp/train /tmp/checkpoints

# Byte-compiled here, so that the image's server starts without compiling; no pip in it.
FROM base AS venv
COPY --from=build /dist/ /dist/
RUN /opt/uv/bin/uv venv --quiet --python python3 /opt/venv \
    && /opt/uv/bin/python /opt/uv/uv.py pip install --python /opt/venv/bin/python \
        --compile-bytecode "$(ls /dist/gelu_serve-*.whl)[cpu,signing]"

# Locust against the service (docker-compose's `loadtest` profile).
FROM base AS loadtest
RUN /opt/uv/bin/uv venv --quiet --python python3 /opt/venv \
    && /opt/uv/bin/python /opt/uv/uv.py pip install --python /opt/venv/bin/python \
        "locust>=2.20" \
    && rm -rf /wheels
COPY bench/locustfile.py /bench/locustfile.py
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin locust
USER 10001
ENTRYPOINT ["/opt/venv/bin/locust", "-f", "/bench/locustfile.py"]

FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    GELU_MODEL_REPOSITORY=/models
COPY --from=venv /opt/venv /opt/venv
COPY --from=models /models /models
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin gelu
USER 10001
EXPOSE 8000 8001
# `gelu-serve health` probes readiness over plaintext, TLS or mutual TLS as GELU_TLS_* say.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["gelu-serve", "health"]
# Every setting comes from GELU_* variables (README). SIGTERM drains (readiness 503 for
# GELU_DRAIN_SECONDS), lets requests finish, and exits 0: give `docker stop -t` more than 25 s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["gelu-serve", "serve", "--host", "0.0.0.0", "--port", "8000"]
