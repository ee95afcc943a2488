"""A random-weight model of a real LLM's shape, for bench/gpu-check.sh (no weights can be downloaded
on a lent GPU machine, and the sizes and kernels are what matter there, not the words):

    python bench/gpu_model.py --shape llama3-8b OUT_DIR

Writes a Llama checkpoint (safetensors, bf16) and a word-level tokenizer whose ids stay inside the
model's vocabulary, with a plain chat template. `OUT_DIR/.complete` is written last, so a check that
starts while a background call still writes the model can wait for it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# name -> LlamaConfig fields; llama3-8b and llama3.2-1b are the published shapes, tiny is for tests.
SHAPES: dict[str, dict[str, float | int]] = {
    "llama3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    "llama3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    "tiny": dict(
        vocab_size=4096,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
    ),
}
COMPLETE = ".complete"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write(shape: str, out: Path) -> float:
    """Writes the model and tokenizer into out; returns the seconds it took."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    started = time.monotonic()
    fields = SHAPES[shape]
    cfg = LlamaConfig(**fields, rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg.dtype = torch.bfloat16  # recorded in config.json: vLLM's dtype "auto" reads it
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 at once: 16 GB for 8B, not 32 first
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    out.mkdir(parents=True, exist_ok=True)
    (out / COMPLETE).unlink(missing_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    words = min(32000, int(fields["vocab_size"]) - 3)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    seconds = time.monotonic() - started
    (out / COMPLETE).write_text(f"{shape} {seconds:.1f}\n")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if (args.out / COMPLETE).exists():
        print(f"model already written: {args.out}")
        return 0
    print(f"model of {args.shape}'s shape written in {write(args.shape, args.out):.0f} s: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
