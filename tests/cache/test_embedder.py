"""The real bundled MiniLM, no mocks: shapes, normalization, agreement with sentence-transformers,
the LRU and the micro-batcher (batched results equal one-by-one results)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import Embedder, EmbedderSettings, bundled_model_path, cosine
from cache.embedder_export import is_fresh
from cache.interfaces import Embedder as EmbedderProtocol

TEXTS = [
    "How do I reset my password?",
    "how can i reset my password",
    "Flights from Paris to Rome in May",
    "Write a Python function that reverses a linked list, with type hints and a docstring please",
    "Can I take ibuprofen with paracetamol?",
    "Why is the sky blue?",
]


@pytest.fixture(scope="session")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Shared across the session (the export takes seconds) but never the user's cache.
    return tmp_path_factory.mktemp("embedder-onnx")


@pytest.fixture(scope="session")
def default_embedder(onnx_dir: Path) -> Embedder:
    return Embedder(EmbedderSettings(onnx_dir=onnx_dir))


@pytest.fixture(scope="session")
def torch_embedder() -> Embedder:
    return Embedder(EmbedderSettings(backend="torch"))


@pytest.fixture
async def fresh_embedder(onnx_dir: Path) -> AsyncIterator[Embedder]:
    emb = Embedder(EmbedderSettings(onnx_dir=onnx_dir, lru_size=3))
    yield emb
    await emb.aclose()


def test_bundled_model_is_found() -> None:
    path = bundled_model_path()
    assert (path / "config.json").exists()
    assert (path / "tokenizer.json").exists()


async def test_shape_dtype_and_unit_norm(default_embedder: Embedder) -> None:
    assert isinstance(default_embedder, EmbedderProtocol)
    vec = await default_embedder.embed("How do I reset my password?")
    assert vec.shape == (384,)
    assert vec.dtype == np.float32
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-5
    assert default_embedder.dim == 384


def test_torch_backend_equals_sentence_transformers(torch_embedder: Embedder) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(bundled_model_path()), device="cpu")
    ref = st.encode(TEXTS, normalize_embeddings=True)
    ours = torch_embedder.embed_many(TEXTS)
    for a, b in zip(ours, ref, strict=True):
        assert cosine(a, b) > 0.999


def test_default_backend_close_to_reference(default_embedder: Embedder, torch_embedder: Embedder) -> None:
    ours = default_embedder.embed_many(TEXTS)
    ref = torch_embedder.embed_many(TEXTS)
    for a, b in zip(ours, ref, strict=True):
        assert cosine(a, b) >= 0.99


def test_similar_prompts_are_close(default_embedder: Embedder) -> None:
    v = default_embedder.embed_many(TEXTS)
    assert cosine(v[0], v[1]) > 0.9
    assert cosine(v[0], v[2]) < 0.5


def test_embed_many_keeps_order_and_duplicates(default_embedder: Embedder) -> None:
    texts = [TEXTS[2], TEXTS[0], TEXTS[2]]
    out = default_embedder.embed_many(texts)
    assert out.shape == (3, 384)
    np.testing.assert_allclose(out[0], out[2])
    assert cosine(out[1], default_embedder.embed_many([TEXTS[0]])[0]) > 0.9999


async def test_lru_returns_the_cached_vector_without_a_forward(fresh_embedder: Embedder) -> None:
    first = await fresh_embedder.embed("cancel my subscription")
    batches = fresh_embedder.batches
    again = await fresh_embedder.embed("cancel my subscription")
    assert again is first
    assert fresh_embedder.batches == batches
    assert not again.flags.writeable  # shared: callers cannot corrupt the cache


async def test_lru_evicts_oldest(fresh_embedder: Embedder) -> None:
    for t in ["a one", "b two", "c three", "d four"]:
        await fresh_embedder.embed(t)
    assert fresh_embedder.lru_len() == 3
    batches = fresh_embedder.batches
    await fresh_embedder.embed("a one")  # evicted: needs a forward again
    assert fresh_embedder.batches == batches + 1


async def test_concurrent_calls_share_one_forward_and_match_unbatched(fresh_embedder: Embedder) -> None:
    fresh_embedder.settings.lru_size = 0  # every call must go through the batcher
    batched = await asyncio.gather(*(fresh_embedder.embed(t) for t in TEXTS))
    assert fresh_embedder.batches == 1
    assert fresh_embedder.batched_texts == len(TEXTS)
    for text, vec in zip(TEXTS, batched, strict=True):
        np.testing.assert_allclose(vec, fresh_embedder.embed_many([text])[0], atol=1e-5)


async def test_int8_backend_close_to_reference_batched_or_not(
    onnx_dir: Path, torch_embedder: Embedder
) -> None:
    emb = Embedder(EmbedderSettings(backend="onnx-int8", onnx_dir=onnx_dir, lru_size=0))
    try:
        ref = torch_embedder.embed_many(TEXTS)
        batched = await asyncio.gather(*(emb.embed(t) for t in TEXTS))
        assert emb.batches == 1
        for text, vec, r in zip(TEXTS, batched, ref, strict=True):
            alone = emb.embed_many([text])[0]
            assert cosine(alone, r) >= 0.99
            # Activations share one int8 scale per batch, so batch-mates shift a vector slightly:
            # the reason this backend is not the default.
            assert cosine(vec, alone) > 0.99
    finally:
        await emb.aclose()


async def test_max_batch_splits_large_bursts(onnx_dir: Path) -> None:
    emb = Embedder(EmbedderSettings(onnx_dir=onnx_dir, lru_size=0, max_batch=2))
    try:
        out = await asyncio.gather(*(emb.embed(t) for t in TEXTS))
        assert len(out) == len(TEXTS)
        assert emb.batches == 3
    finally:
        await emb.aclose()


async def test_cancelled_caller_does_not_break_the_worker(fresh_embedder: Embedder) -> None:
    task = asyncio.create_task(fresh_embedder.embed("a request whose client went away"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    vec = await fresh_embedder.embed("the next request")
    assert vec.shape == (384,)


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMSERVE_EMBED_BACKEND", "torch")
    monkeypatch.setenv("SEMSERVE_EMBED_THREADS", "1")
    monkeypatch.setenv("SEMSERVE_EMBED_MAX_LENGTH", "64")
    s = EmbedderSettings.from_env()
    assert (s.backend, s.threads, s.max_length, s.model_path) == ("torch", 1, 64, None)
    monkeypatch.setenv("SEMSERVE_EMBED_BACKEND", "tensorflow")
    with pytest.raises(ValueError):
        EmbedderSettings.from_env()


def test_prepared_export_is_reused_and_recognised_by_content(
    default_embedder: Embedder, onnx_dir: Path, tmp_path: Path
) -> None:
    # What `semserve embedder prepare` leaves behind is what a later start loads, without exporting.
    again = Embedder(EmbedderSettings(onnx_dir=onnx_dir))
    assert again.onnx_reused is True
    assert again.onnx_file is not None and again.onnx_file.name == "model.opt.onnx"
    # A copy whose stamp records another mtime (an image layer, a restored volume): the same weights
    # by their sha256, so still reused.
    copy = tmp_path / "copy"
    shutil.copytree(onnx_dir, copy)
    [stamp] = copy.glob("*/source.json")
    recorded = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**recorded, "mtime_ns": recorded["mtime_ns"] + 1}))
    moved = Embedder(EmbedderSettings(onnx_dir=copy))
    assert moved.onnx_reused is True and moved.onnx_file is not None
    assert moved.onnx_file.is_relative_to(copy)
    # Other weights of the same size: not their export.
    stamp.write_text(json.dumps({**recorded, "mtime_ns": 1, "sha256": "0" * 64}))
    assert not is_fresh(moved.model_path, stamp.parent / "model.onnx")


async def test_int8_block_backend_is_close_to_fp32_and_batch_independent(
    onnx_dir: Path, default_embedder: Embedder
) -> None:
    emb = Embedder(EmbedderSettings(backend="onnx-int8-block", onnx_dir=onnx_dir, lru_size=0))
    try:
        assert emb.onnx_file is not None and emb.onnx_file.name.endswith(".int8block.onnx")
        ref = default_embedder.embed_many(TEXTS, batch_size=1)
        batched = await asyncio.gather(*(emb.embed(t) for t in TEXTS))
        assert emb.batches == 1
        for text, vec, r in zip(TEXTS, batched, ref, strict=True):
            alone = emb.embed_many([text])[0]
            assert cosine(alone, r) >= 0.998
            # Activations are quantized per token row: batch-mates leave a vector as it was alone.
            assert cosine(vec, alone) > 0.99999
        again = Embedder(EmbedderSettings(backend="onnx-int8-block", onnx_dir=onnx_dir, lru_size=0))
        assert again.onnx_reused and again.onnx_file == emb.onnx_file  # quantized once, then reused
    finally:
        await emb.aclose()


# ---- preload (the transformer's start: the ONNX session loads in a thread while it imports) ----


def test_preload_is_taken_by_the_next_embedder_of_equal_settings(
    default_embedder: Embedder, onnx_dir: Path
) -> None:
    from cache import embedder as embedder_module

    # default_embedder prepared the files in onnx_dir: a preload may start.
    settings = EmbedderSettings(onnx_dir=onnx_dir, lru_size=0)
    assert embedder_module.preload(settings)
    preloaded = Embedder(EmbedderSettings(onnx_dir=onnx_dir, lru_size=0))  # equal, not the same
    assert "preload_wait_s" in preloaded.phases and "session_s" in preloaded.phases
    assert not embedder_module._preloads  # taken: the next one loads its own
    again = Embedder(settings)
    assert "preload_wait_s" not in again.phases
    # The same model, session settings and file: the same vectors.
    assert preloaded.onnx_file == again.onnx_file == default_embedder.onnx_file
    np.testing.assert_allclose(preloaded.embed_many(TEXTS), again.embed_many(TEXTS), atol=1e-6)


def test_preload_only_when_the_onnx_files_are_prepared(tmp_path: Path) -> None:
    from cache import embedder as embedder_module

    # Nothing prepared there (an export would import torch in the thread): no preload.
    assert not embedder_module.preload(EmbedderSettings(onnx_dir=tmp_path))
    # The torch backend loads no ONNX session to overlap.
    assert not embedder_module.preload(EmbedderSettings(backend="torch"))
    assert not embedder_module._preloads
