"""The outputs a v2 request names (`outputs` over REST, `outputs` of ModelInferRequest over gRPC):
only those come back, as Triton answers; a name the model does not have is the client's error,
found before any generation starts. A request that names none gets every output."""

from __future__ import annotations

from kserve import InferRequest, InferResponse

from semserve.errors import BadRequest

OUTPUTS_FIELD = "outputs"


def requested_outputs(request: InferRequest, served: list[str]) -> frozenset[str] | None:
    """The output names `request` asks for (None: all of them); a 400 for one not in `served`."""
    asked = request.request_outputs
    if not asked:
        return None
    names = [output.name for output in asked]
    unknown = [name for name in names if name not in served]
    if unknown:
        raise BadRequest(
            f"unknown output {unknown[0]!r} requested; this model's outputs are {served}", OUTPUTS_FIELD
        )
    return frozenset(names)


def keep_outputs(response: InferResponse, names: frozenset[str] | None) -> InferResponse:
    """`response` with only the outputs in `names` (all when None), in the model's order."""
    if names is not None:
        response.outputs = [output for output in response.outputs if output.name in names]
    return response
