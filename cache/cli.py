"""`semserve cache ...`: stats|flush|inspect look at and clean the cache in Redis directly (JSON out);
the offline commands of the tooling area (train, calibrate-judge, tune-embedder, pairs, eval) are
named here too, so `semserve cache --help` lists them all.

The tooling modules never import this one back: each has `add_arguments(parser)` and `run(args)`,
and this module builds their subcommands from those. Another module may still add a subcommand with
`cache_subparsers(sub)`, which returns the one `cache` subparsers action whichever registers first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from cache.settings import CacheSettings

_ATTR = "_semserve_cache_subparsers"


def cache_subparsers(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The subparsers of `semserve cache`, created on first use (order-independent)."""
    existing = getattr(sub, _ATTR, None)
    if existing is not None:
        return existing
    cache = sub.add_parser("cache", help="inspect and manage the semantic cache in Redis")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True, metavar="CACHE_COMMAND")
    setattr(sub, _ATTR, cache_sub)
    return cache_sub


# The settings the store commands read (EntryStore.from_settings and make_client): their
# --help lists only these, not every transformer-side cache knob.
STORE_SETTINGS = (
    "redis_url", "redis_password", "ca_file", "deployment", "embedding_dim",
    "ttl_seconds", "max_entries_per_tenant", "store_timeout_ms",
)  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    cs = cache_subparsers(sub)

    stats = cs.add_parser("stats", help="entries per tenant, index size and memory")
    stats.add_argument("--tenant", default=None, help="only this tenant")
    CacheSettings.add_arguments(stats, only=STORE_SETTINGS)
    stats.set_defaults(func=_stats)

    flush = cs.add_parser(
        "flush", help="delete a tenant's entries (optionally only one model's or one revision's)"
    )
    flush.add_argument("--tenant", default=None, help="required unless --model-revision is given")
    flush.add_argument("--model", default=None, help="only entries of this model (all revisions)")
    flush.add_argument(
        "--model-revision", default=None,
        help="only entries written under this model revision (every tenant unless --tenant)",
    )
    CacheSettings.add_arguments(flush, only=STORE_SETTINGS)
    flush.set_defaults(func=_flush)

    inspect = cs.add_parser("inspect", help="a tenant's newest entries")
    inspect.add_argument("--tenant", required=True)
    inspect.add_argument("--limit", type=int, default=20)
    CacheSettings.add_arguments(inspect, only=STORE_SETTINGS)
    inspect.set_defaults(func=_inspect)

    # The offline commands (imported here, not at the top: they load numpy and their data).
    from semserve.tooling import (
        cache_eval_cli,
        embedder_tuning,
        judge_calibration,
        pair_generation,
        scorer_training,
    )

    tooling = (
        ("train", scorer_training,
         "fit the pair scorer on the train split and calibrate it (writes scorer.json)"),
        ("calibrate-judge", judge_calibration,
         "choose the same-answer judge's grey zone and threshold on labelled pairs (needs a predictor)"),
        ("tune-embedder", embedder_tuning,
         "fine-tune the embedder's top layers on labelled pairs (writes the delta into cache/data)"),
        ("pairs", pair_generation, "rebuild the labelled pairs from the seeds (data/pairs_*.jsonl)"),
        ("eval", cache_eval_cli, "hit rate and wrong-serve rate on labelled prompt pairs"),
    )  # fmt: skip
    for name, module, help_text in tooling:
        parser = cs.add_parser(name, help=help_text)
        module.add_arguments(parser)
        parser.set_defaults(func=module.run)


async def _with_store(args: argparse.Namespace, op: str) -> Any:
    from cache.entry_store import EntryStore

    store = EntryStore.from_settings(CacheSettings.from_namespace(args))
    try:
        if op == "stats":
            return await store.stats(args.tenant)
        if op == "flush":
            if args.model_revision:
                deleted = await store.flush_revision(args.model_revision, args.tenant, args.model)
            else:
                deleted = await store.flush(args.tenant, args.model)
            return {
                "tenant": args.tenant,
                "model": args.model,
                "model_revision": args.model_revision,
                "deleted": deleted,
            }
        return await store.inspect(args.tenant, args.limit)
    finally:
        await store.close()


def _run(args: argparse.Namespace, op: str) -> int:
    from redis.exceptions import RedisError

    try:
        result = asyncio.run(_with_store(args, op))
    except (RedisError, OSError) as e:
        print(f"error: Redis: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, ensure_ascii=False, default=str))
    return 0


def _stats(args: argparse.Namespace) -> int:
    return _run(args, "stats")


def _flush(args: argparse.Namespace) -> int:
    if not args.tenant and not args.model_revision:
        print("error: cache flush needs --tenant (or --model-revision)", file=sys.stderr)
        return 2
    return _run(args, "flush")


def _inspect(args: argparse.Namespace) -> int:
    return _run(args, "inspect")


def main(argv: list[str] | None = None) -> int:
    """`python -m cache.cli stats ...`: the same commands without the rest of semserve's CLI."""
    parser = argparse.ArgumentParser(prog="python -m cache.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cache", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
