"""`semserve transformer` refuses a bad setting in one line naming it (exit 2), not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "semserve", "transformer", "--http-port", "0", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--openai-route-prefix", "/v1"], None, "openai_route_prefix '/v1'"),
        ([], {"SEMSERVE_TRANSFORMER_CACHE_POLICY": "sometimes"},
         "SEMSERVE_TRANSFORMER_CACHE_POLICY: 'sometimes' is not one of"),
        ([], {"SEMSERVE_EMBED_BACKEND": "gpu"}, "SEMSERVE_EMBED_BACKEND: 'gpu' is not one of"),
        ([], {"SEMSERVE_CACHE_KNN_K": "many"}, "SEMSERVE_CACHE_KNN_K: expected an integer, got 'many'"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(args: list[str], env: dict[str, str] | None, named: str) -> None:
    done = _start(args, env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("semserve transformer: "), done.stderr
    assert named in lines[0]
