"""``capdisc mcp``: capdisc as an MCP server (issue 5, "front doors").

Two tools, served over stdio (one host, one process) or streamable HTTP (many hosts):

* ``discover_capabilities`` - the meta-tool, listed exactly as capdisc defines it everywhere
  (:func:`capdisc.formats.to_mcp`: same name, description, input schema and annotations). A call
  is parsed by :func:`capdisc.metatool.parse_metatool_arguments` and answered by
  :meth:`capdisc.client.Client.discover` in the caller's session with ``tool_format="mcp"``. The
  result is :func:`capdisc.agent.metatool_result` (what the model reads) plus ``session`` (id,
  bound, added, evicted, redundant_search and its note, installable), ``tools`` (MCP tool
  definitions for the host to bind: the whole working set, the meta-tool first, identical to the
  one listed here) and ``tool_names`` (tool name -> capability id), as structured content and the
  same JSON as text.
* ``record_tool_call`` - records that the host executed a capability in the same session and
  returns ``loop_detected``, ``evicted`` and ``guidance``, so hosts that route calls through
  capdisc get the loop guard.

Sessions. Each MCP session is a capdisc session of the tenant served:

* stdio: one session per process, ``mcp-`` + a uuid made when the server starts.
* streamable HTTP: ``mcp-`` + the transport's ``mcp-session-id``, read from the HTTP request the
  lowlevel handler's ``ServerRequestContext.request`` carries (a Starlette ``Request``; it is
  ``None`` on stdio). The SDK's session manager only lets through session ids it issued, to the
  client it issued them to. mcp 2.x clients open the stateless 2026-07-28 era by default when a
  server offers it (``Client(mode="auto")`` probes ``server/discover``), and that era has no
  sessions; so over HTTP this server answers ``server/discover`` with the handshake-era versions
  only, which the SDK's probe reads as a legacy server and answers with the ``initialize``
  handshake (the go-sdk's stateful streamable server does the same). A request that still comes
  without a session (a client pinned to 2026-07-28) is answered without one: its discovery binds
  nothing (``session`` is null, ``tools`` are that turn's matches) and ``record_tool_call`` is
  refused.

The tools are served by the lowlevel ``mcp.server.Server`` with explicit ``tools/list`` and
``tools/call`` handlers, not ``MCPServer``, whose tools take their schema and argument validation
from a Python signature: here the schema must be capdisc's, and a model's arguments are checked by
capdisc's parser so its messages, naming the argument, come back as the tool's error. Client calls
block on Redis, so they run in worker threads, off the event loop.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import redis
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from capdisc.agent import metatool_result
from capdisc.client import Client
from capdisc.errors import CapdiscError, ManifestError
from capdisc.formats import to_mcp
from capdisc.metatool import METATOOL_NAME, parse_metatool_arguments
from capdisc.models import JSONDict
from capdisc.settings import Settings

SERVER_NAME = "capdisc"
RECORD_TOOL_NAME = "record_tool_call"
SESSION_HEADER = "mcp-session-id"
SESSION_PREFIX = "mcp-"
MAX_TOOL_ID_CHARS = 200

RECORD_TOOL: JSONDict = {
    "name": RECORD_TOOL_NAME,
    "title": "Record Tool Call",
    "description": "Record that a discovered tool was executed (tool_id: its capability id), "
                   "so a repeating call is caught as a loop.",
    "inputSchema": {
        "type": "object",
        "properties": {"tool_id": {"type": "string"},
                       "arguments": {"type": ["object", "null"]}},
        "required": ["tool_id"],
        "additionalProperties": False,
    },
    # Changes only the session's working set; recording twice counts twice.
    "annotations": {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False,
                    "openWorldHint": False},
}

Handler = Callable[[Mapping[str, Any], str | None], Awaitable[dict[str, Any]]]


def serve(settings: Settings, *, tenant: str, profile: str | None, host: str,
          port: int | None, roles: list[str] | None = None, user: str | None = None) -> None:
    """Serve until stdin closes (stdio, ``port`` None) or the process is interrupted (streamable
    HTTP on ``host:port``, at ``/mcp``), as a caller with ``roles`` and ``user`` in ``tenant``
    (only what they may see is discovered)."""
    client = Client.from_url(settings.redis_url, tenant=tenant,
                             timeout_s=settings.discover_timeout_s, roles=roles, user=user)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            if port is None:
                server = build_server(client, profile=profile,
                                      stdio_session=SESSION_PREFIX + uuid.uuid4().hex)
                anyio.run(_serve_stdio, server)
            else:
                server = build_server(client, profile=profile, stdio_session=None)
                anyio.run(_serve_http, server, host, port)
    finally:
        client.close()


def tool_definitions() -> list[types.Tool]:
    """The tools listed: capdisc's own MCP definition of the meta-tool, and record_tool_call."""
    return [types.Tool.model_validate(to_mcp([])[0]), types.Tool.model_validate(RECORD_TOOL)]


def build_server(client: Client, *, profile: str | None,
                 stdio_session: str | None) -> Server[Any]:
    """The MCP server; ``stdio_session`` is the session of every call that comes without an HTTP
    request (stdio), ``None`` over HTTP."""
    tools = CapdiscTools(client, profile)
    handlers: dict[str, Handler] = {METATOOL_NAME: tools.discover,
                                    RECORD_TOOL_NAME: tools.record_tool_call}
    schemas = {tool.name: tool.input_schema for tool in tool_definitions()}

    async def list_tools(_ctx: ServerRequestContext[Any],
                         _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_definitions())

    async def call_tool(ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        handler = handlers.get(params.name)
        if handler is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}; this server has "
                                                 f"{', '.join(handlers)}")
        return await run_tool(handler, params.arguments or {}, session_of(ctx, stdio_session))

    server: Server[Any] = Server(SERVER_NAME, on_list_tools=list_tools, on_call_tool=call_tool,
                                 get_tool_input_schema=schemas.get)
    if stdio_session is None:
        server.add_request_handler("server/discover", types.RequestParams,
                                   functools.partial(_handshake_only, server))
    return server


def session_of(ctx: ServerRequestContext[Any], stdio_session: str | None) -> str | None:
    """The capdisc session of a call: the HTTP transport's session, or the process's on stdio;
    ``None`` for an HTTP request without a session."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return stdio_session
    transport_session = headers.get(SESSION_HEADER)
    return SESSION_PREFIX + transport_session if transport_session else None


async def run_tool(handler: Handler, arguments: Mapping[str, Any],
                   session: str | None) -> types.CallToolResult:
    """The handler's answer as structured content and JSON text; capdisc's errors, and Redis
    being unreachable, as a tool error result with the message."""
    try:
        payload = await handler(arguments, session)
    except CapdiscError as exc:
        return _error(str(exc))
    except redis.RedisError as exc:
        return _error(f"capdisc cannot reach its Redis ({exc}); is the stack running?")
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(text=text)],
                                structured_content=payload)


def _error(message: str) -> types.CallToolResult:
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
        raise ManifestError(RECORD_TOOL_NAME, str(unknown[0]),
                            "unknown argument (use tool_id, arguments)")
    tool_id = arguments.get("tool_id")
    if not isinstance(tool_id, str) or not tool_id.strip():
        raise ManifestError(RECORD_TOOL_NAME, "tool_id",
                            "is required: the capability id of the tool executed")
    if len(tool_id) > MAX_TOOL_ID_CHARS:
        raise ManifestError(RECORD_TOOL_NAME, "tool_id",
                            f"is {len(tool_id)} characters; a capability id is shorter")
    call_arguments = arguments.get("arguments")
    if call_arguments is not None and not isinstance(call_arguments, dict):
        raise ManifestError(RECORD_TOOL_NAME, "arguments",
                            "must be the call's arguments as an object, or null")
    return RecordCall(tool_id.strip(), call_arguments)


class CapdiscTools:
    """The tools' work: blocking :class:`Client` calls, each in a worker thread."""

    def __init__(self, client: Client, profile: str | None) -> None:
        self.client = client
        self.profile = profile

    async def discover(self, arguments: Mapping[str, Any], session: str | None
                       ) -> dict[str, Any]:
        call = parse_metatool_arguments(arguments)
        answer = await anyio.to_thread.run_sync(functools.partial(
            self.client.discover, call.query, kind=call.kind, limit=call.limit,
            only_available=bool(call.only_available), session=session, profile=self.profile,
            tool_format="mcp"))
        return {**metatool_result(answer.raw), "session": answer.session,
                "tools": answer.tools, "tool_names": answer.tool_names}

    async def record_tool_call(self, arguments: Mapping[str, Any], session: str | None
                               ) -> dict[str, Any]:
        call = parse_record_arguments(arguments)
        if session is None:
            raise CapdiscError("record_tool_call needs an MCP session, and this request has "
                               "none (a stateless HTTP request); connect with the initialize "
                               "handshake (a 2025 protocol version) to get one")
        outcome = await anyio.to_thread.run_sync(functools.partial(
            self.client.record_tool_call, session, call.tool_id, call.arguments))
        return {**outcome, "session": session}


async def _handshake_only(server: Server[Any], ctx: ServerRequestContext[Any],
                          _params: types.RequestParams | None) -> types.DiscoverResult:
    """``server/discover`` over HTTP: the handshake-era versions only, so that an mcp 2.x client
    in ``auto`` mode connects with ``initialize`` and gets a transport session."""
    return types.DiscoverResult(
        supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
        capabilities=server.get_capabilities(protocol_version=ctx.protocol_version),
        instructions=server.instructions)


async def _serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _serve_http(server: Server[Any], host: str, port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()
