"""Triton's model configuration of the text contract (semserve/v2/model_config.py)."""

from __future__ import annotations

from semserve import v2
from semserve.v2 import inference_pb2 as pb
from semserve.v2.model_config import ModelConfig


def test_the_text_contract_in_triton_s_types_in_both_wire_forms() -> None:
    config = ModelConfig("llm", "vllm", v2.INPUTS_METADATA, v2.OUTPUTS_METADATA)
    json = config.json()
    assert json["max_batch_size"] == 0 and json["model_transaction_policy"] == {"decoupled": True}
    inputs = {i["name"]: i for i in json["input"]}
    assert inputs[v2.TEXT_INPUT] == {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1],
                                     "optional": False}  # fmt: skip
    assert all(i["optional"] for name, i in inputs.items() if name != v2.TEXT_INPUT)
    assert inputs[v2.STREAM_INPUT]["data_type"] == "TYPE_BOOL"
    assert [o["name"] for o in json["output"]] == [o["name"] for o in v2.OUTPUTS_METADATA]
    proto = config.proto()
    assert [i.name for i in proto.input] == list(inputs) and proto.backend == "vllm"
    assert proto.input[0].data_type == pb.TYPE_STRING and list(proto.input[0].dims) == [-1]
    assert proto.model_transaction_policy.decoupled
