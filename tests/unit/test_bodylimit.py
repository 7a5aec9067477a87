"""The HTTP body cap of ``capdisc mcp --http``: bodies over the limit get 413 before the app
reads them whole; smaller ones, and other kinds of connection, pass as they are."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from capdisc_producers.bodylimit import BodyLimit

LIMIT = 10


class EchoApp:
    """Reads the whole body, then answers 200 with it."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def call(
    app: Any,
    chunks: list[bytes],
    headers: list[tuple[bytes, bytes]],
    kind: str = "http",
    unread: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run ``app`` on one request of ``chunks``; what it sent back (``unread`` keeps the
    request messages nobody received)."""
    messages = unread if unread is not None else []
    messages += [
        {"type": "http.request", "body": chunk, "more_body": at < len(chunks) - 1}
        for at, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    anyio.run(app, {"type": kind, "headers": headers}, receive, send)
    return sent


def status(sent: list[dict[str, Any]]) -> int:
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


def test_a_body_within_the_limit_reaches_the_app_unchanged() -> None:
    inner = EchoApp()

    sent = call(BodyLimit(inner, LIMIT), [b"12345", b"67890"], [])

    assert status(sent) == 200 and sent[-1]["body"] == b"1234567890"


def test_a_declared_length_over_the_limit_is_refused_before_the_app_runs() -> None:
    inner = EchoApp()

    sent = call(BodyLimit(inner, LIMIT), [b"x" * 11], [(b"Content-Length", b"11")])

    assert status(sent) == 413 and b"larger than 10 bytes" in sent[-1]["body"]
    assert inner.calls == 0


@pytest.mark.parametrize(
    "declared", [[(b"content-length", b"18")], []], ids=["declared", "streamed"]
)
def test_a_refused_body_is_read_to_its_end_so_the_413_reaches_the_client(
    declared: list[tuple[bytes, bytes]],
) -> None:
    unread: list[dict[str, Any]] = []

    sent = call(
        BodyLimit(EchoApp(), LIMIT), [b"123456", b"789012", b"345678"], declared, unread=unread
    )

    assert status(sent) == 413
    assert len([m for m in sent if m["type"] == "http.response.start"]) == 1
    assert unread == []


@pytest.mark.parametrize("kind", ["lifespan", "websocket"])
def test_other_connections_pass_untouched(kind: str) -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    call(BodyLimit(app, LIMIT), [b"x" * 100], [(b"content-length", b"100")], kind=kind)

    assert seen == [kind]


def test_a_body_too_large_to_drain_is_refused_and_its_connection_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("capdisc_producers.bodylimit.MAX_DRAINED_BYTES", 8)

    sent = call(BodyLimit(EchoApp(), LIMIT), [b"x" * 6] * 5, [(b"content-length", b"30")])

    assert status(sent) == 413
    assert (b"connection", b"close") in sent[0]["headers"]
