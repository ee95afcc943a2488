"""The README's examples, run as a newcomer would (curl, the `openai` client, tritonclient) against
the suite's real predictor and transformer: each prints a sensible answer with the bundled model."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import Predictor, Transformer
from tests.support import ROOT

_BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)
# The local stack's addresses as the README writes them.
_PORTS = ("8090", "8091", "8080", "8081")


def examples() -> list[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text()
    return [(lang, body) for lang, body in _BLOCK.findall(readme) if "127.0.0.1:80" in body]


def _command(lang: str, body: str) -> list[str]:
    if lang == "python":
        return [sys.executable, "-c", body]
    # From the first curl to the end of the block, without its comment lines.
    lines = body.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("curl"))
    script = "\n".join(line for line in lines[start:] if not line.lstrip().startswith("#"))
    return ["bash", "-c", script]


def test_the_readme_has_the_examples_this_test_runs() -> None:
    kinds = [("curl" if lang == "bash" else "tritonclient" if "tritonclient" in body else "openai")
             for lang, body in examples()]
    assert sorted(kinds) == ["curl", "curl", "openai", "openai", "openai", "tritonclient"]


@pytest.mark.parametrize("index", range(6))
def test_readme_example_prints_a_sensible_answer(
    index: int, predictor: Predictor, transformer: Transformer
) -> None:
    lang, body = examples()[index]
    ours = {
        "8090": predictor.http.rsplit(":", 1)[1], "8091": predictor.grpc.rsplit(":", 1)[1],
        "8080": transformer.http.rsplit(":", 1)[1], "8081": transformer.grpc.rsplit(":", 1)[1],
    }
    for port in _PORTS:
        body = body.replace(f"127.0.0.1:{port}", f"127.0.0.1:{ours[port]}")
    done = subprocess.run(_command(lang, body), capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Paris" in done.stdout, done.stdout[-2000:]
