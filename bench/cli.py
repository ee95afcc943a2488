"""`semserve bench ...`: benchmarks that print ratios against a peer measured in the same run."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmarks (ratios against peers)")
    bench_sub = parser.add_subparsers(dest="bench_command", required=True)
    pred = bench_sub.add_parser("predictor", help="our predictor vs vLLM's own OpenAI server")
    pred.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    pred.add_argument("--requests-per-level", type=int, default=0, help="0: 4 x concurrency, min 8")
    pred.add_argument("--max-tokens", type=int, default=64)
    pred.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    pred.add_argument("--output", default=None, help="append the markdown table to this file")
    pred.add_argument("--profile", default=None, help="write the engine profile JSON for simulate")
    pred.set_defaults(func=_main_of("predictor"))

    cache = bench_sub.add_parser(
        "cache",
        help="latency through the transformer (exact/semantic hit, miss vs direct; v2 REST + gRPC) "
        "and RedisVL's SemanticCache side by side",
    )
    cache.add_argument("--concurrency", default="1,16", help="comma-separated levels")
    cache.add_argument("--requests-hit", type=int, default=200, help="requests per exact/semantic cell")
    cache.add_argument("--requests-miss", type=int, default=32, help="requests per miss and direct cell")
    cache.add_argument("--max-tokens", type=int, default=8, help="max_tokens of every request")
    cache.add_argument("--warmup", type=int, default=20, help="warm-up requests per hit path and protocol")
    cache.add_argument("--pairs", default=None, help="eval pairs JSONL (default: the eval split)")
    cache.add_argument("--max-pairs", type=int, default=0, help="cap the pairs used for hits (0: all served)")
    cache.add_argument("--peer-iters", type=int, default=300, help="rounds of the in-process comparison")
    cache.add_argument("--skip-redisvl", action="store_true", help="no RedisVL side-by-side part")
    cache.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    cache.add_argument(
        "--transformer-arg", action="append", default=[], metavar="ARG",
        help="extra argument for `semserve transformer` (repeatable): --transformer-arg=--log-level=debug",
    )
    cache.add_argument(
        "--v2-route-ab", type=int, default=0, metavar="N",
        help="also N v2 REST exact hits each through a second transformer with --no-v2-fast-path "
             "(KServe's route) on the same index, alternated with the first (0: skip)",
    )
    cache.add_argument(
        "--floor-requests", type=int, default=200, metavar="N",
        help="issue 26 floors, same run: N semantic hits (c=1) alternated with the bare embedder "
             "forward in its own process, N at c=32, N exact hits alternated with a bare ASGI app / "
             "bare grpc.aio server answering a body of the same size (0: skip)",
    )
    cache.add_argument(
        "--predictor", default=None, metavar="HTTP_URL,GRPC_ADDR",
        help="use this running predictor (e.g. http://127.0.0.1:18080,127.0.0.1:18081) instead of "
             "starting one",
    )
    cache.add_argument("--seed", type=int, default=0, help="random seed (prompt order, miss prompts)")
    cache.add_argument("--output", default=None, help="append the markdown section to this file")
    cache.set_defaults(func=_main_of("cache"))

    soak = bench_sub.add_parser(
        "soak",
        help="bounded mixed load (hits, paraphrases, misses; v2 REST/gRPC, OpenAI +/- streaming; "
        "several tenants), every answer checked, RSS and fds watched; non-zero exit on failure",
    )
    soak.add_argument("--duration", default="10m", help="e.g. 60, 90s, 10m")
    soak.add_argument("--concurrency", type=int, default=32, help="closed-loop workers")
    soak.add_argument("--window", type=float, default=10.0, help="seconds per reported window")
    soak.add_argument("--tenants", type=int, default=3, help="tenants (API keys) of the started stack")
    soak.add_argument("--transformers", type=int, default=1,
                      help="transformer replicas of the started stack; more than one run behind nginx")
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    soak.add_argument("--transformer", default=None, help="running transformer base URL (else start a stack)")
    soak.add_argument("--transformer-grpc", default=None, help="its gRPC host:port")
    soak.add_argument(
        "--predictor-log", default=None,
        help="with --transformer: the running predictor's JSON log (level info); every answer is "
        "checked against its generation_finished lines",
    )
    soak.add_argument("--api-key", action="append", default=[], metavar="TENANT=KEY",
                      help="with --transformer: one tenant's key (repeatable); none: no auth header")
    soak.add_argument("--pid", action="append", default=[], metavar="NAME=PID",
                      help="with --transformer: a server process to watch (repeatable)")
    soak.add_argument("--output", default=None, help="append the summary to this file")
    soak.set_defaults(func=_main_of("soak"))

    stream = bench_sub.add_parser(
        "stream",
        help="streaming TTFT and inter-token latency of a miss through the transformer (gRPC hop) vs "
        "the predictor's OpenAI route direct and vLLM's own server",
    )
    stream.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    stream.add_argument("--requests", default="16,32,64",
                        help="requests per level and target: one per level or one for all (0: 4 x c, min 8)")
    stream.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (ignore_eos)")
    stream.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    stream.add_argument("--skip-vllm", action="store_true", help="no vLLM server part")
    stream.add_argument("--seed", type=int, default=0, help="random seed (miss prompts)")
    stream.add_argument("--output", default=None, help="append the markdown section to this file")
    stream.add_argument(
        "--engine-cpus", default=None, metavar="LIST",
        help="run the engines (our predictor, vLLM's server) on these CPUs (taskset syntax: 0 or 0-3) "
        "and the transformer, Redis and the clients on the others, as when the transformer is a pod "
        "of its own; default: all share all",
    )
    stream.add_argument(
        "--stream-interval", type=int, default=1, metavar="N",
        help="--stream-interval N for every server (predictor, transformer, vLLM's): tokens per chunk after "
        "the first",
    )
    stream.set_defaults(func=_main_of("stream"))

    from bench import miss

    miss_p = bench_sub.add_parser(
        "miss",
        help="miss overhead, not streamed (v2 REST and OpenAI chat): transformer miss vs the predictor "
        "direct, strictly alternated at c=1, fresh prompts",
    )
    miss.add_arguments(miss_p)
    miss_p.set_defaults(func=_main_of("miss"))

    from bench import coldstart

    cold = bench_sub.add_parser(
        "coldstart",
        help="process start -> ready -> first answer, cold and warm caches: transformer, predictor, "
        "a bare KServe server and vLLM's own server",
    )
    coldstart.add_arguments(cold)
    cold.set_defaults(func=_main_of("startup_levers"))  # the levers with --variant, else coldstart

    from bench import scale

    scale_p = bench_sub.add_parser(
        "scale",
        help="lookup latency (exact, KNN; in process and through the transformer), bytes per entry "
        "and index build time at N synthetic entries over T tenants",
    )
    scale.add_arguments(scale_p)
    scale_p.set_defaults(func=_main_of("scale"))

    from bench import determinism

    det = bench_sub.add_parser(
        "determinism",
        help="temperature-0 answers solo vs inside a batch, prefix caching on and off (counts that differ)",
    )
    determinism.add_arguments(det)
    det.set_defaults(func=_main_of("determinism"), worker=False, prefix_caching="on")

    from bench import fairness

    fair = bench_sub.add_parser(
        "fairness",
        help="a quiet tenant (c=1, short answers) beside a noisy one (c=32, long) on one predictor, fair "
        "admission on and off: quiet TTFT vs solo, token shares vs 2:1 weights, noisy throughput vs solo",
    )
    fairness.add_arguments(fair)
    fair.set_defaults(func=_main_of("fairness"))

    from bench.lm_eval_parity import parse_target

    lm = bench_sub.add_parser(
        "lm-eval",
        help="lm-evaluation-harness's loglikelihood tasks against running servers (echo with logprobs), "
        "each request's loglikelihood against the first target's (vLLM's own server)",
    )
    lm.add_argument("--target", action="append", type=parse_target, required=True, metavar="NAME=URL",
                    help="a completions URL (repeatable); the first is the reference")  # fmt: skip
    lm.add_argument("--tasks", default="semserve_capitals", help="comma-separated lm-eval tasks")
    lm.add_argument("--lm-eval", default="lm_eval", help="the lm_eval command (default: on PATH)")
    lm.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the prepared SmolLM2)")
    lm.add_argument("--concurrent", type=int, default=1, help="lm-eval's num_concurrent")
    lm.add_argument("--tokenized", action="store_true",
                    help="lm-eval sends token ids (its default, tokenized_requests=True) instead of text")
    lm.add_argument("--output", default=None, help="append the markdown table to this file")
    lm.set_defaults(func=_main_of("lm_eval_parity"))


def _main_of(module: str) -> Callable[[argparse.Namespace], int]:
    """`bench.<module>.main`, imported only when that bench runs (each pulls in heavy libraries)."""

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(f"bench.{module}").main(args)

    return run
