"""``capdisc mcp``: capdisc as an MCP server, and a gateway to the tools it discovers.

Served over stdio (one host, one process) or streamable HTTP (many hosts). Each MCP session
lists capdisc's own two tools and the tools a discovery bound in it
(:mod:`capdisc_producers.mcp_gateway` does the work, :mod:`capdisc_producers.mcp_sessions`
keeps the lists):

* ``discover_capabilities`` - the meta-tool, listed exactly as capdisc defines it everywhere
  (:func:`capdisc.agents.formats.to_mcp`: same name, description, input and output schemas and
  annotations). Its arguments are checked by
  :func:`capdisc.agents.metatool.parse_metatool_arguments`; its result (structured content, and
  the same JSON as text) is what was found plus ``session``, ``tools`` and ``tool_names``.
* ``record_tool_call`` - the host ran a tool itself: recorded in the session, so the loop guard
  applies (``loop_detected``, ``evicted``, ``guidance``).
* the session's working set - each tool a discovery bound (always-include ones too) joins the
  session's ``tools/list`` and leaves it when evicted, each change announced with
  ``notifications/tools/list_changed`` on the stream of the call that made it. A call to one
  imported from an MCP server is forwarded there (pooled connections,
  ``mcp_upstream_timeout_s``), recorded in the session and logged; when the loop guard evicts
  it, it leaves the list. A tool with no upstream is a definition only: calling it is a tool
  error telling the host to run it and record the call.

Sessions. Each MCP session is a capdisc session of the tenant served:

* stdio: one session per process, ``mcp-`` + a uuid made when the server starts.
* streamable HTTP: ``mcp-`` + the transport's ``mcp-session-id``, read from the HTTP request the
  lowlevel handler's ``ServerRequestContext.request`` carries (a Starlette ``Request``; it is
  ``None`` on stdio). The SDK's session manager only lets through session ids it issued, to the
  client it issued them to.

A tool list that changes needs a session to announce it on, and the stateless 2026-07-28 era
has none (mcp 2.x clients open it by default when a server offers it: ``Client(mode="auto")``
probes ``server/discover``). So this server speaks the handshake era and declares
``tools.listChanged``: over HTTP it answers ``server/discover`` with the handshake-era versions
only, which the SDK's probe reads as a legacy server and answers with the ``initialize``
handshake (the go-sdk's stateful streamable server does the same); over stdio it serves the
handshake loop alone, which refuses the probe, and the client falls back to ``initialize`` the
same way. A request that still comes without a session over HTTP (a client pinned to
2026-07-28) is answered without one: its discovery binds nothing (``session`` is null,
``tools`` are that turn's matches), ``record_tool_call`` is refused and no tool is listed or
forwarded.

The tools are served by the lowlevel ``mcp.server.Server`` with explicit ``tools/list`` and
``tools/call`` handlers, not ``MCPServer``, whose tools take their schema and argument validation
from a Python signature: here the schema must be capdisc's, a model's arguments are checked by
capdisc's parser so its messages, naming the argument, come back as the tool's error, and the
list differs per session.

Who asks. Over stdio, every call asks as the process that started the server: the holder of its
token (``--token`` or ``CAPDISC_TOKEN``, verified at start when the keyring is at hand). Over
streamable HTTP with auth on, the server is an OAuth resource server built from the SDK's own pieces
(``streamable_http_app(token_verifier=..., auth=AuthSettings(...))``: its bearer middleware and
``RequireAuthMiddleware``): every request needs ``Authorization: Bearer TOKEN`` with the
``discover`` and ``session`` grants (401 with ``WWW-Authenticate: Bearer`` otherwise, 403 without
the grants); each call asks as that token's holder, and the SDK binds each MCP session to the
token's holder (tenant, roles, user, subject). The workers verify the token again. With auth
off, HTTP callers ask as the process;
on a host other than loopback the server says so in its log. When an upstream's tools change, the
re-import is published with the import token (``--import-token`` or ``CAPDISC_MCP_IMPORT_TOKEN``,
default the process's token), which with auth on needs the ``write`` grant: the token an MCP host is
given normally has not. With the keyring at hand, a token that may not write the tenant served is
said at start (``mcp_upstream_reimport_off``, once) and re-imports are not published (each change is
logged as ``mcp_upstream_reimport_skipped``); without it, the workers verify.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import mcp_types as types
import redis
import structlog
from mcp.server import InitializationOptions, NotificationOptions, Server, ServerRequestContext
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import AnyHttpUrl, ValidationError
from starlette.types import ASGIApp

from capdisc.agents.formats import to_mcp
from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Client
from capdisc.errors import AuthError, CapdiscError, ConfigError
from capdisc.identity import auth
from capdisc.identity.gate import Gate, require
from capdisc.logs import configure_logging
from capdisc.models import JSONDict
from capdisc.settings import Settings
from capdisc.version import package_version
from capdisc_producers.bearer import BearerReasons
from capdisc_producers.bodylimit import BodyLimit
from capdisc_producers.mcp_gateway import (
    RECORD_TOOL,
    RECORD_TOOL_NAME,
    Announce,
    Gateway,
    tool_error,
)
from capdisc_producers.mcp_reimport import IMPORT_TOKEN_HINT, Reimporter
from capdisc_producers.mcp_upstream import UpstreamPool

if TYPE_CHECKING:
    import uvicorn

SERVER_NAME = "capdisc"
SESSION_HEADER = "mcp-session-id"
SESSION_PREFIX = "mcp-"

#: One of capdisc's own tools: the caller, the arguments, the session, how to announce changes.
Handler = Callable[[Client, Mapping[str, Any], str | None, Announce], Awaitable[dict[str, Any]]]
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: What ``tools/list`` announces: the list changes as discoveries bind and evict tools.
NOTIFICATIONS = NotificationOptions(tools_changed=True)
#: The signals that stop the server (as asked: exit 0, once its upstream servers are stopped).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Libraries that log every request or session at INFO.
CHATTY_LOGGERS = ("mcp", "httpx", "httpx2", "uvicorn.access")

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
    """Serve until stdin closes or a SIGTERM, SIGINT or SIGHUP comes (stdio, ``port`` None) or
    the process is interrupted (streamable HTTP on ``host:port``, at ``/mcp``), as a caller with
    ``roles`` and ``user`` in ``tenant`` (only what they may see is discovered). With
    ``access.required`` over HTTP, each request asks as the holder of its bearer token, in the
    token's tenant (``tenant`` when ``tenant_given``: a token for another tenant is then
    refused)."""
    access = access or ServerAuth()
    configure_server_logging(settings)
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
    pool = upstream_pool(settings, access, tenant if tenant_given or port is None else None)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            if port is None:
                session = SESSION_PREFIX + uuid.uuid4().hex
                server = build_server(client, profile=profile, stdio_session=session, pool=pool)
                anyio.run(_serve_stdio, server, pool)
            else:
                holders = Holders(client, access.required, tenant if tenant_given else None)
                server = build_server(
                    client, profile=profile, stdio_session=None, holders=holders, pool=pool
                )
                for stop in STOP_SIGNALS[1:]:  # SIGTERM and SIGHUP: Ctrl-C, as uvicorn reads it
                    signal.signal(stop, _interrupt)
                anyio.run(_serve_http, server, pool, host, port, access)
    finally:
        client.close()


def configure_server_logging(settings: Settings) -> None:
    """A server logs at the settings' level (the command line's default is warnings only), on
    stderr (stdout is the stdio transport); the SDK's and HTTP clients' per-request lines are
    left out below warnings."""
    configure_logging(settings.log_level, settings.log_format)
    for chatty in CHATTY_LOGGERS:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))


def upstream_pool(settings: Settings, access: ServerAuth, tenant: str | None) -> UpstreamPool:
    """The connections to the MCP servers tools were imported from; when one's tools change,
    they are re-imported into the registry as ``capdisc import mcp`` would, with the import
    token (``mcp_import_token``, else the process's), checked at start for ``tenant`` (None:
    over HTTP without ``--tenant``, the token's own; each change is checked for its tenants)."""
    timeout_s = settings.mcp_upstream_timeout_s
    token = settings.mcp_import_token or access.token
    reimporter = Reimporter(
        settings.redis_url,
        token,
        wait_s=timeout_s,
        gate=access.gate,
        max_event_bytes=settings.event_max_bytes,
    )
    check_import_token(reimporter, tenant)
    return UpstreamPool(timeout_s, reimporter, settings.mcp_max_result_bytes)


def check_import_token(reimporter: Reimporter, tenant: str | None) -> None:
    """Said once at start: with the keyring at hand, an import token the indexing workers would
    refuse in ``tenant`` means upstream changes are not re-imported (the reimporter skips
    them). Without the keyring nothing is said: the workers verify each event."""
    refusal = reimporter.refusal(tenant)
    if refusal is not None:
        log.warning(
            "mcp_upstream_reimport_off",
            tenant=tenant,
            reason=refusal,
            hint=IMPORT_TOKEN_HINT,
            **auth.label(reimporter.token),
        )


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
    """capdisc's own tools: its MCP definition of the meta-tool, and record_tool_call."""
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


class GatewayServer(Server[Any]):
    """The lowlevel server, declaring that its tool list changes: the streamable HTTP session
    manager builds each session's initialization options with no arguments."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NOTIFICATIONS, experimental_capabilities, extensions
        )


def build_server(
    client: Client,
    *,
    profile: str | None,
    stdio_session: str | None,
    holders: Holders | None = None,
    pool: UpstreamPool | None = None,
) -> Server[Any]:
    """The MCP server; ``stdio_session`` is the session of every call that comes without an HTTP
    request (stdio), ``None`` over HTTP; ``holders`` picks each call's client (default: the
    process's); ``pool`` reaches the upstream servers (run it around the server)."""
    holders = holders or Holders(client, False, None)
    own = tool_definitions()
    gateway = Gateway(profile, pool or UpstreamPool(30.0), frozenset(t.name for t in own))
    handlers: dict[str, Handler] = {
        METATOOL_NAME: gateway.discover,
        RECORD_TOOL_NAME: gateway.record,
    }
    schemas = {tool.name: tool.input_schema for tool in own}

    async def list_tools(
        ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = gateway.listed(session_of(ctx, stdio_session))
        return types.ListToolsResult(tools=[*tool_definitions(), *sdk_tools(listed)])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        session = session_of(ctx, stdio_session)
        handler = handlers.get(params.name)
        if handler is None and gateway.tool(session, params.name) is None:
            raise MCPError(types.INVALID_PARAMS, unknown_tool(params.name, handlers))
        try:
            caller = holders.for_call(ctx)
        except AuthError as exc:
            return tool_error(str(exc))
        announce = functools.partial(announce_list_changed, ctx)
        arguments = params.arguments or {}
        if handler is None:
            return await gateway.forward(caller, params.name, arguments, session, announce)
        return await run_tool(functools.partial(handler, caller, arguments, session, announce))

    server = GatewayServer(
        SERVER_NAME,
        version=package_version(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=schemas.get,
    )
    server.add_request_handler(
        "server/discover", types.RequestParams, functools.partial(_handshake_only, server)
    )
    return server


def unknown_tool(name: str, handlers: Mapping[str, Handler]) -> str:
    return (
        f"unknown tool {name!r}; this server has {', '.join(handlers)} and, in an MCP session, "
        "the tools a discovery bound there (list them again: tools/list)"
    )


def sdk_tools(definitions: list[JSONDict]) -> list[types.Tool]:
    """The listed definitions as the SDK's ``Tool``; one it refuses is left out (logged)."""
    tools: list[types.Tool] = []
    for definition in definitions:
        try:
            tools.append(types.Tool.model_validate(definition))
        except ValidationError as exc:
            log.warning("mcp_tool_unlisted", tool=definition.get("name"), error=str(exc))
    return tools


async def announce_list_changed(ctx: ServerRequestContext[Any]) -> None:
    """``notifications/tools/list_changed`` on the stream of the call being answered, so the
    client has it before the call's result. Only handshake-era sessions can carry it."""
    if ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return
    await ctx.session.send_notification(
        types.ToolListChangedNotification(), related_request_id=ctx.request_id
    )


def session_of(ctx: ServerRequestContext[Any], stdio_session: str | None) -> str | None:
    """The capdisc session of a call: the HTTP transport's session, or the process's on stdio;
    ``None`` for an HTTP request without a session."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return stdio_session
    transport_session = headers.get(SESSION_HEADER)
    return SESSION_PREFIX + transport_session if transport_session else None


async def run_tool(handler: Callable[[], Awaitable[dict[str, Any]]]) -> types.CallToolResult:
    """The handler's answer as structured content and JSON text; capdisc's errors, and Redis
    being unreachable, as a tool error result with the message."""
    try:
        payload = await handler()
    except CapdiscError as exc:
        return tool_error(str(exc))
    except redis.RedisError as exc:
        return tool_error(f"capdisc cannot reach its Redis ({exc}); is the stack running?")
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=payload)


async def _handshake_only(
    server: Server[Any], ctx: ServerRequestContext[Any], _params: types.RequestParams | None
) -> types.DiscoverResult:
    """``server/discover``: the handshake-era versions only, so that an mcp 2.x client in
    ``auto`` mode connects with ``initialize`` and gets a session whose tool list can change."""
    return types.DiscoverResult(
        supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
        capabilities=server.get_capabilities(NOTIFICATIONS, protocol_version=ctx.protocol_version),
        instructions=server.instructions,
    )


async def _serve_stdio(server: Server[Any], pool: UpstreamPool) -> None:
    """One connection over stdin and stdout, in the handshake era only (``serve_loop``, as the
    HTTP session manager drives each session; ``Server.run`` would let a ``server/discover``
    probe open the stateless era): the probe is refused, and the client sends ``initialize``."""
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    options = server.create_initialization_options()
    async with pool.running(), anyio.create_task_group() as tasks:
        tasks.start_soon(_stop_on_signal, pool)
        async with (
            stdio_server() as (read_stream, write_stream),
            server.lifespan(server) as state,
        ):
            await serve_loop(
                server, read_stream, write_stream, lifespan_state=state, init_options=options
            )
        tasks.cancel_scope.cancel()


def _interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM or SIGHUP taken as Ctrl-C (SIGINT), so that the server stopped with either stops
    its upstream servers and exits 0 as it does on Ctrl-C: uvicorn shuts down on SIGINT (and
    on SIGTERM, then raises it again for the handler it found), and the SIGINT cancels the
    serving as Ctrl-C does."""
    signal.raise_signal(signal.SIGINT)


async def _stop_on_signal(pool: UpstreamPool) -> None:
    """A host that stops the server with SIGTERM, SIGINT (Ctrl-C) or SIGHUP (its terminal
    closed), rather than by closing
    stdin: each upstream server is stopped first (they run in sessions of their own, which a
    signal to this process does not reach, so dying at once would leave them running), then
    the process exits 0, stopped when asked, at once (waiting for the serving to end would wait
    on the thread that reads stdin, until the host writes or closes it)."""
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async for received in signals:
            log.info("mcp_stopping", signal=signal.Signals(received).name)
            with anyio.CancelScope(shield=True):
                await pool.close()
            break
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


async def _serve_http(
    server: Server[Any], pool: UpstreamPool, host: str, port: int, access: ServerAuth
) -> None:
    import uvicorn

    app: ASGIApp
    if access.required:
        app = BearerReasons(
            server.streamable_http_app(
                host=host,
                token_verifier=KeyringVerifier(access.gate),
                auth=resource_server(host, port),
            ),
            access.gate,
            log,
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
    listening = listening_socket(host, port)
    config = uvicorn.Config(BodyLimit(app), host=host, port=port, log_level="warning")
    async with pool.running():
        await stopping_upstreams(uvicorn.Server(config), pool).serve(sockets=[listening])


def stopping_upstreams(server: uvicorn.Server, pool: UpstreamPool) -> uvicorn.Server:
    """``server``, stopping the upstream servers as the last step of its shutdown. uvicorn
    raises the SIGTERM or SIGINT it caught again as ``serve`` returns, which ends the process
    before the pool is left; stdio upstreams run in sessions of their own, which that signal
    does not reach, so they would be left running."""
    shutdown = server.shutdown

    async def shutdown_then_upstreams(sockets: list[socket.socket] | None = None) -> None:
        await shutdown(sockets)
        with anyio.CancelScope(shield=True):
            await pool.close()

    server.shutdown = shutdown_then_upstreams  # type: ignore[method-assign]
    return server


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound to ``host:port`` here so that a port already taken is one
    clear error (:class:`ConfigError`) rather than uvicorn's exit from inside the server."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as exc:
        listening.close()
        advice = (
            "choose another --http port, or stop what holds this one"
            if exc.errno == errno.EADDRINUSE
            else f"--host {host!r} must be a name or address of this machine"
        )
        raise ConfigError(
            f"capdisc mcp cannot listen on {_url_host(host)}:{port} ({exc.strerror or exc}); "
            f"{advice}"
        ) from exc
    return listening


#: The grants a bearer token needs over HTTP: each MCP session is a capdisc session, so every
#: call asks in one (a token without ``session`` could connect and then do nothing).
HTTP_GRANTS = ("discover", "session")


def resource_server(host: str, port: int) -> AuthSettings:
    """The SDK's resource-server settings: ``/mcp`` requires a bearer token with the
    ``discover`` and ``session`` grants (401 with ``WWW-Authenticate: Bearer`` without a valid
    token, 403 ``insufficient_scope`` without those grants). Tokens are issued out
    of band (``capdisc token issue``): there is no authorization server, so no metadata is
    advertised (the issuer URL, required by the model, is this server's and only nominal);
    the verifier checks issuer and audience itself."""
    try:
        issuer_url = AnyHttpUrl(f"http://{_url_host(host)}:{port}")
    except ValidationError as exc:
        raise ConfigError(
            f"--host {host!r} is no host a URL can name ({exc.errors()[0]['msg']}); "
            "give a name or address of this machine, such as 127.0.0.1"
        ) from exc
    return AuthSettings(
        issuer_url=issuer_url,
        resource_server_url=None,
        required_scopes=list(HTTP_GRANTS),
        validate_token_resource=False,
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class KeyringVerifier:
    """The SDK's ``TokenVerifier`` over capdisc's keyring: a bearer token is valid when it
    verifies (:func:`capdisc.identity.auth.verify`); its grants are its scopes, and its holder
    (tenant, roles, user and subject: :func:`holder_id`) the principal the SDK binds each MCP
    session to, so that a token of another tenant or with other roles but the same subject
    cannot use that session. The token is logged by kid and subject only."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            # in a thread: the gate reads Redis's clock (a round trip every few seconds)
            identity = await anyio.to_thread.run_sync(self.gate.identity, token)
        except AuthError as exc:
            log.warning("mcp_token_refused", reason=exc.reason, **auth.label(token))
            return None
        return AccessToken(
            token=token,
            client_id=holder_id(identity),
            subject=identity.subject,
            scopes=sorted(identity.grants),
            expires_at=identity.expires_at,
            claims={"iss": auth.ISSUER, "tenant": identity.tenant, "kid": identity.kid},
        )


def holder_id(identity: auth.Identity) -> str:
    """Who holds a token, as the SDK compares principals: its tenant, roles, user and subject
    (a subject alone is the same for every anonymous holder of a tenant, and a user id may be
    the same in two tenants). A token issued again to the same holder keeps its sessions."""
    return json.dumps(
        [identity.tenant, sorted(identity.roles), identity.user, identity.subject],
        separators=(",", ":"),
    )
