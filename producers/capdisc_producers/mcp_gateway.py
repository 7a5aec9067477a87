"""The work behind ``capdisc mcp``'s tools, and each MCP session's tool list.

:class:`Gateway` answers the three kinds of call a session makes:

* ``discover_capabilities`` - the meta-tool: :meth:`capdisc.client.Client.discover` in the
  session, with ``tool_format="mcp"``. The result is
  :func:`capdisc.discovery.toolsets.metatool_result` plus ``session``, ``tools`` (the working
  set's MCP definitions, the meta-tool first) and ``tool_names``; and the working set becomes
  the session's listed tools.
* ``record_tool_call`` - the host ran a tool itself and says so: recorded in the session
  (:meth:`capdisc.client.Client.record_tool_call`), so the loop guard applies.
* a listed tool - forwarded to the MCP server it was imported from
  (:class:`~capdisc_producers.mcp_upstream.UpstreamPool`), then recorded like the above. The
  server's answer is returned as it is (its ``isError`` too); a server that cannot be reached
  or does not answer in time is a tool error saying so. A tool not imported from an MCP server
  has no upstream: calling it is a tool error telling the host to run it and record the call.

Whenever a call changes the session's list (:mod:`capdisc_producers.mcp_sessions`: a discovery
bound or evicted tools, the loop guard evicted one), ``announce`` tells the client, which lists
the tools again. Client calls block on Redis, so they run in worker threads, off the event loop.
While Redis cannot be reached each such call is a tool error saying so, and the log says it
once when the first call fails (``redis_unavailable``) and once when a call reaches it again
(``redis_reconnected``, with how long it was away).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio.to_thread
import mcp_types as types
import redis
import structlog

from capdisc.agents.metatool import parse_metatool_arguments
from capdisc.client import Answer, Client
from capdisc.discovery.toolsets import metatool_result
from capdisc.errors import (
    BadRequestError,
    CapdiscError,
    ManifestError,
    RedisUnavailableError,
    RequestEncodeError,
    UpstreamError,
)
from capdisc.models import JSONDict
from capdisc.sessions.policy import argument_hash
from capdisc_producers.mcp_sessions import (
    Called,
    Discovered,
    Event,
    ListedTool,
    SessionTable,
    changed,
    next_tools,
)
from capdisc_producers.mcp_upstream import UpstreamPool, UpstreamTool, upstream_tool

RECORD_TOOL_NAME = "record_tool_call"
MAX_TOOL_ID_CHARS = 200

RECORD_TOOL: JSONDict = {
    "name": RECORD_TOOL_NAME,
    "title": "Record Tool Call",
    "description": "Record that a discovered tool was executed (tool_id: its capability id), "
    "so a repeating call is caught as a loop.",
    "inputSchema": {
        "type": "object",
        "properties": {"tool_id": {"type": "string"}, "arguments": {"type": ["object", "null"]}},
        "required": ["tool_id"],
        "additionalProperties": False,
    },
    # Changes only the session's working set; recording twice counts twice.
    "annotations": {
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": False,
        "openWorldHint": False,
    },
}

#: Tells the client of the call being answered that its tool list changed.
Announce = Callable[[], Awaitable[None]]
#: What a forwarded call whose arguments a session request cannot carry is recorded with.
ARGUMENTS_HASH = "arguments_hash"
#: What a client call that could not reach Redis raises.
REDIS_AWAY = (RedisUnavailableError, redis.ConnectionError, redis.TimeoutError)

T = TypeVar("T")

log = structlog.get_logger("capdisc.mcp")


class Gateway:
    """The tools' work for every session served: ``profile`` is the agent profile of each
    discovery, ``pool`` the upstream connections, ``own`` the names of capdisc's own tools
    (never shadowed by a listed one)."""

    def __init__(self, profile: str | None, pool: UpstreamPool, own: frozenset[str]) -> None:
        self.profile = profile
        self.pool = pool
        self.own = own
        self.sessions = SessionTable()
        self.redis = RedisOutage()

    def listed(self, session: str | None) -> list[JSONDict]:
        """The MCP definitions a session lists beyond capdisc's own tools."""
        return self.sessions.get(session).definitions()

    def tool(self, session: str | None, name: str) -> ListedTool | None:
        """The listed tool ``name`` of ``session``, if it lists one."""
        return self.sessions.get(session).named(name)

    async def discover(
        self, client: Client, arguments: Mapping[str, Any], session: str | None, announce: Announce
    ) -> dict[str, Any]:
        call = parse_metatool_arguments(arguments)
        answer = await self._ask(
            functools.partial(
                client.discover,
                call.query,
                kind=call.kind,
                limit=call.limit,
                only_available=bool(call.only_available),
                session=session,
                profile=self.profile,
                tool_format="mcp",
            )
        )
        if session is not None:
            await self._apply(session, discovered(answer), announce)
        return {
            **metatool_result(answer.raw),
            "session": answer.session,
            "tools": answer.tools,
            "tool_names": answer.tool_names,
        }

    async def record(
        self, client: Client, arguments: Mapping[str, Any], session: str | None, announce: Announce
    ) -> dict[str, Any]:
        call = parse_record_arguments(arguments)
        if session is None:
            raise CapdiscError(
                "record_tool_call needs an MCP session, and this request has "
                "none (a stateless HTTP request); connect with the initialize "
                "handshake (a 2025 protocol version) to get one"
            )
        outcome = await self._record(client, session, call.tool_id, call.arguments, announce)
        return {**outcome, "session": session}

    async def forward(
        self,
        client: Client,
        name: str,
        arguments: Mapping[str, Any],
        session: str | None,
        announce: Announce,
    ) -> types.CallToolResult:
        """Run the session's listed tool ``name`` on its upstream and record the call."""
        tool = self.tool(session, name)
        if tool is None or session is None:  # evicted by a call answered meanwhile
            return tool_error(f"{name} is no longer listed in this session; list the tools again")
        try:
            target = upstream_tool(tool.source)
        except UpstreamError as exc:
            return tool_error(str(exc))
        if target is None:
            return tool_error(no_upstream(tool))
        result = await self._call(client, session, tool, target, arguments)
        recorded = await self._record_quietly(client, session, tool, arguments, announce)
        return with_guidance(result, recorded)

    async def _call(
        self,
        client: Client,
        session: str,
        tool: ListedTool,
        target: UpstreamTool,
        arguments: Mapping[str, Any],
    ) -> types.CallToolResult:
        started = time.monotonic()
        try:
            result = await self.pool.call(target, arguments, client.tenant)
            outcome = "tool_error" if result.is_error else "ok"
        except UpstreamError as exc:
            result, outcome = tool_error(str(exc)), exc.code
        log.info(
            "mcp_tool_forwarded",
            session=session,
            tool=tool.capability_id,
            upstream=target.upstream.label,
            upstream_tool=target.name,
            outcome=outcome,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )
        return result

    async def _record(
        self,
        client: Client,
        session: str,
        tool_id: str,
        arguments: Any,
        announce: Announce,
    ) -> dict[str, Any]:
        outcome: dict[str, Any] = await self._ask(
            functools.partial(client.record_tool_call, session, tool_id, arguments)
        )
        await self._apply(session, Called(tool_id, bool(outcome.get("evicted"))), announce)
        return outcome

    async def _record_quietly(
        self,
        client: Client,
        session: str,
        tool: ListedTool,
        arguments: Mapping[str, Any],
        announce: Announce,
    ) -> dict[str, Any] | None:
        """Record a forwarded call; if capdisc cannot, the upstream's answer still goes back
        (the failure is logged). Arguments a session request cannot carry (larger than it, or
        nested deeper) are recorded as their hash, all that the loop guard compares."""
        try:
            try:
                return await self._record(
                    client, session, tool.capability_id, dict(arguments), announce
                )
            except (RequestEncodeError, BadRequestError):
                digest = {ARGUMENTS_HASH: argument_hash(arguments)}
                return await self._record(client, session, tool.capability_id, digest, announce)
        except (CapdiscError, redis.RedisError, ValueError) as exc:
            log.warning(
                "mcp_call_not_recorded", session=session, tool=tool.capability_id, error=str(exc)
            )
            return None

    async def _ask(self, call: Callable[[], T]) -> T:
        """A client call, in a worker thread; whether it reached Redis is told to
        :attr:`redis`."""
        try:
            result = await anyio.to_thread.run_sync(call)
        except REDIS_AWAY as exc:
            self.redis.failed(exc)
            raise
        except CapdiscError:  # answered with an error: Redis was reached
            self.redis.answered()
            raise
        self.redis.answered()
        return result

    async def _apply(self, session: str, event: Event, announce: Announce) -> None:
        before = self.sessions.get(session)
        after = next_tools(before, event, self.own)
        self.sessions.put(session, after)
        if changed(before, after):
            await announce()


class RedisOutage:
    """Whether the last call that needed capdisc's Redis reached it: said once when calls stop
    reaching it (``redis_unavailable``) and once when one does again (``redis_reconnected``)."""

    def __init__(self) -> None:
        self._down_since: float | None = None

    def failed(self, exc: Exception) -> None:
        if self._down_since is not None:
            return
        self._down_since = time.monotonic()
        log.warning(
            "redis_unavailable",
            error=str(exc),
            hint="each call meanwhile is a tool error saying so; calls are answered again "
            "once Redis is back (capdisc status shows whether the stack runs)",
        )

    def answered(self) -> None:
        if self._down_since is None:
            return
        outage_s = time.monotonic() - self._down_since
        self._down_since = None
        log.info("redis_reconnected", outage_s=round(outage_s, 3))


def discovered(answer: Answer) -> Discovered:
    """What a discovery answer binds, as the session's list policy reads it."""
    return Discovered(answer.tools, answer.tool_names, answer.tool_sources)


def no_upstream(tool: ListedTool) -> str:
    return (
        f"{tool.name} ({tool.capability_id}) has no upstream: it was not imported from an MCP "
        "server, so capdisc holds its definition only. Run it in the host, then report the "
        f"call with record_tool_call (tool_id {tool.capability_id!r})."
    )


def with_guidance(
    result: types.CallToolResult, recorded: Mapping[str, Any] | None
) -> types.CallToolResult:
    """The upstream's answer, with the loop guard's guidance after it when the call looped."""
    if not recorded or not recorded.get("loop_detected"):
        return result
    note = types.TextContent(text=f"capdisc: {recorded.get('guidance') or 'loop detected'}")
    return result.model_copy(update={"content": [*result.content, note]})


def tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


@dataclass(frozen=True)
class RecordCall:
    """One validated ``record_tool_call`` call."""

    tool_id: str
    arguments: dict[str, Any] | None = None


def parse_record_arguments(arguments: Mapping[str, Any]) -> RecordCall:
    """Check ``record_tool_call``'s arguments strictly, like the meta-tool's: the error names the
    argument."""
    unknown = [key for key in arguments if key not in ("tool_id", "arguments")]
    if unknown:
        raise ManifestError(
            RECORD_TOOL_NAME, str(unknown[0]), "unknown argument (use tool_id, arguments)"
        )
    tool_id = arguments.get("tool_id")
    if not isinstance(tool_id, str) or not tool_id.strip():
        raise ManifestError(
            RECORD_TOOL_NAME, "tool_id", "is required: the capability id of the tool executed"
        )
    if len(tool_id) > MAX_TOOL_ID_CHARS:
        raise ManifestError(
            RECORD_TOOL_NAME, "tool_id", f"is {len(tool_id)} characters; a capability id is shorter"
        )
    call_arguments = arguments.get("arguments")
    if call_arguments is not None and not isinstance(call_arguments, dict):
        raise ManifestError(
            RECORD_TOOL_NAME, "arguments", "must be the call's arguments as an object, or null"
        )
    return RecordCall(tool_id.strip(), call_arguments)
