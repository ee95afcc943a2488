"""v2 REST infer for the served models, as an owned route: `POST /v2/models/{name}/infer` parsed,
run and rendered here, on KServe's public surface only (InferRequest and InferInput built by their
constructors, DataPlane.model_ready and DataPlane.infer, the response's public fields, and its
`to_rest()` where an answer is not plain text tensors).

Most of an exact hit over REST was the HTTP stack around the model: FastAPI's routing and
dependency solving, pydantic validation of the body, KServe's decode/encode (every output through
numpy and back) and `jsonable_encoder`. This layer sits innermost (inside the guard, auth and
CORS, so request ids, the body limit, draining, auth, spans, metrics and logs apply as before).

It answers only what it parses completely: a JSON body (any content type: without the binary
extension's header the body is JSON, as Triton reads it) whose keys are `inputs` (each with a
string name and datatype, an integer shape, a JSON list of data and no parameters of its own) and
optionally `id` (a string) and `parameters` (scalar values). Everything else goes to KServe's route
unchanged, body included: the binary tensor extension, CloudEvents, requested `outputs`, FP16
inputs, invalid JSON (KServe's route answers it through the error table), a model that is not
ready, any path but the served models' own.
Errors of the model are answered from the error table (semserve/errors.py), as on KServe's route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from kserve import InferInput, InferRequest, InferResponse
from kserve.protocol.dataplane import DataPlane

from semserve.errors import SERVER_ERROR, codes_of, error_headers, error_text
from semserve.logs import get_logger

log = get_logger("semserve.v2")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PREFIX, _SUFFIX = "/v2/models/", "/infer"
_BYPASS_HEADERS = (b"inference-header-content-length",)
# KServe's app answers with orjson (ORJSONResponse); these are its options.
_ORJSON = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
_INT32 = (-(2**31), 2**31 - 1)
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class _Route:
    """What the server span reads of the matched route (its http.route), as FastAPI leaves it."""

    path: str = "/v2/models/{model_name}/infer"


_ROUTE = _Route()


class V2RestInfer:
    """Pure ASGI layer in front of KServe's FastAPI app (see the module docstring)."""

    def __init__(self, app: Any, dataplane: DataPlane) -> None:
        self.app = app
        self.dataplane = dataplane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model = self._model_of(scope)
        if model is None:
            await self.app(scope, receive, send)
            return
        messages = await _read_body(receive)
        request = _parse(model, messages, scope["headers"])
        if request is None or not await self._ready(model):
            await self.app(scope, _replaying(messages, receive), send)
            return
        headers = _headers(scope)
        scope["route"] = _ROUTE
        try:
            response, response_headers = await self.dataplane.infer(
                model_name=model, request=request, headers=headers
            )
        except Exception as exc:
            if codes_of(exc) is SERVER_ERROR:
                raise  # the app's 500 handler is outside this layer's reach: the guard logs it
            status = codes_of(exc).http_status
            event = "request_not_ready" if status == 503 else "request_rejected"
            (log.info if status == 503 else log.warning)(
                event, status=status, error=type(exc).__name__, detail=error_text(exc)[:200]
            )
            await _answer(send, status, orjson.dumps({"error": error_text(exc)}), error_headers(exc))
            return
        await _answer(send, 200, render(response), response_headers)

    def _model_of(self, scope: Scope) -> str | None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
            return None
        name = path[len(_PREFIX):-len(_SUFFIX)]
        return name if name in self.dataplane.model_registry.get_models() else None

    async def _ready(self, model: str) -> bool:
        try:
            # As KServe's infer route asks it: the predictor's health is not checked per request.
            return bool(await self.dataplane.model_ready(model, True))
        except Exception:
            return False


def _parse(
    model: str, messages: list[Message], raw_headers: list[tuple[bytes, bytes]]
) -> InferRequest | None:
    """The request as KServe's route would hand it to the model, or None where that route decides."""
    if messages[-1]["type"] != "http.request":
        return None
    # Without the binary extension's header the body is JSON, whatever its content type says, as
    # Triton reads it: tritonclient sends a JSON body with no content type (aiohttp: octet-stream).
    for key, _ in raw_headers:
        if key in _BYPASS_HEADERS or key.startswith(b"ce-"):
            return None
    try:
        body = orjson.loads(b"".join(m.get("body", b"") for m in messages))
    except orjson.JSONDecodeError:
        return None
    if type(body) is not dict or not set(body) <= {"inputs", "id", "parameters"}:
        return None
    request_id, params, inputs = body.get("id"), body.get("parameters"), body.get("inputs")
    if request_id is not None and type(request_id) is not str:
        return None
    if params is not None and not _plain_parameters(params):
        return None
    if type(inputs) is not list:
        return None
    infer_inputs = [_input(item) for item in inputs]
    if any(i is None for i in infer_inputs):
        return None
    return InferRequest(model_name=model, infer_inputs=infer_inputs, request_id=request_id,
                        parameters=params)  # fmt: skip


def _input(item: Any) -> InferInput | None:
    if type(item) is not dict or not set(item) <= {"name", "datatype", "shape", "data"}:
        return None
    name, datatype, shape, data = (item.get(k) for k in ("name", "datatype", "shape", "data"))
    if type(name) is not str or type(datatype) is not str or datatype == "FP16":
        return None
    if type(shape) is not list or any(type(d) is not int for d in shape) or type(data) is not list:
        return None
    return InferInput(name=name, shape=shape, datatype=datatype, data=data, parameters={})


def _plain_parameters(params: Any) -> bool:
    return type(params) is dict and all(type(v) in _SCALARS for v in params.values())


def render(response: InferResponse) -> bytes:
    """The JSON of a v2 REST answer, fields in the order of KServe's InferenceResponse."""
    if not isinstance(response, InferResponse):  # a v1-style dict
        return orjson.dumps(response, option=_ORJSON)
    outputs = []
    for output in response.outputs:
        data = output.data
        if output.parameters or type(data) is not list or not _plain_values(output.datatype, data):
            return _kserve_rendering(response)
        outputs.append({"name": output.name, "shape": list(output.shape), "datatype": output.datatype,
                        "parameters": None, "data": data})  # fmt: skip
    params = response.parameters
    if params and not _plain_parameters(params):
        return _kserve_rendering(response)
    return orjson.dumps({
        "model_name": response.model_name,
        "model_version": response.model_version,
        "id": response.id,
        "parameters": dict(params) if params else None,
        "outputs": outputs,
    }, option=_ORJSON)


def _plain_values(datatype: str, data: list[Any]) -> bool:
    if datatype == "BYTES":
        return all(type(v) is str for v in data)
    if datatype == "INT32":
        low, high = _INT32
        return all(type(v) is int and low <= v <= high for v in data)
    return False


def _kserve_rendering(response: InferResponse) -> bytes:
    """Any other answer through KServe's public encoding of it."""
    content, _ = response.to_rest()
    return orjson.dumps(content, option=_ORJSON)


def _headers(scope: Scope) -> dict[str, str]:
    """The request headers as `dict(request.headers)` gives KServe: lowercase names (uvicorn's),
    the first value of a repeated one."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        headers.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return headers


async def _answer(send: Send, status: int, body: bytes, model_headers: dict[str, str]) -> None:
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    for key, value in model_headers.items():
        if key.lower() not in ("content-length", "content-type"):  # as KServe's route drops them
            headers.append((key.lower().encode("latin-1"), str(value).encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> list[Message]:
    """The request's body messages up to its last one (or the client's disconnect)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives the app the messages already read, then whatever the client does next."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
