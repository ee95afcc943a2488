"""Building KServe's REST app without importing vLLM.

KServe 0.21's `RESTServer._register_endpoints` imports `kserve.protocol.rest.openai.config` to add
its own OpenAI routes; that package's `types` imports vLLM's protocol modules, which import torch,
vLLM's config and transformers: 6-10 s on a 2-core machine, paid by the transformer (which has
no use for vLLM) whenever vLLM is installed beside it. KServe only adds those routes for models
that subclass its `OpenAIModel`; ours never do (both services register their own OpenAI routes,
semserve/openai_routes.py), so the import buys nothing.

KServe already handles that import failing (`except ImportError: "OpenAI endpoints not
registered"`, its path when vLLM is absent). We take that path on purpose: while the app is
built, the module name maps to None in `sys.modules`, which makes the import raise
ModuleNotFoundError at once without loading any parent package. Everything else KServe registers
(v1, v2, model repository, time series, /metrics) stays KServe's own code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

KSERVE_OPENAI_CONFIG = "kserve.protocol.rest.openai.config"
_ABSENT = object()


@contextlib.contextmanager
def without_kserve_openai() -> Iterator[None]:
    """Within the block, `import kserve.protocol.rest.openai.config` fails fast (ImportError)."""
    previous = sys.modules.get(KSERVE_OPENAI_CONFIG, _ABSENT)
    sys.modules[KSERVE_OPENAI_CONFIG] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if previous is _ABSENT:
            sys.modules.pop(KSERVE_OPENAI_CONFIG, None)
        else:
            sys.modules[KSERVE_OPENAI_CONFIG] = previous  # type: ignore[assignment]
