"""A cap on the size of an HTTP request's body, for ``capdisc mcp --http``.

The MCP transport reads a request's whole body before it looks at it, so without a cap one
client could make the server hold any amount of memory. :class:`BodyLimit` is ASGI middleware
that answers 413 to a body declared (``Content-Length``) or found, as it streams in, to be
larger than its limit, before the application sees more of it. The rest of such a body is read
and dropped first (up to :data:`MAX_DRAINED_BYTES`): the server closes a connection once its
response is sent, and a client still sending would see the connection reset, not the 413.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The largest request body ``capdisc mcp --http`` reads: a discovery or a forwarded tool
#: call with generous arguments fits many times over.
MAX_HTTP_BODY_BYTES = 4 * 1024 * 1024
#: How much of a refused body is read (and dropped) so that its 413 reaches the client.
MAX_DRAINED_BYTES = 16 * 1024 * 1024


class BodyTooLarge(Exception):
    """Raised inside :class:`BodyLimit` when a streamed body passes the limit."""


class BodyLimit:
    """Wraps an ASGI app: an HTTP request whose body is over ``max_bytes`` gets 413."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_HTTP_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_size(scope) > self.max_bytes:
            await _refuse(send, self.max_bytes, drained=await _drain(receive))
            return
        started = False
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if started:  # too late to answer 413: the connection is closed instead
                raise
            await _refuse(send, self.max_bytes, drained=await _drain(receive))


def _declared_size(scope: Scope) -> int:
    """The request's ``Content-Length`` (0 when absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else 0
    return 0


async def _drain(receive: Receive) -> bool:
    """Read and drop what is left of the request's body, up to :data:`MAX_DRAINED_BYTES`;
    whether all of it was."""
    drained = 0
    while drained <= MAX_DRAINED_BYTES:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return False
        drained += len(message.get("body", b""))
        if not message.get("more_body"):
            return True
    return False


async def _refuse(send: Send, max_bytes: int, *, drained: bool) -> None:
    description = f"the request body is larger than {max_bytes} bytes"
    close = [] if drained else [(b"connection", b"close")]
    await send_error(send, 413, "request_too_large", description, close)


async def send_error(
    send: Send,
    status: int,
    error: str,
    description: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An error response of the front door: ``{"error", "error_description"}`` as JSON (the
    shape OAuth errors have), with ``headers`` besides."""
    body = json.dumps({"error": error, "error_description": description}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
