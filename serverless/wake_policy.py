"""Choosing a wake policy with numbers (issue 28 item 5): scale to zero, scale to sleep and min-scale 1
for one tenant's traffic, on a measured CPU profile and a published GPU profile.

Each run is the simulator's (serverless/simulate.py) on the tenant's overlay, twice over: the
transformer component first (transformer-cpu: measured start), then the predictor on the misses,
each arriving when the transformer has passed it on. A hit's first-answer wait is its transformer
wait plus the cache lookup; a miss's is that plus the predictor's arrival-to-first-token.

Policies, as overrides on the overlay's InferenceService:
- scale to zero: minReplicas 0 for both components (the overlay's windows and retention stay);
- min-scale 1: minReplicas 1 for both;
- scale to sleep: min-scale 1, and the kept predictor sleeps after `sleep_after_idle_s` with nothing
  in flight (vLLM sleep mode). The next miss waits a wake drawn from the profile's published range,
  and misses arriving during that wake wait for its end. An approximation over the min-scale-1 run:
  the tenant's in-flight count stands for the kept pod's (exact with one pod, as a dev tenant has).
  A sleeping pod still holds its GPU in Kubernetes (the device stays allocated); what it frees is
  the GPU's memory, for other engines on a shared GPU. So both are reported: GPU-seconds
  allocated, and awake (weights and KV cache in GPU memory).

CPU has no sleep mode (vLLM's CPU backend): its scale-to-sleep rows say so instead of numbers.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serverless import settings_from_manifest as sfm
from serverless.kustomize import render_overlay
from serverless.pod_profile import EngineProfile, StartupModel, load_profile
from serverless.pods import RequestState
from serverless.sim_report import percentile
from serverless.simulate import RunOptions, Simulation
from serverless.traffic import Arrival, sporadic

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("scale to zero", "scale to sleep", "min-scale 1")
CACHE_HIT_S = 0.02
TRANSFORMER_OVERHEAD_S = 0.01


@dataclass(frozen=True)
class Hardware:
    """A predictor profile with its start-up and (if any) its sleep-mode wake, and their sources."""

    name: str
    predictor: EngineProfile
    wake_s: tuple[float, float] | None  # None: no sleep mode
    source: str


def cpu_measured() -> Hardware:
    engine = load_profile("coldstart-cpu")
    # bench/RESULTS.md phases of the warm start with the engine core in the predictor's process
    # and vLLM's AOT compile cache loaded (2026-12-05: 19.9 s, 18.6-22.6): server, vLLM imports,
    # the engine's config, worker and weights ~15 s (model_load), the compiled model loaded, KV
    # cache and warm-up ~5 s (warmup, 3.6-7.6 s so the sum spans the measured range), after 1-3 s
    # of scheduling.
    startup = StartupModel(schedule_s=(1.0, 3.0), model_load_s=(14.0, 14.0), warmup_s=(3.6, 7.6))
    return Hardware(
        "cpu (measured)",
        replace(engine, startup=startup),
        None,
        "bench/RESULTS.md (2026-12-05, 2-core CPU, SmolLM2-135M): predictor warm start 19.9 s = "
        "imports, engine config/worker/weights ~15 s + compiled model from vLLM's AOT cache, KV "
        "cache and warm-up ~5 s (engine core in the predictor's process); "
        "throughput and TTFT serverless/profiles/coldstart-cpu.json; no "
        "sleep mode (vLLM's CPU backend has none)",
    )


def gpu_published() -> Hardware:
    engine = load_profile("gpu")
    # The image is taken as cached on the node: the comparison is of the engine's start, not the pull.
    startup = StartupModel(schedule_s=(1.0, 5.0), warmup_s=(48.0, 60.0))
    return Hardware(
        "gpu (published)",
        replace(engine, startup=startup),
        (0.26, 3.0),
        "vLLM's sleep-mode blog post (October 2025): wake from level-1 sleep 0.26-3 s against a "
        "~48-60 s reload; throughput/TTFT serverless/profiles/gpu.json (published A100 Llama-3.1-8B "
        "sweep); image cached on the node, 1-5 s scheduling",
    )


@dataclass(frozen=True)
class Tenant:
    name: str
    overlay: str  # manifests/overlays/<overlay>
    arrivals: list[Arrival]  # `hit` decided for every request (the same for every policy)
    description: str


def dev_tenant(duration: float, seed: int, mean_gap: float = 180.0, hit_ratio: float = 0.3) -> Tenant:
    rng = random.Random(f"{seed}:dev")
    arrivals = [replace(a, hit=rng.random() < hit_ratio) for a in sporadic(duration, rng, mean_gap)]
    return Tenant("dev (sporadic)", "dev-tenant", arrivals,
                  f"one request every {mean_gap:g} s on average, {hit_ratio:.0%} cache hits")  # fmt: skip


def prod_tenant(duration: float, seed: int, hit_ratio: float = 0.5) -> Tenant:
    """Bursts of 1-5 min at 3 requests/s, 5-40 min apart, nothing in between (a batch job, a
    business-hours team): the case where the choice matters for a prod tenant."""
    rng = random.Random(f"{seed}:prod")
    arrivals: list[Arrival] = []
    t = rng.uniform(60, 600)
    while t < duration:
        end = min(duration, t + rng.uniform(60, 300))
        while (t := t + rng.expovariate(3.0)) < end:
            arrivals.append(Arrival(t, hit=rng.random() < hit_ratio))
        t = end + rng.uniform(300, 2400)
    return Tenant("prod (bursty)", "prod", arrivals,
                  f"bursts of 1-5 min at 3 req/s, 5-40 min apart, {hit_ratio:.0%} cache hits")  # fmt: skip


@dataclass(frozen=True)
class PolicyResult:
    hardware: str
    tenant: str
    policy: str
    unit: str  # "GPU-s" or "pod-s"
    requests: int
    hits: int
    misses: int
    not_served: int
    seconds_allocated: float | None
    seconds_awake: float | None
    hit_p50: float | None
    hit_p99: float | None
    miss_p50: float | None
    miss_p99: float | None
    wakes: int = 0
    note: str = ""


@dataclass(frozen=True)
class Served:
    """A predictor request as the simulator finished it (times from its arrival at the predictor)."""

    index: int
    arrival: float
    first_token: float
    done: float


@functools.cache
def _rendered(overlay: str) -> list[dict[str, Any]]:
    return render_overlay(ROOT / "manifests" / "overlays" / overlay).documents


def _isvc(overlay: str, min_replicas: int) -> tuple[dict[str, Any], dict[str, str] | None]:
    docs = _rendered(overlay)
    isvc = sfm.pick_inferenceservice(docs)
    for component in ("predictor", "transformer"):
        isvc = sfm.apply_overrides(isvc, component, [f"minReplicas={min_replicas}"])
    return isvc, sfm.cluster_config_from(docs)


def _run(isvc: dict[str, Any], cluster: dict[str, str] | None, component: str, profile: EngineProfile,
         arrivals: list[Arrival], duration: float, seed: int, output_tokens: int) -> Simulation:  # fmt: skip
    settings = sfm.settings_from_inferenceservice(isvc, component, cluster)
    options = RunOptions(duration=duration, seed=seed, output_tokens=output_tokens, start="idle",
                         record_series=False)  # fmt: skip
    sim = Simulation(settings, profile, arrivals, options)
    sim.run()
    return sim


def _served(sim: Simulation) -> dict[int, Served]:
    return {
        r.id: Served(r.id, r.arrival, r.first_token, r.done)
        for r in sim.requests
        if r.state == RequestState.DONE and r.first_token is not None and r.done is not None
    }


@dataclass(frozen=True)
class SleepOutcome:
    delays: dict[int, float]  # predictor request index -> seconds it waited for a wake
    asleep_s: float
    wakes: int


def apply_sleep(served: list[Served], idle_s: float, wake_s: tuple[float, float], duration: float,
                rng: random.Random) -> SleepOutcome:  # fmt: skip
    """Where the kept engine sleeps in a min-scale-1 run, and what each request waits for its wake."""
    delays: dict[int, float] = {}
    busy_until = 0.0  # the run starts warm and idle
    wake_end = float("-inf")
    asleep = 0.0
    wakes = 0
    for r in sorted(served, key=lambda s: s.arrival):
        a = r.arrival
        if a >= busy_until + idle_s and a >= wake_end:
            asleep += a - (busy_until + idle_s)
            wake_end = a + rng.uniform(*wake_s)
            wakes += 1
        delays[r.index] = max(0.0, wake_end - a)
        busy_until = max(busy_until, r.done + delays[r.index])
    if duration > busy_until + idle_s:
        asleep += duration - (busy_until + idle_s)
    return SleepOutcome(delays, asleep, wakes)


def compare(hardware: Hardware, tenant: Tenant, duration: float, seed: int = 0,
            sleep_after_idle_s: float = 300.0, output_tokens: int = 128) -> list[PolicyResult]:  # fmt: skip
    """The three policies for one tenant on one hardware profile."""
    transformer = load_profile("transformer-cpu")
    unit = "GPU-s" if hardware.predictor.accelerator == "gpu" else "pod-s"
    out = []
    for policy in POLICIES:
        if policy == "scale to sleep" and hardware.wake_s is None:
            out.append(PolicyResult(hardware.name, tenant.name, policy, unit, len(tenant.arrivals),
                                    0, 0, 0, None, None, None, None, None, None,
                                    note="refused: vLLM's CPU backend has no sleep mode"))  # fmt: skip
            continue
        isvc, cluster = _isvc(tenant.overlay, 0 if policy == "scale to zero" else 1)
        # Every request passes the transformer (hits are answered there): it is the transformer's
        # "miss" in the simulator, with one token of work.
        through = [replace(a, hit=False, output_tokens=1) for a in tenant.arrivals]
        t_sim = _run(isvc, cluster, "transformer", transformer, through, duration, seed, 1)
        t_done = _served(t_sim)
        t_wait = {i: s.first_token - s.arrival for i, s in t_done.items()}
        hits = [t_wait[i] + CACHE_HIT_S for i, a in enumerate(tenant.arrivals) if a.hit and i in t_wait]
        miss_ids = [i for i, a in enumerate(tenant.arrivals) if not a.hit and i in t_wait]
        to_predictor = [Arrival(tenant.arrivals[i].t + t_wait[i], hit=False) for i in miss_ids]
        p_sim = _run(isvc, cluster, "predictor", hardware.predictor, to_predictor, duration, seed,
                     output_tokens)  # fmt: skip
        p_done = _served(p_sim)
        allocated = p_sim.gpu_seconds()
        awake = allocated
        delays: dict[int, float] = {}
        wakes = 0
        if policy == "scale to sleep":
            assert hardware.wake_s is not None
            slept = apply_sleep(list(p_done.values()), sleep_after_idle_s, hardware.wake_s, duration,
                                random.Random(f"{seed}:wake"))  # fmt: skip
            delays, wakes = slept.delays, slept.wakes
            awake = allocated - slept.asleep_s * p_sim.s.gpus_per_pod
        misses = [
            t_wait[miss_ids[j]] + (s.first_token - s.arrival) + delays.get(j, 0.0) + TRANSFORMER_OVERHEAD_S
            for j, s in p_done.items()
        ]
        unanswered = (len(tenant.arrivals) - len(t_done)) + (len(to_predictor) - len(p_done))
        out.append(PolicyResult(
            hardware.name, tenant.name, policy, unit, len(tenant.arrivals), len(hits), len(misses),
            unanswered, allocated, awake, percentile(hits, 50), percentile(hits, 99),
            percentile(misses, 50), percentile(misses, 99), wakes,
        ))  # fmt: skip
    return out


def _s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}"


def markdown_table(results: list[PolicyResult]) -> str:
    rows = [
        "| hardware | tenant | policy | requests (hits / misses) | accelerator-s allocated | awake | "
        "hit wait p50 / p99 (s) | miss wait p50 / p99 (s) | wakes | not served |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        if r.note:
            rows.append(f"| {r.hardware} | {r.tenant} | {r.policy} | {r.requests} | {r.note} | | | | | |")
            continue
        rows.append(
            f"| {r.hardware} | {r.tenant} | {r.policy} | {r.requests} ({r.hits} / {r.misses}) | "
            f"{r.seconds_allocated:,.0f} {r.unit} | {r.seconds_awake:,.0f} {r.unit} | "
            f"{_s(r.hit_p50)} / {_s(r.hit_p99)} | {_s(r.miss_p50)} / {_s(r.miss_p99)} | {r.wakes} | "
            f"{r.not_served} |"
        )
    return "\n".join(rows)
