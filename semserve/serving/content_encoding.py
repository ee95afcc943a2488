"""Request bodies sent compressed (`Content-Encoding: gzip` or `deflate`), decoded before any route
reads them, as Triton's HTTP endpoint does: tritonclient's `request_compression_algorithm` sends
them, and KServe's app reads the compressed bytes as the body (a 400 "not valid UTF-8").

The decoded size is held to the same body limit as a plain body (a small gzip can expand a
thousandfold), counted while decoding, so memory never holds more than the limit.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# zlib's wbits: gzip framing; zlib framing (what HTTP's "deflate" means, RFC 9110); raw deflate,
# which some clients send for "deflate" all the same.
_GZIP, _ZLIB, _RAW = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS
SUPPORTED = ("gzip", "deflate", "identity")


@dataclass(frozen=True)
class EncodingError(Exception):
    """A body that cannot be decoded: `status` is the HTTP answer (400, 413 or 415)."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


def encodings(header: str) -> list[str]:
    """The codings of a Content-Encoding header in the order they were applied, identity left out."""
    names = [part.strip().lower() for part in header.split(",")]
    return [name for name in names if name and name != "identity"]


def decode_body(body: bytes, header: str, limit: int) -> bytes:
    """`body` with every coding of `header` undone (the last applied first); at most `limit` bytes."""
    codings = encodings(header)
    unsupported = [c for c in codings if c not in SUPPORTED]
    if unsupported:
        raise EncodingError(
            415, f"content-encoding {unsupported[0]!r} is not supported (send gzip, deflate or identity)"
        )
    for coding in reversed(codings):
        body = _inflate(body, coding, limit)
    return body


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    tries = (_GZIP,) if coding == "gzip" else (_ZLIB, _RAW)
    for wbits in tries:
        decoder = zlib.decompressobj(wbits)
        try:
            out = decoder.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            raise EncodingError(413, f"request body is larger than the limit of {limit} bytes once decoded")
        if not decoder.eof:
            raise EncodingError(400, f"request body is a truncated {coding} stream")
        if decoder.unused_data:
            raise EncodingError(400, f"request body has data after its {coding} stream")
        return out
    raise EncodingError(400, f"request body is not valid {coding} data (content-encoding: {coding})")
