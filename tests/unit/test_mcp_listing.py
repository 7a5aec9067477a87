"""Reading a raw ``tools/list`` page tool by tool: what the ``mcp`` SDK would refuse or drop is
refused on its own, with its position and reason."""

from __future__ import annotations

from typing import Any

import pytest

from capdisc_producers.mcp_import import read_tools


def tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


REGION = {"type": "string", "x-mcp-header": "Region"}


@pytest.mark.parametrize(
    ("properties", "why"),
    [
        ({"filter": {"type": "object", "x-mcp-header": "Filter"}}, "integer/string/boolean"),
        ({"region": {"type": "string", "x-mcp-header": "bad header"}}, "RFC 9110 token"),
        ({"a": REGION, "b": {"type": "string", "x-mcp-header": "region"}}, "duplicates"),
    ],
)
def test_a_tool_with_an_invalid_x_mcp_header_is_refused_on_a_modern_connection(
    properties: dict[str, Any], why: str
) -> None:
    read, refused = read_tools([tool("echo", {}), tool("odd", properties)], modern=True)

    assert [t["name"] for t in read] == ["echo"]
    assert [(r.name, r.position) for r in refused] == [("odd", 2)]
    assert "x-mcp-header" in refused[0].reason and why in refused[0].reason


def test_a_valid_x_mcp_header_is_kept_on_a_modern_connection() -> None:
    read, refused = read_tools([tool("regional", {"region": REGION})], modern=True)

    assert [t["name"] for t in read] == ["regional"] and not refused


def test_x_mcp_header_annotations_are_not_checked_on_a_legacy_connection() -> None:
    odd = tool("odd", {"filter": {"type": "object", "x-mcp-header": "Filter"}})

    read, refused = read_tools([odd], modern=False)

    assert [t["name"] for t in read] == ["odd"] and not refused
