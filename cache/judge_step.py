"""The optional same-answer judge step of a lookup (cache.semantic_cache): a second opinion on the one
candidate the scorer rejected by score alone in its grey zone. Kept apart from the policy so the
verify loop stays one screen; with no judge the step is never taken.

The judge (cache.interfaces.Judge, e.g. the predictor's own model) is slow next to the scorer and may
fail: it runs under `judge_timeout_ms`, and a timeout or any error rejects, so the judge can cost a
hit but never serve an answer it did not vouch for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cache.counters import CacheCounters
from cache.interfaces import Judge, Verdict
from cache.settings import CacheSettings
from semserve import tracing


class JudgeStep:
    def __init__(
        self,
        judge: Judge,
        settings: CacheSettings,
        counters: CacheCounters,
        fail: Callable[[str, str], None],
        recovered: Callable[[str], None],
    ) -> None:
        self.judge = judge
        self.settings = settings
        self.counters = counters
        self._fail = fail  # for one log line per change of the judge's health, like Redis's
        self._recovered = recovered

    def wants(self, verdict: Verdict) -> bool:
        """A rejection the judge may overturn: the scorer's own, by score alone (a rejection a rule
        objected to names that rule instead), with a probability at least `judge_min_score`."""
        return (
            not verdict.accept
            and verdict.rule == "scorer"
            and verdict.score >= self.settings.judge_min_score
        )

    async def ask(self, query: str, candidate: str, scored: Verdict) -> Verdict:
        """The judge's verdict on a grey-zone candidate whose scorer verdict was `scored`."""
        self.counters.judge_calls += 1
        threshold = self.settings.judge_threshold
        try:
            with tracing.span("semserve.cache.judge"):
                async with asyncio.timeout(self.settings.judge_timeout_ms / 1000.0):
                    p = float(await self.judge.same_answer(query, candidate))
            if not 0.0 <= p <= 1.0:  # NaN too: never serve on a number that is no probability
                raise ValueError(f"judge probability {p} is not in [0, 1]")
        except Exception as e:  # TimeoutError included; a cancel of the lookup itself propagates
            self.counters.judge_errors += 1
            why = "timeout" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            self._fail("judge", why)
            return Verdict(False, "judge_error", scored.score, f"judge failed ({why}); {scored.detail}")
        self._recovered("judge")
        if p >= threshold:
            self.counters.judge_accepts += 1
            return Verdict(True, "judge", p, f"same-answer judge p={p:.3f} >= {threshold}; {scored.detail}")
        return Verdict(False, "judge", p, f"same-answer judge p={p:.3f} < {threshold}; {scored.detail}")
