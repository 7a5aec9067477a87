"""``capdisc mcp``: a real MCP client (``mcp`` 2.x) against the server over stdio and streamable
HTTP, answered by the suite's real discovery workers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client as MCPClient
from mcp import StdioServerParameters
from mcp_types import CallToolResult

from capdisc.agents.formats import to_mcp
from capdisc.agents.metatool import METATOOL_DESCRIPTION, METATOOL_NAME, metatool_definition
from capdisc.client import Client
from capdisc.identity import auth
from capdisc_producers.bodylimit import MAX_HTTP_BODY_BYTES

from .conftest import ROOT, Stack, publish, stop_process
from .test_import_mcp import free_port

SLACK = "tool:slack-post-message"
SERVE = [sys.executable, "-m", "capdisc_producers.cli", "mcp"]


def stdio_server(stack: Stack, tenant: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=SERVE[0], args=[*SERVE[1:], "--tenant", tenant], env=stack.env, cwd=str(ROOT)
    )


def published(stack: Stack, registry: Path, tenant: str) -> None:
    """Publish the example registry and wait until a discovery worker serves it."""
    report = publish(stack.url, registry, tenant)
    assert report.complete
    Client(stack.connection(), tenant=tenant, timeout_s=30).discover(
        "warm up", min_version=report.index_version
    )


def run(body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body)


async def discover(mcp: MCPClient, **arguments: Any) -> dict[str, Any]:
    """A successful discover_capabilities call's structured content (equal to its JSON text)."""
    result = await mcp.call_tool(METATOOL_NAME, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    assert json.loads(text_of(result)) == result.structured_content
    return result.structured_content


def text_of(result: CallToolResult) -> str:
    block = result.content[0]
    assert block.type == "text"
    return block.text


def test_stdio_lists_capdiscs_meta_tool_and_returns_argument_errors(
    stack: Stack, tenant: str
) -> None:
    async def body() -> None:
        async with MCPClient(stdio_server(stack, tenant)) as mcp:
            server = mcp.server_info
            listed = {tool.name: tool for tool in (await mcp.list_tools()).tools}
            empty = await mcp.call_tool(METATOOL_NAME, {"query": "  "})
            extra = await mcp.call_tool(METATOOL_NAME, {"query": "x", "limit": 50})
            unknown_tenant = await mcp.call_tool(METATOOL_NAME, {"query": "send an email"})
            no_tool_id = await mcp.call_tool("record_tool_call", {"arguments": {}})

        meta = listed[METATOOL_NAME]
        assert (server.name, server.version) == ("capdisc", metadata.version("capdisc"))
        assert set(listed) == {METATOOL_NAME, "record_tool_call"}
        assert meta.description == METATOOL_DESCRIPTION
        assert meta.input_schema == metatool_definition()["parameters"]
        assert meta.model_dump(by_alias=True, exclude_none=True) == to_mcp([])[0]
        assert empty.is_error and "'query'" in text_of(empty) and "empty" in text_of(empty)
        assert extra.is_error and "'limit'" in text_of(extra)
        assert unknown_tenant.is_error and tenant in text_of(unknown_tenant)
        assert no_tool_id.is_error and "'tool_id'" in text_of(no_tool_id)

    run(body)


def test_stdio_calls_share_one_working_set_and_get_the_loop_guard(
    stack: Stack, registry: Path, tenant: str
) -> None:
    published(stack, registry, tenant)
    calls: list[dict[str, Any]] = []

    async def body() -> None:
        async with MCPClient(stdio_server(stack, tenant)) as mcp:
            first = await discover(mcp, query="post a message to slack")
            second = await discover(mcp, query="open a pull request", kind="tool")
            for _ in range(4):
                result = await mcp.call_tool(
                    "record_tool_call",
                    {"tool_id": SLACK, "arguments": {"channel": "#ops", "text": "hi"}},
                )
                assert not result.is_error, result.content
                calls.append(result.structured_content or {})
            calls.insert(0, first)
            calls.insert(1, second)

    run(body)
    first, second, *recorded = calls
    session = first["session"]["id"]
    assert first["capabilities"][0]["id"] == SLACK
    assert first["tools"][0] == to_mcp([])[0]  # the meta-tool, then the working set
    assert SLACK in first["tool_names"].values()
    slack_tool = next(t for t in first["tools"] if first["tool_names"].get(t["name"]) == SLACK)
    assert slack_tool["inputSchema"]["required"] == ["channel", "text"]
    assert session.startswith("mcp-") and SLACK in first["session"]["bound"]
    assert second["session"]["id"] == session
    assert SLACK in second["session"]["bound"]
    assert second["capabilities"][0]["id"] in second["session"]["bound"]
    assert SLACK in second["tool_names"].values()
    assert set(second["tool_names"].values()) <= set(second["session"]["bound"])
    assert [o["loop_detected"] for o in recorded] == [False, False, False, True]
    assert recorded[-1]["evicted"] and recorded[-1]["guidance"]
    assert recorded[-1]["session"] == session
    working = Client(stack.connection(), tenant=tenant, timeout_s=20).working_set(session)
    assert {b["id"] for b in working["bound"]} == set(second["session"]["bound"]) - {SLACK}


@pytest.fixture
def http_server(stack: Stack, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Starts ``capdisc mcp --http PORT`` for a tenant; returns the endpoint URL once the port
    accepts connections."""
    running: list[subprocess.Popen[bytes]] = []

    def start(tenant: str) -> str:
        port = free_port()
        log = tmp_path / "mcp-http.log"
        with log.open("ab") as out:
            running.append(
                subprocess.Popen(
                    [*SERVE, "--tenant", tenant, "--http", str(port)],
                    env=stack.env,
                    cwd=ROOT,
                    stdout=out,
                    stderr=out,
                )
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # readiness: the port accepts a connection
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return f"http://127.0.0.1:{port}/mcp"
            except OSError:
                if running[-1].poll() is not None:
                    raise AssertionError(f"capdisc mcp exited; see {log}") from None
                time.sleep(0.05)
        raise AssertionError("capdisc mcp did not listen within 30 s")

    yield start
    for process in running:
        stop_process(process)


def test_http_each_mcp_session_is_its_own_capdisc_session(
    stack: Stack, registry: Path, tenant: str, http_server: Callable[[str], str]
) -> None:
    published(stack, registry, tenant)
    url = http_server(tenant)
    answers: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}

    async def body() -> None:
        async with MCPClient(url) as one, MCPClient(url) as other:
            assert one.protocol_version == other.protocol_version == "2025-11-25"
            answers["a"].append(await discover(one, query="post a message to slack"))
            answers["b"].append(await discover(other, query="open a pull request"))
            answers["a"].append(await discover(one, query="convert 100 dollars to euros"))
            recorded = await one.call_tool("record_tool_call", {"tool_id": SLACK})
            assert not recorded.is_error and recorded.structured_content
            assert recorded.structured_content["loop_detected"] is False

    run(body)
    (a1, a2), (b1,) = answers["a"], answers["b"]
    assert a1["capabilities"][0]["id"] == SLACK
    assert a1["session"]["id"] == a2["session"]["id"] != b1["session"]["id"]
    assert SLACK in a2["session"]["bound"] and SLACK not in b1["session"]["bound"]
    client = Client(stack.connection(), tenant=tenant, timeout_s=20)
    for answer in (a2, b1):
        working = client.working_set(answer["session"]["id"])
        assert {b["id"] for b in working["bound"]} == set(answer["session"]["bound"])


def test_http_a_stateless_client_is_answered_without_a_session(
    stack: Stack, http_server: Callable[[str], str]
) -> None:
    url = http_server("warmup")  # the tenant the suite's warm-up published
    results: list[CallToolResult] = []

    async def body() -> None:
        async with MCPClient(url, mode="2026-07-28") as mcp:
            results.append(await mcp.call_tool(METATOOL_NAME, {"query": "ping"}))
            results.append(await mcp.call_tool("record_tool_call", {"tool_id": "tool:ping"}))

    run(body)
    found, refused = results
    assert not found.is_error and found.structured_content
    assert found.structured_content["session"] is None
    assert found.structured_content["capabilities"][0]["id"] == "tool:ping"
    assert refused.is_error and "needs an MCP session" in text_of(refused)


def test_http_a_request_body_over_the_limit_gets_413_and_the_server_keeps_serving(
    stack: Stack, http_server: Callable[[str], str]
) -> None:
    url = http_server("warmup")
    oversized = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "'
        + b"x" * (MAX_HTTP_BODY_BYTES)
        + b'"}'
    )
    request = urllib.request.Request(
        url,
        data=oversized,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)

    assert refused.value.code == 413
    assert json.loads(refused.value.read())["error"] == "request_too_large"
    results: list[CallToolResult] = []

    async def body() -> None:
        async with MCPClient(url, mode="2026-07-28") as mcp:
            results.append(await mcp.call_tool(METATOOL_NAME, {"query": "ping"}))

    run(body)
    assert not results[0].is_error


def test_http_on_a_port_already_taken_exits_2_saying_so(stack: Stack) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        done = subprocess.run(
            [*SERVE, "--tenant", "warmup", "--http", str(port)],
            env=stack.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert done.returncode == 2, done.stderr
    assert f"capdisc mcp cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "signal-test", "version": "1"},
    },
}


def serving(stack: Stack, transport: str) -> subprocess.Popen[bytes]:
    """``capdisc mcp`` started and answering: over stdio its handshake answered, over HTTP its
    port accepting connections."""
    port = free_port()
    argv = [*SERVE, "--tenant", "warmup", *(["--http", str(port)] if transport == "http" else [])]
    server = subprocess.Popen(
        argv,
        env=stack.env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin and server.stdout
    if transport == "stdio":
        server.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        server.stdin.flush()
        assert b'"result"' in server.stdout.readline()
        return server
    deadline = time.monotonic() + 30
    while True:  # readiness: the port accepts a connection
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "not listening"
            time.sleep(0.05)


@pytest.mark.parametrize(
    "stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["sigterm", "sigint", "sighup"]
)
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_stopped_with_a_signal_exits_0(
    stack: Stack, transport: str, stop: signal.Signals
) -> None:
    server = serving(stack, transport)
    try:
        server.send_signal(stop)
        assert server.wait(timeout=15) == 0
    finally:
        stop_process(server)


@pytest.mark.parametrize(
    ("host", "why"),
    [("", "no host a URL can name"), ("192.0.2.1", "Cannot assign requested address")],
    ids=["empty", "not-this-machines"],
)
def test_http_on_a_host_it_cannot_serve_exits_2_naming_the_host(
    stack: Stack, tmp_path: Path, host: str, why: str
) -> None:
    keys_file = tmp_path / "auth_keys.json"  # with auth on, the host is the resource's URL too
    auth.save_keyring(keys_file, auth.Keyring([auth.new_key(time.time())]))
    env = {**stack.env, "CAPDISC_AUTH": "on", "CAPDISC_AUTH_KEYS_FILE": str(keys_file)}

    done = subprocess.run(
        [*SERVE, "--tenant", "warmup", "--http", str(free_port()), "--host", host],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 2, done.stderr
    assert f"--host {host!r}" in done.stderr and why in done.stderr
    assert "Traceback" not in done.stderr
