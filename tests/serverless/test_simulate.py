"""The simulation: activator holding/releasing, timeouts, scale-to-zero and panic timing, determinism."""

from __future__ import annotations

import math

import pytest

from serverless import settings_from_manifest as sfm
from serverless.kpa import Autoscaler
from serverless.metrics import MetricCollector, Stat
from serverless.pod_profile import PROFILE_DIR, EngineProfile, StartupModel, load_profile, shipped_profiles
from serverless.sim_settings import SimSettings
from serverless.simulate import RunOptions, Simulation, simulate
from serverless.traffic import Arrival, burst, diurnal, generate, read_trace, sporadic, steady, write_trace


def profile(startup_s: float) -> EngineProfile:
    return EngineProfile(
        name="test",
        concurrency=[1, 8, 32],
        tokens_per_s=[60.0, 300.0, 500.0],
        ttft_s=[0.1, 0.3, 1.0],
        max_num_seqs=32,
        startup=StartupModel(schedule_s=(0.0, 0.0), warmup_s=(startup_s, startup_s)),
    )


def settings(**predictor: object) -> SimSettings:
    isvc = {"kind": "InferenceService", "metadata": {"name": "t"}, "spec": {"predictor": {"minReplicas": 0}}}
    anns = {k: str(v) for k, v in predictor.items() if "/" in k}
    fields = {k: v for k, v in predictor.items() if "/" not in k}
    isvc["spec"]["predictor"].update(fields)  # type: ignore[index]
    isvc["spec"]["predictor"]["annotations"] = anns  # type: ignore[index]
    return sfm.settings_from_inferenceservice(isvc)


def run(
    s: SimSettings, arrivals: list[Arrival], duration: float, startup: float = 40.0, **kw: object
) -> Simulation:
    options = RunOptions(duration=duration, start=kw.pop("start", "idle"), **kw)  # type: ignore[arg-type]
    sim = Simulation(s, profile(startup), arrivals, options)
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


def test_activator_holds_then_releases_when_pod_ready() -> None:
    sim = run(settings(), [Arrival(10.2, output_tokens=60)], duration=120, startup=40.0)
    req = sim.requests[0]
    assert req.state == "done" and req.cold
    # Poke at 10.2 -> pod created at once -> ready 40 s later; the request waits in the activator meanwhile.
    (pod,) = sim.pods
    assert pod.created == pytest.approx(10.2) and pod.ready_at == pytest.approx(50.2)
    assert req.first_token == pytest.approx(50.2 + 0.1)
    assert req.done == pytest.approx(50.3 + 1.0)  # 60 tokens at 60 tok/s
    se = sim.series
    held = {t: q for t, q in zip(se["t"], se["activator_queue"], strict=True)}
    assert held[11.0] == 1 and held[50.0] == 1 and held[51.0] == 0
    s = sim.result.summary  # type: ignore[attr-defined]
    assert s["cold_starts"] == 1 and s["cold_start_wait_max_s"] == pytest.approx(40.0)


def test_activator_request_timeout() -> None:
    # timeout 20 s < 40 s startup: the held request gets a 503; one arriving after the pod is up is served.
    sim = run(
        settings(timeout=20), [Arrival(5.0), Arrival(60.0, output_tokens=30)], duration=120, startup=40.0
    )
    first, second = sim.requests
    assert first.state == "timed_out"
    assert second.state == "done" and not second.cold
    assert sim.result.summary["timed_out"] == 1  # type: ignore[attr-defined]


def test_activator_queue_bound() -> None:
    s = settings()
    s.activator_queue_depth = 3
    sim = run(s, [Arrival(1.0 + i * 0.01) for i in range(5)], duration=30, startup=100.0)
    assert sum(r.state == "rejected" for r in sim.requests) == 2


def test_container_concurrency_limits_the_activator() -> None:
    # CC 1: the activator sends one request at a time to the only pod; the rest wait in the activator.
    s = settings(containerConcurrency=1, maxReplicas=1)
    sim = run(s, [Arrival(1.0, output_tokens=60) for _ in range(3)], duration=200, startup=10.0)
    done = sorted(r.done for r in sim.requests if r.done)
    assert len(done) == 3
    assert done[1] - done[0] == pytest.approx(1.1) and done[2] - done[1] == pytest.approx(1.1)


@pytest.mark.parametrize(
    ("tbc", "retention", "extra"),
    [
        (0, 0, 30),  # activator left the path while serving: it must proxy for the grace period first
        (211, 0, 0),  # default TBC: already proxying for longer than the grace period (fast path)
        (211, 120, 120),  # retention counts from going inactive
    ],
)
def test_scale_to_zero_timing(tbc: int, retention: int, extra: int) -> None:
    """Last load -> a full stable window of zero -> inactive -> zero after max(grace, retention), where
    the grace period only runs if the activator was not in the path already (kpa/scaler.go)."""
    s = settings(**{
        "autoscaling.knative.dev/scale-to-zero-pod-retention-period": f"{retention}s",
        "autoscaling.knative.dev/target-burst-capacity": str(tbc),
    })  # fmt: skip
    sim = run(s, [Arrival(10.0, output_tokens=60)], duration=400, startup=5.0)
    (pod,) = sim.pods
    done = sim.requests[0].done
    assert done is not None and pod.gone_at is not None
    last_busy_bucket = math.ceil(done)  # the scrape that still saw the request
    expected = last_busy_bucket + 60 + extra
    assert expected - 2 <= pod.gone_at <= expected + 4
    assert sim.pa.history[-1][1] == "inactive"


def test_cache_hits_served_while_predictor_at_zero() -> None:
    sim = run(settings(), [Arrival(float(t)) for t in range(1, 50)], duration=100, hit_ratio=1.0)
    assert not sim.pods
    s = sim.result.summary  # type: ignore[attr-defined]
    assert s["served"] == 49 and s["latency_p99_s"] == pytest.approx(0.02) and s["gpu_seconds"] == 0


def test_trace_hit_column_is_replayed(tmp_path: object) -> None:
    sim = run(settings(), [Arrival(1.0, hit=True), Arrival(2.0, hit=False)], duration=100, hit_ratio=1.0)
    assert [r.hit for r in sim.requests] == [True, False]


def test_panic_entry_and_exit_timing() -> None:
    """Concurrency 10 at target 10 on one pod, a surge to 100 for 30 s: panic at the first tick that sees
    it through the 6 s panic window, exit a stable window after the last over-threshold tick."""
    c = MetricCollector(60, 6)
    a = Autoscaler(sfm.settings_from_inferenceservice(
        {"kind": "InferenceService", "metadata": {}, "spec": {"predictor": {"scaleTarget": 10,
         "annotations": {"autoscaling.knative.dev/target-utilization-percentage": "100"}}}}
    ).decider_spec())  # fmt: skip
    entered = exited = None
    last_over = None
    for t in range(1, 300):
        c.record(float(t), Stat(concurrency=100.0 if 100 <= t < 130 else 10.0))
        if t % 2 == 0:
            stable, panic = c.stable_and_panic_concurrency(float(t))  # type: ignore[misc]
            if math.ceil(panic / 10) >= 2:
                last_over = t
            was = a.in_panic
            a.scale(float(t), stable, panic, 1)
            if a.in_panic and not was:
                entered = t
            if was and not a.in_panic:
                exited = t
    assert entered == 100
    assert last_over == 134  # the panic window still holds a 100 until 6 s after the surge
    assert exited == 196  # first tick with panic_time + 60 < now


def test_burst_panics_and_scales_out() -> None:
    s = settings(minReplicas=1, containerConcurrency=16)
    arr = burst(1.0, 400, __import__("random").Random(1), at=120, factor=10, ramp=5, length=60)
    sim = run(s, arr, duration=400, startup=20.0, start="warm", output_tokens=64)
    se = sim.series
    panic_t = [t for t, p in zip(se["t"], se["panic"], strict=True) if p]
    assert panic_t and 120 <= panic_t[0] <= 130
    assert max(se["pods_ready"]) > 1


def test_deterministic_for_a_seed() -> None:
    s = settings(minReplicas=0)
    prof = load_profile("cpu")
    arr = generate("burst", 1.0, 600, seed=7)
    a = simulate(s, prof, arr, RunOptions(duration=600, seed=7, hit_ratio=0.3, start="idle"))
    b = simulate(
        s,
        prof,
        generate("burst", 1.0, 600, seed=7),
        RunOptions(duration=600, seed=7, hit_ratio=0.3, start="idle"),
    )
    assert a.summary == b.summary and a.series == b.series
    c = simulate(
        s,
        prof,
        generate("burst", 1.0, 600, seed=8),
        RunOptions(duration=600, seed=8, hit_ratio=0.3, start="idle"),
    )
    assert c.summary != a.summary


def test_baselines_report_savings() -> None:
    s = settings(minReplicas=0)
    arr = [Arrival(10.0 + 600 * i) for i in range(3)]
    r = simulate(s, profile(30.0), arr, RunOptions(duration=1800, seed=0, hit_ratio=0.0, start="idle"))
    # Three cold starts, each keeping a pod ~2 minutes, vs. one pod for the whole 30 minutes.
    assert r.summary["cold_starts"] == 3
    assert r.summary["gpu_seconds_saved_by_scale_to_zero"] > 1000
    assert r.summary["gpu_seconds_saved_by_cache"] == 0


def test_generators_and_trace_roundtrip(tmp_path: object) -> None:
    import random
    from pathlib import Path

    rng = random.Random(0)
    assert 500 < len(steady(1.0, 600, rng)) < 700
    assert 0 < len(sporadic(3600, rng, mean_gap=180)) < 40
    d = diurnal(10.0, 1000, rng, period=1000)
    mid = sum(1 for a in d if 400 <= a.t < 600)
    edge = sum(1 for a in d if a.t < 100 or a.t >= 900)
    assert mid > 3 * edge
    path = Path(str(tmp_path)) / "t.csv"
    write_trace(path, [Arrival(5.0, "p1", "dev", True, 10), Arrival(7.5, "p2", "prod", None, None)])
    back = read_trace(path)
    assert [(a.t, a.prompt_id, a.hit, a.output_tokens) for a in back] == [
        (0.0, "p1", True, 10),
        (2.5, "p2", None, None),
    ]
    assert [a.tenant for a in read_trace(path, tenant="prod")] == ["prod"]


def test_engine_profile_interpolation() -> None:
    p = load_profile("cpu")
    assert p.aggregate_tokens_per_s(1) == 60 and p.aggregate_tokens_per_s(8) == 300
    assert p.aggregate_tokens_per_s(20) == pytest.approx(400)
    assert p.aggregate_tokens_per_s(64) == 500  # saturated past the last point
    assert p.per_request_tokens_per_s(8) == pytest.approx(37.5)
    lo, hi = p.startup.bounds()
    assert (lo, hi) == (31.0, 88.0)
    with pytest.raises(ValueError, match="concurrency"):
        EngineProfile.from_dict({"concurrency": [8, 1], "tokens_per_s": [1, 2], "ttft_s": [0, 0]})


def test_every_shipped_profile_loads_with_sane_values() -> None:
    names = shipped_profiles()
    assert {"cpu", "gpu"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p == load_profile(PROFILE_DIR / f"{name}.json")  # a name is its file
        assert p.name, name
        # Throughput grows with the batch, first tokens do not get faster under load.
        assert all(b >= a for a, b in zip(p.tokens_per_s, p.tokens_per_s[1:], strict=False)), name
        assert all(b >= a for a, b in zip(p.ttft_s, p.ttft_s[1:], strict=False)), name
        assert 0 < p.ttft(1) < 10 and p.max_num_seqs >= p.concurrency[0], name
        low, high = p.startup.bounds()
        assert 0 < low <= high < 3600, name  # a pod starts, and within the hour
    # The two the CLI names: a CPU pod is billed as pod-seconds, a GPU pod as GPU-seconds.
    assert load_profile("cpu").accelerator == "cpu" and load_profile("gpu").accelerator == "gpu"
    with pytest.raises(ValueError, match="not 'cpu', 'gpu' or an existing JSON file"):
        load_profile("no-such-profile")


def test_plot_counts_every_cache_hit_even_where_dots_overlap() -> None:
    """Issue 29: the summary said 5 cache hits, the plot showed 4 dots. Every hit takes the same
    20 ms, so two hits seconds apart on a half-hour axis are one dot; the legend carries the
    counts, and they are the summary's."""
    from serverless.sim_report import figure

    arrivals = [Arrival(100.0, hit=True), Arrival(104.0, hit=True), Arrival(200.0, output_tokens=60),
                Arrival(900.0, hit=True), Arrival(1700.0, hit=True), Arrival(1799.9, hit=True)]  # fmt: skip
    sim = run(settings(), arrivals, duration=1800)
    summary = sim.result.summary  # type: ignore[attr-defined]
    assert summary["cache_hits"] == 5
    fig = figure(sim.result)  # type: ignore[attr-defined]
    ax = fig.axes[3]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"cache hit ({summary['cache_hits']})" in labels, labels
    assert f"predictor ({summary['served'] - summary['cache_hits']} served)" in labels, labels
    hits = next(c for c in ax.collections if c.get_label().startswith("cache hit"))
    assert len(hits.get_offsets()) == 5  # all drawn, the last one (at the very end) included
    fig.canvas.draw()
    xs = sorted(ax.transData.transform(hits.get_offsets())[:, 0])
    assert xs[1] - xs[0] < 3  # the two at 100 s and 104 s are one dot: why the count is needed
