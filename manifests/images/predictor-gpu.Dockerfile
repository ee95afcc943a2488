# semserve predictor on GPU: `semserve predictor` over PyPI vLLM (CUDA torch wheels bring the CUDA
# runtime; the node's NVIDIA driver comes in through the container toolkit).
# Build from the repo root:  docker build -f manifests/images/predictor-gpu.Dockerfile -t IMAGE .
# The model is not baked in: KServe's storage-initializer (or a pvc:// storageUri) puts it at
# /mnt/models. To bake one anyway (air-gapped nodes, faster cold starts) use KServe's modelcar
# (storageUri: oci://IMAGE, a scratch image holding /models) rather than a fatter runtime image.
FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY semserve ./semserve
COPY cache ./cache
COPY transformers_svc ./transformers_svc
COPY predictors ./predictors
COPY serverless ./serverless
COPY bench ./bench
RUN python -m venv /opt/semserve && /opt/semserve/bin/pip install ".[gpu]"

FROM python:3.11.13-slim-bookworm
RUN groupadd --gid 10001 semserve && useradd --uid 10001 --gid 10001 --home-dir /home/semserve \
        --create-home --shell /usr/sbin/nologin semserve \
 && mkdir -p /mnt/models && chown 10001:10001 /mnt/models
COPY --from=build /opt/semserve /opt/semserve
ENV PATH=/opt/semserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/semserve \
    HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["semserve"]
CMD ["predictor", "--model", "/mnt/models", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8081"]
