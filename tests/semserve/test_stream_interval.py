"""semserve.stream_interval: a streamed answer regrouped to at least N new tokens per piece after
the first, as vLLM's stream interval sends it; the text, logprobs and counts unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from itertools import pairwise

import pytest

from semserve.answer import Answer, Piece, TokenLogprob, answer_of, replay
from semserve.stream_interval import effective, every, joined


def tokens(n: int, finish: str | None = "stop", per_piece: int = 1) -> list[Piece]:
    """n tokens "t0 t1 ..." in pieces of `per_piece` (the last may be shorter), the last with `finish`."""
    bounds = [*range(0, n, per_piece), n]
    return [Piece("".join(f"t{i} " for i in range(start, end)), finish if end == n else None, end, 5)
            for start, end in pairwise(bounds)]  # fmt: skip


class Source:
    """The pieces as an async generator that records whether it was closed."""

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces, self.closed = pieces, False

    async def __call__(self) -> AsyncIterator[Piece]:
        try:
            for p in self.pieces:
                yield p
        finally:
            self.closed = True


def regrouped(interval: int, pieces: list[Piece]) -> list[Piece]:
    async def run() -> list[Piece]:
        return [p async for p in every(interval, Source(pieces)())]

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("interval", "n", "per_piece", "sizes"),
    [
        (1, 5, 1, [1, 1, 1, 1, 1]),  # as it came
        (4, 10, 1, [1, 4, 4, 1]),  # the first at once, then 4 each, the rest with the finish
        (4, 9, 1, [1, 4, 4]),
        (3, 1, 1, [1]),
        (2, 10, 3, [3, 3, 3, 1]),  # pieces already larger than the interval pass as they are
        (8, 10, 3, [3, 7]),  # whole pieces only: 3+3 < 8 waits, then the last ends it
        (100, 10, 1, [1, 9]),
    ],
)
def test_every_n_tokens(interval: int, n: int, per_piece: int, sizes: list[int]) -> None:
    pieces = tokens(n, per_piece=per_piece)
    out = regrouped(interval, pieces)
    counts = [p.completion_tokens for p in out]
    assert [b - a for a, b in zip([0, *counts], counts, strict=False)] == sizes
    assert answer_of(out) == answer_of(pieces)
    assert [p.finish_reason for p in out] == [None] * (len(out) - 1) + ["stop"]


def test_a_stream_cut_off_sends_what_it_held() -> None:
    # A generation that ends with no finish reason (the predictor went away): nothing held is lost.
    pieces = tokens(6, finish=None)
    out = regrouped(4, pieces)
    assert "".join(p.text for p in out) == "".join(p.text for p in pieces)
    assert out[-1].completion_tokens == 6


def test_joined_keeps_logprobs_in_order_and_the_last_counts() -> None:
    a = Piece("a", None, 1, 5, "rev-a", (TokenLogprob("a", -0.1),))
    b = Piece("b", None, 2, 5, None, None)  # a token whose logprobs came with the one before
    c = Piece("c", "length", 3, 5, None, (TokenLogprob("c", -0.3, (("c", -0.3), ("d", -1.0))),))
    one = joined([a, b, c])
    assert one == Piece("abc", "length", 3, 5, "rev-a", (a.logprobs[0], c.logprobs[0]))  # type: ignore[index]
    assert joined([b]) is b
    assert joined([b, Piece("", None, 2, 5)]).logprobs is None


def test_a_replayed_hit_groups_by_its_spread_counts() -> None:
    answer = Answer("one two three four five six seven eight", "stop", 8, 3)
    out = regrouped(3, replay(answer))
    assert [p.text for p in out] == ["one ", "two three four ", "five six seven ", "eight"]
    assert answer_of(out) == answer_of(replay(answer))


def test_closing_the_regrouped_stream_closes_its_source() -> None:
    source = Source(tokens(10))

    async def run() -> None:
        stream = every(4, source())
        assert (await anext(stream)).completion_tokens == 1
        await stream.aclose()

    asyncio.run(run())
    assert source.closed


@pytest.mark.parametrize(("server", "asked", "used"), [(1, None, 1), (1, 4, 4), (4, 2, 4), (4, None, 4)])
def test_a_request_raises_the_server_interval_never_lowers_it(
    server: int, asked: int | None, used: int
) -> None:
    assert effective(server, asked) == used
