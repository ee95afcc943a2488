"""A limit on the size of an HTTP request head (request line + headers), enforced while parsing.

uvicorn's default parser, httptools, has no such limit: it buffers a head of any size (a 10 MB
header was accepted in a test), so a client could hold memory with headers alone, long before any
body limit applies. This protocol counts the bytes of the head as they arrive and answers
431 Request Header Fields Too Large, then closes the connection, as soon as the head passes the
limit without having ended; memory per connection stays within the limit plus one socket read.

Only the head is counted: the body has its own limit (semserve.serving.HttpGuard, 413).
"""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_MAX_HEADER_BYTES = 64 * 1024
_END = b"\r\n\r\n"


def _response_431(limit: int) -> bytes:
    body = json.dumps({"error": f"request headers are larger than the limit of {limit} bytes"}).encode()
    return b"".join([
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n\r\n",
        body,
    ])


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a head size limit; `max_header_bytes` is set by `protocol_class`."""

    max_header_bytes = DEFAULT_MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""  # the last bytes seen, so a "\r\n\r\n" split across reads is found
        self._rejected = False

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._in_head:
            room = self.max_header_bytes - self._head_bytes
            window = self._tail + data[: max(room, 0) + len(_END)]
            if _END not in window and self._head_bytes + len(data) > self.max_header_bytes:
                self._reject()
                return
            self._head_bytes += len(data)
            self._tail = data[-(len(_END) - 1):]
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # Keep-alive: the next request on this connection has a head of its own.
        self._in_head, self._head_bytes, self._tail = True, 0, b""

    def _reject(self) -> None:
        self._rejected = True
        self.logger.warning("request head over %d bytes: 431", self.max_header_bytes)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_response_431(self.max_header_bytes))
            self.transport.close()


def protocol_class(max_header_bytes: int) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` with this limit."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,),
                {"max_header_bytes": int(max_header_bytes)})


def uvicorn_options(max_header_bytes: int) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.Config` that enforce the limit."""
    return {"http": protocol_class(max_header_bytes)}
