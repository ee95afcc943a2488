"""Issue 13, round 3: the predictor's own model (SmolLM2-135M-Instruct) as a same-answer judge, measured
offline on the calibration split with transformers/torch (the `dev` extra) on the prepared model.

    .venv/bin/python -m bench.llm_judge yes-no [--limit 400]
    .venv/bin/python -m bench.llm_judge likelihood [--split calib]
    .venv/bin/python -m bench.llm_judge latency --predictor-url http://127.0.0.1:8090 [--calls 40]

  yes-no      the judge prompt the predictor's judge model uses (predictors/judge.py): log P(Yes) - log
              P(No) at the first answer position. ROC AUC and served at 1 / 5 / 20 % wrong, alone.
  likelihood  the answer the model gives to the cached prompt (greedy, 40 tokens), then the mean log-prob
              of that answer after the new prompt minus after its own prompt: a paraphrase should leave the
              answer as likely, a look-alike make it less likely. Alone, and as a second stage for the
              scorer's grey zone, chosen on one half of the calibration intents and read on the other.
  latency     the predictor's judge model (`semserve predictor` running) asked one pair at a time over
              v2 REST: p50 / p90 of one call, after five warm-up calls.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from bench.pair_judges import pairs_of, served_at_budget
from semserve.tooling.cache_eval import Pair

SYSTEM = "You are a helpful assistant."
BATCH = 16


class SmolJudge:
    def __init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from semserve.model_prep import default_model_dir

        torch.set_num_threads(2)
        path = default_model_dir()
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id

    def chat(self, user: str, system: str = SYSTEM) -> str:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    def yes_no(self, pairs: Sequence[Pair]) -> np.ndarray:
        from predictors.judge import AnswerTokens, judge_messages

        torch, tok = self.torch, self.tok
        words = AnswerTokens.of(tok)
        yes, no = sorted(words.yes), sorted(words.no)
        tok.padding_side = "left"
        out: list[float] = []
        for i in range(0, len(pairs), BATCH):
            chunk = pairs[i : i + BATCH]
            texts = [
                tok.apply_chat_template(judge_messages(p.b, p.a), tokenize=False, add_generation_prompt=True)
                for p in chunk
            ]
            enc = tok(texts, return_tensors="pt", padding=True)
            with torch.no_grad():
                lp = self.model(**enc).logits[:, -1, :].log_softmax(-1)
            out += (torch.logsumexp(lp[:, yes], -1) - torch.logsumexp(lp[:, no], -1)).tolist()
        return np.array(out)

    def answers(self, prompts: Sequence[str]) -> dict[str, object]:
        torch, tok = self.torch, self.tok
        tok.padding_side = "left"
        out: dict[str, object] = {}
        for i in range(0, len(prompts), BATCH):
            chunk = prompts[i : i + BATCH]
            enc = tok([self.chat(q) for q in chunk], return_tensors="pt", padding=True)
            with torch.no_grad():
                gen = self.model.generate(**enc, max_new_tokens=40, do_sample=False)
            for q, ids in zip(chunk, gen, strict=True):
                ids = ids[enc.input_ids.shape[1] :]
                out[q] = ids[ids != self.pad]
        return out

    def mean_logprobs(self, items: Sequence[tuple[str, object]]) -> np.ndarray:
        """Mean log-prob of each answer (token ids) after its prompt, batched by length."""
        torch = self.torch
        res = np.zeros(len(items))
        order = sorted(range(len(items)), key=lambda i: len(items[i][1]))  # type: ignore[arg-type]
        for s in range(0, len(order), BATCH):
            idx = order[s : s + BATCH]
            seqs, starts = [], []
            for i in idx:
                q, ans = items[i]
                ids = self.tok(self.chat(q), return_tensors="pt").input_ids[0]
                seqs.append(torch.cat([ids, ans]))
                starts.append(len(ids))
            width = max(len(x) for x in seqs)
            batch = torch.full((len(seqs), width), self.pad)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for j, x in enumerate(seqs):
                batch[j, : len(x)] = x
                mask[j, : len(x)] = 1
            with torch.no_grad():
                lp = self.model(input_ids=batch, attention_mask=mask).logits.log_softmax(-1)
            for j, i in enumerate(idx):
                n, st = len(seqs[j]), starts[j]
                res[i] = float(lp[j, st - 1 : n - 1].gather(-1, batch[j, st:n, None])[:, 0].mean())
        return res


def report_alone(name: str, scores: np.ndarray, pairs: Sequence[Pair]) -> None:
    from sklearn.metrics import roc_auc_score

    same = np.array([p.same_answer for p in pairs])
    served = [f"{b:g}: {served_at_budget(scores, same, b)[1]:.3f}" for b in (0.01, 0.05, 0.2)]
    print(f"{name}: {len(pairs)} pairs, ROC AUC {roc_auc_score(same, scores):.3f}, served at wrong {served}")


def second_stage(pairs: Sequence[Pair], delta: np.ndarray) -> None:
    """Scorer alone vs scorer + (grey zone and likelihood delta) at <= 1 % wrong, chosen on one half."""
    from cache.embedder import Embedder
    from cache.scorer import PairScorer
    from semserve.tooling.cache_eval import pair_similarities
    from semserve.tooling.judge_calibration import intent_halves
    from semserve.tooling.scorer_training import pair_rows

    hard = frozenset({"negation", "number", "date"})
    r = pair_rows(pairs, pair_similarities(pairs, Embedder()), 0.65, hard)
    p = np.where(r.judged, PairScorer.load().probabilities(r.x), 0.0)
    p = np.where(r.exact, 1.0, p)
    same, halves = r.same, intent_halves(pairs)

    def rates(serve: np.ndarray, m: np.ndarray) -> tuple[float, float]:
        return float(serve[same & m].mean()), float(serve[~same & m].mean())

    for h in (0, 1):
        fit, other = halves == h, halves != h
        alone = max((rates(p >= t, fit)[0], t) for t in np.unique(p) if rates(p >= t, fit)[1] <= 0.01)
        best = (0.0, 1.0, 1.0, 0.0)  # served, scorer threshold, grey floor, delta threshold
        # The scorer's own best threshold is a candidate: the second stage can only add on this half.
        for thr in (alone[1], 0.83, 0.85, 0.87, 0.9, 0.93):
            for lo in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
                for t2 in np.quantile(delta, np.linspace(0.3, 0.99, 70)):
                    serve = (p >= thr) | (r.judged & (p >= lo) & (delta >= t2))
                    s, w = rates(serve, fit)
                    if w <= 0.01 and s > best[0]:
                        best = (s, thr, lo, float(t2))
        s, thr, lo, t2 = best
        two = (p >= thr) | (r.judged & (p >= lo) & (delta >= t2))
        a_s, a_w = rates(p >= alone[1], other)
        b_s, b_w = rates(two, other)
        print(f"chosen on half {h}: scorer alone {alone[0]:.3f} -> other half served {a_s:.3f} "
              f"wrong {a_w:.4f}; "
              f"with the second stage {s:.3f} (threshold {thr}, grey from {lo}, delta >= {t2:.3f}) -> "
              f"other half served {b_s:.3f} wrong {b_w:.4f}")


def latency(url: str, calls: int) -> None:
    import asyncio

    import httpx

    from semserve.tooling.judge_calibration import judge_probabilities

    pairs = pairs_of("eval")[: calls + 5]

    async def timed() -> list[float]:
        ms = []
        async with httpx.AsyncClient() as client:
            for p in pairs:
                t = time.perf_counter()
                await judge_probabilities([p], url, "llm", 1, client=client)
                ms.append((time.perf_counter() - t) * 1000.0)
        return ms[5:]

    ms = np.array(asyncio.run(timed()))
    print(f"judge call over v2 REST, one at a time: p50 {np.median(ms):.1f} ms, "
          f"p90 {np.percentile(ms, 90):.1f} ms ({len(ms)} calls)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="judge", required=True)
    y = sub.add_parser("yes-no")
    y.add_argument("--limit", type=int, default=400)
    lk = sub.add_parser("likelihood")
    lk.add_argument("--split", default="calib", choices=("calib", "eval"))
    lt = sub.add_parser("latency")
    lt.add_argument("--predictor-url", required=True)
    lt.add_argument("--calls", type=int, default=40)
    args = ap.parse_args(argv)
    if args.judge == "latency":
        latency(args.predictor_url, args.calls)
        return 0
    judge = SmolJudge()
    t = time.perf_counter()
    if args.judge == "yes-no":
        pairs = pairs_of("calib")[: args.limit]
        report_alone("yes-no judge", judge.yes_no(pairs), pairs)
    else:
        pairs = pairs_of(args.split)
        cached = sorted({p.a for p in pairs})
        answers = judge.answers(cached)
        own = dict(zip(cached, judge.mean_logprobs([(q, answers[q]) for q in cached]), strict=True))
        other = judge.mean_logprobs([(p.b, answers[p.a]) for p in pairs])
        delta = other - np.array([own[p.a] for p in pairs])
        report_alone("answer likelihood", delta, pairs)
        second_stage(pairs, delta)
    print(f"took {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
