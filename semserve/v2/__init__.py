"""The v2 (Open Inference Protocol) side of both services, one concept per module:

- text_contract: the text tensor contract (inputs, outputs, parameters; parse and build);
  its names are re-exported here, so `from semserve import v2` then `v2.parse_request(...)`
- text_model: the kserve.Models that answer only v2 (V2Model) and carry the text contract (TextModel)
- requested_outputs: the outputs a request names, the only ones that come back
- rest_infer: v2 REST infer for the served models in an owned route (KServe's for the rest)
- generate_routes: Triton's generate / generate_stream extension over HTTP
- grpc_service: `inference.GRPCInferenceService` as Triton serves it (ModelInfer, ModelStreamInfer)
- grpc_tensors: between its wire messages (inference.proto, inference_pb2) and KServe's objects
- grpc_reflection: server reflection describing that service as served (grpcurl)

Error answers on every route come from semserve/errors.py's table.
"""

from semserve.v2.text_contract import (
    CHAT_INPUT,
    COMPLETION_TOKENS,
    EMPTY_FINAL_RESPONSE,
    FINAL_RESPONSE,
    FINISH_REASON,
    IDS_INPUT,
    INPUTS_METADATA,
    MODEL_REVISION,
    OUTPUTS_METADATA,
    PROMPT_TOKENS,
    SAMPLING_INPUT,
    STREAM_INPUT,
    TEXT_INPUT,
    TEXT_OUTPUT,
    StreamPart,
    TextRequest,
    build_response,
    decode_text,
    parse_request,
    piece_response,
    read_response,
    response_revision,
    results_from_columns,
    text_inputs,
)

__all__ = [
    "CHAT_INPUT",
    "COMPLETION_TOKENS",
    "EMPTY_FINAL_RESPONSE",
    "FINAL_RESPONSE",
    "FINISH_REASON",
    "IDS_INPUT",
    "INPUTS_METADATA",
    "MODEL_REVISION",
    "OUTPUTS_METADATA",
    "PROMPT_TOKENS",
    "SAMPLING_INPUT",
    "STREAM_INPUT",
    "TEXT_INPUT",
    "TEXT_OUTPUT",
    "StreamPart",
    "TextRequest",
    "build_response",
    "decode_text",
    "parse_request",
    "piece_response",
    "read_response",
    "response_revision",
    "results_from_columns",
    "text_inputs",
]
