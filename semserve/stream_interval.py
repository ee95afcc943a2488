"""Streamed answers in chunks of at least N new tokens (vLLM's stream interval), in both services.

vLLM's `--stream-interval` (the server's) and `stream_interval` (a request's, which may only raise
it) trade smoothness for cost: the first piece goes at once, the last with the finish reason, and
those between carry at least N tokens each. Every chunk costs a message over the gRPC hop, an SSE
event and its JSON; on a GPU that streams thousands of tokens a second that per-chunk cost is what
the transformer spends most of its CPU on.

The predictor leaves the grouping to vLLM's output processor where its vLLM takes a request's
interval, and groups the engine's pieces itself where it does not. The transformer groups at its
edge whatever the pieces came from: its predictor, a replayed cache hit, or a generation shared by
requests that each group it to their own interval.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from semserve.answer import Piece, answer_of, whole_piece


def effective(server: int, asked: int | None) -> int:
    """The interval a request streams at: the server's, raised (never lowered) by the request's."""
    return max(server, asked or 1)


def joined(pieces: Sequence[Piece]) -> Piece:
    """Consecutive pieces as one: their text and logprobs in order, the last one's counts and
    finish reason."""
    return pieces[0] if len(pieces) == 1 else whole_piece(answer_of(list(pieces)))


async def every(interval: int, pieces: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    """`pieces` regrouped: the first as it comes, then one piece per `interval` new tokens or more,
    and whatever is held when the last (finish reason) or the end comes. Closing this closes
    `pieces` (a predictor call is aborted, a shared generation left)."""
    try:
        if interval <= 1:
            async for piece in pieces:
                yield piece
            return
        held: list[Piece] = []
        sent = 0  # completion tokens sent so far; 0: nothing sent yet, so the next goes at once
        async for piece in pieces:
            held.append(piece)
            if sent and piece.finish_reason is None and piece.completion_tokens - sent < interval:
                continue
            out = joined(held)
            held = []
            sent = out.completion_tokens
            yield out
        if held:
            yield joined(held)
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
