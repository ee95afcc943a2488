"""`semserve transformer`: the semantic-cache KServe transformer in front of the predictor."""

from __future__ import annotations

import argparse
import gc

from cache.settings import CacheSettings, EmbedderSettings, VerifierSettings
from semserve.tracing import TracingSettings
from transformers_svc.config import TransformerSettings

PREFIXES = {"cache": "cache-", "embed": "embed-", "verify": "verify-", "trace": "trace-"}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("transformer", help="run the semantic-cache transformer (KServe v2 + OpenAI)")
    TransformerSettings.add_arguments(parser)
    CacheSettings.add_arguments(parser, flag_prefix=PREFIXES["cache"])
    EmbedderSettings.add_arguments(parser, flag_prefix=PREFIXES["embed"])
    VerifierSettings.add_arguments(parser, flag_prefix=PREFIXES["verify"])
    TracingSettings.add_arguments(parser, flag_prefix=PREFIXES["trace"])
    parser.set_defaults(func=_run)
    register_auth(sub)


def _run(args: argparse.Namespace) -> int:
    settings = TransformerSettings.from_namespace(args)
    cache_settings = CacheSettings.from_namespace(args, flag_prefix=PREFIXES["cache"])
    embed_settings = EmbedderSettings.from_namespace(args, flag_prefix=PREFIXES["embed"])
    verify_settings = VerifierSettings.from_namespace(args, flag_prefix=PREFIXES["verify"])
    trace_settings = TracingSettings.from_namespace(args, flag_prefix=PREFIXES["trace"])
    # Start phases overlap (bench/RESULTS.md, "Transformer start"): no garbage collection until
    # the server freezes what start built (SemserveModelServer.serve turns it back on; its passes
    # over ~2 000 modules' objects were ~0.3 s of the start), and the embedder's ONNX session
    # loads in a thread while the service's modules import. Logging first: that thread logs.
    gc.disable()
    from cache import embedder
    from semserve import logs

    logs.configure(settings.log_level)
    if settings.cache_policy != "off":
        embedder.preload(embed_settings)

    from transformers_svc.server import run

    run(settings, cache_settings, embed_settings, verify_settings, trace_settings)
    return 0


def register_auth(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("auth", help="API key helpers for the transformer's key files")
    auth_sub = parser.add_subparsers(dest="auth_command", required=True)
    hash_cmd = auth_sub.add_parser(
        "hash", help="read a key on stdin (never argv: it shows in ps) and print its stored form"
    )
    hash_cmd.set_defaults(func=_hash)


def _hash(_: argparse.Namespace) -> int:
    import sys

    from transformers_svc.auth import hash_key

    key = sys.stdin.readline().strip()
    if not key:
        print("no key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0
