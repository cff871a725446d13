# syntax=docker/dockerfile:1
# shardq image: `dispatcher run` by default (`dispatcherctl` and `dispatcher demo` are in it too).
#
#   docker build -t shardq:0.1.0 .
#   docker run --rm -p 7070:7070 -p 9464:9464 \
#       -e SHARDQ_REDIS_URL=redis://redis:6379/0 -e SHARDQ_DB_URL=postgresql://... shardq:0.1.0

# -- builder: wheels for the project and every dependency -------------------------------
FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package is built from (see [tool.setuptools] in pyproject.toml).
COPY pyproject.toml README.md ./
COPY dispatcher ./dispatcher
COPY worker_sdk ./worker_sdk
COPY shardmap ./shardmap
COPY shardq_common ./shardq_common

# The dispatcher and dashboard extras: the daemon and its web dashboard (a worker's image installs `shardq` alone).
RUN pip wheel --wheel-dir /wheels '.[dispatcher,dashboard]'

# -- final: the wheels installed, no build tools, a non-root user -----------------------
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SHARDQ_LISTEN=0.0.0.0:7070 \
    SHARDQ_METRICS_LISTEN=0.0.0.0:9464

# The wheels are bind-mounted from the builder, so they never land in a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'shardq[dispatcher,dashboard]'

RUN groupadd --system --gid 10001 shardq \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/shardq --create-home \
       --shell /usr/sbin/nologin shardq

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/shardq

EXPOSE 7070 9464

ENTRYPOINT ["dispatcher"]
CMD ["run"]
