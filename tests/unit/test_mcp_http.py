"""The bounded HTTP client of the gateway's streamable HTTP transport: a JSON answer or a
server-sent event longer than the limit is not read past it, and the request it answered is
answered by a JSON-RPC error saying so."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx2
import pytest

from capdisc_producers.mcp_http import BoundedClient, EventSplitter
from capdisc_producers.mcp_stdio import ANSWER_MISMATCHED, ANSWER_TOO_LARGE

LIMIT = 1000
CHUNK = 100
REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "flood"}}


class Served:
    """A mock server's body, sent ``CHUNK`` bytes at a time; counts the chunks the client
    took."""

    def __init__(self, body: bytes, content_type: str, **headers: str) -> None:
        self.body, self.taken = body, 0
        self.headers = {"content-type": content_type, **headers}

    async def chunks(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.body), CHUNK):
            self.taken += 1
            yield self.body[start : start + CHUNK]

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=self.headers, content=self.chunks())


def exchange(
    served: Served, method: str = "POST", read: Callable[[httpx2.Response], Any] | None = None
) -> Any:
    """Send ``REQUEST`` (or a GET) through a bounded client to ``served``; what ``read`` makes of
    the response (by default its body)."""
    out: list[Any] = []

    async def body() -> None:
        transport = httpx2.MockTransport(served.handler)
        async with BoundedClient("http://upstream/mcp", LIMIT, transport) as client:
            request = client.build_request(
                method, "http://upstream/mcp", json=REQUEST if method == "POST" else None
            )
            response = await client.send(request, stream=True)
            try:
                out.append(await (read or (lambda r: r.aread()))(response))
            finally:
                await response.aclose()

    anyio.run(body)
    return out[0]


def answer(size: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"text": "x" * size}}).encode()


def test_a_json_answer_within_the_limit_is_passed_on_whole() -> None:
    served = Served(answer(500), "application/json")

    assert exchange(served) == answer(500)


def test_a_json_answer_longer_than_the_limit_is_not_read_past_it() -> None:
    served = Served(answer(50_000), "application/json")

    refusal = json.loads(exchange(served))

    assert served.taken == LIMIT // CHUNK + 1
    assert refusal["id"] == 7 and refusal["error"]["code"] == ANSWER_TOO_LARGE
    assert refusal["error"]["data"] == {"bytes_read": (LIMIT // CHUNK + 1) * CHUNK}
    assert "more than 1000 bytes (reading stopped there)" in refusal["error"]["message"]


def test_a_json_answer_declared_longer_than_the_limit_is_not_read_at_all() -> None:
    served = Served(answer(50_000), "application/json", **{"content-length": "50033"})

    refusal = json.loads(exchange(served))

    assert served.taken == 0
    assert refusal["error"]["data"] == {"bytes": 50033}


def test_a_json_answer_to_another_request_id_is_replaced_by_an_error_saying_so() -> None:
    served = Served(
        json.dumps({"jsonrpc": "2.0", "id": 99, "result": {}}).encode(), "application/json"
    )

    refusal = json.loads(exchange(served))

    assert refusal["id"] == 7 and refusal["error"]["code"] == ANSWER_MISMATCHED
    assert refusal["error"]["message"].startswith("with JSON-RPC id 99, not 7, the id of")


def test_a_json_answer_with_its_requests_id_as_a_string_is_passed_on() -> None:
    body = json.dumps({"jsonrpc": "2.0", "result": {}, "id": "7"}).encode()

    assert exchange(Served(body, "application/json")) == body


def test_server_sent_events_are_passed_on_one_whole_event_at_a_time() -> None:
    first, second = b"event: message\ndata: " + answer(300) + b"\n\n", b"data: {}\r\n\r\n"
    served = Served(first + second, "text/event-stream")

    async def pieces(response: httpx2.Response) -> list[bytes]:
        return [piece async for piece in response.aiter_raw()]

    passed = exchange(served, read=pieces)

    assert b"".join(passed) == first + second and passed[0].startswith(first)
    assert all(piece.endswith((b"\n\n", b"\r\n\r\n")) for piece in passed)


def test_an_event_longer_than_the_limit_answers_the_request_with_the_size_error() -> None:
    served = Served(b"event: message\ndata: " + answer(50_000) + b"\n\n", "text/event-stream")

    body = exchange(served)

    assert served.taken == LIMIT // CHUNK + 1
    assert body.startswith(b"event: message\ndata: ") and body.endswith(b"\n\n")
    refusal = json.loads(body.split(b"data: ", 1)[1])
    assert refusal["id"] == 7 and refusal["error"]["code"] == ANSWER_TOO_LARGE


def test_an_event_longer_than_the_limit_on_the_servers_own_stream_is_skipped_unkept() -> None:
    after = b"event: message\ndata: " + notification(10) + b"\n\n"
    huge = b"event: message\ndata: " + notification(50_000) + b"\n\n"
    served = Served(huge + after, "text/event-stream")

    async def pieces(response: httpx2.Response) -> list[bytes]:
        return [piece async for piece in response.aiter_raw()]

    passed = exchange(served, method="GET", read=pieces)

    assert passed == [after]  # the stream goes on: the server's next message is read


@pytest.mark.parametrize("blank", [b"\n\n", b"\r\r", b"\r\n\r\n", b"\n\r\n"])
def test_an_event_ends_at_a_blank_line_of_any_line_ending(blank: bytes) -> None:
    splitter = EventSplitter()
    stream = b"data: one" + blank + b"data: two"

    whole = b"".join(splitter.feed(stream[i : i + 1]) for i in range(len(stream)))

    assert whole == b"data: one" + blank and splitter.rest() == b"data: two"


def test_a_carriage_return_at_a_chunks_end_waits_for_the_next_chunk() -> None:
    splitter = EventSplitter()

    assert splitter.feed(b"data: one\r\n\r") == b""
    assert splitter.feed(b"\ndata: two") == b"data: one\r\n\r\n"
    assert splitter.pending == len(b"data: two")


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_bomb_is_refused_after_one_decoded_piece(coding: str) -> None:
    wbits = zlib.MAX_WBITS | 16 if coding == "gzip" else zlib.MAX_WBITS
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    bomb = packer.compress(answer(16 * 1024 * 1024)) + packer.flush()  # 16 MiB in about 16 KB
    served = Served(bomb, "application/json", **{"content-encoding": coding})

    refusal = json.loads(exchange(served))

    assert refusal["error"]["code"] == ANSWER_TOO_LARGE
    assert refusal["error"]["data"]["bytes_read"] <= LIMIT + 1024 * 1024  # one decoded piece
    assert served.taken <= 2


def notification(size: int) -> bytes:
    params = {"level": "debug", "data": "x" * size}
    message = {"jsonrpc": "2.0", "method": "notifications/message", "params": params}
    return json.dumps(message).encode()


@pytest.mark.parametrize("blank", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_a_notification_longer_than_the_limit_is_skipped_and_the_answer_after_it_passed_on(
    blank: bytes,
) -> None:
    line_end = blank[: len(blank) // 2]
    huge = b"event: message" + line_end + b"data: " + notification(50_000)
    reply = b"event: message\ndata: " + answer(300) + b"\n\n"
    served = Served(huge + blank + reply, "text/event-stream")

    body = exchange(served)

    assert body == reply


@pytest.mark.parametrize("blank", [b"\n\n", b"\r\n\r\n", b"\r\r", b"\n\r\n"])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_a_skipped_event_is_dropped_to_its_end_and_the_next_read_whole(
    blank: bytes, chunk: int
) -> None:
    splitter = EventSplitter()
    stream = b"data: " + b"y" * 3000 + blank + b"data: next" + blank + b"data: rest"
    out: list[bytes] = []
    for start in range(0, len(stream), chunk):
        out.append(splitter.feed(stream[start : start + chunk]))
        if splitter.pending > 100 and not splitter.skipping:
            splitter.skip()

    assert b"".join(out) == b"data: next" + blank
    assert splitter.rest() == b"data: rest"
    assert max(len(piece) for piece in out) <= len(b"data: next" + blank)
