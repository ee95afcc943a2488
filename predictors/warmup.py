"""`semserve predictor --warm-up`: start the engine once, generate one token, exit.

What a warm-up Job (or an image build step, or `make model`) runs to fill the compile cache
(predictors/warm_start.py) before any serving pod needs it. It must be given the same engine flags
as the serving predictor (model, --max-model-len, --max-num-seqs, --dtype, ...): vLLM keys its
compile cache by the engine configuration, so a warm-up with other flags warms nothing.
"""

from __future__ import annotations

import asyncio

from predictors.config import PredictorSettings
from semserve import logs
from semserve.sampling import SamplingOptions

log = logs.get_logger("semserve.predictor.warmup")


async def _warm(settings: PredictorSettings) -> None:
    from predictors.engine import Engine
    from predictors.server import resolve_model_dir

    engine = Engine(settings, resolve_model_dir(settings))
    await engine.start()
    try:
        prepared = await engine.prepare("Hello", SamplingOptions(max_tokens=1, temperature=0))
        await engine.answer(prepared, "warm-up", "warm-up")
    finally:
        engine.shutdown()


def run(settings: PredictorSettings) -> int:
    logs.configure(settings.log_level)
    asyncio.run(_warm(settings))
    log.info("warm_up_done")
    return 0
