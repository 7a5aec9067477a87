"""``capdisc import mcp`` against a real MCP server the test starts (stdio and streamable HTTP)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis

from capdisc import keys
from capdisc.client import Client

from .conftest import ROOT, Stack, stop_process
from .test_cli import run_cli

SERVER = ROOT / "tests" / "fixtures" / "mcp_weather_server.py"
ODD_LISTING = ROOT / "tests" / "fixtures" / "mcp_odd_listing_server.py"
FLOOD_HTTP = ROOT / "tests" / "fixtures" / "mcp_flood_http.py"


def imported(stack: Stack, tenant: str, *source: str) -> tuple[int, str, str]:
    result = run_cli("import", "mcp", *source, "--tenant", tenant, env=stack.env)
    return result.returncode, result.stdout, result.stderr


def stored(connection: redis.Redis, tenant: str, cap_id: str) -> dict[str, object] | None:
    raw = connection.hget(keys.caps(tenant), cap_id)
    return json.loads(raw)["capability"] if raw else None


def test_stdio_server_tools_become_discoverable_capabilities(
    stack: Stack, tenant: str, connection: redis.Redis
) -> None:
    code, out, err = imported(stack, tenant, "--command", f"{sys.executable} {SERVER}")

    assert code == 0, err
    assert "3 upserted, 0 deleted, 0 unchanged, 0 rejected" in out
    forecast = stored(connection, tenant, "tool:weather-station.get_forecast")
    convert = stored(connection, tenant, "tool:weather-station.convert_units")
    assert forecast and convert
    assert forecast["has_side_effects"] is False and convert["has_side_effects"] is True
    assert forecast["full_schema"]["required"] == ["city"]  # type: ignore[index]
    assert forecast["source_ref"]["description"] == (  # type: ignore[index]
        "Forecasts, severe weather alerts and unit conversions for any city."
    )
    version = int(out.rsplit("index version ", 1)[1])
    answer = Client(connection, tenant=tenant, timeout_s=20).discover(
        "are there severe weather alerts in Texas", min_version=version
    )
    assert answer.ids[0] == "tool:weather-station.get_alerts"


def test_rerunning_an_unchanged_server_sends_nothing(stack: Stack, tenant: str) -> None:
    command = f"{sys.executable} {SERVER}"
    imported(stack, tenant, "--command", command)

    code, out, _err = imported(stack, tenant, "--command", command)

    assert code == 0 and "0 upserted, 0 deleted, 3 unchanged" in out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    port = free_port()
    running: list[subprocess.Popen[bytes]] = []
    yield port, running
    for process in running:
        stop_process(process)


def serve_http(
    port: int, running: list[subprocess.Popen[bytes]], *args: str, argv: list[str] | None = None
) -> None:
    """Serve the weather server (with ``args``), or ``argv``, on ``port``; wait until it
    listens."""
    for process in running:
        stop_process(process)
    running[:] = [
        subprocess.Popen(
            argv or [sys.executable, str(SERVER), *args, "http", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # readiness: the port accepts a connection
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if running[0].poll() is not None:
                raise AssertionError("the MCP test server exited") from None
            time.sleep(0.05)
    raise AssertionError("the MCP test server did not listen within 30 s")


def test_http_server_changes_are_reindexed_and_removed_tools_deleted(
    stack: Stack,
    tenant: str,
    connection: redis.Redis,
    http_server: tuple[int, list[subprocess.Popen[bytes]]],
) -> None:
    port, running = http_server
    url = f"http://127.0.0.1:{port}/mcp"
    serve_http(port, running)
    first = imported(stack, tenant, "--url", url)
    assert first[0] == 0, first[2]
    before = stored(connection, tenant, "tool:weather-station.get_forecast")

    serve_http(port, running, "v2")
    code, out, err = imported(stack, tenant, "--url", url)

    assert code == 0, err
    assert f"mcp:{url}: 2 upserted, 1 deleted, 1 unchanged, 0 rejected" in out
    assert "changed: tool:weather-station.get_forecast (content hash" in out
    after = stored(connection, tenant, "tool:weather-station.get_forecast")
    assert before and after and before["description"] != after["description"]
    assert stored(connection, tenant, "tool:weather-station.convert_units") is None
    assert stored(connection, tenant, "tool:weather-station.get_air_quality") is not None


def test_an_unreachable_server_is_a_clear_error(stack: Stack, tenant: str) -> None:
    code, _out, err = imported(
        stack, tenant, "--url", f"http://127.0.0.1:{free_port()}/mcp", "--timeout", "10"
    )

    assert code == 2
    assert "could not be listed" in err or "did not list its tools" in err


class Refusing(BaseHTTPRequestHandler):
    """An HTTP server that refuses every request as one wanting credentials does."""

    def do_POST(self) -> None:
        body = b'{"error": "invalid_token"}'
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("www-authenticate", 'Bearer error="invalid_token"')
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_server_that_wants_credentials_is_named_as_such(stack: Stack, tenant: str) -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), Refusing) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
            code, _out, err = imported(stack, tenant, "--url", url, "--timeout", "10")
        finally:
            server.shutdown()

    assert code == 2
    assert "answered HTTP 401 Unauthorized" in err and "capdisc sends none" in err


def read_before_refusing(err: str) -> int:
    """How much of an answer the import read before refusing it, from its logged warning."""
    (line,) = [line for line in err.splitlines() if "mcp_upstream_answer_too_large" in line]
    return int(json.loads(line)["bytes_read"])


def test_a_listing_larger_than_the_limit_over_http_is_refused_unread(
    stack: Stack, tenant: str, http_server: tuple[int, list[subprocess.Popen[bytes]]]
) -> None:
    port, running = http_server
    url = f"http://127.0.0.1:{port}/mcp"
    serve_http(port, running, argv=[sys.executable, str(FLOOD_HTTP), str(port), "huge-listing"])

    code, out, err = imported(stack, tenant, "--url", url, "--timeout", "30")

    assert code == 2, out
    assert f"MCP server {url} answered tools/list with more than the 8388608 bytes" in err
    assert "capdisc reads (mcp_max_result_bytes)" in err and "CAPDISC_MCP_MAX_RESULT_BYTES" in err
    assert read_before_refusing(err) <= 8 * 1024 * 1024 + 4096 + 256 * 1024


def test_a_listing_larger_than_the_limit_over_stdio_is_refused_unread(
    stack: Stack, tenant: str
) -> None:
    command = f"{sys.executable} {ODD_LISTING} huge"
    env = {**stack.env, "CAPDISC_MCP_MAX_RESULT_BYTES": str(1024 * 1024)}

    result = run_cli("import", "mcp", "--command", command, "--tenant", tenant, env=env)

    assert result.returncode == 2, result.stdout
    assert f"MCP server {command} answered tools/list with more than the 1048576 bytes" in (
        result.stderr
    )


def test_a_tool_too_large_for_an_event_is_refused_at_once_and_the_rest_imported(
    stack: Stack, tenant: str, connection: redis.Redis
) -> None:
    started = time.monotonic()
    code, out, err = imported(
        stack, tenant, "--command", f"{sys.executable} {ODD_LISTING} huge", "--timeout", "30"
    )

    assert code == 1, err
    assert "tool:odd-listing.survey: is " in err and "the limit is 1048576" in err
    assert "CAPDISC_EVENT_MAX_BYTES" in err
    assert "1 upserted, 0 deleted, 0 unchanged, 1 rejected" in out and "applied" in out
    assert time.monotonic() - started < 25  # not a wait for an event the workers never decode
    assert stored(connection, tenant, "tool:odd-listing.echo")
    assert stored(connection, tenant, "tool:odd-listing.survey") is None


def test_tools_the_sdk_cannot_read_are_refused_each_and_the_rest_imported(
    stack: Stack, tenant: str, connection: redis.Redis
) -> None:
    command = f"{sys.executable} {ODD_LISTING} broken"

    code, out, err = imported(stack, tenant, "--command", command, "--timeout", "30")

    assert code == 1, err
    assert "1 upserted, 0 deleted, 0 unchanged, 3 rejected" in out
    assert f"mcp:{command} tool 'scramble': field 'inputSchema'" in err
    assert f"mcp:{command} tool number 3 (it has no name): field 'name'" in err
    assert f"mcp:{command} tool 'peek': field 'annotations.readOnlyHint'" in err
    assert stored(connection, tenant, "tool:odd-listing.echo")


def test_a_listing_too_deep_to_read_is_named_when_the_import_times_out(
    stack: Stack, tenant: str
) -> None:
    command = f"{sys.executable} {ODD_LISTING} deep"

    code, _out, err = imported(stack, tenant, "--command", command, "--timeout", "3")

    assert code == 2
    assert "did not list its tools within 3 s; it sent a message that could not be read" in err
    assert "recursion limit exceeded" in err
