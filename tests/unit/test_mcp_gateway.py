"""The pure parts of the ``capdisc mcp`` gateway: what each MCP session lists, where an imported
tool's calls go, and the tool sources a discovery reply carries."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import mcp_types as types
import pytest

from capdisc.agents.formats import to_mcp
from capdisc.discovery.replies import ToolBundle
from capdisc.discovery.toolsets import tool_bundle
from capdisc.errors import EventDecodeError, UpstreamError
from capdisc.models import Capability, SourceRef
from capdisc_producers.mcp_gateway import with_guidance
from capdisc_producers.mcp_sessions import (
    Called,
    Discovered,
    Event,
    ListedTool,
    SessionTable,
    SessionTools,
    changed,
    next_tools,
)
from capdisc_producers.mcp_upstream import Upstream, UpstreamTool, parse_upstream, upstream_tool

OWN = frozenset({"discover_capabilities", "record_tool_call"})
META = to_mcp([])[0]
NOW = SourceRef("mcp", "mcp:uvx mcp-server-time", "get_current_time")


def tool(name: str, description: str = "does it") -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": {"type": "object"}}


def found(*names: str, sources: dict[str, SourceRef] | None = None) -> Discovered:
    """A discovery answer binding ``names`` (capability ``tool:NAME``), the meta-tool first."""
    return Discovered(
        [META, *(tool(n) for n in names)], {n: f"tool:{n}" for n in names}, sources or {}
    )


def listing(*names: str) -> SessionTools:
    return SessionTools(tuple(ListedTool(tool(n), f"tool:{n}") for n in names))


# -- the per-session list policy -----------------------------------------------------------------

POLICY: list[tuple[str, SessionTools, Event, list[str], bool]] = [
    ("first-discovery-lists-the-working-set", listing(), found("a", "b"), ["a", "b"], True),
    ("same-working-set-again", listing("a", "b"), found("a", "b"), ["a", "b"], False),
    ("a-tool-joins", listing("a"), found("a", "b"), ["a", "b"], True),
    ("lru-eviction-leaves", listing("a", "b"), found("b", "c"), ["b", "c"], True),
    ("order-follows-the-answer", listing("a", "b"), found("b", "a"), ["b", "a"], True),
    ("nothing-bound", listing("a"), found(), [], True),
    ("meta-tool-never-listed-twice", listing(), found(), [], False),
    ("own-name-is-never-shadowed", listing(), found("record_tool_call", "a"), ["a"], True),
    ("loop-evicted-leaves", listing("a", "b"), Called("tool:a", evicted=True), ["b"], True),
    ("loop-kept-always-include-stays", listing("a"), Called("tool:a"), ["a"], False),
    ("call-without-loop-changes-nothing", listing("a"), Called("tool:a"), ["a"], False),
    ("eviction-of-an-unlisted-tool", listing("a"), Called("tool:z", evicted=True), ["a"], False),
]


@pytest.mark.parametrize(
    ("before", "event", "names", "announced"),
    [case[1:] for case in POLICY],
    ids=[case[0] for case in POLICY],
)
def test_session_list_policy(
    before: SessionTools, event: Event, names: list[str], announced: bool
) -> None:
    after = next_tools(before, event, OWN)

    assert [t.name for t in after.tools] == names
    assert changed(before, after) is announced


def test_a_changed_definition_is_announced_though_the_names_stay() -> None:
    before = listing("a")
    event = Discovered([tool("a", "now does more")], {"a": "tool:a"}, {})

    assert changed(before, next_tools(before, event, OWN))


def test_listed_tools_keep_their_capability_and_source() -> None:
    after = next_tools(listing(), found("now", "local", sources={"now": NOW}), OWN)

    now, local = after.named("now"), after.named("local")
    assert now is not None and (now.capability_id, now.source) == ("tool:now", NOW)
    assert local is not None and local.source is None
    assert after.named("discover_capabilities") is None


def test_the_table_forgets_the_least_recently_used_session() -> None:
    table = SessionTable(limit=2)
    table.put("s1", listing("a"))
    table.put("s2", listing("b"))
    table.get("s1")
    table.put("s3", listing("c"))

    assert table.get("s2") == SessionTools()
    assert [t.name for t in table.get("s1").tools] == ["a"]
    assert table.get(None) == SessionTools()


# -- where an imported tool's calls go -----------------------------------------------------------

LOCAL_URL = "http://127.0.0.1:8000/mcp"
QUOTED = "python '/opt/my servers/s.py' --tz 'Europe/Paris'"
PARSED: list[tuple[str, str, Upstream]] = [
    ("http", f"mcp:{LOCAL_URL}", Upstream(f"mcp:{LOCAL_URL}", LOCAL_URL)),
    (
        "https",
        "mcp:https://x.example/mcp",
        Upstream("mcp:https://x.example/mcp", "https://x.example/mcp"),
    ),
    (
        "command",
        "mcp:uvx mcp-server-time",
        Upstream("mcp:uvx mcp-server-time", argv=("uvx", "mcp-server-time")),
    ),
    (
        "quoted",
        f"mcp:{QUOTED}",
        Upstream(f"mcp:{QUOTED}", argv=("python", "/opt/my servers/s.py", "--tz", "Europe/Paris")),
    ),
]


@pytest.mark.parametrize(
    ("source", "expected"), [c[1:] for c in PARSED], ids=[c[0] for c in PARSED]
)
def test_parse_upstream(source: str, expected: Upstream) -> None:
    assert parse_upstream(source) == expected


REFUSED: list[tuple[str, str, str]] = [
    ("no-prefix", "uvx mcp-server-time", "not an MCP server source"),
    ("empty", "mcp:", "names no URL or command"),
    ("blank", "mcp:   ", "names no URL or command"),
    ("unbalanced-quote", "mcp:python 'server.py", "cannot be read"),
]


@pytest.mark.parametrize(
    ("source", "fragment"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_parse_upstream_refuses(source: str, fragment: str) -> None:
    with pytest.raises(UpstreamError, match=fragment) as caught:
        parse_upstream(source)
    assert "capdisc import mcp" in str(caught.value) or "cannot be read" in str(caught.value)


def test_upstream_tool_of_an_imported_tool() -> None:
    assert upstream_tool(NOW) == UpstreamTool(
        Upstream(NOW.source, argv=("uvx", "mcp-server-time")), "get_current_time"
    )
    assert upstream_tool(NOW).upstream.label == "uvx mcp-server-time"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "ref",
    [None, SourceRef("manifest", "/registry", "slack/CAPABILITY.yaml"), SourceRef("jsonl", "x")],
    ids=["none", "manifest", "jsonl"],
)
def test_a_tool_not_imported_from_mcp_has_no_upstream(ref: SourceRef | None) -> None:
    assert upstream_tool(ref) is None


def test_an_mcp_source_without_the_tools_name_is_refused() -> None:
    with pytest.raises(UpstreamError, match="has no name there"):
        upstream_tool(SourceRef("mcp", "mcp:uvx mcp-server-time", ""))


# -- the tool sources a reply carries ------------------------------------------------------------

IMPORTED = Capability(
    id="tool:mcp-time.get_current_time",
    kind="tool",
    name="mcp-time.get_current_time",
    description="Get current time in a specific timezone",
    source_ref=NOW,
)
LOCAL = Capability(id="tool:clock", kind="tool", name="clock", description="Tells the time.")


def test_a_bundle_names_where_only_mcp_imported_tools_are_called() -> None:
    bundle = tool_bundle([IMPORTED, LOCAL], "mcp")

    assert bundle.sources == {"mcp-time.get_current_time": NOW}
    assert set(bundle.tool_names) == {"mcp-time.get_current_time", "clock"}


def test_tool_sources_cross_the_wire() -> None:
    bundle = tool_bundle([IMPORTED, LOCAL], "mcp")

    assert ToolBundle.from_dict(bundle.to_dict(), "reply") == bundle
    assert "tool_sources" not in tool_bundle([LOCAL], "mcp").to_dict()


def test_a_tool_source_carries_where_the_tool_is_called_not_its_servers_description() -> None:
    described = replace(IMPORTED, source_ref=replace(NOW, description="Time zones."))

    bundle = tool_bundle([described], "mcp")

    assert bundle.sources == {"mcp-time.get_current_time": NOW}
    assert "description" not in bundle.to_dict()["tool_sources"]["mcp-time.get_current_time"]


def test_a_reply_without_tool_sources_reads_as_none() -> None:
    assert ToolBundle.from_dict({"tools": [], "tool_names": {}}, "reply").sources == {}


def test_a_malformed_tool_source_is_refused_naming_the_field() -> None:
    raw = {"tools": [], "tool_names": {}, "tool_sources": {"x": {"type": "mcp", "source": 1}}}

    with pytest.raises(EventDecodeError, match="tool source field 'source'"):
        ToolBundle.from_dict(raw, "reply")


# -- what goes back to the host ------------------------------------------------------------------

ANSWER = types.CallToolResult(content=[types.TextContent(text="12:00")], structured_content={})


def test_a_looping_call_returns_the_answer_and_the_guidance() -> None:
    result = with_guidance(ANSWER, {"loop_detected": True, "guidance": "Rethink the approach."})

    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    assert texts == ["12:00", "capdisc: Rethink the approach."]
    assert result.structured_content == {}


@pytest.mark.parametrize("recorded", [None, {"loop_detected": False}], ids=["unrecorded", "fine"])
def test_other_calls_return_the_answer_as_it_is(recorded: dict[str, Any] | None) -> None:
    assert with_guidance(ANSWER, recorded) is ANSWER
