"""A streamable HTTP client transport for capdisc whose answers from the server are bounded.

The ``mcp`` SDK's streamable HTTP client reads an ``application/json`` answer whole before
parsing it: an upstream that answered a tool call with 200 MB cost the gateway 200 MB and the
whole download before the size was checked. Its server-sent events are bounded, but at a
limit of its own (1 MiB by default, not ``mcp_max_result_bytes``), and an event past it fails
the call as a lost connection ("SSE stream failed"), which says nothing of the size.

:func:`bounded_http` is the SDK's ``streamable_http_client`` given an HTTP client of its own
(:class:`BoundedClient`) that reads at most ``max_message_bytes`` (plus
:data:`ENVELOPE_BYTES` for the JSON-RPC envelope) of each message from the server:

* an ``application/json`` body is read up to the limit (not at all when its
  ``Content-Length`` says it is longer); past it, reading stops, the connection is dropped,
  and the request is answered in the body's place by a JSON-RPC error (code
  :data:`~capdisc_producers.mcp_stdio.ANSWER_TOO_LARGE`, as for a stdio server) that the
  gateway and ``capdisc import mcp`` turn into an error naming the server and the limit;
* a ``text/event-stream`` body is passed on one whole event at a time. An event that grows past
  the limit is, when it is a message of the server's own, skipped to its end unkept, logged,
  and the stream read on: every such event on the stream the client opens for the server's
  messages (GET), and on a request's stream one whose start shows a ``method`` before any
  ``result`` or ``error`` (a log or progress notification, a request to the client). Any other
  is taken for the request's answer, and the request is answered by that same error.

A JSON answer whose JSON-RPC id (read from its start or end) is not the id of the request it
answers is replaced by a JSON-RPC error saying so (code
:data:`~capdisc_producers.mcp_stdio.ANSWER_MISMATCHED`): the SDK
passes such an answer on as it is, the client finds no request of that id and drops it, and
the call waited its whole timeout.

A request refused with an HTTP error status whose body is no JSON-RPC error (a 401 from a
server that wants credentials, a proxy's 502) is answered by a JSON-RPC error naming the status,
where the SDK would say only "Server returned an error response"; a 404, which the SDK reads as
a session the server forgot, is left to it.

The next request opens a connection of its own, so the server answers it as usual. Bodies are
asked for uncompressed (``Accept-Encoding: identity``) and counted as decoded, so a server that
compresses anyway is bounded too: ``httpx2`` decodes gzip and deflate at most 1 MiB at a time,
so a small compressed body that expands to gigabytes costs the limit plus 1 MiB.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx2
import structlog
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import coerce_request_id

from capdisc_producers.mcp_stdio import (
    ANSWER_MISMATCHED,
    ANSWER_TOO_LARGE,
    EDGE_BYTES,
    ENVELOPE_BYTES,
    HTTP_REFUSED,
    ID_AT_END,
    ID_AT_START,
)

log = structlog.get_logger("capdisc.mcp")

#: The SDK's timeouts (``create_mcp_http_client``): 30 s, and 300 s between reads of a stream.
_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
_LINE_END = re.compile(rb"\r\n|\r|\n")
#: The first of the keys that tell a JSON-RPC message from the server apart.
_FIRST_KEY = re.compile(rb'"(method|result|error)"\s*:')
#: How much of an error status's body is read to see whether it is a JSON-RPC error.
_STATUS_BODY_BYTES = 64 * 1024
#: Headers that describe the body as it came over the wire, not as it is passed on (decoded).
_WIRE_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def bounded_http(url: str, max_message_bytes: int) -> AbstractAsyncContextManager[Any]:
    """The SDK's streamable HTTP transport to ``url``, reading at most ``max_message_bytes``
    (plus the envelope) of any message from the server, as the module describes."""

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        limit = max_message_bytes + ENVELOPE_BYTES
        client = BoundedClient(url, limit)
        # The SDK's own bound on an event stays as a backstop, above ours.
        async with (
            client,
            streamable_http_client(
                url, http_client=client, max_sse_event_size=2 * limit
            ) as streams,
        ):
            yield streams

    return transport()


class BoundedClient(httpx2.AsyncClient):
    """An ``httpx2`` client whose responses to JSON-RPC messages are bounded (the module says
    how): at most ``limit`` bytes of one. ``label`` names the server in logs."""

    def __init__(
        self, label: str, limit: int, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        super().__init__(
            timeout=_TIMEOUT, headers={"accept-encoding": "identity"}, transport=transport
        )
        self.label = label
        self.limit = limit

    async def send(self, request: httpx2.Request, *, stream: bool = False, **kwargs: Any) -> Any:
        response = await super().send(request, stream=True, **kwargs)
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if (
            response.status_code >= 400
            and response.status_code != 404
            and _request_id(request) is not None
        ):
            response = await self._status(request, response)
        elif kind == "application/json":
            response = await self._json(request, response)
        elif kind == "text/event-stream":
            response = _passed_on(request, response, _Events(self, request, response))
        if not stream:
            await response.aread()
        return response

    async def _json(self, request: httpx2.Request, response: httpx2.Response) -> httpx2.Response:
        declared = _declared_size(response)
        try:
            if declared is not None and declared > self.limit:
                return self._refused(request, response, declared, exact=True)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.limit:
                    return self._refused(request, response, len(body), exact=False)
        finally:
            await response.aclose()  # a body not read to its end drops the connection
        answered = _answered_id(body)
        asked = _request_id(request)
        if (
            asked is not None
            and answered is not None
            and coerce_request_id(answered)
            != coerce_request_id(asked)  # "7" is 7, as the SDK has it
        ):
            return self._mismatched(request, response, answered, asked)
        return _passed_on(request, response, httpx2.ByteStream(bytes(body)))

    async def _status(self, request: httpx2.Request, response: httpx2.Response) -> httpx2.Response:
        """A request refused with an HTTP error status: passed on when the body is a JSON-RPC
        error (the SDK reads it), else answered by a JSON-RPC error naming the status."""
        body = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > _STATUS_BODY_BYTES:
                    break
        finally:
            await response.aclose()
        if _is_jsonrpc_error(body):
            return _passed_on(request, response, httpx2.ByteStream(bytes(body)))
        error = {"code": HTTP_REFUSED, "message": http_refusal(response)}
        answer = json.dumps({"jsonrpc": "2.0", "id": _request_id(request), "error": error})
        return httpx2.Response(
            response.status_code,
            headers={"content-type": "application/json"},
            content=answer.encode(),
            request=request,
        )

    def _mismatched(
        self, request: httpx2.Request, response: httpx2.Response, answered: Any, asked: Any
    ) -> httpx2.Response:
        """The JSON-RPC error answering ``request`` in place of an answer that carries another
        request's id (which the client would drop, leaving the call to wait its timeout)."""
        log.warning("mcp_upstream_answer_mismatched", upstream=self.label, id=answered, asked=asked)
        error = {
            "code": ANSWER_MISMATCHED,
            "message": f"with JSON-RPC id {json.dumps(answered)}, not {json.dumps(asked)}, the "
            "id of the request it answers",
        }
        body = json.dumps({"jsonrpc": "2.0", "id": asked, "error": error}).encode()
        headers = {k: v for k, v in response.headers.items() if k.lower() not in _WIRE_HEADERS}
        return httpx2.Response(response.status_code, headers=headers, content=body, request=request)

    def _refused(
        self, request: httpx2.Request, response: httpx2.Response, size: int, *, exact: bool
    ) -> httpx2.Response:
        body = self.too_large(request, size, exact=exact)
        headers = {k: v for k, v in response.headers.items() if k.lower() not in _WIRE_HEADERS}
        headers["content-type"] = "application/json"
        return httpx2.Response(200, headers=headers, content=body, request=request)

    def too_large(self, request: httpx2.Request, size: int, *, exact: bool) -> bytes:
        """The JSON-RPC error answering ``request`` in place of an answer longer than the
        limit (``size`` bytes, or more when not ``exact``), logged."""
        log.warning(
            "mcp_upstream_answer_too_large",
            upstream=self.label,
            bytes=size if exact else None,
            bytes_read=None if exact else size,
            limit_bytes=self.limit,
        )
        what = f"{size} bytes" if exact else f"more than {self.limit} bytes (reading stopped there)"
        error = {
            "code": ANSWER_TOO_LARGE,
            "message": f"the answer is {what}, more than the {self.limit} bytes capdisc reads "
            "(mcp_max_result_bytes)",
            "data": {"bytes": size} if exact else {"bytes_read": size},
        }
        answer = {"jsonrpc": "2.0", "id": _request_id(request), "error": error}
        return json.dumps(answer).encode()


class _Events(httpx2.AsyncByteStream):
    """A ``text/event-stream`` body passed on one whole event at a time (an event longer than
    the limit is never held whole), then closed with the response it reads."""

    def __init__(
        self, client: BoundedClient, request: httpx2.Request, response: httpx2.Response
    ) -> None:
        self.client, self.request, self.response = client, request, response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        events = EventSplitter()
        async for chunk in self.response.aiter_bytes():
            whole = events.feed(chunk)
            if whole:
                yield whole
            if events.pending > self.client.limit:
                if not self._answers_a_request() or _from_the_server(events.head()):
                    self._skip(events)
                    continue
                answer = self.client.too_large(self.request, events.pending, exact=False)
                yield b"event: message\ndata: " + answer + b"\n\n"
                return
        if events.pending and not events.skipping:
            yield events.rest()

    def _answers_a_request(self) -> bool:
        """Whether this stream carries the answer to a request (a POST of one), not only the
        server's own messages (the GET stream)."""
        return self.request.method == "POST" and _request_id(self.request) is not None

    def _skip(self, events: EventSplitter) -> None:
        log.warning(
            "mcp_upstream_message_skipped",
            upstream=self.client.label,
            bytes_read=events.pending,
            limit_bytes=self.client.limit,
            reason="a message of the server's own past the limit, not the answer",
        )
        events.skip()

    async def aclose(self) -> None:
        await self.response.aclose()


def _from_the_server(event_head: bytes) -> bool:
    """Whether an event's start shows a message of the server's own (a notification or a
    request to the client), not an answer: a ``method`` key before any ``result`` or
    ``error``."""
    data = event_head.partition(b"data:")[2]
    found = _FIRST_KEY.search(data)
    return found is not None and found.group(1) == b"method"


class EventSplitter:
    """Splits a server-sent event stream after each whole event (a blank line ends one), keeping
    the event not yet ended (``pending`` bytes of it)."""

    def __init__(self) -> None:
        self._kept = bytearray()
        self._line_start = 0  # where the line being read starts in what is kept (-1: before it)
        self._scanned = 0  # how much of what is kept was looked through for line ends
        #: Whether the event not yet ended is being dropped (:meth:`skip`).
        self.skipping = False

    @property
    def pending(self) -> int:
        return len(self._kept)

    def head(self) -> bytes:
        """The start of the event not yet ended."""
        return bytes(self._kept[:EDGE_BYTES])

    def skip(self) -> None:
        """Drop the event not yet ended, what is kept of it now and the rest as it comes; the
        events after it are split as before."""
        self.skipping = True
        self._forget()

    def _forget(self) -> None:
        """Drop what is kept of the event being skipped, but for a carriage return not yet
        looked at (it may start a CRLF), remembering whether a line starts after it."""
        self._line_start = 0 if self._line_start == self._scanned else -1
        del self._kept[: self._scanned]
        self._scanned = 0

    def feed(self, chunk: bytes) -> bytes:
        """Take ``chunk``; return the events it ended (whole), if any."""
        self._kept += chunk
        start = ended = 0
        for found in _LINE_END.finditer(self._kept, self._scanned):
            if found.group() == b"\r" and found.end() == len(self._kept):
                self._scanned = found.start()  # may start a CRLF: look again with more
                break
            if found.start() == self._line_start:  # a blank line: the event ends here
                if self.skipping:  # the skipped one: what follows is passed on
                    self.skipping, start = False, found.end()
                ended = found.end()
            self._line_start = found.end()
        else:
            self._scanned = len(self._kept)
        whole = bytes(self._kept[start:ended])
        if ended:
            del self._kept[:ended]
            self._line_start -= ended
            self._scanned -= ended
        if self.skipping:
            self._forget()
        return whole

    def rest(self) -> bytes:
        """What is kept, once the stream has ended."""
        rest = bytes(self._kept)
        self._kept.clear()
        self._line_start = self._scanned = 0
        return rest


def _passed_on(
    request: httpx2.Request, response: httpx2.Response, body: httpx2.AsyncByteStream
) -> httpx2.Response:
    """``response`` with ``body`` (decoded) in place of its own."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    passed = httpx2.Response(
        response.status_code,
        headers=headers,
        stream=body,
        request=request,
        extensions=response.extensions,
    )
    passed.next_request = response.next_request
    return passed


def http_refusal(response: httpx2.Response) -> str:
    """What an HTTP error status from an MCP server means, and what to do."""
    status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    if response.status_code in (401, 403):
        return (
            f"the server answered {status}: it wants credentials, and capdisc sends none to an "
            "MCP server; use a server that needs none, or reach it through a proxy that adds them"
        )
    return f"the server answered {status}; check the URL and that the server runs, then try again"


def _is_jsonrpc_error(body: bytes | bytearray) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and isinstance(message.get("error"), dict)


def _declared_size(response: httpx2.Response) -> int | None:
    """The body's size as the server declared it, if it did (and sent it uncompressed)."""
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return None
    try:
        return int(response.headers["content-length"])
    except (KeyError, ValueError):
        return None


def _answered_id(body: bytes | bytearray) -> Any:
    """The id of the JSON-RPC answer ``body`` holds, read from its start or end where JSON-RPC
    writers put it (not parsed whole); None when neither has one."""
    for pattern, text in ((ID_AT_START, body[:EDGE_BYTES]), (ID_AT_END, body[-EDGE_BYTES:])):
        found = pattern.search(bytes(text).decode("utf-8", "replace"))
        if found:
            try:
                return json.loads(found.group(1))
            except ValueError:
                return None
    return None


def _request_id(request: httpx2.Request) -> Any:
    """The JSON-RPC id of the request ``request`` carries; None for none (a notification, an
    answer to the server, a GET)."""
    try:
        message = json.loads(request.content or b"null")
    except (ValueError, httpx2.RequestNotRead):
        return None
    return message.get("id") if isinstance(message, dict) and "method" in message else None
