"""The one error table (semserve/errors.py): each error class's HTTP status, gRPC code and OpenAI
type, the text a client reads, and a JSON syntax error's position."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from fastapi.exceptions import RequestValidationError
from kserve.errors import InferenceError, InvalidInput, ModelNotFound, ServerNotReady

from semserve.errors import (
    BadRequest,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ServingError,
    Unauthenticated,
    Unavailable,
    codes_of,
    error_field,
    error_from_grpc_code,
    error_from_status,
    error_text,
    json_error_text,
)

ROWS = [
    (BadRequest("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (PayloadTooLarge("x"), 413, grpc.StatusCode.RESOURCE_EXHAUSTED, "invalid_request_error"),
    (Unauthenticated("x"), 401, grpc.StatusCode.UNAUTHENTICATED, "authentication_error"),
    (Forbidden("x"), 403, grpc.StatusCode.PERMISSION_DENIED, "permission_error"),
    (NotFound("x"), 404, grpc.StatusCode.NOT_FOUND, "not_found_error"),
    (Unavailable("x"), 503, grpc.StatusCode.UNAVAILABLE, "service_unavailable"),
    (ServingError("x"), 500, grpc.StatusCode.INTERNAL, "server_error"),
    (InvalidInput("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (InferenceError("x"), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (RequestValidationError([]), 400, grpc.StatusCode.INVALID_ARGUMENT, "invalid_request_error"),
    (ModelNotFound("m"), 404, grpc.StatusCode.NOT_FOUND, "not_found_error"),
    (ServerNotReady("x"), 503, grpc.StatusCode.UNAVAILABLE, "service_unavailable"),
    (asyncio.CancelledError(), 499, grpc.StatusCode.CANCELLED, "server_error"),
    (RuntimeError("bug"), 500, grpc.StatusCode.INTERNAL, "server_error"),
]


@pytest.mark.parametrize(("exc", "status", "code", "openai_type"), ROWS)
def test_each_error_has_one_row(exc: BaseException, status: int, code: grpc.StatusCode,
                                openai_type: str) -> None:  # fmt: skip
    codes = codes_of(exc)
    assert (codes.http_status, codes.grpc_status(), codes.openai_type) == (status, code, openai_type)
    if isinstance(exc, ServingError):  # the attributes callers read are the table's
        assert (exc.http_status, exc.openai_type) == (status, openai_type)


def test_a_subclass_takes_its_nearest_row() -> None:
    class TooLong(BadRequest):
        pass

    assert codes_of(TooLong("x")).http_status == 400
    assert codes_of(TooLong("x", "messages")).openai_type == "invalid_request_error"


def test_error_text_and_field() -> None:
    assert error_text(BadRequest("max_tokens must be >= 1", "max_tokens")) == "max_tokens must be >= 1"
    assert error_field(BadRequest("bad", "max_tokens")) == "max_tokens"
    assert error_field(RuntimeError("x")) is None
    assert error_text(ModelNotFound("nope")) == "Model with name nope does not exist."
    assert error_text(InvalidInput("shape is wrong")) == "shape is wrong"
    assert error_text(RuntimeError("boom")) == "RuntimeError: boom"
    assert error_text(asyncio.CancelledError()) == "CancelledError"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"inputs": [1 2]}', "invalid JSON at line 1 column 15 (char 14): Expecting ',' delimiter"),
        ('{"a": 1,\n "b": }', "invalid JSON at line 2 column 7 (char 15): Expecting value"),
        ("", "invalid JSON at line 1 column 1 (char 0): Expecting value"),
    ],
)
def test_json_error_names_line_column_and_problem(body: str, expected: str) -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(body)
    err = caught.value
    assert json_error_text(err.msg, err.doc, err.pos) == expected


def test_an_upstream_answer_read_back_through_the_table() -> None:
    bad = error_from_status(400, "max_tokens too large", "max_tokens")
    assert type(bad) is BadRequest and bad.field == "max_tokens"
    assert type(error_from_status(404, "no model")) is NotFound
    assert type(error_from_status(500, "boom")) is Unavailable
    assert type(error_from_grpc_code("INVALID_ARGUMENT", "x", "text_input")) is BadRequest
    assert type(error_from_grpc_code("NOT_FOUND", "x")) is NotFound
    assert type(error_from_grpc_code("DEADLINE_EXCEEDED", "x")) is Unavailable
