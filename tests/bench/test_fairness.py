"""`semserve bench fairness`'s arithmetic and report (the run itself starts a predictor: minutes)."""

from __future__ import annotations

import argparse

from bench.cli import register
from bench.fairness import Phase, Tenant, report


def args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in kw.items()]
    return parser.parse_args(["bench", "fairness", *flags])


def test_flags_and_defaults() -> None:
    a = args(duration=5)
    got = (a.duration, a.max_num_seqs, a.noisy_concurrency, a.quiet_tokens, a.noisy_tokens)
    assert got == (5, 8, 32, 8, 32)


def test_tokens_count_what_streamed_in_at_the_reported_tokens_per_chunk() -> None:
    t = Tenant("noisy", chunks=100, answered_tokens=60, answered_chunks=30)
    assert t.tokens() == 200  # 2 tokens per chunk
    assert Tenant("quiet", chunks=7).tokens() == 7  # no usage seen: one per chunk


def phase(name: str, quiet: tuple[list[float], int] | None, noisy_chunks: int | None) -> Phase:
    tenants = {}
    if quiet is not None:
        tenants["quiet"] = Tenant("quiet", ttft_ms=quiet[0], chunks=quiet[1], late_chunks=quiet[1] // 2)
    if noisy_chunks is not None:
        tenants["noisy"] = Tenant("noisy", chunks=noisy_chunks, late_chunks=noisy_chunks // 2)
    return Phase(name, tenants, 10.0)


def base_phases() -> list[Phase]:
    """quiet solo 100 ms; fair on 1.4x its TTFT, 0.9x noisy's throughput, 0.66 of the tokens."""
    return [
        phase("quiet solo", ([100.0] * 9, 90), None),
        phase("noisy solo", None, 1000),
        phase("mixed, fair on", ([140.0] * 9, 90), 900),
        phase("mixed, fair off", ([900.0] * 9, 90), 1000),
        phase("shares, fair on", ([1.0], 660), 340),
        phase("shares, fair off", ([1.0], 500), 500),
    ]


def test_report_ratios_and_goals() -> None:
    ps = base_phases()
    text = report(args(duration=10), ps, 3.0, (1.0, 2.0), 60.0)
    assert "| mixed, fair on | 140 | 140 | 1.40 | 1.40 | 90.0 | 0.90 | - |" in text
    assert "| shares, fair on | - | - | - | - | 34.0 | 0.34 | 0.660 |" in text
    assert "1.40x solo (goal <= 1.5x): met" in text
    assert "fair on 0.660 vs weight 0.667 (goal within 10%): met" in text
    assert "0.90x solo (goal >= 0.8x): met" in text
    off = report(args(duration=10), [*ps[:2], phase("mixed, fair on", ([900.0], 9), 500), *ps[3:4],
                                      phase("shares, fair on", ([1.0], 500), 500), ps[5]], 3.0, (1, 2), 60)
    assert off.count("not met") == 3


def test_vllm_priority_rows_read_against_their_own_solo() -> None:
    ps = [
        *base_phases(),
        phase("vLLM priority: quiet solo", ([200.0] * 9, 90), None),
        phase("vLLM priority: mixed, same", ([1000.0] * 9, 90), 1000),
        phase("vLLM priority: mixed, quiet first", ([500.0] * 9, 90), 800),
    ]
    text = report(args(duration=10, vllm_priority=True), ps, 3.0, (1.0, 2.0), 60.0, 90.0)
    # quiet's ratios in the vLLM rows are against quiet solo on vLLM's server (200 ms), not ours
    assert "| vLLM priority: mixed, quiet first | 500 | 500 | 2.50 | 2.50 | 80.0 |" in text
    assert "p50 0.50x with quiet's requests first against one priority for both (500 vs 1000 ms)" in text
    assert "--vllm-priority" in text and "(`--scheduling-policy priority`, max_num_seqs 8" in text


def test_the_predictors_own_queue_is_read_from_its_metrics_and_reported() -> None:
    from bench.fairness import engine_waiting

    page = ('vllm:num_requests_waiting{engine="0",model_name="llm"} 3.0\n'
            'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 3.0\n'
            'vllm:num_requests_waiting{engine="1",model_name="llm"} 2.0\n'
            'vllm:num_requests_running{engine="0",model_name="llm"} 8.0\n')
    assert engine_waiting(page) == 5.0  # both engines; not the by-reason series, not running
    ps = base_phases()
    ps[2].engine_waiting = [1.0, 2.0, 3.0]
    ps[3].engine_waiting = [20.0, 24.0]
    text = report(args(duration=10), ps, 3.0, (1.0, 2.0), 60.0)
    assert "| - / - | 2.0 / 3 | 0/0 |" in text and "| - / - | 22.0 / 24 | 0/0 |" in text
