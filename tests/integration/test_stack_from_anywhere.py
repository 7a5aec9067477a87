"""A running ``capdisc up`` found from any working directory: ``Client.from_stack()``, the
command's ``--stack DIR`` and ``capdisc mcp --stack DIR`` (an MCP host starts it elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client as MCPClient
from mcp import StdioServerParameters

from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Client

from .upstack import UpProcess, running_up

SLACK = "tool:slack-post-message"
QUERY = "post a message to the team's slack channel"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """One ``capdisc up`` (auth on, as ``make up``) in a project of its own; stopped, with
    every child, at the end of the module."""
    with running_up(tmp_path_factory.mktemp("project")) as process:
        yield process


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory outside the project, with no stack named in the environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("CAPDISC_STACK", "CAPDISC_TOKEN", "CAPDISC_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def outside_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}


def test_client_from_stack_discovers_from_another_directory(up: UpProcess, elsewhere: Path) -> None:
    with Client.from_stack(up.project, timeout_s=30) as client:
        answer = client.discover(QUERY)

    assert SLACK in answer.ids


@pytest.mark.parametrize(
    "where",
    [pytest.param("global", id="global"), pytest.param("command", id="command")],
)
def test_the_stack_option_discovers_from_another_directory(
    up: UpProcess, elsewhere: Path, where: str
) -> None:
    stack = ["--stack", str(up.project)]
    argv = [*stack, "discover", QUERY, "--json"]
    if where == "command":
        argv = ["discover", QUERY, "--json", *stack]
    done = subprocess.run(
        [sys.executable, "-m", "capdisc_producers.cli", *argv],
        cwd=elsewhere,
        env=outside_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert SLACK in [c["id"] for c in json.loads(done.stdout)["capabilities"]]


def test_mcp_with_the_stack_option_serves_from_another_directory(
    up: UpProcess, elsewhere: Path
) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "capdisc_producers.cli", "mcp", "--stack", str(up.project)],
        env=outside_env(),
        cwd=str(elsewhere),
    )
    found: list[str] = []

    async def body() -> None:
        async with MCPClient(server) as mcp:
            result = await mcp.call_tool(METATOOL_NAME, {"query": QUERY})
            assert not result.is_error, result.content
            assert isinstance(result.structured_content, dict)
            found.extend(c["id"] for c in result.structured_content["capabilities"])

    anyio.run(body)

    assert SLACK in found
