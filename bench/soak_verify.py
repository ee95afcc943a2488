"""The answer check of `semserve bench soak`: every served answer against the predictor's own
`generation_finished` log lines (see bench/soak.py's docstring for the rules)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Served:
    """What the client got: cache status, text, and the end of the answer as the response told it."""

    status: str
    text: str
    finish_reason: str | None
    completion_tokens: int | None


@dataclass(frozen=True)
class Sent:
    """One request as sent: what its answer may be checked against."""

    rid: str
    path: str
    op: str
    tenant: str
    kind: str  # "raw" (v2 and OpenAI completions share entries) or "chat"
    prompt: str
    accept: tuple[str, ...]  # prompts whose answers a semantic hit may carry


@dataclass(frozen=True)
class Generation:
    """One `generation_finished` line of the predictor's log."""

    request_id: str
    outcome: str
    finish_reason: str | None
    completion_tokens: int
    output_sha256: str


def read_generations(log_path: Path, prefix: str) -> dict[str, list[Generation]]:
    """The predictor's generations whose request id starts with `prefix`, by request id (a v2
    request's prompt i runs as `<id>-<i>`: filed under `<id>`)."""
    out: dict[str, list[Generation]] = defaultdict(list)
    with log_path.open(errors="replace") as f:
        for line in f:
            if "generation_finished" not in line or prefix not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            rid = str(e.get("request_id") or "")
            if e.get("event") != "generation_finished" or not rid.startswith(prefix):
                continue
            base = rid[: -len("-0")] if rid.endswith("-0") else rid
            out[base].append(Generation(rid, str(e.get("outcome")), e.get("finish_reason"),
                                        int(e.get("completion_tokens") or 0), str(e.get("output_sha256"))))
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Verdict:
    """The answer check over a whole run (see the module docstring)."""

    checked: int = 0
    misses_by_request: int = 0  # misses matched to the predictor's generation for that request
    misses_joined: int = 0  # misses without a generation of their own (single flight)
    hits: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    answers_per_prompt: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def fail(self, kind: str, detail: str) -> None:
        self.failures[kind] += 1
        if len(self.samples) < 10:
            self.samples.append(f"{kind}: {detail}")

    @property
    def prompts_with_several_answers(self) -> int:
        return sum(1 for v in self.answers_per_prompt.values() if len(v) > 1)


def verify(served: list[tuple[Sent, Served]], sent: list[Sent],
           generations: dict[str, list[Generation]]) -> Verdict:
    v = Verdict()
    by_rid = {s.rid: s for s in sent}
    # What the predictor produced cleanly, per (tenant, kind, prompt), from every request sent,
    # answered or not (an answer stored by a request whose client gave up is still the model's).
    produced: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for rid, gens in generations.items():
        s = by_rid.get(rid)
        if s is None:
            continue
        for g in gens:
            if g.outcome == "ok" and g.finish_reason in ("stop", "length"):
                produced[(s.tenant, s.kind, s.prompt)].add(g.output_sha256)
    for s, got in served:
        v.checked += 1
        digest = _sha(got.text)
        v.answers_per_prompt.setdefault((s.kind, s.prompt), set()).add(digest)
        where = f"{s.path} {s.op} {got.status} tenant={s.tenant} rid={s.rid} {s.prompt!r}: {got.text!r}"
        if got.finish_reason not in (None, "stop", "length"):
            v.fail("partial_answer", f"{where} finish_reason={got.finish_reason}")
            continue
        if got.status == "miss":
            own = generations.get(s.rid, [])
            if own:
                v.misses_by_request += 1
                g = own[-1]
                if g.outcome != "ok" or g.finish_reason not in ("stop", "length"):
                    v.fail("partial_answer", f"{where}: the predictor's generation ended {g.outcome}/"
                                             f"{g.finish_reason}")
                elif g.output_sha256 != digest:
                    v.fail("wrong_answer", f"{where}: not the text the predictor generated for this "
                                           f"request ({g.completion_tokens} tokens, {g.finish_reason})")
                elif got.finish_reason is not None and got.finish_reason != g.finish_reason:
                    v.fail("wrong_answer", f"{where}: finish_reason {got.finish_reason}, the predictor's "
                                           f"{g.finish_reason}")
                elif got.completion_tokens is not None and got.completion_tokens != g.completion_tokens:
                    v.fail("partial_answer", f"{where}: {got.completion_tokens} completion tokens, the "
                                             f"predictor's {g.completion_tokens}")
                continue
            v.misses_joined += 1
            if digest not in produced[(s.tenant, s.kind, s.prompt)]:
                v.fail("wrong_answer", f"{where}: no generation of its own and no generation for this "
                                       f"tenant and prompt gave this text")
            continue
        v.hits += 1
        allowed = s.accept if got.status == "semantic" else (s.prompt,)
        if not any(digest in produced[(s.tenant, s.kind, p)] for p in allowed):
            v.fail("wrong_answer", f"{where}: the predictor never produced this text for this tenant and "
                                   f"{'these prompts' if len(allowed) > 1 else 'prompt'}")
    return v
