"""Where ``capdisc mcp`` forwards a tool call: the MCP server the tool was imported from.

* :func:`upstream_tool` reads a capability's ``source_ref`` as ``capdisc import mcp`` wrote it
  (type ``mcp``, source ``mcp:<url>`` or ``mcp:<command>``, location the tool's name on that
  server) into the server and the tool to call. Pure.
* :class:`UpstreamPool` holds one client session per upstream server, opened on its first call
  and reused by every session served, closed on shutdown or by :meth:`UpstreamPool.close` (a
  stdio server's process is stopped with it). A call that is not answered within ``timeout_s``,
  connecting included, is cancelled and raises :class:`~capdisc.errors.UpstreamTimeout` (saying
  so when the server meanwhile sent a message the client could not read: the answer may have
  been that one); a server that cannot be started or reached, or breaks the protocol, raises
  :class:`~capdisc.errors.UpstreamError`; a connection that was lost (closed, or an HTTP
  session the server forgot) is opened again on the next call. An answer larger than
  ``max_result_bytes`` as JSON raises :class:`~capdisc.errors.UpstreamError` saying to ask for
  less, rather than reaching a host that cannot use it; it is not even read past that (a stdio
  server's: :mod:`capdisc_producers.mcp_stdio`; over streamable HTTP:
  :mod:`capdisc_producers.mcp_http`), so the server answers the next call at once.
  A tool's own failure is its result (``isError``), returned as it is.
* When a pooled server says its tools changed (``notifications/tools/list_changed``), the pool
  lists them again over the same connection and hands the listing to ``on_tools_changed``, with
  the tenants whose calls went to that server. Changes heard while a re-listing waits to start
  are covered by it: a server that sends the notification in a burst, or on every call, costs
  one re-listing at a time and one more after it, not one per notification.

Connections use the initialize handshake (``mode="legacy"``): a server that speaks both
protocol eras would otherwise be reached in the stateless 2026-07-28 era, which carries no
list-changed notifications outside ``subscriptions/listen``.
"""

from __future__ import annotations

import functools
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskGroup
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from capdisc.discovery.toolsets import MCP_SOURCE_TYPE
from capdisc.errors import UpstreamError, UpstreamTimeout
from capdisc.models import SourceRef
from capdisc_producers.mcp_import import (
    MAX_MESSAGE_BYTES,
    ListingTap,
    ServerTools,
    list_all_tools,
    tapped,
    unread_answer,
    unreadable_reason,
    validation_reason,
)
from capdisc_producers.mcp_stdio import ANSWER_MISMATCHED, ANSWER_TOO_LARGE, HTTP_REFUSED

SOURCE_PREFIX = "mcp:"
_HTTP = ("http://", "https://")
_REIMPORT_HINT = "import the server again with capdisc import mcp --url URL | --command CMD"
_SLOW = "; retry it, or raise mcp_upstream_timeout_s for a slow server"
#: Errors after which a pooled connection is opened again on the next call: the transport
#: closed, or (streamable HTTP only) the server no longer knows the session, say after a
#: restart. Over stdio an invalid-request error is the server's answer to that one request
#: (say, a tool that asked the gateway for an elicitation it does not offer): the server runs
#: on, and stopping it would cost its state and a start for each such answer.
SESSION_LOST = frozenset({types.CONNECTION_CLOSED, types.INVALID_REQUEST})
STDIO_LOST = frozenset({types.CONNECTION_CLOSED})

log = structlog.get_logger("capdisc.mcp")


# -- which server, which tool --------------------------------------------------------------------


@dataclass(frozen=True)
class Upstream:
    """One MCP server tools were imported from: its import source (``mcp:<url>`` or
    ``mcp:<command>``, the pool's key) and how to reach it."""

    source: str
    url: str | None = None
    argv: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The URL or the command, for messages and logs."""
        return self.source.removeprefix(SOURCE_PREFIX)


@dataclass(frozen=True)
class UpstreamTool:
    """A tool to call: on ``upstream``, under its own ``name`` there."""

    upstream: Upstream
    name: str


def upstream_tool(ref: SourceRef | None) -> UpstreamTool | None:
    """Where a capability's calls go; None for one not imported from an MCP server. An MCP
    ``source_ref`` that names no usable server or tool raises :class:`UpstreamError`."""
    if ref is None or ref.type != MCP_SOURCE_TYPE:
        return None
    if not ref.location:
        raise UpstreamError(f"the tool from {ref.source!r} has no name there; {_REIMPORT_HINT}")
    return UpstreamTool(parse_upstream(ref.source), ref.location)


def parse_upstream(source: str) -> Upstream:
    """``mcp:<url>`` (http or https: streamable HTTP) or ``mcp:<command>`` (stdio, split like
    a shell would)."""
    if not source.startswith(SOURCE_PREFIX):
        raise UpstreamError(f"{source!r} is not an MCP server source; {_REIMPORT_HINT}")
    target = source[len(SOURCE_PREFIX) :].strip()
    if target.startswith(_HTTP):
        return Upstream(source, url=target)
    try:
        argv = tuple(shlex.split(target))
    except ValueError as exc:
        raise UpstreamError(f"the command in {source!r} cannot be read ({exc})") from exc
    if not argv:
        raise UpstreamError(f"{source!r} names no URL or command; {_REIMPORT_HINT}")
    return Upstream(source, argv=argv)


def target_of(upstream: Upstream) -> str | StdioServerParameters:
    """What the ``mcp`` client connects to: the URL, or the command to start."""
    if upstream.url is not None:
        return upstream.url
    return StdioServerParameters(command=upstream.argv[0], args=list(upstream.argv[1:]))


def transport_of(upstream: Upstream, max_message_bytes: int) -> ListingTap:
    """What the pool connects to: the URL (:func:`~capdisc_producers.mcp_http.bounded_http`)
    or the command started by :func:`bounded_stdio`, both refusing an answer longer than
    ``max_message_bytes`` without reading it whole, tapped so that a re-listing reads each
    tool on its own (:class:`ListingTap`)."""
    return tapped(target_of(upstream), max_message_bytes)


# -- the pool ------------------------------------------------------------------------------------

#: Told when a pooled server's tools changed: the server, its tools now, the tenants served.
ToolsChanged = Callable[[Upstream, ServerTools, frozenset[str]], Awaitable[None]]


@dataclass(eq=False)
class _Connection:
    """One pooled server: ready once connected (``client`` set) or failed (``failure``)."""

    upstream: Upstream
    ready: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    client: MCPClient | None = None
    tap: ListingTap | None = None
    failure: str = ""
    tenants: set[str] = field(default_factory=set)
    relisting: anyio.Lock = field(default_factory=anyio.Lock)
    #: A re-listing is waiting to start: a change heard meanwhile needs no other.
    relist_pending: bool = False
    ended: anyio.Event = field(default_factory=anyio.Event)
    #: When the server last sent a message the client could not read (and dropped), and why.
    unread_at: float = 0.0
    unread_reason: str = ""


class UpstreamPool:
    """One client session per upstream MCP server, shared by every session served."""

    def __init__(
        self,
        timeout_s: float,
        on_tools_changed: ToolsChanged | None = None,
        max_result_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.timeout_s = timeout_s
        self.on_tools_changed = on_tools_changed
        self.max_result_bytes = max_result_bytes
        self._connections: dict[str, _Connection] = {}
        self._tasks: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[UpstreamPool]:
        """Serve calls inside this block; on leaving it every connection is closed."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield self
            finally:  # every connection and re-listing ends; stdio servers are stopped
                self._tasks = None
                self._connections.clear()
                tasks.cancel_scope.cancel()

    async def close(self) -> None:
        """Close every connection now and return once each is closed (a stdio server stopped:
        its stdin closed, then SIGTERM, then SIGKILL)."""
        connections = list(self._connections.values())
        self._tasks = None
        self._connections.clear()
        for connection in connections:
            connection.scope.cancel()
        for connection in connections:
            await connection.ended.wait()

    async def call(
        self, tool: UpstreamTool, arguments: Mapping[str, Any], tenant: str
    ) -> types.CallToolResult:
        """The server's answer to one call made for ``tenant``."""
        started = time.monotonic()
        try:
            with anyio.fail_after(self.timeout_s):
                client = await self._client(tool.upstream, tenant)
                result = await call_tool(client, tool.name, arguments)
        except TimeoutError as exc:
            unread = self._unread_since(tool.upstream, started)
            self._drop_unconnected(tool.upstream)
            raise UpstreamTimeout(
                f"MCP server {tool.upstream.label} did not answer {tool.name!r} within "
                f"{self.timeout_s:g} s, so the call was cancelled{unread_answer(unread) or _SLOW}"
            ) from exc
        except MCPError as exc:
            if exc.code == ANSWER_TOO_LARGE:
                data = exc.error.data if isinstance(exc.error.data, dict) else {}
                size = data.get("bytes")  # none when reading stopped at the limit
                raise self._too_large(tool, _size(size) if isinstance(size, int) else "") from exc
            if exc.code == ANSWER_MISMATCHED:  # the answer named another request
                raise UpstreamError(
                    f"MCP server {tool.upstream.label} answered {tool.name!r} {exc.error.message};"
                    " the server breaks the protocol: call another tool, and report it to the "
                    "server's maintainers"
                ) from exc
            if exc.code in (SESSION_LOST if tool.upstream.url is not None else STDIO_LOST):
                self._drop(tool.upstream)
                raise _failed(tool, exc) from exc
            if exc.code == HTTP_REFUSED:  # the message says what to do
                raise UpstreamError(
                    f"MCP server {tool.upstream.label} could not take {tool.name!r}: {exc}"
                ) from exc
            raise UpstreamError(
                f"MCP server {tool.upstream.label} refused {tool.name!r} ({exc}, JSON-RPC "
                f"error {exc.code}); it runs, so calling again as it is will not help: check the "
                "arguments against the tool's input schema, or call another tool"
            ) from exc
        except ValidationError as exc:  # an answer that is no tool result: the server is at fault
            raise UpstreamError(
                f"MCP server {tool.upstream.label} answered {tool.name!r} with something that "
                f"is no MCP tool result ({validation_reason(exc)}); the server breaks the "
                "protocol: call another tool, and report it to the server's maintainers"
            ) from exc
        except (RuntimeError, ValueError, OSError) as exc:
            raise _failed(tool, exc) from exc
        self._check_size(tool, result)
        return result

    def _check_size(self, tool: UpstreamTool, result: types.CallToolResult) -> None:
        """Refuse to pass on an answer larger than ``max_result_bytes`` (as JSON)."""
        size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode())
        if size > self.max_result_bytes:
            raise self._too_large(tool, _size(size))

    def _too_large(self, tool: UpstreamTool, size: str) -> UpstreamError:
        """The refusal of an answer of ``size`` (empty: not read to its end, so unknown)."""
        answered = f"with {size}, more than" if size else "with more than"
        stopped = "; reading stopped there" if not size else ""
        return UpstreamError(
            f"MCP server {tool.upstream.label} answered {tool.name!r} {answered} the "
            f"{_size(self.max_result_bytes)} capdisc passes on (mcp_max_result_bytes){stopped}; "
            "call it again asking for less (a narrower query, a smaller page or range), or "
            "raise CAPDISC_MCP_MAX_RESULT_BYTES"
        )

    async def _client(self, upstream: Upstream, tenant: str) -> MCPClient:
        connection = self._connections.get(upstream.source)
        if connection is None:
            connection = _Connection(upstream)
            self._connections[upstream.source] = connection
            self._running().start_soon(self._hold, connection)
        connection.tenants.add(tenant)
        await connection.ready.wait()
        if connection.client is None:
            raise UpstreamError(
                f"MCP server {upstream.label} could not be started or reached "
                f"({connection.failure or 'it closed the connection'}); check that it runs "
                "(capdisc import mcp with its --url or --command lists it), then call again"
            )
        return connection.client

    def _running(self) -> TaskGroup:
        if self._tasks is None:
            raise UpstreamError("capdisc mcp is shutting down; call the tool again once it runs")
        return self._tasks

    async def _hold(self, connection: _Connection) -> None:
        """Open the connection and keep it open until cancelled or lost (logged, never raised:
        one server's failure must not stop the others). A stdio server that exits, between
        calls too, ends it: the next call starts the server again."""
        label = connection.upstream.label
        started = time.monotonic()
        with connection.scope:
            try:
                connection.tap = transport_of(connection.upstream, self.max_result_bytes)
                async with MCPClient(
                    connection.tap,
                    mode="legacy",
                    message_handler=functools.partial(self._heard, connection),
                ) as client:
                    connection.client = client
                    connection.ready.set()
                    log.info("mcp_upstream_connected", upstream=label, took_ms=_ms(started))
                    await connection.tap.ended.wait()  # until the server's side ends
                    log.info("mcp_upstream_ended", upstream=label)
            except Exception as exc:  # the task's boundary: report, and let the next call retry
                connection.failure = first_cause(exc)
                log.warning("mcp_upstream_failed", upstream=label, error=connection.failure)
        connection.client = None
        connection.ready.set()
        self._forget(connection)
        connection.ended.set()

    async def _heard(self, connection: _Connection, message: Any) -> None:
        """A message from the server: a tool-list change starts a re-listing (in a task of its
        own: the client's reader must not wait on a request it is to read the answer of)."""
        if isinstance(message, Exception):  # a message the client could not read, dropped
            connection.unread_at, connection.unread_reason = (
                time.monotonic(),
                unreadable_reason(message),
            )
        if isinstance(message, types.ToolListChangedNotification) and self._tasks is not None:
            if connection.relist_pending:  # the re-listing waiting to start will see this change
                return
            connection.relist_pending = True
            log.info("mcp_upstream_tools_changed", upstream=connection.upstream.label)
            self._tasks.start_soon(self._relist, connection)

    async def _relist(self, connection: _Connection) -> None:
        async with connection.relisting:  # one at a time per server; each sees the newest list
            connection.relist_pending = False
            client, tap = connection.client, connection.tap
            if client is None or tap is None or self.on_tools_changed is None:
                return
            try:
                with anyio.fail_after(self.timeout_s):
                    listing = await list_all_tools(client, tap)
                await self.on_tools_changed(
                    connection.upstream, listing, frozenset(connection.tenants)
                )
            except Exception as exc:  # the task's boundary: one failed re-import is logged
                log.warning(
                    "mcp_upstream_reimport_failed",
                    upstream=connection.upstream.label,
                    error=first_cause(exc),
                )

    def _unread_since(self, upstream: Upstream, started: float) -> list[str]:
        """Why the server's unreadable message since ``started`` could not be read, if it sent
        one (the answer awaited may have been that message)."""
        connection = self._connections.get(upstream.source)
        if connection is None or connection.unread_at < started:
            return []
        return [connection.unread_reason]

    def _drop(self, upstream: Upstream) -> None:
        connection = self._connections.pop(upstream.source, None)
        if connection is not None:
            connection.scope.cancel()

    def _drop_unconnected(self, upstream: Upstream) -> None:
        """After a timeout: a connection still not open is given up (the next call starts
        again); an open one stays, it only had a slow call."""
        connection = self._connections.get(upstream.source)
        if connection is not None and connection.client is None:
            self._drop(upstream)

    def _forget(self, connection: _Connection) -> None:
        if self._connections.get(connection.upstream.source) is connection:
            del self._connections[connection.upstream.source]


async def call_tool(
    client: MCPClient, name: str, arguments: Mapping[str, Any]
) -> types.CallToolResult:
    """``tools/call`` as it is: not ``Client.call_tool``, which first lists the server's tools
    to check the result against the tool's output schema, so that one tool the SDK refuses in
    that listing (an input schema of another type than ``object``, say) failed every call to
    every tool of the server. The answer is passed on unchecked; capdisc lists no output schema
    for a forwarded tool."""
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name=name, arguments=dict(arguments))
    )
    return await client.session.send_request(request, types.CallToolResult)


def _failed(tool: UpstreamTool, exc: Exception) -> UpstreamError:
    return UpstreamError(
        f"MCP server {tool.upstream.label} failed {tool.name!r} ({exc}); check that the "
        "server runs, then call the tool again"
    )


def first_cause(exc: BaseException) -> str:
    """The innermost first error of an exception group (anyio wraps transport errors), as
    text."""
    inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
    return first_cause(inner[0]) if inner else (str(exc) or type(exc).__name__)


def _size(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB" if size >= 100_000 else f"{size} bytes"


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
