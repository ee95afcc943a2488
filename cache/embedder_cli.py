"""`semserve embedder prepare`: export the embedder to ONNX (and an ORT-optimized copy) ahead of time.

Run where the `export` extra (torch, transformers, onnx) is installed: the transformer image runs it
in its build stage and ships only the files, `make model` runs it for the local stack. A transformer
that finds the prepared files starts without torch and without exporting (its `embedder_ready` log
line says `onnx_reused: true` and names the file).
"""

from __future__ import annotations

import argparse

from cache.settings import EmbedderSettings
from semserve import logs

PREFIX = "embed-"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("embedder", help="the semantic cache's sentence embedder")
    embedder_sub = parser.add_subparsers(dest="embedder_command", required=True)
    prep = embedder_sub.add_parser(
        "prepare", help="export the ONNX model(s) into the embedder cache (--embed-onnx-dir)"
    )
    EmbedderSettings.add_arguments(prep, flag_prefix=PREFIX)
    prep.set_defaults(func=_prepare)


def _prepare(args: argparse.Namespace) -> int:
    from cache.embedder import Embedder

    logs.configure()
    embedder = Embedder(EmbedderSettings.from_namespace(args, flag_prefix=PREFIX))
    print(embedder.onnx_file.parent if embedder.onnx_file else "(torch backend: nothing to prepare)")
    return 0
