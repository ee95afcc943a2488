"""`semserve simulate`: replay traffic against what a manifest would deploy, and size it."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from semserve.config import Settings, setting
from serverless import settings_from_manifest as sfm
from serverless.kustomize import load_documents, render_overlay
from serverless.pod_profile import load_profile
from serverless.sim_report import format_summary, plot
from serverless.simulate import START_MODES, RunOptions, simulate
from serverless.traffic import generate, read_trace

TRAFFIC_KINDS = ("steady", "burst", "diurnal", "sporadic")


@dataclass
class SimulateSettings(Settings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_SIM_"
    traffic: str = setting("steady", "Traffic generator (ignored with --trace).", choices=TRAFFIC_KINDS)
    rate: float = setting(1.0, "Requests/s: steady rate, burst base rate, diurnal peak.")
    duration: float = setting(0.0, "Seconds simulated (0: 3600, or last trace request + 120).")
    burst_at: float = setting(-1.0, "Burst start in seconds (-1: a third into the run).")
    burst_factor: float = setting(10.0, "Burst height as a multiple of --rate.")
    burst_ramp: float = setting(5.0, "Seconds for the burst to reach its height.")
    burst_length: float = setting(60.0, "Seconds the burst holds its height.")
    period: float = setting(86400.0, "Diurnal period in seconds (compress a day to test quickly).")
    mean_gap: float = setting(180.0, "Sporadic: mean seconds between requests.")
    hit_ratio: float = setting(0.0, "Share of requests the semantic cache answers (trace 'hit' wins).")
    output_tokens: int = setting(128, "Tokens generated per predictor request (trace column wins).")
    profile: str = setting("cpu", "Engine profile: cpu, gpu or a JSON file from semserve bench predictor.")
    seed: int = setting(0, "Random seed; a run is deterministic for a seed.")
    start: str = setting(
        "deploy", "Initial state: deploy (just applied), idle (at min), warm.", choices=START_MODES
    )
    baselines: bool = setting(True, "Also run without cache / scale-to-zero to report what each saves.")


def _describe_traffic(opts: SimulateSettings) -> str:
    """The traffic as the generator sees it: sporadic ignores --rate and uses --mean-gap."""
    if opts.traffic == "sporadic":
        return f"sporadic, one request every {opts.mean_gap:g}s on average"
    if opts.traffic == "burst":
        return f"burst @ {opts.rate:g}/s, x{opts.burst_factor:g} for {opts.burst_length:g}s"
    if opts.traffic == "diurnal":
        return f"diurnal, peak {opts.rate:g}/s, period {opts.period:g}s"
    return f"{opts.traffic} @ {opts.rate:g}/s"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate KPA autoscaling of a tenant (cache + activator + vLLM pods)",
        description=__doc__,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--isvc", type=Path, help="rendered (multi-doc) YAML holding the InferenceService")
    src.add_argument("--overlay", type=Path, help="kustomize directory, e.g. manifests/overlays/dev-tenant")
    p.add_argument("--name", help="InferenceService name when the YAML has several")
    p.add_argument("--component", default="predictor", help="ISVC component to simulate (default predictor)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a component field (minReplicas=0) or annotation "
                   "(autoscaling.knative.dev/window=120s); repeatable")  # fmt: skip
    p.add_argument("--trace", type=Path, help="CSV trace: timestamp[,prompt_id,tenant,hit,output_tokens]")
    p.add_argument("--tenant", help="only this tenant's rows of --trace")
    p.add_argument("--plot", type=Path, help="write a PNG over time here")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="JSON result to FILE (or stdout)")
    p.add_argument(
        "--show-settings", action="store_true", help="print the resolved settings and their sources"
    )
    SimulateSettings.add_arguments(p)
    p.set_defaults(func=run)


def _load_isvc(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str] | None, str]:
    if args.isvc is not None:
        docs = load_documents(Path(args.isvc).read_text())
        how = str(args.isvc)
    elif args.overlay is not None:
        rendered = render_overlay(args.overlay)
        docs, how = rendered.documents, f"{args.overlay} ({rendered.how})"
    else:
        # No manifest: an InferenceService with nothing set, i.e. KServe's and Knative's defaults.
        return (
            {"kind": "InferenceService", "metadata": {"name": "defaults"}, "spec": {"predictor": {}}},
            None,
            ("defaults"),
        )
    return sfm.pick_inferenceservice(docs, args.name), sfm.cluster_config_from(docs), how


def run(args: argparse.Namespace) -> int:
    try:
        opts = SimulateSettings.from_namespace(args)
        isvc, cluster, how = _load_isvc(args)
        if args.overrides:
            isvc = sfm.apply_overrides(isvc, args.component, args.overrides)
        settings = sfm.settings_from_inferenceservice(isvc, args.component, cluster)
        profile = load_profile(opts.profile)
        if args.trace is not None:
            arrivals = read_trace(args.trace, args.tenant)
            duration = opts.duration or ((arrivals[-1].t if arrivals else 0.0) + 120.0)
        else:
            duration = opts.duration or 3600.0
            arrivals = generate(
                opts.traffic, opts.rate, duration, opts.seed,
                burst_at=None if opts.burst_at < 0 else opts.burst_at, burst_factor=opts.burst_factor,
                burst_ramp=opts.burst_ramp, burst_length=opts.burst_length, period=opts.period,
                mean_gap=opts.mean_gap,
            )  # fmt: skip
        options = RunOptions(
            duration=duration, seed=opts.seed, hit_ratio=opts.hit_ratio, output_tokens=opts.output_tokens,
            start=opts.start,
        )  # fmt: skip
        result = simulate(settings, profile, arrivals, options, baselines=opts.baselines)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"semserve simulate: {e}", file=sys.stderr)
        return 2

    out = sys.stderr if args.json == "-" else sys.stdout  # keep stdout clean for JSON
    traffic = f"trace {args.trace}" if args.trace else _describe_traffic(opts)
    print(f"{settings.name}/{settings.component} from {how}; profile {profile.name}; {traffic}; "
          f"{duration:g}s; seed {opts.seed}", file=out)  # fmt: skip
    for w in settings.warnings:
        print(f"warning: {w}", file=out)
    if args.show_settings:
        for k, v in settings.to_dict().items():
            if k not in ("sources", "warnings"):
                print(f"  {k} = {v}", file=out)
        for k, v in settings.sources.items():
            print(f"  [{k}] from {v}", file=out)
    print(format_summary(result.summary, profile.accelerator), file=out)
    if args.plot is not None:
        plot(result, args.plot, f"{settings.name} — {traffic}, profile {profile.name}")
        print(f"plot: {args.plot}", file=out)
    if args.json is not None:
        payload = {
            "summary": result.summary,
            "settings": result.settings,
            "profile": result.profile,
            "series": result.series,
            "source": how,
            "seed": opts.seed,
        }
        text = json.dumps(payload, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
            print(f"json: {args.json}", file=out)
    return 0
