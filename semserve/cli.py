"""`semserve`: the one command line. Each subcommand lives beside the code it runs.

This is the only module of semserve/ that names the services, and only as strings loaded on demand,
so `semserve cache ...` never imports vLLM and shared code keeps importing no service.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from semserve.config import SettingError

# Each module has `register(subparsers)`, adding its subcommand(s) with `set_defaults(func=...)`.
COMMAND_MODULES = [
    "semserve.commands.model",
    "semserve.commands.up",
    "semserve.commands.settings",
    "semserve.tooling.dependency_audit",
    "predictors.cli",
    "transformers_svc.cli",
    "bench.cli",
    "cache.cli",
    "cache.embedder_cli",
    "serverless.cli",
    "serverless.tenant",
]


# The services: a pod runs one of these at every start, which then imports only that command's
# module (all of them import bench, serverless and tooling code: ~0.15 s of a 2-core start).
SERVICE_COMMANDS = {"transformer": "transformers_svc.cli", "predictor": "predictors.cli"}


def build_parser(modules: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES if modules is None else modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    service = SERVICE_COMMANDS.get(argv[0]) if argv else None
    parser = build_parser([service] if service else None)
    args = parser.parse_args(argv)
    # kserve.model_server parses sys.argv when imported; our flags must not reach its parser.
    sys.argv = sys.argv[:1]
    try:
        code = args.func(args)
    except SettingError as exc:  # a bad env var or setting: one line, no traceback
        print(f"semserve {args.command}: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
