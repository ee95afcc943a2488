"""v2 gRPC against the real predictor, through KServe's own client."""

from __future__ import annotations

import grpc
import pytest
from kserve import InferenceGRPCClient, InferInput, InferRequest

from tests.conftest import FRANCE, Predictor


def client(p: Predictor) -> InferenceGRPCClient:
    return InferenceGRPCClient(p.grpc, timeout=120, retries=0)


def text_request(prompts: list[str], **params: object) -> InferRequest:
    return InferRequest(
        model_name="llm",
        infer_inputs=[InferInput("text_input", [len(prompts)], "BYTES", prompts)],
        parameters={"max_tokens": 12, "temperature": 0, **params},
    )


def column(resp, name: str) -> list:
    out = resp.get_output_by_name(name)
    return [v.decode() if isinstance(v, bytes) else v for v in out.as_numpy().tolist()]


async def test_server_and_model_ready(predictor: Predictor) -> None:
    c = client(predictor)
    assert await c.is_server_ready()
    assert await c.is_model_ready("llm")
    await c.close()


async def test_grpc_infer_single_and_batch(predictor: Predictor) -> None:
    c = client(predictor)
    one = await c.infer(text_request([FRANCE]))
    assert "Paris" in column(one, "text_output")[0]
    four = await c.infer(text_request([FRANCE, "Hello", "1, 2, 3,", "Dear Sir,"], max_tokens=4))
    assert len(column(four, "text_output")) == 4
    assert all(n <= 4 for n in column(four, "completion_tokens"))
    assert column(four, "text_output")[0] == column(await c.infer(text_request([FRANCE], max_tokens=4)),
                                                    "text_output")[0]
    await c.close()


async def test_grpc_metadata(predictor: Predictor) -> None:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(predictor.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="llm"))
        assert {i.name for i in meta.inputs} >= {"text_input"}
        outputs = {o.name for o in meta.outputs}
        assert outputs == {"text_output", "finish_reason", "completion_tokens", "logprobs", "prompt_logprobs",
                       "prompt_text"}


@pytest.mark.parametrize(
    ("request_factory", "needle"),
    [
        (lambda: InferRequest("llm", [InferInput("prompt", [1], "BYTES", ["x"])]), "unknown input"),
        (lambda: InferRequest("llm", [InferInput("text_input", [1], "INT32", [3])]), "BYTES"),
        (lambda: text_request([" "]), "empty"),
        (lambda: text_request(["hi"], max_tokens=0), "max_tokens"),
        (lambda: text_request(["word " * 3000]), "context"),
    ],
)
async def test_grpc_bad_input_is_invalid_argument(predictor: Predictor, request_factory, needle) -> None:
    c = client(predictor)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.infer(request_factory())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details()
    await c.close()


async def test_grpc_raw_messages_utf8_float_params_unknown_model(predictor: Predictor) -> None:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(predictor.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        bad = pb.ModelInferRequest(
            model_name="llm",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="text_input", datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[b"\xff\xfe bad"]),
                )
            ],
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ModelInfer(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "UTF-8" in err.value.details()
        # KServe's v2 proto has no double parameter: floats travel as strings (or in the
        # sampling_parameters JSON input); "-1.0" must still be read as a number and refused.
        cold = pb.ModelInferRequest(
            model_name="llm",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="text_input", datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[b"hi"]),
                )
            ],
            parameters={"temperature": pb.InferParameter(string_param="-1.0")},
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ModelInfer(cold)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "temperature" in err.value.details()
        cold.parameters["temperature"].string_param = "0"
        cold.parameters["max_tokens"].int64_param = 3
        ok = await stub.ModelInfer(cold)
        assert [o.name for o in ok.outputs][:1] == ["text_output"]
        bad.model_name = "nope"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ModelInfer(bad)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
