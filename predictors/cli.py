"""`semserve predictor`: serve a model with vLLM behind KServe v2 (REST + gRPC) and OpenAI routes."""

from __future__ import annotations

import argparse

from predictors.config import PredictorSettings
from semserve import lifeline
from semserve.tracing import TracingSettings

TRACE_PREFIX = "trace-"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("predictor", help="run the vLLM predictor (KServe v2 + OpenAI)")
    PredictorSettings.add_arguments(parser)
    TracingSettings.add_arguments(parser, flag_prefix=TRACE_PREFIX)
    # Not a setting of the server: a one-off mode (a warm-up Job, `make model`), so no env var.
    parser.add_argument(
        "--warm-up", action="store_true",
        help="start the engine once (filling the compile cache under $SEMSERVE_CACHE_DIR), then exit",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    settings = PredictorSettings.from_namespace(args)  # a bad one: one line and exit 2 (semserve/cli.py)
    if settings.sleep_enabled:
        # Before anything loads: a setting this machine's vLLM cannot honour fails in seconds,
        # saying why, instead of after a minute of engine start.
        from predictors.sleep import platform_refusal

        problem = platform_refusal(settings.sleep_after_idle_s)
        if problem:
            raise SystemExit(f"semserve predictor: {problem}")
    trace_settings = TracingSettings.from_namespace(args, flag_prefix=TRACE_PREFIX)
    # vLLM's engine processes (EngineCore, Workers) die with this process, even on SIGKILL.
    lifeline.guard_children()
    if args.warm_up:
        from predictors.warmup import run as warm_up

        return warm_up(settings)
    # Imported late: vLLM and torch take seconds to import and `--help` should not wait for them.
    from predictors.server import run

    run(settings, trace_settings)
    return 0
