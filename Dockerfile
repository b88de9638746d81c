# syntax=docker/dockerfile:1
# ctxproxy: the proxy that keeps every LLM request inside the model's context window.
# Build: docker build -t ctxproxy:0.1.0 .   (the tag deploy/k8s/kustomization.yaml and docker-compose.yml use)
# Run:   docker run -p 127.0.0.1:8080:8080 -e CTXPROXY_UPSTREAM_BASE_URL=... ctxproxy:0.1.0
#
# Reproducible: every Python package (the build backend included) comes at the version pinned in
# constraints.txt, the lock that `bash .ci/lint-deploy` keeps consistent with pyproject.toml. The
# base image is a fixed Python minor on a fixed Debian release; pin it by digest for bit-for-bit
# rebuilds: docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:... .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Stage 1: the ctxproxy wheel and the wheels of every dependency, all at their locked versions.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY constraints.txt ./
# The build backend at its locked version; the wheel is then built without an isolated (unpinned)
# build environment.
RUN pip install --constraint constraints.txt hatchling
COPY pyproject.toml README.md ./
# The build hook hatchling loads (it only acts on editable installs; see .ci/dev_alias/).
COPY .ci/dev_alias/hatch_build.py ./.ci/dev_alias/
COPY config ./config
COPY app ./app
RUN pip wheel --no-build-isolation --constraint constraints.txt --wheel-dir /wheels ".[metrics,redis]"

# Stage 2: the runtime, with no build tools and no source tree: the tokenizer vocabularies and the
# model table are package data inside the wheel, so the container never downloads anything at run
# time. It needs no writable path: it runs with a read-only root file system (Kubernetes manifests
# in deploy/k8s, `read_only: true` in docker-compose.yml).
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    CTXPROXY_HOST=0.0.0.0 \
    CTXPROXY_PORT=8080
# The wheels are mounted from the build stage, not copied, so they leave no layer behind; the lock
# applies here too, so nothing but the locked versions can be installed.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,source=constraints.txt,target=/tmp/constraints.txt \
    pip install --no-index --find-links=/wheels --constraint /tmp/constraints.txt "ctxproxy[metrics,redis]" \
    && groupadd --system --gid 10001 ctxproxy \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin ctxproxy
WORKDIR /srv/ctxproxy
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
# Liveness only (the process answers); readiness (/readyz: vocabularies loaded, upstream reachable)
# is what compose and Kubernetes gate traffic on.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CTXPROXY_PORT', '8080'), timeout=4).status == 200 else 1)"]
# Address, port, workers and the drain on SIGTERM come from CTXPROXY_* settings.
CMD ["ctxproxy", "serve"]
