"""Every command line the images and manifests run is one `semserve` accepts: Dockerfile
ENTRYPOINT+CMD, and each rendered container's command+args, with what KServe adds (runtime args
concatenated with the InferenceService's, `{{.Name}}`, the transformer's injected flags)."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import pytest

from tests.manifests.conftest import MANIFESTS, OVERLAYS, by_kind

IMAGES = MANIFESTS / "images"
DOCKERFILES = ["transformer.Dockerfile", "predictor-gpu.Dockerfile", "predictor-cpu.Dockerfile"]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from semserve.cli import build_parser

    return build_parser()


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"semserve rejects: {' '.join(argv)}")


def _instruction(text: str, name: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.startswith(f"{name} ")]
    assert lines, f"no {name}"
    return list(json.loads(lines[-1][len(name) + 1 :]))  # exec form only: no shell in between


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_entrypoint_and_cmd(parser: argparse.ArgumentParser, dockerfile: str) -> None:
    text = (IMAGES / dockerfile).read_text()
    entry, cmd = _instruction(text, "ENTRYPOINT"), _instruction(text, "CMD")
    assert entry == ["semserve"]
    args = parse(parser, cmd)
    assert args.command == cmd[0] == ("transformer" if "transformer" in dockerfile else "predictor")
    # Non-root, pinned bases.
    assert re.search(r"^USER 10001", text, re.M)
    stages = set(re.findall(r"^FROM \S+ AS (\S+)", text, re.M))
    for base in re.findall(r"^FROM (\S+)", text, re.M):
        if base in stages:  # an earlier stage of this file, itself built on a pinned base
            continue
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", base), f"{dockerfile}: unpinned base {base}"


def _expand(arg: str, isvc: str) -> str:
    # What the kubelet ($(VAR) from env) and KServe ({{.Name}}) substitute.
    return arg.replace("$(ISVC_NAME)", isvc).replace("$(POD_NAMESPACE)", "ns").replace("{{.Name}}", isvc)


def command_lines(docs: list[dict[str, Any]]) -> list[tuple[str, list[str], dict[str, Any]]]:
    out = []
    runtimes = {d["metadata"]["name"]: d for d in by_kind(docs, "ServingRuntime")}
    for isvc in by_kind(docs, "InferenceService"):
        name = isvc["metadata"]["name"]
        pred = isvc["spec"]["predictor"]
        model = pred["model"]
        rt = runtimes[model["runtime"]]["spec"]["containers"][0]
        argv = [*rt["command"], *rt["args"], *model.get("args", [])]  # KServe concatenates args
        out.append(("predictor", [_expand(a, name) for a in argv], pred))
        tr = isvc["spec"]["transformer"]
        c = tr["containers"][0]
        argv = [*c["command"], *c["args"]]
        # The controller appends these unless the flag is already there (prefix match).
        for flag, value in (
            ("--model_name", name),
            ("--predictor_host", f"{name}-predictor.ns"),
            ("--http_port", "8080"),
        ):
            if not any(a.startswith(flag) for a in argv):
                argv += [flag, value]
        if tr.get("containerConcurrency"):
            argv += ["--workers", str(tr["containerConcurrency"])]
        out.append(("transformer", [_expand(a, name) for a in argv], tr))
    return out


@pytest.mark.parametrize("directory", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_manifest_command_lines(parser: argparse.ArgumentParser, rendered: Any, directory: str) -> None:
    docs = rendered[directory]
    lines = command_lines(docs)
    assert lines
    for component, argv, spec in lines:
        assert argv[0] == "semserve"
        args = parse(parser, argv[1:])
        assert args.command == component
        if component == "predictor":
            assert str(args.model) == "/mnt/models" and args.model_name == "semserve"
            assert args.host == "0.0.0.0" and (args.http_port, args.grpc_port) == (8080, 8081)
            # Targets derived from the batch: a pod never admits more than one engine batch.
            if spec.get("containerConcurrency"):
                assert spec["containerConcurrency"] == args.max_num_seqs
                assert spec["scaleTarget"] <= args.max_num_seqs
        else:
            assert args.predictor_protocol == "grpc-v2" and args.model_name == "semserve"
            ports = [p["containerPort"] for p in spec["containers"][0]["ports"]]
            assert args.http_port == ports[0] == 8080
            assert args.predictor_host.endswith(":80" if len(ports) == 1 else ":8081")
        # Every HTTP probe targets the HTTP port and a health route the servers have.
        container = spec.get("model") or spec["containers"][0]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == args.http_port and get["path"] in ("/v2/health/ready", "/v2/health/live")


def test_secrets_never_in_args(rendered: Any) -> None:
    for directory, docs in rendered.items():
        for _, argv, _ in command_lines(docs):
            assert not any(re.search(r"password|api.keys|token", a, re.I) for a in argv), (directory, argv)
