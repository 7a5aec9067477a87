"""``capdisc mcp``: capdisc as an MCP server, one more front door beside the client and CLI.

Two tools, served over stdio (one host, one process) or streamable HTTP (many hosts):

* ``discover_capabilities`` - the meta-tool, listed exactly as capdisc defines it everywhere
  (:func:`capdisc.agents.formats.to_mcp`: same name, description, input schema and annotations). A
  call
  is parsed by :func:`capdisc.agents.metatool.parse_metatool_arguments` and answered by
  :meth:`capdisc.client.Client.discover` in the caller's session with ``tool_format="mcp"``. The
  result is :func:`capdisc.discovery.toolsets.metatool_result` (what the model reads) plus
  ``session`` (id,
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

Who asks. Over stdio, every call asks as the process that started the server: the holder of its
token (``--token`` or ``CAPDISC_TOKEN``, verified at start when the keyring is at hand). Over
streamable HTTP with auth on, the server is an OAuth resource server built from the SDK's own
pieces (``streamable_http_app(token_verifier=..., auth=AuthSettings(...))``: its bearer
middleware and ``RequireAuthMiddleware``): every request needs ``Authorization: Bearer TOKEN``
with the ``discover`` grant (401 with ``WWW-Authenticate: Bearer`` otherwise); each call asks as
that token's holder, and the SDK binds each MCP session to the token's subject. The workers
verify the token again. With auth off, HTTP callers ask as the process; on a host other than
loopback the server says so in its log.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import redis
import structlog
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import AnyHttpUrl

from capdisc.agents.formats import to_mcp
from capdisc.agents.metatool import METATOOL_NAME, parse_metatool_arguments
from capdisc.client import Client
from capdisc.discovery.toolsets import metatool_result
from capdisc.errors import AuthError, CapdiscError, ConfigError, ManifestError
from capdisc.identity import auth
from capdisc.identity.gate import Gate, require
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

Handler = Callable[[Client, Mapping[str, Any], str | None], Awaitable[dict[str, Any]]]
LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = structlog.get_logger("capdisc.mcp")


@dataclass(frozen=True)
class ServerAuth:
    """Who the server's callers are.

    ``token``: the identity of the process that started the server (stdio, and HTTP without
    auth): every call asks as its holder. ``gate``: with auth on, the keyring that verifies
    (the process token at start; over HTTP, each request's ``Authorization: Bearer`` token,
    whose holder the call then asks as). ``required``: HTTP requires bearer tokens."""

    token: str | None = None
    gate: Gate = field(default_factory=lambda: Gate(None))
    required: bool = False


def serve(
    settings: Settings,
    *,
    tenant: str,
    profile: str | None,
    host: str,
    port: int | None,
    roles: list[str] | None = None,
    user: str | None = None,
    access: ServerAuth | None = None,
    tenant_given: bool = False,
) -> None:
    """Serve until stdin closes (stdio, ``port`` None) or the process is interrupted (streamable
    HTTP on ``host:port``, at ``/mcp``), as a caller with ``roles`` and ``user`` in ``tenant``
    (only what they may see is discovered). With ``access.required`` over HTTP, each request
    asks as the holder of its bearer token, in the token's tenant (``tenant`` when
    ``tenant_given``: a token for another tenant is then refused)."""
    access = access or ServerAuth()
    if access.required and not access.gate.enabled:
        raise ConfigError(
            "auth is on but capdisc mcp has no keyring to verify tokens with; "
            "point CAPDISC_AUTH_KEYS_FILE at it, or set CAPDISC_AUTH=off"
        )
    if port is None or not access.required:  # over HTTP with auth, each request has its own
        check_process_token(access, tenant, time.time())
    client = Client.from_url(
        settings.redis_url,
        tenant=tenant,
        timeout_s=settings.discover_timeout_s,
        roles=roles,
        user=user,
        token=access.token,
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):
            if port is None:
                server = build_server(
                    client, profile=profile, stdio_session=SESSION_PREFIX + uuid.uuid4().hex
                )
                anyio.run(_serve_stdio, server)
            else:
                holders = Holders(client, access.required, tenant if tenant_given else None)
                server = build_server(client, profile=profile, stdio_session=None, holders=holders)
                anyio.run(_serve_http, server, host, port, access)
    finally:
        client.close()


def check_process_token(access: ServerAuth, tenant: str, now: float) -> None:
    """The process's identity, checked at start: verified when the keyring is at hand (an
    :class:`~capdisc.errors.AuthError` stops the server), required when auth is on. Without
    the keyring the workers verify it on every call."""
    if (access.token is None and not access.required) or not access.gate.enabled:
        return
    identity = access.gate.identity(access.token)
    require(identity, tenant, "session")
    log.info("mcp_identity", tenant=tenant, **auth.label(access.token))


def tool_definitions() -> list[types.Tool]:
    """The tools listed: capdisc's own MCP definition of the meta-tool, and record_tool_call."""
    return [types.Tool.model_validate(to_mcp([])[0]), types.Tool.model_validate(RECORD_TOOL)]


class Holders:
    """The client each call asks with: the process's, or over HTTP with auth, one asking as the
    holder of the request's verified bearer token (sharing the process's connection)."""

    def __init__(self, client: Client, required: bool, tenant: str | None) -> None:
        self.client = client
        self.required = required
        self.tenant = tenant

    def for_call(self, ctx: ServerRequestContext[Any]) -> Client:
        if not self.required:
            return self.client
        user = getattr(ctx.request, "scope", {}).get("user")
        access_token = getattr(user, "access_token", None)
        if not isinstance(access_token, AccessToken):  # the middleware lets none through
            raise AuthError("this request carries no verified bearer token", "missing")
        claims = access_token.claims or {}
        tenant = self.tenant or (
            None if claims.get("tenant") == auth.ALL_TENANTS else claims.get("tenant")
        )
        return self.client.as_holder(access_token.token, tenant)


def build_server(
    client: Client,
    *,
    profile: str | None,
    stdio_session: str | None,
    holders: Holders | None = None,
) -> Server[Any]:
    """The MCP server; ``stdio_session`` is the session of every call that comes without an HTTP
    request (stdio), ``None`` over HTTP; ``holders`` picks each call's client (default: the
    process's)."""
    holders = holders or Holders(client, False, None)
    tools = CapdiscTools(profile)
    handlers: dict[str, Handler] = {
        METATOOL_NAME: tools.discover,
        RECORD_TOOL_NAME: tools.record_tool_call,
    }
    schemas = {tool.name: tool.input_schema for tool in tool_definitions()}

    async def list_tools(
        _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_definitions())

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        handler = handlers.get(params.name)
        if handler is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"unknown tool {params.name!r}; this server has {', '.join(handlers)}",
            )
        try:
            caller = holders.for_call(ctx)
        except AuthError as exc:
            return _error(str(exc))
        return await run_tool(
            functools.partial(handler, caller),
            params.arguments or {},
            session_of(ctx, stdio_session),
        )

    server: Server[Any] = Server(
        SERVER_NAME,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=schemas.get,
    )
    if stdio_session is None:
        server.add_request_handler(
            "server/discover", types.RequestParams, functools.partial(_handshake_only, server)
        )
    return server


def session_of(ctx: ServerRequestContext[Any], stdio_session: str | None) -> str | None:
    """The capdisc session of a call: the HTTP transport's session, or the process's on stdio;
    ``None`` for an HTTP request without a session."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return stdio_session
    transport_session = headers.get(SESSION_HEADER)
    return SESSION_PREFIX + transport_session if transport_session else None


async def run_tool(
    handler: Callable[[Mapping[str, Any], str | None], Awaitable[dict[str, Any]]],
    arguments: Mapping[str, Any],
    session: str | None,
) -> types.CallToolResult:
    """The handler's answer as structured content and JSON text; capdisc's errors, and Redis
    being unreachable, as a tool error result with the message."""
    try:
        payload = await handler(arguments, session)
    except CapdiscError as exc:
        return _error(str(exc))
    except redis.RedisError as exc:
        return _error(f"capdisc cannot reach its Redis ({exc}); is the stack running?")
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=payload)


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


class CapdiscTools:
    """The tools' work: blocking :class:`Client` calls, each in a worker thread."""

    def __init__(self, profile: str | None) -> None:
        self.profile = profile

    async def discover(
        self, client: Client, arguments: Mapping[str, Any], session: str | None
    ) -> dict[str, Any]:
        call = parse_metatool_arguments(arguments)
        answer = await anyio.to_thread.run_sync(
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
        return {
            **metatool_result(answer.raw),
            "session": answer.session,
            "tools": answer.tools,
            "tool_names": answer.tool_names,
        }

    async def record_tool_call(
        self, client: Client, arguments: Mapping[str, Any], session: str | None
    ) -> dict[str, Any]:
        call = parse_record_arguments(arguments)
        if session is None:
            raise CapdiscError(
                "record_tool_call needs an MCP session, and this request has "
                "none (a stateless HTTP request); connect with the initialize "
                "handshake (a 2025 protocol version) to get one"
            )
        outcome = await anyio.to_thread.run_sync(
            functools.partial(client.record_tool_call, session, call.tool_id, call.arguments)
        )
        return {**outcome, "session": session}


async def _handshake_only(
    server: Server[Any], ctx: ServerRequestContext[Any], _params: types.RequestParams | None
) -> types.DiscoverResult:
    """``server/discover`` over HTTP: the handshake-era versions only, so that an mcp 2.x client
    in ``auto`` mode connects with ``initialize`` and gets a transport session."""
    return types.DiscoverResult(
        supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
        capabilities=server.get_capabilities(protocol_version=ctx.protocol_version),
        instructions=server.instructions,
    )


async def _serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _serve_http(server: Server[Any], host: str, port: int, access: ServerAuth) -> None:
    import uvicorn

    if access.required:
        app = server.streamable_http_app(
            host=host, token_verifier=KeyringVerifier(access.gate), auth=resource_server(host, port)
        )
    else:
        if host not in LOOPBACK:
            log.warning(
                "mcp_http_without_auth",
                host=host,
                port=port,
                hint="anyone who reaches this port asks as this process's identity; "
                "turn auth on (CAPDISC_AUTH=on, CAPDISC_AUTH_KEYS_FILE) so each "
                "request needs a bearer token",
            )
        app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def resource_server(host: str, port: int) -> AuthSettings:
    """The SDK's resource-server settings: ``/mcp`` requires a bearer token with the
    ``discover`` grant (401 with ``WWW-Authenticate: Bearer`` otherwise). Tokens are issued out
    of band (``capdisc token issue``): there is no authorization server, so no metadata is
    advertised (the issuer URL, required by the model, is this server's and only nominal);
    the verifier checks issuer and audience itself."""
    return AuthSettings(
        issuer_url=AnyHttpUrl(f"http://{_url_host(host)}:{port}"),
        resource_server_url=None,
        required_scopes=["discover"],
        validate_token_resource=False,
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class KeyringVerifier:
    """The SDK's ``TokenVerifier`` over capdisc's keyring: a bearer token is valid when it
    verifies (:func:`capdisc.identity.auth.verify`); its grants are its scopes, its subject the
    principal the SDK binds each MCP session to. The token is logged by kid and subject only."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            identity = self.gate.identity(token)
        except AuthError as exc:
            log.warning("mcp_token_refused", reason=exc.reason, **auth.label(token))
            return None
        return AccessToken(
            token=token,
            client_id=identity.subject,
            subject=identity.subject,
            scopes=sorted(identity.grants),
            expires_at=identity.expires_at,
            claims={"iss": auth.ISSUER, "tenant": identity.tenant, "kid": identity.kid},
        )
