"""tritonclient (the latest, with numpy 2) against one of our servers, in a process of its own: its
protobuf package `inference` cannot share a process with KServe's, which the test process imports.

    python tests/clients/triton_check.py SCENARIO GRPC_ADDRESS HTTP_ADDRESS JSON_ARGS

prints one JSON object: what the client read. Scenarios:
- unary:  gRPC infer (batch, double parameter) and HTTP infer of args["prompts"];
- stream: sync start_stream/async_stream_infer of args["requests"] (each: id, prompt, stream,
          empty_final, max_tokens), all on one stream; responses grouped by request id;
- aio:    the same requests through tritonclient.grpc.aio's stream_infer;
- cancel: one long streamed request, cancelled (stop_stream(cancel_requests=True)) after its first
          piece; reports how many pieces arrived and how long the cancel took.
- wire:   what a Triton user's client sends beyond the defaults, each case on its own: JSON bodies
          (binary_data=False: no content type; the asyncio client's octet-stream), request bodies
          compressed with gzip and deflate, requested output subsets (HTTP, gRPC, a stream), an
          unknown requested output and a model version; args["prompt"]. Each case: its outputs
          (name -> values) or its error.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import time
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

MODEL = "llm"


def _inputs(module: Any, prompt: str, *, stream: bool | None, max_tokens: int, chat: bool = False,
            extra_sampling: dict[str, Any] | None = None) -> list[Any]:
    name = "chat" if chat else "text_input"
    text = module.InferInput(name, [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    sampling = module.InferInput("sampling_parameters", [1], "BYTES")
    params = {"temperature": 0, "max_tokens": max_tokens, **(extra_sampling or {})}
    sampling.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
    inputs = [text, sampling]
    if stream is not None:
        flag = module.InferInput("stream", [1], "BOOL")
        flag.set_data_from_numpy(np.array([stream], dtype=bool))
        inputs.append(flag)
    return inputs


def _text(values: Any) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]


def _read(result: Any) -> dict[str, Any]:
    response = result.get_response()
    out: dict[str, Any] = {
        "id": response.id,
        "final": response.parameters["triton_final_response"].bool_param,
        "params": {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.parameters.items()
                   if v.WhichOneof("parameter_choice")},
    }
    for name in ("text_output", "finish_reason", "cache_status"):
        values = result.as_numpy(name)
        out[name] = None if values is None else _text(values)
    tokens = result.as_numpy("completion_tokens")
    out["completion_tokens"] = None if tokens is None else [int(v) for v in tokens.reshape(-1)]
    return out


def unary(grpc_address: str, http_address: str, args: dict[str, Any]) -> dict[str, Any]:
    prompts = args["prompts"]
    client = grpcclient.InferenceServerClient(grpc_address)
    text = grpcclient.InferInput("text_input", [len(prompts)], "BYTES")
    text.set_data_from_numpy(np.array([p.encode() for p in prompts], dtype=np.object_))
    # Sampling as request parameters: temperature as a double, as tritonclient sends floats.
    result = client.infer(MODEL, [text], parameters={"temperature": 0.0, "max_tokens": args["max_tokens"]},
                          request_id="unary-1")
    grpc_out = {
        "id": result.get_response().id,
        "text_output": _text(result.as_numpy("text_output")),
        "finish_reason": _text(result.as_numpy("finish_reason")),
        "completion_tokens": [int(v) for v in result.as_numpy("completion_tokens")],
        "raw_outputs": len(result.get_response().raw_output_contents),
    }
    http = httpclient.InferenceServerClient(http_address)
    htext = httpclient.InferInput("text_input", [len(prompts)], "BYTES")
    htext.set_data_from_numpy(np.array([p.encode() for p in prompts], dtype=np.object_))
    hresult = http.infer(MODEL, [htext], parameters={"temperature": 0.0, "max_tokens": args["max_tokens"]})
    http_out = {
        "text_output": _text(hresult.as_numpy("text_output")),
        "completion_tokens": [int(v) for v in hresult.as_numpy("completion_tokens")],
    }
    return {"grpc": grpc_out, "http": http_out}


def _request_kwargs(module: Any, spec: dict[str, Any]) -> dict[str, Any]:
    kwargs = {
        "model_name": MODEL,
        "inputs": _inputs(module, spec["prompt"], stream=spec.get("stream"), max_tokens=spec["max_tokens"],
                          chat=spec.get("chat", False), extra_sampling=spec.get("sampling")),
        "request_id": spec["id"],
    }
    if module is grpcclient:
        # The asyncio client has no way to ask for it (the parameter name is reserved).
        kwargs["enable_empty_final_response"] = spec.get("empty_final", False)
    return kwargs


def _group(events: list[dict[str, Any]]) -> dict[str, Any]:
    by_id: dict[str, list[dict[str, Any]]] = {}
    errors: list[str] = []
    for event in events:
        if "error" in event:
            errors.append(event["error"])
        else:
            by_id.setdefault(event["id"], []).append(event)
    return {"responses": by_id, "errors": errors}


def stream(grpc_address: str, _: str, args: dict[str, Any]) -> dict[str, Any]:
    requests = args["requests"]
    client = grpcclient.InferenceServerClient(grpc_address)
    events: queue.Queue[dict[str, Any]] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        events.put({"error": str(error)} if error is not None else _read(result))

    client.start_stream(callback=callback, stream_timeout=120)
    for spec in requests:
        client.async_stream_infer(**_request_kwargs(grpcclient, spec))
    seen: list[dict[str, Any]] = []
    ended = 0
    while ended < len(requests):
        event = events.get(timeout=120)
        seen.append(event)
        if "error" in event or event["final"]:
            ended += 1
    client.stop_stream()
    return _group(seen)


def aio(grpc_address: str, _: str, args: dict[str, Any]) -> dict[str, Any]:
    requests = args["requests"]

    async def run() -> list[dict[str, Any]]:
        client = aioclient.InferenceServerClient(grpc_address)

        async def messages() -> Any:
            for spec in requests:
                yield _request_kwargs(aioclient, spec)

        seen: list[dict[str, Any]] = []
        ended = 0
        async for result, error in client.stream_infer(messages(), stream_timeout=120):
            event = {"error": str(error)} if error is not None else _read(result)
            seen.append(event)
            if "error" in event or event["final"]:
                ended += 1
                if ended == len(requests):
                    break
        await client.close()
        return seen

    return _group(asyncio.run(run()))


def cancel(grpc_address: str, _: str, args: dict[str, Any]) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(grpc_address)
    events: queue.Queue[dict[str, Any]] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        events.put({"error": str(error)} if error is not None else _read(result))

    client.start_stream(callback=callback)
    spec = {"id": "long", "prompt": args["prompt"], "stream": True, "max_tokens": args["max_tokens"],
            "sampling": {"ignore_eos": True}}
    client.async_stream_infer(**_request_kwargs(grpcclient, spec))
    first = events.get(timeout=120)
    started = time.monotonic()
    client.stop_stream(cancel_requests=True)
    return {"first": first, "cancel_seconds": time.monotonic() - started}


def _outputs(result: Any) -> dict[str, list[Any]]:
    response = result.get_response()
    names = [o["name"] for o in response["outputs"]] if isinstance(response, dict) else \
        [o.name for o in response.outputs]
    return {name: [v.decode() if isinstance(v, bytes) else (v if isinstance(v, str) else int(v))
                   for v in result.as_numpy(name).reshape(-1)] for name in names}


def _case(call: Any) -> dict[str, Any]:
    try:
        return {"outputs": _outputs(call())}
    except Exception as exc:  # the client's exception is the case's answer
        return {"error": str(exc)}


def wire(grpc_address: str, http_address: str, args: dict[str, Any]) -> dict[str, Any]:
    prompt = args["prompt"]
    params = {"temperature": 0.0, "max_tokens": 8}
    http = httpclient.InferenceServerClient(http_address)
    grpc_client = grpcclient.InferenceServerClient(grpc_address)

    def text(module: Any, binary: bool = True) -> Any:
        tensor = module.InferInput("text_input", [1], "BYTES")
        data = np.array([prompt.encode()], dtype=np.object_)
        if module is grpcclient:
            tensor.set_data_from_numpy(data)
        else:
            tensor.set_data_from_numpy(data, binary_data=binary)
        return tensor

    def http_infer(binary: bool = True, outputs: list[str] | None = None, **kwargs: Any) -> Any:
        wanted = None if outputs is None else \
            [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
        return http.infer(MODEL, [text(httpclient, binary)], parameters=params, outputs=wanted, **kwargs)

    def grpc_infer(outputs: list[str] | None = None, **kwargs: Any) -> Any:
        wanted = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
        return grpc_client.infer(MODEL, [text(grpcclient)], parameters=params, outputs=wanted, **kwargs)

    def aio_infer(binary: bool, **kwargs: Any) -> Any:
        async def run() -> Any:
            client = httpaio.InferenceServerClient(http_address)
            try:
                return await client.infer(MODEL, [text(httpaio, binary)], parameters=params, **kwargs)
            finally:
                await client.close()

        return asyncio.run(run())

    def streamed_subset() -> Any:
        events: queue.Queue[Any] = queue.Queue()
        client = grpcclient.InferenceServerClient(grpc_address)
        client.start_stream(callback=lambda result, error: events.put(error or result), stream_timeout=120)
        client.async_stream_infer(MODEL, [text(grpcclient)], parameters=params, request_id="subset",
                                  outputs=[grpcclient.InferRequestedOutput("finish_reason")])
        event = events.get(timeout=120)
        client.stop_stream()
        if isinstance(event, Exception):
            raise event
        return event

    return {
        "json": _case(lambda: http_infer(binary=False, outputs=["text_output", "finish_reason"])),
        "json_all_outputs": _case(lambda: http_infer(binary=False)),
        "aio_json": _case(lambda: aio_infer(False)),
        "aio_binary": _case(lambda: aio_infer(True)),
        "aio_json_gzip": _case(lambda: aio_infer(False, request_compression_algorithm="gzip")),
        "gzip": _case(lambda: http_infer(request_compression_algorithm="gzip",
                                         response_compression_algorithm="gzip")),
        "deflate": _case(lambda: http_infer(binary=False, request_compression_algorithm="deflate")),
        "http_subset": _case(lambda: http_infer(outputs=["finish_reason"])),
        "grpc_subset": _case(lambda: grpc_infer(outputs=["finish_reason", "text_output"])),
        "stream_subset": _case(streamed_subset),
        "http_unknown_output": _case(lambda: http_infer(outputs=["text_output", "logits"])),
        "grpc_unknown_output": _case(lambda: grpc_infer(outputs=["logits"])),
        "grpc_version": _case(lambda: grpc_infer(model_version="1")),
    }


def extensions(grpc_address: str, http_address: str, args: dict[str, Any]) -> dict[str, Any]:
    """Triton's model configuration and statistics extensions, over HTTP and gRPC, around the same
    prompt asked twice."""
    http = httpclient.InferenceServerClient(http_address)
    grpc_client = grpcclient.InferenceServerClient(grpc_address)

    def ask() -> None:
        tensor = httpclient.InferInput("text_input", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([args["prompt"].encode()], dtype=np.object_))
        http.infer(MODEL, [tensor], parameters={"temperature": 0.0, "max_tokens": 4})

    def stats() -> dict[str, Any]:
        return {"http": http.get_inference_statistics(MODEL),
                "grpc": grpc_client.get_inference_statistics(MODEL, as_json=True)}  # fmt: skip

    def error(call: Any) -> str:
        try:
            call()
        except Exception as exc:  # the client's exception is the case's answer
            return str(exc)
        return ""

    before = stats()
    ask()
    ask()
    return {
        "http_server": http.get_server_metadata(),
        "grpc_server": grpc_client.get_server_metadata(as_json=True),
        "http_index": http.get_model_repository_index(),
        "grpc_index": grpc_client.get_model_repository_index(as_json=True),
        "http_config": http.get_model_config(MODEL),
        "grpc_config": grpc_client.get_model_config(MODEL, as_json=True),
        "before": before,
        "after": stats(),
        "all_models": grpc_client.get_inference_statistics(as_json=True),
        "http_unknown": error(lambda: http.get_model_config("nope")),
        "grpc_unknown": error(lambda: grpc_client.get_inference_statistics("nope")),
        "grpc_version": error(lambda: grpc_client.get_model_config(MODEL, model_version="2")),
    }


SCENARIOS = {"unary": unary, "stream": stream, "aio": aio, "cancel": cancel, "wire": wire,
             "extensions": extensions}  # fmt: skip

if __name__ == "__main__":
    scenario, grpc_address, http_address, raw = sys.argv[1:5]
    print(json.dumps(SCENARIOS[scenario](grpc_address, http_address, json.loads(raw))))
