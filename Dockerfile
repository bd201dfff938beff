# gelu-serve, CPU image. Stages: build (the project's wheel) -> models (train and export the
# default models; torch lives only here) -> venv (the serving install) -> runtime (final).
#
#   docker build -t gelu-serve .                                  # from PyPI
#   docker build -t gelu-serve --build-arg PIP_NO_INDEX=1 .       # offline, from ./wheels
#
# ./wheels is searched in every case (PIP_FIND_LINKS); `docker/fetch-wheels.sh` fills it.
# The CUDA variant is Dockerfile.cuda. The load-test image is the `loadtest` target.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
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

FROM base AS build
COPY wheels/ /wheels/
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
COPY wheels/ /wheels/
COPY --from=build /dist/ /dist/
RUN python3 -m venv /tmp/train \
    && /tmp/train/bin/pip install --no-compile "$(ls /dist/gelu_serve-*.whl)[cpu,train]" \
    && /tmp/train/bin/gelu-serve models --repository /models --checkpoints /tmp/checkpoints \
    && rm -rf /tmp/train /tmp/checkpoints

FROM base AS venv
COPY wheels/ /wheels/
COPY --from=build /dist/ /dist/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install "$(ls /dist/gelu_serve-*.whl)[cpu,signing]" \
    && /opt/venv/bin/pip uninstall --yes pip

# Locust against the service (docker-compose's `loadtest` profile).
FROM base AS loadtest
COPY wheels/ /wheels/
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install "locust>=2.20" \
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
