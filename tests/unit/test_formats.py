"""Tool definitions in four formats, each checked against its format's rules, and the name map."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capdisc.agents import formats
from capdisc.agents.formats import (
    ANTHROPIC_NAMES,
    MCP_NAMES,
    NAME_RULES,
    OPENAI_NAMES,
    TOOL_FORMATS,
    NameMap,
    NameRule,
    ToolFormat,
    callable_capabilities,
    list_discovered_tools,
    openai_client_tool_search,
    to_anthropic,
    to_anthropic_tool_references,
    to_mcp,
    to_openai_chat,
    to_openai_responses,
    to_openai_tool_search_output,
    tool_name,
)
from capdisc.agents.metatool import METATOOL_NAME, metatool_definition
from capdisc.errors import ManifestError
from capdisc.models import Capability, JSONDict
from capdisc.registry.flags import Mark

# -- the formats' rules, written out -------------------------------------------------------------
# OpenAI: FunctionDefinition.name "a-z, A-Z, 0-9, underscores and dashes, maximum length of 64";
# Anthropic: ^[a-zA-Z0-9_-]{1,128}$ (we hold it to 64); MCP SEP-986: ^[A-Za-z0-9._-]{1,128}$.

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANTHROPIC_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MCP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def check_object_schema(schema: Any, *, needs_properties: bool = False) -> None:
    assert isinstance(schema, dict)
    assert schema["type"] == "object"
    if needs_properties:
        assert "properties" in schema
    if "properties" in schema:
        assert isinstance(schema["properties"], dict)
    if "required" in schema:
        assert set(schema["required"]) <= set(schema.get("properties", {}))


def check_openai_chat_tool(tool: JSONDict) -> None:
    assert set(tool) == {"type", "function"}
    assert tool["type"] == "function"
    function = tool["function"]
    assert (
        {"name", "parameters"} <= set(function) <= {"name", "description", "parameters", "strict"}
    )
    assert OPENAI_NAME.match(function["name"])
    assert len(function.get("description", "")) <= 1024
    assert function.get("strict", False) is False
    check_object_schema(function["parameters"], needs_properties=True)


def check_openai_responses_function(tool: JSONDict) -> None:
    assert (
        {"type", "name", "parameters", "strict"}
        <= set(tool)
        <= {"type", "name", "description", "parameters", "strict", "defer_loading"}
    )
    assert tool["type"] == "function"
    assert OPENAI_NAME.match(tool["name"])
    assert len(tool.get("description", "")) <= 1024
    assert tool["strict"] is False
    assert tool.get("defer_loading", True) is True
    check_object_schema(tool["parameters"], needs_properties=True)


def check_openai_responses_tool(tool: JSONDict) -> None:
    if tool["type"] == "tool_search":
        assert set(tool) == {"type", "execution", "description", "parameters"}
        assert tool["execution"] == "client"
        check_object_schema(tool["parameters"])
    else:
        check_openai_responses_function(tool)


def check_anthropic_tool(tool: JSONDict) -> None:
    assert (
        {"name", "input_schema"}
        <= set(tool)
        <= {"name", "description", "input_schema", "defer_loading"}
    )
    assert ANTHROPIC_NAME.match(tool["name"])
    assert tool.get("defer_loading", True) is True
    check_object_schema(tool["input_schema"])


MCP_HINTS = {"title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}


MCP_META_KEY = re.compile(
    r"^(?:[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)*"
    r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?/[A-Za-z0-9._-]+$"
)


def check_mcp_tool(tool: JSONDict) -> None:
    assert (
        {"name", "inputSchema"}
        <= set(tool)
        <= {"name", "title", "description", "inputSchema", "outputSchema", "annotations", "_meta"}
    )
    assert "outputSchema" not in tool or tool["name"] == METATOOL_NAME
    assert MCP_NAME.match(tool["name"])
    assert all(MCP_META_KEY.match(key) for key in tool.get("_meta", {}))
    check_object_schema(tool["inputSchema"])
    annotations = tool.get("annotations", {})
    assert set(annotations) <= MCP_HINTS
    assert all(isinstance(v, bool) for k, v in annotations.items() if k != "title")


CHECKS: dict[ToolFormat, Callable[[JSONDict], None]] = {
    "openai-chat": check_openai_chat_tool,
    "openai-responses": check_openai_responses_tool,
    "anthropic": check_anthropic_tool,
    "mcp": check_mcp_tool,
}


def name_of(fmt: ToolFormat, tool: JSONDict) -> str:
    if fmt == "openai-chat":
        return str(tool["function"]["name"])
    return str(tool["name"])


# -- a catalog with every awkward case -----------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "draft": {"type": "boolean", "default": False}},
    "required": ["title"],
}
PR = Capability(
    id="tool:github-create-pull-request",
    kind="tool",
    name="github-create-pull-request",
    display_name="GitHub Create Pull Request",
    description="Open a pull request.",
    full_schema=SCHEMA,
    has_side_effects=True,
)
CLOCK = Capability(id="tool:clock", kind="tool", name="clock", description="Tells the time.")
UNTYPED = Capability(
    id="tool:untyped",
    kind="tool",
    name="untyped",
    description="No type key.",
    full_schema={"properties": {"q": {"type": "string"}}},
)
MCP_ISSUE = Capability(
    id="mcp:github/create_issue",
    kind="tool",
    name="create_issue",
    description="Create an issue.",
    full_schema={"type": "object", "properties": {}},
)
DOTTED = Capability(id="tool:web.search", kind="tool", name="web.search", description="Search.")
LONG = Capability(
    id="mcp:" + "very-long-server-name/" * 6 + "tool",
    kind="tool",
    name="tool",
    description="A long MCP-derived id.",
)
SHADOW = Capability(
    id=f"tool:{METATOOL_NAME}",
    kind="tool",
    name=METATOOL_NAME,
    description="A capability named like the meta-tool.",
)
SKILL = Capability(
    id="skill:summarize",
    kind="skill",
    name="summarize",
    description="Summarize documents.",
    full_content="# Summarize\n",
)
EXTENSION = Capability(
    id="extension:github", kind="extension", name="github", description="GitHub tools."
)
CHANNEL = Capability(
    id="channel:discord",
    kind="channel",
    name="discord",
    description="Discord messages.",
    has_side_effects=True,
)
OFFLINE = Capability(
    id="tool:offline", kind="tool", name="offline", description="Not set up.", available=False
)

TOOLS = [PR, CLOCK, UNTYPED, MCP_ISSUE, DOTTED, LONG, SHADOW]
CATALOG = [*TOOLS, SKILL, EXTENSION, CHANNEL, OFFLINE, PR]


def build(
    fmt: ToolFormat,
    caps: list[Capability],
    include_metatool: bool = True,
    defer_loading: bool = False,
) -> list[JSONDict]:
    if fmt == "openai-chat":
        return to_openai_chat(caps, include_metatool)
    if fmt == "openai-responses":
        return to_openai_responses(caps, include_metatool, defer_loading)
    if fmt == "anthropic":
        return to_anthropic(caps, include_metatool, defer_loading)
    return to_mcp(caps, include_metatool)


DEFERRABLE: list[ToolFormat] = ["openai-responses", "anthropic"]


# -- every format follows its rules --------------------------------------------------------------


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_every_definition_follows_the_format_rules(fmt: ToolFormat) -> None:
    for tool in build(fmt, CATALOG):
        CHECKS[fmt](tool)


@pytest.mark.parametrize("fmt", DEFERRABLE)
def test_deferred_definitions_follow_the_format_rules(fmt: ToolFormat) -> None:
    for tool in build(fmt, CATALOG, defer_loading=True):
        CHECKS[fmt](tool)


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_names_are_unique_within_a_list(fmt: ToolFormat) -> None:
    names = [name_of(fmt, tool) for tool in build(fmt, CATALOG)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_metatool_comes_first(fmt: ToolFormat) -> None:
    assert name_of(fmt, build(fmt, TOOLS)[0]) == METATOOL_NAME


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_without_the_metatool_only_capabilities_are_listed(fmt: ToolFormat) -> None:
    tools = build(fmt, TOOLS, include_metatool=False)
    assert len(tools) == len(TOOLS)
    assert METATOOL_NAME not in [name_of(fmt, tool) for tool in tools]


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_only_available_tools_become_definitions(fmt: ToolFormat) -> None:
    names = NameMap.for_format(fmt, CATALOG)
    listed = {names.get_id(name_of(fmt, tool)) for tool in build(fmt, CATALOG)} - {None}
    assert listed == {cap.id for cap in TOOLS}


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_a_list_of_only_skills_extensions_and_channels_is_just_the_metatool(
    fmt: ToolFormat,
) -> None:
    assert [name_of(fmt, tool) for tool in build(fmt, [SKILL, EXTENSION, CHANNEL])] == [
        METATOOL_NAME
    ]


def test_callable_capabilities_keeps_the_first_of_each_id_in_order() -> None:
    assert callable_capabilities(CATALOG) == TOOLS


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_list_discovered_tools_is_the_format_builder_with_the_metatool(fmt: ToolFormat) -> None:
    assert list_discovered_tools(CATALOG, fmt) == build(fmt, CATALOG)


def test_list_discovered_tools_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown tool format 'gemini'"):
        list_discovered_tools(TOOLS, "gemini")  # type: ignore[arg-type]


# -- schemas -------------------------------------------------------------------------------------


def schema_of(fmt: ToolFormat, tool: JSONDict) -> JSONDict:
    if fmt == "openai-chat":
        return dict(tool["function"]["parameters"])
    key = {"openai-responses": "parameters", "anthropic": "input_schema", "mcp": "inputSchema"}[fmt]
    return dict(tool[key])


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_a_complete_schema_passes_through_unchanged(fmt: ToolFormat) -> None:
    (tool,) = build(fmt, [PR], include_metatool=False)
    assert schema_of(fmt, tool) == SCHEMA


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_metatool_schema_passes_through_unchanged(fmt: ToolFormat) -> None:
    assert schema_of(fmt, build(fmt, [])[0]) == metatool_definition()["parameters"]


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_output_schema_is_a_copy_of_the_capability_schema(fmt: ToolFormat) -> None:
    cap = PR.with_changes(full_schema=copy.deepcopy(SCHEMA))
    (tool,) = build(fmt, [cap], include_metatool=False)
    schema_of(fmt, tool)["properties"]["title"]["type"] = "integer"
    assert cap.full_schema == SCHEMA


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_a_schema_without_type_gets_type_object(fmt: ToolFormat) -> None:
    (tool,) = build(fmt, [UNTYPED], include_metatool=False)
    assert schema_of(fmt, tool) == {"type": "object", "properties": {"q": {"type": "string"}}}


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("openai-chat", {"type": "object", "properties": {}}),
        ("openai-responses", {"type": "object", "properties": {}}),
        ("anthropic", {"type": "object"}),
        ("mcp", {"type": "object"}),
    ],
)
def test_a_tool_without_schema_takes_no_arguments(fmt: ToolFormat, expected: JSONDict) -> None:
    """OpenAI rejects an object schema without ``properties``; the others accept it bare."""
    (tool,) = build(fmt, [CLOCK], include_metatool=False)
    assert schema_of(fmt, tool) == expected


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_a_non_object_schema_is_refused(fmt: ToolFormat) -> None:
    cap = CLOCK.with_changes(full_schema={"type": "string"})
    with pytest.raises(ManifestError, match="tool:clock: field 'full_schema': top-level type"):
        build(fmt, [cap])


def test_openai_chat_never_turns_strict_on() -> None:
    assert all("strict" not in tool["function"] for tool in to_openai_chat(CATALOG))


def test_openai_responses_turns_strict_off_explicitly() -> None:
    """Responses makes ``strict`` default to on for compatible schemas: say false."""
    assert all(tool["strict"] is False for tool in to_openai_responses(CATALOG))


@pytest.mark.parametrize("fmt", ["openai-chat", "openai-responses"])
def test_openai_descriptions_are_cut_to_1024_characters(fmt: ToolFormat) -> None:
    (tool,) = build(fmt, [CLOCK.with_changes(description="x" * 3000)], include_metatool=False)
    description = tool["function"]["description"] if fmt == "openai-chat" else tool["description"]
    assert len(description) == 1024
    assert description.endswith("…")


@pytest.mark.parametrize("fmt", ["anthropic", "mcp"])
def test_other_formats_keep_a_long_description_whole(fmt: ToolFormat) -> None:
    (tool,) = build(fmt, [CLOCK.with_changes(description="x" * 3000)], include_metatool=False)
    assert tool["description"] == "x" * 3000


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_an_empty_description_is_left_out(fmt: ToolFormat) -> None:
    (tool,) = build(fmt, [CLOCK.with_changes(description="")], include_metatool=False)
    assert "description" not in (tool["function"] if fmt == "openai-chat" else tool)


# -- deferral and tool search --------------------------------------------------------------------


def test_chat_completions_has_no_deferral() -> None:
    assert all("defer_loading" not in tool["function"] for tool in to_openai_chat(TOOLS))


@pytest.mark.parametrize("fmt", DEFERRABLE)
def test_without_deferral_nothing_is_deferred(fmt: ToolFormat) -> None:
    assert all("defer_loading" not in tool for tool in build(fmt, TOOLS))


@pytest.mark.parametrize("fmt", DEFERRABLE)
def test_deferral_defers_every_capability(fmt: ToolFormat) -> None:
    tools = build(fmt, TOOLS, defer_loading=True)
    assert [tool.get("defer_loading") for tool in tools[1:]] == [True] * len(TOOLS)


def test_anthropic_metatool_is_never_deferred() -> None:
    assert "defer_loading" not in to_anthropic(TOOLS, defer_loading=True)[0]


def test_deferred_responses_list_searches_through_the_metatool() -> None:
    search = to_openai_responses(TOOLS, defer_loading=True)[0]
    meta = metatool_definition()
    assert search == {
        "type": "tool_search",
        "execution": "client",
        "description": meta["description"],
        "parameters": meta["parameters"],
    }
    assert search == openai_client_tool_search()


def test_tool_search_output_answers_the_call_with_loaded_functions() -> None:
    item = to_openai_tool_search_output("call_42", CATALOG)
    assert set(item) == {"type", "call_id", "execution", "tools"}
    assert (item["type"], item["call_id"], item["execution"]) == (
        "tool_search_output",
        "call_42",
        "client",
    )
    for tool in item["tools"]:
        check_openai_responses_function(tool)
        assert "defer_loading" not in tool
    assert len(item["tools"]) == len(TOOLS)


def test_tool_search_output_has_the_names_of_the_full_deferred_list() -> None:
    defined = {tool["name"] for tool in to_openai_responses(CATALOG, defer_loading=True)[1:]}
    item = to_openai_tool_search_output("c", [LONG, MCP_ISSUE])
    loaded = {tool["name"] for tool in item["tools"]}
    assert loaded <= defined


def test_tool_references_are_tool_reference_blocks() -> None:
    refs = to_anthropic_tool_references([PR, SKILL, CLOCK])
    assert refs == [
        {"type": "tool_reference", "tool_name": "github-create-pull-request"},
        {"type": "tool_reference", "tool_name": "clock"},
    ]


def test_tool_references_name_tools_defined_in_the_deferred_list() -> None:
    defined = {
        tool["name"]
        for tool in to_anthropic(CATALOG, defer_loading=True)
        if tool.get("defer_loading")
    }
    for subset in ([LONG], [MCP_ISSUE, DOTTED], [SHADOW, PR]):
        assert {ref["tool_name"] for ref in to_anthropic_tool_references(subset)} <= defined


# -- MCP annotations and title -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("has_side_effects", "annotations"),
    [
        (False, {"readOnlyHint": True}),
        (True, {"readOnlyHint": False, "destructiveHint": True}),
        # unknown (the source did not say) is never advertised as read-only
        (None, {"readOnlyHint": False}),
    ],
)
def test_mcp_annotations_follow_declared_side_effects(
    has_side_effects: bool | None, annotations: JSONDict
) -> None:
    (tool,) = to_mcp(
        [CLOCK.with_changes(has_side_effects=has_side_effects)], include_metatool=False
    )
    assert tool["annotations"] == annotations


def test_a_tool_that_omits_side_effects_is_not_read_only() -> None:
    assert CLOCK.has_side_effects is None
    (tool,) = to_mcp([CLOCK], include_metatool=False)
    assert tool["annotations"].get("readOnlyHint") is not True


def test_mcp_metatool_reads_only_a_closed_world() -> None:
    assert to_mcp([])[0]["annotations"] == {"readOnlyHint": True, "openWorldHint": False}


def test_mcp_title_is_the_display_name() -> None:
    (tool,) = to_mcp([PR], include_metatool=False)
    assert tool["title"] == "GitHub Create Pull Request"


def test_mcp_title_is_left_out_without_a_display_name() -> None:
    (tool,) = to_mcp([CLOCK], include_metatool=False)
    assert "title" not in tool


def test_mcp_output_validates_as_the_sdk_tool() -> None:
    types = pytest.importorskip("mcp.types")
    for tool in to_mcp(CATALOG):
        parsed = types.Tool.model_validate(tool)
        assert parsed.model_dump(by_alias=True, exclude_none=True, mode="json") == tool


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25", "2026-07-28"])
def test_mcp_output_is_a_valid_tools_list_result(version: str) -> None:
    """The SDK's per-version wire schema accepts the list and drops nothing from it."""
    methods = pytest.importorskip("mcp.types.methods")
    result: JSONDict = {"tools": to_mcp(CATALOG)}
    if version >= "2026-07-28":  # the modern envelope's required result fields
        result.update(resultType="complete", cacheScope="private", ttlMs=0)
    dumped = methods.serialize_server_result("tools/list", version, result)
    assert dumped["tools"] == result["tools"]


# -- flagged tools -------------------------------------------------------------------------------

PLACES = (
    ("instruction_override", "description"),
    ("secret_access", "description"),
    ("secret_access", "parameters.properties.title.description"),
)
CAUTIONED = {PR.id: Mark(PLACES, caution=True)}
MARKED = {PR.id: Mark(PLACES, caution=False)}


def build_marked(fmt: ToolFormat, caps: list[Capability], marks: dict[str, Mark]) -> list[JSONDict]:
    return formats.list_discovered_tools(caps, fmt, marks)


def description_of(fmt: ToolFormat, tool: JSONDict) -> str:
    return str((tool["function"] if fmt == "openai-chat" else tool).get("description", ""))


@pytest.mark.parametrize("marks", [CAUTIONED, MARKED], ids=["warn", "flag"])
@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_marked_definitions_follow_the_format_rules(
    fmt: ToolFormat, marks: dict[str, Mark]
) -> None:
    for tool in build_marked(fmt, CATALOG, marks):
        CHECKS[fmt](tool)


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_a_cautioned_tool_description_starts_with_its_rule_codes(fmt: ToolFormat) -> None:
    tools = build_marked(fmt, [PR, CLOCK], CAUTIONED)[1:]

    assert description_of(fmt, tools[0]) == (
        "[flagged: instruction_override, secret_access] Open a pull request."
    )
    assert description_of(fmt, tools[1]) == "Tells the time."


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
def test_a_marked_tool_keeps_its_description_under_flag(fmt: ToolFormat) -> None:
    (tool,) = build_marked(fmt, [PR], MARKED)[1:]
    assert description_of(fmt, tool) == "Open a pull request."


@pytest.mark.parametrize("marks", [CAUTIONED, MARKED], ids=["warn", "flag"])
def test_a_marked_mcp_tool_names_rules_and_places_in_meta(marks: dict[str, Mark]) -> None:
    pr, clock = to_mcp([PR, CLOCK], include_metatool=False, marks=marks)

    assert pr["_meta"] == {
        formats.MCP_FLAGS_META: [
            {"rule": "instruction_override", "where": "description"},
            {"rule": "secret_access", "where": "description"},
            {"rule": "secret_access", "where": "parameters.properties.title.description"},
        ]
    }
    assert "_meta" not in clock


def test_a_cautioned_openai_description_stays_within_the_limit_with_its_label() -> None:
    long = PR.with_changes(description="x" * 2000)
    (tool,) = to_openai_chat([long], include_metatool=False, marks=CAUTIONED)

    assert len(tool["function"]["description"]) == formats.OPENAI_DESCRIPTION_MAX
    assert tool["function"]["description"].startswith("[flagged: instruction_override")


@pytest.mark.parametrize("marks", [CAUTIONED, MARKED], ids=["warn", "flag"])
def test_marked_mcp_output_validates_as_the_sdk_tool(marks: dict[str, Mark]) -> None:
    types = pytest.importorskip("mcp.types")
    for tool in to_mcp(CATALOG, marks=marks):
        parsed = types.Tool.model_validate(tool)
        assert parsed.model_dump(by_alias=True, exclude_none=True, mode="json") == tool


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25", "2026-07-28"])
def test_marked_mcp_output_is_a_valid_tools_list_result(version: str) -> None:
    methods = pytest.importorskip("mcp.types.methods")
    result: JSONDict = {"tools": to_mcp(CATALOG, marks=CAUTIONED)}
    if version >= "2026-07-28":
        result.update(resultType="complete", cacheScope="private", ttlMs=0)
    dumped = methods.serialize_server_result("tools/list", version, result)
    assert dumped["tools"] == result["tools"]


# -- names ---------------------------------------------------------------------------------------


def test_a_clean_tool_id_keeps_its_name() -> None:
    assert tool_name("tool:github-create-pull-request", OPENAI_NAMES) == (
        "github-create-pull-request"
    )


def test_illegal_characters_become_separators_and_a_hash() -> None:
    assert re.fullmatch(
        r"mcp__github__create_issue_[0-9a-f]{8}", tool_name("mcp:github/create_issue", OPENAI_NAMES)
    )


def test_dots_stay_in_mcp_names_only() -> None:
    assert tool_name("tool:web.search", MCP_NAMES) == "web.search"
    assert re.fullmatch(r"web__search_[0-9a-f]{8}", tool_name("tool:web.search", OPENAI_NAMES))


@pytest.mark.parametrize("rule", [OPENAI_NAMES, ANTHROPIC_NAMES, MCP_NAMES])
def test_a_long_id_is_cut_to_the_limit_with_a_hash(rule: NameRule) -> None:
    name = tool_name("tool:" + "a" * 300, rule)
    assert len(name) == rule.max_len
    assert re.fullmatch(r"a+_[0-9a-f]{8}", name)


def test_ids_that_sanitize_alike_get_different_names() -> None:
    ids = ["mcp:a/b", "mcp:a.b", "mcp:a:b", "tool:mcp__a__b", "tool:mcp:a/b"]
    names = NameMap(ids, OPENAI_NAMES)
    assert len({names.to_name(cap_id) for cap_id in ids}) == len(ids)


def test_no_capability_takes_the_metatool_name() -> None:
    name = tool_name(f"tool:{METATOOL_NAME}", OPENAI_NAMES)
    assert name != METATOOL_NAME
    assert name.startswith(f"{METATOOL_NAME}_")


def test_a_clean_name_that_looks_hashed_is_hashed_itself() -> None:
    """So a clean name can never equal another id's hashed name."""
    name = tool_name("tool:report_0123abcd", OPENAI_NAMES)
    assert re.fullmatch(r"report_0123abcd_[0-9a-f]{8}", name)


def test_an_empty_stem_still_makes_a_legal_name() -> None:
    assert re.fullmatch(r"cap_[0-9a-f]{8}", tool_name("", OPENAI_NAMES))


def test_a_name_does_not_depend_on_the_other_ids() -> None:
    whole = NameMap([c.id for c in CATALOG], OPENAI_NAMES)
    part = NameMap([LONG.id, MCP_ISSUE.id], OPENAI_NAMES)
    assert part.items() == [
        (LONG.id, whole.to_name(LONG.id)),
        (MCP_ISSUE.id, whole.to_name(MCP_ISSUE.id)),
    ]


def test_to_id_gives_the_capability_id_back() -> None:
    names = NameMap.for_format("openai-chat", CATALOG)
    assert names.to_id(names.to_name(MCP_ISSUE.id)) == MCP_ISSUE.id


def test_to_id_of_a_name_never_given_raises_key_error() -> None:
    with pytest.raises(KeyError):
        NameMap.for_format("anthropic", TOOLS).to_id("made_up_tool")


def test_get_id_of_a_name_never_given_is_none() -> None:
    assert NameMap.for_format("anthropic", TOOLS).get_id(METATOOL_NAME) is None


def test_duplicate_ids_are_mapped_once() -> None:
    names = NameMap(["tool:a", "tool:b", "tool:a"], OPENAI_NAMES)
    assert (len(names), list(names), "tool:a" in names) == (2, ["tool:a", "tool:b"], True)


def test_a_hash_clash_lengthens_the_clashing_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "tool_name", lambda cap_id, rule: "same_0123abcd")
    names = NameMap(["mcp:x", "mcp:y", "mcp:z"], OPENAI_NAMES)
    assert all(re.fullmatch(r"mcp__[xyz]_[0-9a-f]{16}", names.to_name(i)) for i in names)
    assert [names.to_id(names.to_name(i)) for i in names] == ["mcp:x", "mcp:y", "mcp:z"]


CAPABILITY_IDS = st.one_of(
    st.from_regex(r"[a-z]{1,8}:[A-Za-z0-9][A-Za-z0-9._/:-]{0,159}", fullmatch=True),
    st.from_regex(r"tool:[A-Za-z0-9_-]{1,80}", fullmatch=True),
    st.text(max_size=200),
)


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
@given(ids=st.lists(CAPABILITY_IDS, max_size=30))
def test_name_map_round_trips_with_legal_unique_names(fmt: ToolFormat, ids: list[str]) -> None:
    rule = NAME_RULES[fmt]
    names = NameMap.for_format(fmt, ids)
    given_names = [names.to_name(cap_id) for cap_id in names]
    assert all(rule.pattern.fullmatch(name) for name in given_names)
    assert METATOOL_NAME not in given_names
    assert len(set(given_names)) == len(given_names) == len(set(ids))
    assert all(names.to_id(names.to_name(cap_id)) == cap_id for cap_id in ids)


@given(ids=st.lists(CAPABILITY_IDS, max_size=30))
def test_name_map_does_not_depend_on_order(ids: list[str]) -> None:
    forward = NameMap(ids, OPENAI_NAMES)
    backward = NameMap(reversed(ids), OPENAI_NAMES)
    assert all(forward.to_name(cap_id) == backward.to_name(cap_id) for cap_id in ids)
