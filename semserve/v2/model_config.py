"""Triton's model configuration extension: a model's configuration as `GET /v2/models/{name}/config`
and the `ModelConfig` RPC return it (tritonclient's `get_model_config`), so that Triton's tools can
read the text contract (semserve/v2/text_contract.py) as they read Triton's vLLM backend's: inputs
and outputs with Triton's types, no batching dimension of Triton's own (`max_batch_size` 0: the
first dimension is the batch), and decoupled, as ModelStreamInfer answers a request with several
responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from semserve.v2 import inference_pb2 as pb
from semserve.v2.text_contract import TEXT_INPUT

# The v2 datatypes of the contract, as Triton's model configuration names them.
_TRITON_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16",
}  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    name: str
    backend: str  # "vllm" for the predictor, "python" for the transformer, as Triton would name them
    inputs: list[dict[str, Any]]  # v2 metadata: {"name", "datatype", "shape"}
    outputs: list[dict[str, Any]]

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "platform": "",
            "backend": self.backend,
            "max_batch_size": 0,
            # Every input but the prompts is optional; `chat` is the prompts' other form.
            "input": [{"name": i["name"], "data_type": _TRITON_TYPES[i["datatype"]], "dims": list(i["shape"]),
                       "optional": i["name"] != TEXT_INPUT} for i in self.inputs],
            "output": [{"name": o["name"], "data_type": _TRITON_TYPES[o["datatype"]],
                        "dims": list(o["shape"])} for o in self.outputs],
            "model_transaction_policy": {"decoupled": True},
        }  # fmt: skip

    def proto(self) -> pb.ModelConfig:
        config = self.json()
        return pb.ModelConfig(
            name=config["name"],
            platform=config["platform"],
            backend=config["backend"],
            max_batch_size=config["max_batch_size"],
            input=[pb.ModelInput(name=i["name"], data_type=pb.DataType.Value(i["data_type"]), dims=i["dims"],
                                 optional=i["optional"]) for i in config["input"]],
            output=[pb.ModelOutput(name=o["name"], data_type=pb.DataType.Value(o["data_type"]),
                                   dims=o["dims"]) for o in config["output"]],
            model_transaction_policy=pb.ModelTransactionPolicy(decoupled=True),
        )  # fmt: skip
