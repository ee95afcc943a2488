"""`semserve cache ...` commands, run as a subprocess against the session Redis."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import redis

from cache.cli import cache_subparsers, register
from semserve.tooling.local_redis import RedisServer

ROOT = Path(__file__).resolve().parents[2]


def run_cli(redis_server: RedisServer, *args: str) -> dict | list:
    common = ["--redis-url", redis_server.url, "--deployment", "test"]
    out = subprocess.run(
        [sys.executable, "-m", "cache.cli", *args, *common],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_stats_inspect_flush(redis_server: RedisServer, clean_redis: redis.Redis) -> None:
    # Written through the same code the services use, from a child process, so this test needs no loop.
    script = (
        "import asyncio, numpy as np\n"
        "from cache.entry_store import EntryStore\nfrom cache.settings import CacheSettings\n"
        "from cache.keys import CacheRequest\n"
        f"settings = CacheSettings(redis_url={redis_server.url!r}, deployment='test')\n"
        "s = EntryStore.from_settings(settings)\n"
        "async def main():\n"
        "    await s.ensure_index()\n"
        "    for t, p in [('acme', 'q1'), ('acme', 'q2'), ('beta', 'q1')]:\n"
        "        v = np.ones(384, np.float32) / np.sqrt(384)\n"
        "        await s.put(CacheRequest(t, 'm', 'chat', p), p, v, {'text': p})\n"
        "    await s.put(CacheRequest('beta', 'm', 'chat', 'old', model_revision='v1'), 'old', v, {})\n"
        "    await s.close()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=ROOT)
    # One revision's entries, across tenants, without --tenant.
    flushed = run_cli(redis_server, "flush", "--model-revision", "v1")
    assert flushed["deleted"] == 1 and flushed["model_revision"] == "v1"  # type: ignore[index]
    stats = run_cli(redis_server, "stats")
    assert stats["tenants"] == {"acme": 2, "beta": 1}  # type: ignore[index]
    rows = run_cli(redis_server, "inspect", "--tenant", "acme", "--limit", "1")
    assert isinstance(rows, list) and len(rows) == 1 and rows[0]["prompt"] == "q2"
    assert run_cli(redis_server, "flush", "--tenant", "acme")["deleted"] == 2  # type: ignore[index]
    assert run_cli(redis_server, "stats", "--tenant", "beta")["tenants"] == {"beta": 1}  # type: ignore[index]


def test_other_modules_can_add_cache_subcommands() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cache_subparsers(sub).add_parser("extra").set_defaults(func="extra")  # e.g. registered first
    register(sub)
    assert parser.parse_args(["cache", "extra"]).func == "extra"
    assert parser.parse_args(["cache", "stats"]).cache_command == "stats"


def test_store_commands_list_only_the_settings_they_use() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    cache_sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = cache_sub.choices["cache"]._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("stats", "flush", "inspect"):
        text = commands[name].format_help()
        assert "--redis-url" in text and "--deployment" in text, name
        # Transformer-side knobs that a store command never reads.
        for unused in ("--min-similarity", "--knn-k", "--lookup-timeout-ms", "--enabled", "--epoch"):
            assert unused not in text, (name, unused)
