"""bench/gpu_model.py: the random-weight model bench/gpu-check.sh serves, built here in its tiny shape."""

from __future__ import annotations

import json
from pathlib import Path

from bench import gpu_model


def test_tiny_model_loads_back_with_a_tokenizer_inside_its_vocabulary(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny"
    assert gpu_model.main(["--shape", "tiny", str(out)]) == 0
    assert (out / gpu_model.COMPLETE).read_text().startswith("tiny ")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 4096
    assert "bfloat16" in json.dumps(config)  # vLLM's dtype "auto" serves what the file says

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("w5 w7")["input_ids"][-2:] == [8, 10]
    assert max(tok.get_vocab().values()) < config["vocab_size"]
    chat = tok.apply_chat_template([{"role": "user", "content": "w1 w2"}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    assert chat == "user: w1 w2\nassistant:"


def test_a_written_model_is_not_written_again(tmp_path: Path, capsys) -> None:
    out = tmp_path / "tiny"
    gpu_model.main(["--shape", "tiny", str(out)])
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert gpu_model.main(["--shape", "tiny", str(out)]) == 0
    assert "already written" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == before
