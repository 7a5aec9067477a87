"""``capdisc mcp`` as a gateway: a real MCP client (``mcp`` 2.x) discovers through it, sees the
tools it bound join ``tools/list`` (announced with ``notifications/tools/list_changed``), and
calls them; the gateway forwards each call to the MCP server the tool was imported from.

Upstreams are real servers: ``mcp-server-time`` from PyPI (over stdio, and over streamable HTTP
through ``tests/fixtures/mcp_time_http.py``), and ``tests/fixtures/mcp_harbour_server.py``, whose
tools fail, hang and change the server's tool list. Every process a test starts is stopped when
it ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
import pytest
import redis
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs

from capdisc import keys
from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Client
from capdisc.errors import UpstreamError
from capdisc_producers.mcp_import import ServerTools
from capdisc_producers.mcp_reimport import Reimporter
from capdisc_producers.mcp_upstream import Upstream, UpstreamPool, UpstreamTool

from .conftest import ROOT, Stack, publish, stop_process, wait_for
from .test_cli import run_cli
from .test_import_mcp import free_port, stored

TIME_COMMAND = f"{sys.executable} -m mcp_server_time --local-timezone UTC"
HARBOUR = ROOT / "tests" / "fixtures" / "mcp_harbour_server.py"
TIME_HTTP = ROOT / "tests" / "fixtures" / "mcp_time_http.py"
ODD_LISTING = ROOT / "tests" / "fixtures" / "mcp_odd_listing_server.py"
GATEWAY = [sys.executable, "-m", "capdisc_producers.cli", "mcp"]
OWN_TOOLS = {METATOOL_NAME, "record_tool_call"}
UPSTREAM_TIMEOUT_S = 3
CONVERT = "mcp-time.convert_time"
NOON_UTC_IN_TOKYO = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}


# -- helpers -------------------------------------------------------------------------------------


class ListChanges:
    """The client's message handler: counts ``notifications/tools/list_changed``."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.count += 1
            self._changed.set()
            self._changed = anyio.Event()

    async def beyond(self, seen: int) -> None:
        """Wait (10 s at most) until more than ``seen`` have arrived."""
        with anyio.fail_after(10):
            while self.count <= seen:
                await self._changed.wait()


def import_upstream(stack: Stack, tenant: str, *source: str) -> int:
    """``capdisc import mcp`` the server, wait until a discovery worker serves it; the index
    version."""
    result = run_cli("import", "mcp", *source, "--tenant", tenant, env=stack.env)
    assert result.returncode == 0, result.stderr
    return served(stack, tenant, int(result.stdout.rsplit("index version ", 1)[1]))


def served(stack: Stack, tenant: str, version: int) -> int:
    Client(stack.connection(), tenant=tenant, timeout_s=30).discover("warm up", min_version=version)
    return version


def gateway_env(stack: Stack) -> dict[str, str]:
    return {**stack.env, "CAPDISC_MCP_UPSTREAM_TIMEOUT_S": str(UPSTREAM_TIMEOUT_S)}


def stdio_gateway(stack: Stack, tenant: str, cwd: Path = ROOT) -> StdioServerParameters:
    return StdioServerParameters(
        command=GATEWAY[0],
        args=[*GATEWAY[1:], "--tenant", tenant],
        env=gateway_env(stack),
        cwd=str(cwd),
    )


async def names(mcp: MCPClient) -> set[str]:
    return {tool.name for tool in (await mcp.list_tools()).tools}


async def discover(mcp: MCPClient, changes: ListChanges, query: str) -> dict[str, Any]:
    """A discovery that binds something new: its structured content, once the list change it
    made was announced."""
    seen = changes.count
    result = await mcp.call_tool(METATOOL_NAME, {"query": query})
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    await changes.beyond(seen)
    return result.structured_content


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def use_count(stack: Stack, tenant: str, session: str, cap_id: str) -> int:
    working = Client(stack.connection(), tenant=tenant, timeout_s=20).working_set(session)
    return next((b["use_count"] for b in working["bound"] if b["id"] == cap_id), 0)


def start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=out)


def listening(process: subprocess.Popen[bytes], port: int, log: Path) -> str:
    """The endpoint, once ``port`` accepts connections."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # readiness: the port accepts a connection
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if process.poll() is not None:
                raise AssertionError(f"{process.args} exited; see {log}") from None
            time.sleep(0.05)
    raise AssertionError(f"{process.args} did not listen within 30 s; see {log}")


@pytest.fixture
def serve_http(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts an HTTP server (``argv`` with ``{port}`` filled in) and returns its endpoint;
    every server started is stopped at the end."""
    running: list[subprocess.Popen[bytes]] = []

    def serve(argv: list[str], env: dict[str, str] | None = None) -> str:
        port = free_port()
        log = tmp_path / f"http-{port}.log"
        running.append(start([a.format(port=port) for a in argv], log, env))
        return listening(running[-1], port, log)

    yield serve
    for process in running:
        stop_process(process)


# -- a real server from PyPI, through the gateway ------------------------------------------------


def check_tokyo_noon(result: types.CallToolResult) -> None:
    """mcp-server-time's own answer: 12:00 UTC is 21:00 in Tokyo, nine hours ahead."""
    assert not result.is_error, text_of(result)
    answer = result.structured_content or {}
    assert answer["target"]["timezone"] == "Asia/Tokyo"
    assert answer["target"]["datetime"].endswith("T21:00:00+09:00")
    assert answer["time_difference"] == "+9.0h"
    assert json.loads(text_of(result)) == answer


def test_stdio_gateway_forwards_to_mcp_server_time_over_stdio(stack: Stack, tenant: str) -> None:
    import_upstream(stack, tenant, "--command", TIME_COMMAND)
    changes = ListChanges()
    seen: dict[str, Any] = {}

    async def body() -> None:
        gateway = stdio_gateway(stack, tenant)
        async with MCPClient(gateway, message_handler=changes) as mcp:
            seen["before"] = await names(mcp)
            seen["found"] = await discover(mcp, changes, "convert a time between timezones")
            seen["after"] = await names(mcp)
            seen["result"] = await mcp.call_tool(CONVERT, NOON_UTC_IN_TOKYO)

    anyio.run(body)
    assert seen["before"] == OWN_TOOLS
    assert seen["found"]["tool_names"][CONVERT] == "tool:mcp-time.convert_time"
    assert CONVERT in seen["after"] and seen["after"] > OWN_TOOLS
    check_tokyo_noon(seen["result"])
    session = seen["found"]["session"]["id"]
    assert use_count(stack, tenant, session, "tool:mcp-time.convert_time") == 1


def test_a_server_imported_by_a_relative_command_is_reached_from_another_directory(
    stack: Stack, tenant: str, tmp_path: Path
) -> None:
    relative = os.path.relpath(sys.executable, ROOT)  # a venv's python: a symlink, kept as one
    command = f"{relative} -m mcp_server_time --local-timezone UTC"
    result = run_cli(
        "import", "mcp", "--command", command, "--tenant", tenant, env=stack.env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    served(stack, tenant, int(result.stdout.rsplit("index version ", 1)[1]))
    changes = ListChanges()
    seen: dict[str, Any] = {}

    async def body() -> None:
        # started elsewhere, as a host starts it
        async with MCPClient(
            stdio_gateway(stack, tenant, tmp_path), message_handler=changes
        ) as mcp:
            await discover(mcp, changes, "convert a time between timezones")
            seen["result"] = await mcp.call_tool(CONVERT, NOON_UTC_IN_TOKYO)

    anyio.run(body)
    check_tokyo_noon(seen["result"])


def test_http_gateway_forwards_to_mcp_server_time_over_http(
    stack: Stack, tenant: str, serve_http: Callable[..., str]
) -> None:
    upstream = serve_http([sys.executable, str(TIME_HTTP), "{port}"])
    import_upstream(stack, tenant, "--url", upstream)
    gateway = serve_http([*GATEWAY, "--tenant", tenant, "--http", "{port}"], gateway_env(stack))
    changes = ListChanges()
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with MCPClient(gateway, message_handler=changes) as mcp:
            seen["found"] = await discover(mcp, changes, "convert a time between timezones")
            seen["after"] = await names(mcp)
            seen["result"] = await mcp.call_tool(CONVERT, NOON_UTC_IN_TOKYO)
            seen["now"] = await discover(mcp, changes, "current time in a timezone")
            seen["clock"] = await mcp.call_tool("mcp-time.get_current_time", {"timezone": "UTC"})

    anyio.run(body)
    assert CONVERT in seen["after"]
    check_tokyo_noon(seen["result"])
    assert not seen["clock"].is_error and seen["clock"].structured_content["timezone"] == "UTC"
    session = seen["found"]["session"]["id"]
    assert seen["now"]["session"]["id"] == session
    assert use_count(stack, tenant, session, "tool:mcp-time.convert_time") == 1
    assert use_count(stack, tenant, session, "tool:mcp-time.get_current_time") == 1


def test_an_upstream_restarted_under_the_gateway_is_reached_again(
    stack: Stack, tenant: str, serve_http: Callable[..., str], tmp_path: Path
) -> None:
    port = free_port()
    argv, log = [sys.executable, str(TIME_HTTP), str(port)], tmp_path / "time.log"
    upstream = [start(argv, log)]
    try:
        import_upstream(stack, tenant, "--url", listening(upstream[0], port, log))
        gateway = serve_http([*GATEWAY, "--tenant", tenant, "--http", "{port}"], gateway_env(stack))
        results = anyio.run(restarted_between_calls, gateway, upstream, argv, log, port)
    finally:
        for process in upstream:
            stop_process(process)
    first, lost, again = results
    check_tokyo_noon(first)
    assert lost.is_error and f"MCP server http://127.0.0.1:{port}/mcp failed" in text_of(lost)
    check_tokyo_noon(again)


async def restarted_between_calls(
    gateway: str, upstream: list[subprocess.Popen[bytes]], argv: list[str], log: Path, port: int
) -> list[types.CallToolResult]:
    """Call the time server, restart it (its sessions are gone), call it twice more: the first
    call after the restart fails, and the gateway connects again for the next."""
    changes = ListChanges()
    async with MCPClient(gateway, message_handler=changes) as mcp:
        await discover(mcp, changes, "convert a time between timezones")
        results = [await mcp.call_tool(CONVERT, NOON_UTC_IN_TOKYO)]
        await anyio.to_thread.run_sync(restart, upstream, argv, log, port)
        results.append(await mcp.call_tool(CONVERT, NOON_UTC_IN_TOKYO))
        results.append(await mcp.call_tool(CONVERT, NOON_UTC_IN_TOKYO))
    return results


def restart(upstream: list[subprocess.Popen[bytes]], argv: list[str], log: Path, port: int) -> None:
    stop_process(upstream[-1])
    upstream.append(start(argv, log))
    listening(upstream[-1], port, log)


# -- an upstream that fails, hangs, loops and changes its tools ----------------------------------


def harbour_tools(stack: Stack, tenant: str, *source: str) -> None:
    """Import the harbour server (over stdio unless ``source`` says otherwise)."""
    import_upstream(stack, tenant, *(source or ("--command", f"{sys.executable} {HARBOUR}")))


async def bind_harbour(mcp: MCPClient, changes: ListChanges, *tools: str) -> dict[str, Any]:
    """Discover by its name each harbour tool not listed yet (one discovery may bind several);
    the last answer."""
    found: dict[str, Any] = {}
    for tool in tools:
        if f"harbour-master.{tool}" not in await names(mcp):
            found = await discover(mcp, changes, f"harbour-master.{tool}")
        assert f"harbour-master.{tool}" in await names(mcp)
    return found


def test_upstream_failures_and_hangs_are_tool_errors_and_the_gateway_keeps_serving(
    stack: Stack, tenant: str
) -> None:
    harbour_tools(stack, tenant)
    changes = ListChanges()
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with MCPClient(stdio_gateway(stack, tenant), message_handler=changes) as mcp:
            await bind_harbour(mcp, changes, "get_wave_height", "get_currents", "get_water_level")
            dover = {"harbour": "Dover"}
            seen["failed"] = await mcp.call_tool("harbour-master.get_wave_height", dover)
            started = time.monotonic()
            seen["hung"] = await mcp.call_tool("harbour-master.get_currents", dover)
            seen["hung_s"] = time.monotonic() - started
            seen["after"] = await mcp.call_tool("harbour-master.get_water_level", dover)

    anyio.run(body)
    assert seen["failed"].is_error and "wave buoy off Dover is offline" in text_of(seen["failed"])
    assert seen["hung"].is_error
    assert f"did not answer 'get_currents' within {UPSTREAM_TIMEOUT_S} s" in text_of(seen["hung"])
    assert UPSTREAM_TIMEOUT_S <= seen["hung_s"] < UPSTREAM_TIMEOUT_S + 5
    assert not seen["after"].is_error
    assert text_of(seen["after"]) == "Dover: 2.4 m above chart datum"


def test_a_forwarded_call_that_loops_leaves_the_list(stack: Stack, tenant: str) -> None:
    harbour_tools(stack, tenant)
    changes = ListChanges()
    seen: dict[str, Any] = {"results": []}
    level = "harbour-master.get_water_level"

    async def body() -> None:
        async with MCPClient(stdio_gateway(stack, tenant), message_handler=changes) as mcp:
            seen["found"] = await bind_harbour(mcp, changes, "get_water_level")
            before = changes.count
            for _ in range(4):
                seen["results"].append(await mcp.call_tool(level, {"harbour": "Dover"}))
            await changes.beyond(before)
            seen["after"] = await names(mcp)
            try:
                await mcp.call_tool(level, {"harbour": "Dover"})
            except MCPError as exc:  # no longer listed: an unknown tool, a protocol error
                seen["stale"] = str(exc)

    anyio.run(body)
    *fine, looped = seen["results"]
    assert all(not r.is_error and "capdisc:" not in text_of(r) for r in fine)
    assert not looped.is_error and "Dover: 2.4 m" in text_of(looped)
    assert "capdisc: This tool was called repeatedly" in text_of(looped)
    assert level not in seen["after"] and seen["after"] >= OWN_TOOLS
    assert "unknown tool" in seen["stale"]


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"then": value}
    return value


@pytest.mark.parametrize(
    "arguments",
    [{"harbour": "Dover" + " " * 70_000 + "."}, {"harbour": "Dover", "route": nested(40)}],
    ids=["larger-than-a-request", "deeper-than-a-request"],
)
def test_a_forwarded_call_too_large_to_record_as_it_is_still_gets_the_loop_guard(
    stack: Stack, tenant: str, arguments: dict[str, Any]
) -> None:
    harbour_tools(stack, tenant)
    changes = ListChanges()
    results: list[types.CallToolResult] = []
    level = "harbour-master.get_water_level"

    async def body() -> None:
        async with MCPClient(stdio_gateway(stack, tenant), message_handler=changes) as mcp:
            await bind_harbour(mcp, changes, "get_water_level")
            for _ in range(4):
                results.append(await mcp.call_tool(level, arguments))

    with capture_logs():
        anyio.run(body)
    *fine, looped = results
    assert all(not r.is_error and "capdisc:" not in text_of(r) for r in fine)
    assert "capdisc: This tool was called repeatedly" in text_of(looped)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_upstream_whose_tools_change_is_imported_again(
    stack: Stack,
    tenant: str,
    connection: redis.Redis,
    serve_http: Callable[..., str],
    transport: str,
) -> None:
    source = ("--command", f"{sys.executable} {HARBOUR}")
    if transport == "http":
        source = ("--url", serve_http([sys.executable, str(HARBOUR), "http", "{port}"]))
    harbour_tools(stack, tenant, *source)
    changes = ListChanges()
    seen: dict[str, Any] = {}
    tides = "tool:harbour-master.get_tide_tables"

    async def body() -> None:
        async with MCPClient(stdio_gateway(stack, tenant), message_handler=changes) as mcp:
            await bind_harbour(mcp, changes, "open_tide_tables")
            seen["opened"] = await mcp.call_tool("harbour-master.open_tide_tables", {})
            await anyio.to_thread.run_sync(reimported, stack, connection, tenant, tides)
            seen["found"] = await bind_harbour(mcp, changes, "get_tide_tables")
            seen["tides"] = await mcp.call_tool(
                "harbour-master.get_tide_tables", {"harbour": "Dover"}
            )

    anyio.run(body)
    assert not seen["opened"].is_error, text_of(seen["opened"])
    assert seen["found"]["capabilities"][0]["id"] == tides
    assert "Dover: high water 06:12" in text_of(seen["tides"])
    record = stored(connection, tenant, tides)
    assert record and record["source_ref"]["source"] == f"mcp:{source[1]}"


def test_a_reimport_names_the_tools_it_refused_and_publishes_the_others(
    stack: Stack, tenant: str, connection: redis.Redis
) -> None:
    listing = ServerTools(
        "store",
        [
            {"name": "get item", "description": "Fetch an item by its id."},
            {"name": "get_item", "description": "Delete an item by its id."},
        ],
    )
    reimporter = Reimporter(stack.url, None, wait_s=20)

    with capture_logs() as logs:
        anyio.run(reimporter, Upstream("mcp:store", argv=("store",)), listing, frozenset({tenant}))

    (warning,) = [e for e in logs if e["event"] == "mcp_upstream_reimport_rejected"]
    assert warning["count"] == 1 and warning["upstream"] == "store"
    (why,) = cast(list[str], warning["rejected"])
    assert "mcp:store tool 'get_item'" in why and "the same as tool 'get item'" in why
    assert "fix them on the server" in str(warning["hint"])
    assert stored(connection, tenant, "tool:store.get_item")


def reimported(stack: Stack, connection: redis.Redis, tenant: str, cap_id: str) -> None:
    """The gateway's re-import reached the registry (its record is stored) and a discovery
    worker serves it."""
    wait_for(lambda: stored(connection, tenant, cap_id), 30, f"the re-import of {cap_id}")
    served(stack, tenant, int(connection.get(keys.version(tenant)) or 0))


# -- a tool with no upstream ---------------------------------------------------------------------


BLOCKING_UPSTREAM = """
import os, pathlib, sys, time
from mcp.server.mcpserver import MCPServer

server = MCPServer("lighthouse")


def wait_for_fog(harbour: str) -> str:
    pathlib.Path(sys.argv[1]).write_text(f"{os.getpid()} {os.getppid()}")
    time.sleep(600)  # blocking: the server does not end when its stdin closes
    return harbour


server.add_tool(wait_for_fog, description="Lighthouse fog watch: wait for fog at a harbour.")
server.run("stdio")
"""


#: Each signal over stdio; over HTTP, Ctrl-C and SIGTERM (SIGHUP takes SIGTERM's path there:
#: both are raised again as SIGINT by ``capdisc_producers.mcp_server._interrupt``).
STOPS = [
    ("stdio", signal.SIGTERM),
    ("stdio", signal.SIGINT),
    ("stdio", signal.SIGHUP),
    ("http", signal.SIGTERM),
    ("http", signal.SIGINT),
]


@pytest.mark.parametrize(("transport", "stop"), STOPS, ids=lambda v: getattr(v, "name", v))
def test_a_gateway_stopped_with_a_signal_stops_its_upstream_servers(
    stack: Stack,
    tenant: str,
    tmp_path: Path,
    serve_http: Callable[..., str],
    transport: str,
    stop: signal.Signals,
) -> None:
    script, pids = tmp_path / "lighthouse.py", tmp_path / "pids"
    script.write_text(BLOCKING_UPSTREAM)
    import_upstream(stack, tenant, "--command", f"{sys.executable} {script} {pids}")
    gateway: str | StdioServerParameters = stdio_gateway(stack, tenant)
    if transport == "http":
        gateway = serve_http([*GATEWAY, "--tenant", tenant, "--http", "{port}"], gateway_env(stack))
    changes = ListChanges()
    seen: dict[str, int] = {}

    async def wait_for_fog(mcp: MCPClient) -> None:
        with contextlib.suppress(MCPError):  # the gateway may end before it answers
            await mcp.call_tool("lighthouse.wait_for_fog", {"harbour": "Dover"})

    async def body() -> None:
        async with MCPClient(gateway, message_handler=changes) as mcp:
            await discover(mcp, changes, "lighthouse.wait_for_fog")
            async with anyio.create_task_group() as calls:
                calls.start_soon(wait_for_fog, mcp)
                while not pids.exists() or not pids.read_text():  # the call is upstream
                    await anyio.sleep(0.05)
                seen["upstream"], seen["gateway"] = map(int, pids.read_text().split())
                os.kill(seen["gateway"], stop)
                with anyio.fail_after(15):
                    while alive(seen["gateway"]):
                        await anyio.sleep(0.05)
                calls.cancel_scope.cancel()

    try:
        anyio.run(body)
        wait_for(lambda: not alive(seen["upstream"]), 10, "the upstream server's exit")
    finally:
        for pid in seen.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_tool_not_imported_from_mcp_is_a_definition_only(
    stack: Stack, tenant: str, registry: Path
) -> None:
    served(stack, tenant, publish(stack.url, registry, tenant).index_version)
    changes = ListChanges()
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with MCPClient(stdio_gateway(stack, tenant), message_handler=changes) as mcp:
            seen["found"] = await discover(mcp, changes, "post a message to slack")
            seen["listed"] = await names(mcp)
            seen["call"] = await mcp.call_tool(
                "slack-post-message", {"channel": "#ops", "text": "hi"}
            )

    anyio.run(body)
    assert "slack-post-message" in seen["listed"]
    assert seen["call"].is_error
    message = text_of(seen["call"])
    assert "has no upstream" in message and "record_tool_call" in message
    assert "tool:slack-post-message" in message


# -- the pool on its own -------------------------------------------------------------------------


def pool_call(upstream: Upstream, timeout_s: float, tool: str = "anything") -> str:
    """Call a tool on ``upstream`` through a pool of its own; the UpstreamError's message."""
    caught: list[UpstreamError] = []

    async def body() -> None:
        async with UpstreamPool(timeout_s).running() as pool:
            try:
                await pool.call(UpstreamTool(upstream, tool), {}, "t")
            except UpstreamError as exc:
                caught.append(exc)

    anyio.run(body)
    assert caught, "the call did not fail"
    return str(caught[0])


def test_a_tool_the_sdk_refuses_in_the_listing_leaves_the_other_tools_callable() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(10).running() as pool:
            answers.append(await pool.call(UpstreamTool(odd, "echo"), {"text": "ahoy"}, "t"))

    anyio.run(body)

    assert not answers[0].is_error
    assert text_of(answers[0]) == "ahoy"


def test_a_relisting_refuses_each_tool_the_sdk_cannot_read_and_keeps_the_others() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    heard: list[ServerTools] = []
    relisted = anyio.Event()

    async def changed(_upstream: Upstream, listing: ServerTools, _tenants: frozenset[str]) -> None:
        heard.append(listing)
        relisted.set()

    async def body() -> None:
        async with UpstreamPool(10, on_tools_changed=changed).running() as pool:
            await pool.call(UpstreamTool(odd, "break_listing"), {}, "t")
            with anyio.fail_after(10):
                await relisted.wait()

    anyio.run(body)

    listing = heard[0]
    assert [tool["name"] for tool in listing.tools] == ["echo"]
    assert [(r.name, r.position) for r in listing.refused] == [
        ("scramble", 1),
        ("", 3),
        ("peek", 4),
    ]
    assert "inputSchema" in listing.refused[0].reason


def test_an_answer_too_deep_to_read_is_named_when_the_call_times_out() -> None:
    deep = Upstream("mcp:deep", argv=(sys.executable, str(ODD_LISTING), "deep"))

    message = pool_call(deep, 2)

    assert "did not answer 'anything' within 2 s" in message
    assert "sent a message that could not be read, which may have been the answer" in message
    assert "recursion limit exceeded" in message


def test_an_answer_larger_than_the_limit_is_refused_saying_to_ask_for_less() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    caught: list[UpstreamError] = []
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(10, max_result_bytes=2048).running() as pool:
            answers.append(await pool.call(UpstreamTool(odd, "echo"), {"text": "ahoy"}, "t"))
            with pytest.raises(UpstreamError) as raised:
                await pool.call(UpstreamTool(odd, "echo"), {"text": "x" * 4096}, "t")
            caught.append(raised.value)

    anyio.run(body)

    assert text_of(answers[0]) == "ahoy"
    message = str(caught[0])
    assert "MCP server odd answered 'echo' with 41" in message
    assert "more than the 2048 bytes capdisc passes on" in message
    assert "asking for less" in message and "CAPDISC_MCP_MAX_RESULT_BYTES" in message


def test_a_stdio_answer_at_the_limit_passes_though_its_envelope_is_beyond_it() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    empty = types.CallToolResult(content=[types.TextContent(type="text", text="")])
    text = "x" * (2048 - len(empty.model_dump_json(by_alias=True, exclude_none=True)))
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(10, max_result_bytes=2048).running() as pool:
            answers.append(await pool.call(UpstreamTool(odd, "echo"), {"text": text}, "t"))

    anyio.run(body)

    assert text_of(answers[0]) == text  # 2,048 bytes as a result, more as a JSON-RPC line


def test_a_huge_answer_is_refused_without_reading_it_and_the_upstream_still_answers() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    caught: list[UpstreamError] = []
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(UPSTREAM_TIMEOUT_S * 2).running() as pool:
            with pytest.raises(UpstreamError) as raised:
                await pool.call(UpstreamTool(odd, "flood"), {"megabytes": 50}, "t")
            caught.append(raised.value)
            answers.append(await pool.call(UpstreamTool(odd, "echo"), {"text": "ahoy"}, "t"))

    anyio.run(body)

    message = str(caught[0])
    assert "MCP server odd answered 'flood' with 52.4 MB" in message, message
    assert "more than the 8.4 MB capdisc passes on (mcp_max_result_bytes)" in message
    assert text_of(answers[0]) == "ahoy"


FLOOD_HTTP = ROOT / "tests" / "fixtures" / "mcp_flood_http.py"
#: How far past the limit an answer over HTTP may be read: the envelope, and the chunk that
#: crossed the limit.
READ_PAST_LIMIT = 4096 + 256 * 1024


def flood_then_echo(endpoint: str, arguments: dict[str, Any]) -> tuple[str, str, list[Any]]:
    """Call ``flood`` over HTTP through a pool, then ``echo``: the flood's UpstreamError message
    (empty if it was answered), the echo's text, and the logs."""
    upstream = Upstream(f"mcp:{endpoint}", url=endpoint)
    caught: list[str] = []
    echoed: list[str] = []

    async def body() -> None:
        async with UpstreamPool(UPSTREAM_TIMEOUT_S * 4).running() as pool:
            try:
                await pool.call(UpstreamTool(upstream, "flood"), arguments, "t")
            except UpstreamError as exc:
                caught.append(str(exc))
            answer = await pool.call(UpstreamTool(upstream, "echo"), {"text": "ahoy"}, "t")
            echoed.append(text_of(answer))

    with capture_logs() as logs:
        anyio.run(body)
    return (caught or [""])[0], echoed[0], logs


def read_before_refusing(logs: list[Any]) -> int:
    (refused,) = [e for e in logs if e["event"] == "mcp_upstream_answer_too_large"]
    return int(refused["bytes_read"])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "event-stream"])
def test_a_huge_answer_over_http_is_refused_unread_and_the_upstream_still_answers(
    serve_http: Callable[..., str], stream: bool
) -> None:
    endpoint = serve_http([sys.executable, str(FLOOD_HTTP), "{port}"])

    message, echoed, logs = flood_then_echo(endpoint, {"megabytes": 200, "sse": stream})

    assert f"MCP server {endpoint} answered 'flood' with more than the 8.4 MB" in message
    assert "capdisc passes on (mcp_max_result_bytes)" in message
    assert "asking for less" in message and "CAPDISC_MCP_MAX_RESULT_BYTES" in message
    assert read_before_refusing(logs) <= 8 * 1024 * 1024 + READ_PAST_LIMIT
    assert echoed == "ahoy"


def test_an_event_stream_answer_above_the_sdks_own_event_limit_is_passed_on(
    serve_http: Callable[..., str],
) -> None:
    upstream_url = serve_http([sys.executable, str(FLOOD_HTTP), "{port}"])
    upstream = Upstream(f"mcp:{upstream_url}", url=upstream_url)
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(UPSTREAM_TIMEOUT_S * 4).running() as pool:
            flood = UpstreamTool(upstream, "flood")
            answers.append(await pool.call(flood, {"megabytes": 3, "sse": True}, "t"))

    anyio.run(body)

    assert text_of(answers[0]) == "x" * 3_000_000


def test_a_huge_log_notification_before_the_answer_is_skipped_and_the_answer_passed_on(
    serve_http: Callable[..., str],
) -> None:
    endpoint = serve_http([sys.executable, str(FLOOD_HTTP), "{port}"])
    upstream = Upstream(f"mcp:{endpoint}", url=endpoint)
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(UPSTREAM_TIMEOUT_S * 4).running() as pool:
            answers.append(await pool.call(UpstreamTool(upstream, "chatty"), {}, "t"))

    with capture_logs() as logs:
        anyio.run(body)

    assert text_of(answers[0]) == "after the chatter"
    (skipped,) = [e for e in logs if e["event"] == "mcp_upstream_message_skipped"]
    assert skipped["bytes_read"] <= 8 * 1024 * 1024 + READ_PAST_LIMIT


def test_a_json_answer_to_another_request_id_fails_the_call_at_once(
    serve_http: Callable[..., str],
) -> None:
    endpoint = serve_http([sys.executable, str(FLOOD_HTTP), "{port}"])
    upstream = Upstream(f"mcp:{endpoint}", url=endpoint)
    caught: list[UpstreamError] = []
    echoed: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(60).running() as pool:
            with anyio.fail_after(10), pytest.raises(UpstreamError) as raised:
                await pool.call(UpstreamTool(upstream, "stray"), {}, "t")
            caught.append(raised.value)
            echoed.append(await pool.call(UpstreamTool(upstream, "echo"), {"text": "ahoy"}, "t"))

    anyio.run(body)

    message = str(caught[0])
    assert f"MCP server {endpoint} answered 'stray' with JSON-RPC id 987654321, not" in message
    assert "breaks the protocol" in message and "check that the server runs" not in message
    assert text_of(echoed[0]) == "ahoy"


def test_a_stdio_answer_to_a_request_never_sent_fails_the_call_at_once() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    caught: list[UpstreamError] = []
    echoed: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(60).running() as pool:
            with anyio.fail_after(10), pytest.raises(UpstreamError) as raised:
                await pool.call(UpstreamTool(odd, "stray"), {}, "t")
            caught.append(raised.value)
            echoed.append(await pool.call(UpstreamTool(odd, "echo"), {"text": "ahoy"}, "t"))

    anyio.run(body)

    message = str(caught[0])
    assert "MCP server odd answered 'stray' with JSON-RPC id 987654321, not" in message
    assert "breaks the protocol" in message
    assert text_of(echoed[0]) == "ahoy"


def test_an_answer_that_is_no_tool_result_is_named_as_the_servers_fault() -> None:
    odd = Upstream("mcp:odd", argv=(sys.executable, str(ODD_LISTING)))
    caught: list[UpstreamError] = []
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(UPSTREAM_TIMEOUT_S).running() as pool:
            with pytest.raises(UpstreamError) as raised:
                await pool.call(UpstreamTool(odd, "garble"), {}, "t")
            caught.append(raised.value)
            answers.append(await pool.call(UpstreamTool(odd, "echo"), {"text": "ahoy"}, "t"))

    anyio.run(body)

    message = str(caught[0])
    assert "MCP server odd answered 'garble' with something that is no MCP tool result" in message
    assert "(content: Input should be a valid list)" in message
    assert "breaks the protocol" in message and "\n" not in message
    assert "check that the server runs" not in message and "errors.pydantic.dev" not in message
    assert text_of(answers[0]) == "ahoy"


ASKING_UPSTREAM = """
import os
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("pilot")


class Confirm(BaseModel):
    ok: bool


def whoami() -> str:
    return str(os.getpid())


async def ask_the_captain(ctx: Context) -> str:
    return str(await ctx.elicit("Bring her in?", Confirm))  # the gateway elicits nothing


server.add_tool(whoami)
server.add_tool(ask_the_captain)
server.run("stdio")
"""


def test_a_stdio_servers_invalid_request_error_keeps_its_connection(tmp_path: Path) -> None:
    script = tmp_path / "pilot.py"
    script.write_text(ASKING_UPSTREAM)
    pilot = Upstream(f"mcp:{script}", argv=(sys.executable, str(script)))
    answers: list[str] = []
    refused: list[MCPError] = []

    async def body() -> None:
        async with UpstreamPool(20).running() as pool:
            answers.append(text_of(await pool.call(UpstreamTool(pilot, "whoami"), {}, "t")))
            try:
                await pool.call(UpstreamTool(pilot, "ask_the_captain"), {}, "t")
            except UpstreamError as exc:
                assert isinstance(exc.__cause__, MCPError)
                refused.append(exc.__cause__)
            answers.append(text_of(await pool.call(UpstreamTool(pilot, "whoami"), {}, "t")))

    anyio.run(body)
    assert refused and refused[0].code == types.INVALID_REQUEST
    first, after = answers
    assert first == after  # the same server process: not stopped and started again


def test_a_stdio_server_that_exited_while_idle_is_started_again_for_the_next_call(
    tmp_path: Path,
) -> None:
    script = tmp_path / "pilot.py"
    script.write_text(ASKING_UPSTREAM)
    whoami = UpstreamTool(Upstream(f"mcp:{script}", argv=(sys.executable, str(script))), "whoami")
    answers: list[types.CallToolResult] = []

    async def body() -> None:
        async with UpstreamPool(20).running() as pool:
            with capture_logs() as logs:
                answers.append(await pool.call(whoami, {}, "t"))
                os.kill(int(text_of(answers[0])), signal.SIGKILL)  # it exits between calls
                with anyio.fail_after(10):
                    while not any(e["event"] == "mcp_upstream_ended" for e in logs):
                        await anyio.sleep(0.05)
            answers.append(await pool.call(whoami, {}, "t"))

    anyio.run(body)
    first, again = answers
    assert not again.is_error, text_of(again)
    assert text_of(again) != text_of(first)


def test_a_call_the_server_refused_says_so_rather_than_to_check_that_it_runs(
    tmp_path: Path,
) -> None:
    script = tmp_path / "pilot.py"
    script.write_text(ASKING_UPSTREAM)

    message = pool_call(
        Upstream(f"mcp:{script}", argv=(sys.executable, str(script))), 20, "ask_the_captain"
    )

    assert f"MCP server {script} refused 'ask_the_captain'" in message
    assert "Elicitation not supported" in message
    assert "check that the server runs" not in message


def test_a_server_that_cannot_be_started_is_an_upstream_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-server"

    message = pool_call(Upstream(f"mcp:{missing}", argv=(str(missing),)), 10)

    assert f"MCP server {missing} could not be started or reached" in message
    assert "capdisc import mcp" in message


def test_a_server_that_never_answers_the_handshake_times_out_and_is_stopped(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    )
    silent = Upstream("mcp:silent", argv=(sys.executable, "-c", script))

    started = time.monotonic()
    message = pool_call(silent, 1)

    assert "did not answer 'anything' within 1 s" in message
    assert time.monotonic() - started < 10
    pid = int(pid_file.read_text())
    wait_for(lambda: not alive(pid), 10, "the silent server's exit")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):  # a zombie is as good as gone
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    return False
