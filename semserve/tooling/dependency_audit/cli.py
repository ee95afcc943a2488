"""`semserve audit deps`: the command, its log lines and its exit status."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import time

from semserve import logs
from semserve.tooling.dependency_audit.packages import Dist, installed_distributions
from semserve.tooling.dependency_audit.policy import PolicyError, load_policy
from semserve.tooling.dependency_audit.report import EXIT_POLICY_ERROR, render
from semserve.tooling.dependency_audit.scan import audit
from semserve.tooling.dependency_audit.settings import AuditSettings

log = logs.get_logger("semserve.dependency_audit")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("audit", help="security audits")
    audit_sub = parser.add_subparsers(dest="audit_command", required=True)
    deps = audit_sub.add_parser(
        "deps", help="known vulnerabilities of the installed Python packages (OSV, PyPI)"
    )
    AuditSettings.add_arguments(deps)
    deps.add_argument(
        "--package", action="append", default=None, metavar="NAME==VERSION", type=Dist.parse,
        help="audit these (repeatable) instead of the installed distributions",
    )
    deps.add_argument(
        "--as-of", default=None, metavar="YYYY-MM-DD", type=_day,
        help="judge the exceptions' `until` dates as of this day (default: today), e.g. to "
        "reproduce an earlier audit",
    )
    deps.set_defaults(func=run_deps)


def _day(raw: str) -> dt.date:
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date YYYY-MM-DD, got {raw!r}") from None


def run_deps(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:  # a host that set up logging (pytest) keeps its own
        logs.configure("info")
        # One line per request would bury the progress lines.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        settings = AuditSettings.from_namespace(args)
        # The default file may be absent (no exceptions); one that was named must exist.
        explicit = "exceptions" in vars(args) or bool(os.environ.get("SEMSERVE_AUDIT_EXCEPTIONS"))
        policy = load_policy(settings.exceptions, required=explicit)
    except PolicyError as exc:
        print(f"audit: invalid policy: {exc}", file=sys.stderr)
        return EXIT_POLICY_ERROR
    except ValueError as exc:
        print(f"audit: invalid setting: {exc}", file=sys.stderr)
        return EXIT_POLICY_ERROR
    dists = list(args.package) if args.package else installed_distributions()
    log.info("audit_start", packages=len(dists), osv_url=settings.osv_url, pypi_url=settings.pypi_url,
             policy=policy.path, require_coverage=settings.require_coverage)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 2.0:
            last[0] = now
            log.info("audit_progress", queries_done=done, queries=total)

    report = audit(dists, settings, policy, today=args.as_of, progress=progress)
    data = report.as_dict()
    if settings.json is not None:
        settings.json.parent.mkdir(parents=True, exist_ok=True)
        settings.json.write_text(json.dumps(data, indent=2) + "\n")
    log.info("audit_done", **{k: v for k, v in data["summary"].items() if k != "verdict"},
             osv_error=report.osv_error, elapsed_s=data["elapsed_s"])
    print(render(report))
    return report.exit_status()


def main(argv: list[str] | None = None) -> int:
    """`python -m semserve.tooling.dependency_audit ...` is `semserve audit deps ...` without the
    other commands."""
    parser = argparse.ArgumentParser(prog="semserve")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", "deps", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
