"""The bounded line reader of the gateway's stdio transport: a line longer than the limit is
skipped without being kept and answered as an error to the request it answered."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import JSONRPCError, JSONRPCResponse

from capdisc_producers.mcp_stdio import (
    ANSWER_MISMATCHED,
    ANSWER_TOO_LARGE,
    AnswerTooLarge,
    _lines,
    _message,
)


async def chunks_of(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def read(
    data: bytes,
    limit: int,
    chunk: int,
    waiting: set[types.RequestId],
    sent: set[types.RequestId] | None = None,
) -> list[object]:
    """The messages ``data`` holds, read ``chunk`` bytes at a time; ``sent`` are the request ids
    sent (default: the ones ``waiting``)."""
    out: list[object] = []
    sent_ids = dict.fromkeys(waiting if sent is None else sent)

    async def body() -> None:
        async for line in _lines(chunks_of(data, chunk), limit):
            out.append(_message(line, limit, waiting, sent_ids))

    anyio.run(body)
    return out


def answer(request_id: int | str, text: str, *, id_last: bool = False) -> bytes:
    result = {"content": [{"type": "text", "text": text}]}
    body = {"result": result, "jsonrpc": "2.0", "id": request_id} if id_last else None
    body = body or {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(body).encode() + b"\n"


def test_lines_across_chunks_are_read_whole() -> None:
    data = answer(1, "ahoy") + answer(2, "x" * 300) + b"\n" + answer(3, "last")

    out = read(data, 1024, 7, {1, 2, 3})

    assert [m.message.id for m in out if isinstance(m, SessionMessage)] == [1, 2, 3]
    assert all(isinstance(m.message, JSONRPCResponse) for m in out if isinstance(m, SessionMessage))


def test_a_line_over_the_limit_answers_its_request_with_an_error_and_the_next_is_read() -> None:
    for id_last in (False, True):  # the id leads (Python SDK) or closes (TypeScript SDK)
        data = answer(7, "x" * 100_000, id_last=id_last) + answer(8, "ahoy")

        out = read(data, 4096, 1000, {5, 7, 8})

        assert len(out) == 2
        first, second = out
        assert isinstance(first, SessionMessage) and isinstance(first.message, JSONRPCError)
        assert first.message.id == 7 and first.message.error.code == ANSWER_TOO_LARGE
        assert first.message.error.data == {"bytes": len(data) - len(answer(8, "ahoy")) - 1}
        assert isinstance(second, SessionMessage) and second.message.id == 8


def test_a_long_line_naming_no_waiting_request_answers_the_only_one_waiting() -> None:
    data = b'{"jsonrpc": "2.0", "result": {"text": "' + b"x" * 50_000 + b'"}, "id": 99}\n'

    only = read(data, 4096, 4096, {3})
    several = read(data, 4096, 4096, {3, 4})

    assert isinstance(only[0], SessionMessage) and only[0].message.id == 3
    assert isinstance(several[0], AnswerTooLarge)
    assert "more than the 4096 bytes capdisc reads" in str(several[0])


@pytest.mark.parametrize(
    ("answered", "waiting", "sent", "passed_as_is"),
    [
        (99, {7}, {7}, False),  # an id never sent, one request waiting: that request fails
        (3, {7}, {3, 7}, True),  # an answer to a request given up on: the client drops it
        (99, {7, 8}, {7, 8}, True),  # which request it was meant for cannot be told
        (7, {7}, {7}, True),  # its own answer
    ],
)
def test_an_answer_to_no_request_sent_fails_the_one_waiting(
    answered: int, waiting: set[types.RequestId], sent: set[types.RequestId], passed_as_is: bool
) -> None:
    (out,) = read(answer(answered, "ahoy"), 4096, 1000, set(waiting), sent)

    assert isinstance(out, SessionMessage)
    if passed_as_is:
        assert isinstance(out.message, JSONRPCResponse) and out.message.id == answered
    else:
        assert isinstance(out.message, JSONRPCError) and out.message.id == 7
        assert out.message.error.code == ANSWER_MISMATCHED
        assert out.message.error.message.startswith("with JSON-RPC id 99, not 7")
