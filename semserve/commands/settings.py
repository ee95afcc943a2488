"""`semserve settings`: every setting of every service as the README's markdown tables.

The README's tables are this command's output, so flags, env vars and docs cannot drift apart
(tests/semserve/test_settings.py checks it).
"""

from __future__ import annotations

import argparse
import importlib

# (title, module, class, flag prefix)
TABLES = [
    ("Predictor", "predictors.config", "PredictorSettings", ""),
    ("Transformer", "transformers_svc.config", "TransformerSettings", ""),
    ("Cache (Redis, policy)", "cache.settings", "CacheSettings", "cache-"),
    ("Embedder", "cache.settings", "EmbedderSettings", "embed-"),
    ("Verifier", "cache.settings", "VerifierSettings", "verify-"),
    ("Tracing (predictor and transformer)", "semserve.tracing", "TracingSettings", "trace-"),
]


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("settings", help="print every setting (flag, env var, default) as markdown")
    parser.set_defaults(func=_print)


def markdown() -> str:
    parts = []
    for title, module, cls_name, prefix in TABLES:
        cls = getattr(importlib.import_module(module), cls_name)
        parts.append(f"#### {title}\n\n{cls.markdown_table(prefix)}\n")
    return "\n".join(parts)


def _print(_: argparse.Namespace) -> int:
    print(markdown(), end="")
    return 0
