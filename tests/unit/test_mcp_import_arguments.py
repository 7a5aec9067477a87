"""What ``capdisc import mcp`` refuses before it starts or reaches any server."""

from __future__ import annotations

import pytest

from capdisc.errors import MCPImportError
from capdisc_producers.mcp_import import list_server_tools


@pytest.mark.parametrize("command", ["", "   "])
def test_an_empty_command_is_refused_saying_so(command: str) -> None:
    with pytest.raises(MCPImportError, match="--command is empty"):
        list_server_tools(command=command, timeout_s=5.0)


@pytest.mark.parametrize(
    "given", [{}, {"url": "http://127.0.0.1:1/mcp", "command": "server"}], ids=["none", "both"]
)
def test_exactly_one_of_url_and_command_is_needed(given: dict[str, str]) -> None:
    with pytest.raises(MCPImportError, match="exactly one of --url and --command"):
        list_server_tools(**given, timeout_s=5.0)
