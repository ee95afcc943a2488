"""Model preparation: the default checkpoint exists, verifies, and corruption is detected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from semserve import model_prep


def test_prepared_default_model_verifies() -> None:
    result = model_prep.prepare()  # conftest's predictor needs it anyway; a second call is a check
    assert result.model_dir.is_dir()
    assert model_prep.verify(result.model_dir)
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert model_prep.prepare().reused is True


def test_corruption_is_detected(tmp_path: Path) -> None:
    src = model_prep.default_model_dir()
    copy = tmp_path / "m"
    copy.mkdir()
    for name in ("config.json", "tokenizer_config.json", model_prep.MANIFEST):
        shutil.copy(src / name, copy / name)
    # The manifest lists files not copied here, so the partial copy must not verify.
    assert not model_prep.verify(copy)
    full = tmp_path / "full"
    shutil.copytree(src, full)
    assert model_prep.verify(full)
    with (full / "config.json").open("a") as f:
        f.write(" ")
    assert not model_prep.verify(full)


def test_one_gguf_reader_is_shared_within_the_conversion_only() -> None:
    import gguf

    original = gguf.GGUFReader
    path = model_prep.find_gguf()
    with model_prep._one_gguf_reader():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # the parses of one conversion share one reader
        assert "general.architecture" in first.fields
    assert gguf.GGUFReader is original
