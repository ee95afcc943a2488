"""transformers_svc/predictor_client.py builds the v2 request its predictor calls get: the sampling
options as JSON, with this transformer's stream interval in place of the request's (a generation
may be shared by requests that ask for different intervals; each regroups its own)."""

from __future__ import annotations

import json

import pytest

from semserve.sampling import SamplingOptions
from semserve.v2 import text_contract as v2
from transformers_svc.config import TransformerSettings
from transformers_svc.predictor_client import PredictorClient


def sampling_sent(settings: TransformerSettings, options: SamplingOptions) -> dict[str, object]:
    request = PredictorClient(settings)._request("Hello", options, "rid", stream=True)
    [tensor] = [t for t in request.inputs if t.name == v2.SAMPLING_INPUT]
    return json.loads(tensor.contents.bytes_contents[0])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("server", "asked", "sent"), [(1, None, None), (1, 8, None), (3, None, 3), (3, 8, 3)]
)
def test_the_transformers_stream_interval_is_sent_not_the_requests(
    server: int, asked: int | None, sent: int | None
) -> None:
    options = SamplingOptions(max_tokens=7, temperature=0, stream_interval=asked)
    got = sampling_sent(TransformerSettings(stream_interval=server), options)
    assert got.get("stream_interval") == sent
    assert got["max_tokens"] == 7 and got["temperature"] == 0


def test_a_stream_interval_below_one_stops_the_start() -> None:
    with pytest.raises(ValueError, match="stream_interval 0: must be >= 1"):
        TransformerSettings(stream_interval=0)
