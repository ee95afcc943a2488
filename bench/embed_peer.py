"""The semantic hit's floor in `semserve bench cache` (issue 26): the bare forward of the transformer's
embedder in a process of its own.

It loads the embedder the transformer loads (EmbedderSettings from the environment, the same
defaults as `semserve transformer`; no LRU) and times one prompt's forward (tokenize, ONNX run,
pooling) in the calling thread: no event loop, no thread hand-off, no batching. The bench drives it
over stdin, so its rounds can alternate with the transformer's hits:

    python -m bench.embed_peer --prompts FILE      # one prompt per line
    stdin: "<n>\\n"  ->  stdout: one JSON list of n latencies in ms (prompts taken in turn)

It prints `ready` once loaded; EOF on stdin ends it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from cache.embedder import Embedder
    from cache.settings import EmbedderSettings

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=Path, required=True, help="one prompt per line")
    args = p.parse_args(argv)
    prompts = [line for line in args.prompts.read_text().splitlines() if line.strip()]
    embedder = Embedder(dataclasses.replace(EmbedderSettings.from_env(), lru_size=0))
    for prompt in prompts[:5]:  # the runtime's first runs allocate; a served embedder is past them
        embedder.embed_many([prompt], batch_size=1)
    print("ready", flush=True)
    i = 0
    for line in sys.stdin:
        n = int(line.strip() or 0)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            embedder.embed_many([prompts[i % len(prompts)]], batch_size=1)
            out.append((time.perf_counter() - t) * 1000.0)
            i += 1
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
