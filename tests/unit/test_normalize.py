"""Source normalization: the four source normalizers and the strict record validator."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capdisc.errors import ManifestError
from capdisc.models import Capability, Relationship, SourceRef, display_name_from
from capdisc.registry.normalize import (
    capability_from_record,
    from_channel,
    from_extension,
    from_skill,
    from_tool,
    refuse_invisible,
    split_front_matter,
)

SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}}}
RECORD = {"kind": "tool", "name": "web-search", "description": "Searches the public web."}

# -- from_tool -----------------------------------------------------------------------------------


@pytest.mark.parametrize("schema_key", ["parameters", "input_schema", "inputSchema"])
def test_tool_schema_key_becomes_full_schema(schema_key: str) -> None:
    tool = {"name": "web_search", "description": "Searches the web.", schema_key: SCHEMA}

    assert from_tool(tool).full_schema == SCHEMA


def test_tool_without_schema_has_no_full_schema() -> None:
    assert from_tool({"name": "clock", "description": "Tells the time."}).full_schema is None


def test_tool_becomes_a_tool_capability_with_derived_id_and_display_name() -> None:
    capability = from_tool({"name": "web_search", "description": "Searches the web."}, "mcp-web")

    assert capability == Capability(
        id="tool:web_search",
        kind="tool",
        name="web_search",
        description="Searches the web.",
        display_name="Web Search",
        category="general",
        source_ref=SourceRef(type="tool", source="mcp-web", location="web_search"),
    )


def test_tool_keeps_its_optional_fields() -> None:
    tool = {
        "name": "send",
        "description": "Sends mail.",
        "category": "email",
        "tags": ["Mail"],
        "required_secrets": ["SMTP_PASSWORD"],
        "has_side_effects": True,
        "version": "1.0",
    }

    capability = from_tool(tool)

    assert (
        capability.category,
        capability.tags,
        capability.required_secrets,
        capability.has_side_effects,
        capability.version,
    ) == ("email", ("mail",), ("SMTP_PASSWORD",), True, "1.0")


def test_tool_ignores_keys_outside_its_vocabulary() -> None:
    tool = {"name": "clock", "description": "Tells the time.", "id": "tool:other", "x-vendor": 1}

    assert from_tool(tool).id == "tool:clock"


def test_invalid_tool_error_names_source_and_tool() -> None:
    with pytest.raises(ManifestError) as info:
        from_tool({"name": "web search", "description": "x"}, "mcp-web")

    assert info.value.source == "mcp-web:web search"
    assert info.value.field == "name"


# -- from_skill ----------------------------------------------------------------------------------

SKILL_MD = """---
description: Reviews a pull request for style and bugs.
category: developer
tags: [review, git]
requires: [tool:git-cli, github-list-pull-requests]
---

# Code review

Read the diff first.
"""


def test_skill_front_matter_becomes_the_fields() -> None:
    capability = from_skill("code-review", SKILL_MD)

    assert (
        capability.id,
        capability.kind,
        capability.description,
        capability.category,
        capability.tags,
        capability.required_tools,
    ) == (
        "skill:code-review",
        "skill",
        "Reviews a pull request for style and bugs.",
        "developer",
        ("review", "git"),
        ("tool:git-cli", "github-list-pull-requests"),
    )


def test_skill_full_content_is_the_whole_document() -> None:
    assert from_skill("code-review", SKILL_MD).full_content == SKILL_MD


def test_skill_name_in_front_matter_overrides_the_given_name() -> None:
    markdown = "---\nname: pr-review\ndescription: Reviews.\n---\nbody\n"

    assert from_skill("code-review", markdown).id == "skill:pr-review"


def test_skill_required_tools_key_wins_over_requires() -> None:
    markdown = "---\ndescription: d\nrequires: [a]\nrequired_tools: [b]\n---\n"

    assert from_skill("s", markdown).required_tools == ("b",)


def test_skill_source_ref_names_the_skill() -> None:
    assert from_skill("code-review", SKILL_MD, "skills-dir").source_ref == SourceRef(
        type="skill", source="skills-dir", location="code-review"
    )


def test_skill_without_front_matter_is_missing_its_description() -> None:
    with pytest.raises(ManifestError) as info:
        from_skill("notes", "# Just markdown\n")

    assert str(info.value) == "skill:notes: field 'description': is required"


def test_skill_front_matter_never_closed_is_rejected() -> None:
    with pytest.raises(ManifestError) as info:
        from_skill("notes", "---\ndescription: d\n# body\n")

    assert str(info.value) == "skill:notes: front matter opened with '---' is never closed"


def test_skill_front_matter_is_parsed_strictly() -> None:
    with pytest.raises(ManifestError) as info:
        from_skill("notes", "---\ndescription: &d x\n---\n")

    assert info.value.source == "skill:notes (front matter)"
    assert info.value.problem == "line 2: YAML anchors (&name) are not allowed"


@pytest.mark.parametrize(
    ("markdown", "front", "body"),
    [
        ("# title\n", {}, "# title\n"),
        ("---\na: 1\n---\nbody\n", {"a": 1}, "body\n"),
        ("---\na: 1\n---\n\n\nbody\n", {"a": 1}, "body\n"),
        ("---\na: 1\nb: [x, y]\n---", {"a": 1, "b": ["x", "y"]}, ""),
    ],
)
def test_split_front_matter(markdown: str, front: dict[str, Any], body: str) -> None:
    assert split_front_matter(markdown, "s") == (front, body)


# -- from_extension ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "available"),
    [
        ({"installed": True}, True),
        ({"installed": False}, False),
        ({}, False),
        ({"available": True}, True),
        ({"installed": False, "available": True}, False),
    ],
)
def test_extension_availability_follows_installed(flags: dict[str, bool], available: bool) -> None:
    entry = {"name": "github", "description": "GitHub integration.", **flags}

    assert from_extension(entry).available is available


def test_extension_tools_become_required_tools() -> None:
    entry = {"name": "github", "description": "d", "tools": ["tool:github-create-issue"]}

    assert from_extension(entry).required_tools == ("tool:github-create-issue",)


def test_extension_id_and_source_ref() -> None:
    capability = from_extension({"name": "github", "description": "d"}, "catalog.json")

    assert (capability.id, capability.kind, capability.source_ref) == (
        "extension:github",
        "extension",
        SourceRef(type="extension", source="catalog.json", location="github"),
    )


# -- from_channel --------------------------------------------------------------------------------


def test_channel_id_is_channel_colon_platform() -> None:
    capability = from_channel({"platform": "slack", "name": "Slack", "description": "d"})

    assert (capability.id, capability.name, capability.kind) == (
        "channel:slack",
        "slack",
        "channel",
    )


def test_channel_falls_back_to_name_without_platform() -> None:
    assert from_channel({"name": "telegram", "description": "d"}).id == "channel:telegram"


def test_channel_category_is_always_communication() -> None:
    entry = {"platform": "slack", "description": "d", "category": "chat"}

    assert from_channel(entry).category == "communication"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, True),
        ({"has_side_effects": False}, False),
    ],
)
def test_channel_has_side_effects_unless_told_otherwise(
    flags: dict[str, bool], expected: bool
) -> None:
    entry = {"platform": "slack", "description": "d", **flags}

    assert from_channel(entry).has_side_effects is expected


def test_channel_source_ref_names_the_platform() -> None:
    assert from_channel({"platform": "slack", "description": "d"}, "chans").source_ref == SourceRef(
        type="channel", source="chans", location="slack"
    )


# -- display names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "display"),
    [
        ("web-search", "Web Search"),
        ("web_search", "Web Search"),
        ("github.create-issue", "Github Create Issue"),
        ("stripe", "Stripe"),
        ("getPRs", "GetPRs"),
        ("web--search", "Web Search"),
        ("v2-api", "V2 Api"),
        ("---", "---"),
    ],
)
def test_display_name_from(name: str, display: str) -> None:
    assert display_name_from(name) == display


# -- capability_from_record ----------------------------------------------------------------------


def test_minimal_record_gets_defaults() -> None:
    assert capability_from_record(RECORD, "src") == Capability(
        id="tool:web-search",
        kind="tool",
        name="web-search",
        description="Searches the public web.",
        display_name="Web Search",
        category="general",
    )


def test_record_with_unknown_field_is_rejected_naming_it() -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, "colour": "red"}, "src")

    assert info.value.field == "colour"
    assert info.value.problem.startswith("unknown field (known fields: available, category, ")


def test_record_that_is_not_a_mapping_is_rejected() -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record(["kind", "tool"], "src")  # type: ignore[arg-type]

    assert str(info.value) == "src: must be a mapping of fields, got a list"


@pytest.mark.parametrize("missing", ["kind", "name", "description"])
def test_missing_required_field_is_rejected(missing: str) -> None:
    record = {k: v for k, v in RECORD.items() if k != missing}

    with pytest.raises(ManifestError) as info:
        capability_from_record(record, "src")

    assert str(info.value) == f"src: field '{missing}': is required"


@pytest.mark.parametrize("required", ["kind", "name", "description"])
@pytest.mark.parametrize("empty", [None, ""])
def test_required_field_that_is_null_or_empty_is_rejected(required: str, empty: str | None) -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, required: empty}, "src")

    assert str(info.value) == f"src: field '{required}': is required"


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("name", 42, "must be a string, got a number (quote it)"),
        ("description", ["a"], "must be a string, got a list"),
        ("description", "   ", "must not be empty"),
        ("description", "x" * 4097, "is 4097 characters, the limit is 4096"),
        ("kind", "plugin", "must be one of tool, skill, extension, channel, got 'plugin'"),
        (
            "id",
            "Tool:web-search",
            "'Tool:web-search' is not a valid id (form 'kind:name', for example 'tool:web-search')",
        ),
        ("display_name", None, "must be a string, got null (quote it)"),
        ("display_name", "x" * 257, "is 257 characters, the limit is 256"),
        (
            "category",
            "web search",
            "'web search' is not a valid name (letters, digits, '.', '_', "
            "'-'; starts with a letter or digit; at most 64 characters)",
        ),
        ("available", "yes", "must be true or false, got a string"),
        ("has_side_effects", 1, "must be true or false, got a number"),
        ("tags", "search", "must be a list of strings, got a string"),
        ("tags", ["t"] * 65, "has 65 items, the limit is 64"),
        ("required_secrets", {"KEY": 1}, "must be a list of strings, got a mapping"),
        ("full_schema", [], "must be a JSON Schema object, got a list"),
        ("full_schema", {"type": "string"}, "the top-level schema must have type 'object'"),
        ("full_content", 3.5, "must be a string, got a number (quote it)"),
        ("source_ref", {"source": "x"}, "must be a mapping with a 'type'"),
        ("relationships", "tool:a", "must be a list, got a string"),
        ("version", 2, "must be a string, got a number (quote it)"),
    ],
)
def test_record_field_of_wrong_type_or_form_is_rejected_naming_it(
    field: str, value: Any, problem: str
) -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, field: value}, "src")

    assert info.value.field == field
    assert info.value.problem == problem


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("tags", ["ok", "bad tag"], "tags[1]"),
        ("required_secrets", ["OK_KEY", "1BAD"], "required_secrets[1]"),
        ("required_tools", ["tool:ok", "not ok"], "required_tools[1]"),
        ("example_queries", ["fine", 7], "example_queries[1]"),
        ("relationships", [{"target": "tool:a", "weight": 2}], "relationships[0].weight"),
        ("relationships", [{"type": "related"}], "relationships[0]"),
        ("full_schema", {"type": "object", "properties": []}, "full_schema.properties"),
        (
            "full_schema",
            {"type": "object", "properties": {"a": {"default": float("inf")}}},
            "full_schema.properties.a.default",
        ),
        ("example_queries", [""], "example_queries[0]"),
        (
            "full_schema",
            {"type": "object", "properties": {"a\u200b": {}}},
            "full_schema.properties.a\u200b",
        ),
    ],
)
def test_invalid_list_item_or_nested_value_is_named_by_its_path(
    field: str, value: Any, where: str
) -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, field: value}, "src")

    assert info.value.field == where


def test_schema_nested_deeper_than_the_limit_is_rejected() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(33):
        schema = {"type": "object", "properties": {"p": schema}}

    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, "full_schema": schema}, "src")

    assert info.value.problem == "is nested deeper than 32 levels"


@pytest.mark.parametrize(
    ("char", "what"),
    [
        ("\u200b", "zero width space"),
        ("\u202e", "right-to-left override"),
        ("\ufeff", "byte order mark"),
        ("\U000e0041", "tag latin capital letter a"),
        ("\ue000", "private use"),
        ("\x07", "bell control"),
    ],
)
def test_invisible_characters_are_refused_in_text(char: str, what: str) -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, "description": f"ok{char}ok"}, "src")

    assert info.value.problem.startswith(
        f"contains the invisible or control character U+{ord(char):04X} at position 2;"
    )


@pytest.mark.parametrize("text", ["line one\nline two", "tab\tseparated", "crlf\r\nend"])
def test_newlines_and_tabs_are_allowed_in_text(text: str) -> None:
    assert capability_from_record({**RECORD, "description": text}, "src").description == text


def test_name_that_changes_under_nfkc_is_rejected() -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, "name": "ｗｅｂ"}, "src")

    assert info.value.field == "name"


def test_description_is_stripped() -> None:
    record = {**RECORD, "description": "  Searches.\n"}

    assert capability_from_record(record, "src").description == "Searches."


def test_tags_are_lowercased_and_duplicates_dropped() -> None:
    record = {**RECORD, "tags": ["Search", "WEB", "Search"]}

    assert capability_from_record(record, "src").tags == ("search", "web")


def test_relationship_given_as_string_is_related() -> None:
    record = {**RECORD, "relationships": ["tool:web-fetch"]}

    assert capability_from_record(record, "src").relationships == (
        Relationship(target="tool:web-fetch", type="related"),
    )


@pytest.mark.parametrize("ref", ["tool:web-fetch", "web-fetch", "mcp:github/create_issue"])
def test_required_tools_accept_ids_and_names(ref: str) -> None:
    assert capability_from_record({**RECORD, "required_tools": [ref]}, "src").required_tools == (
        ref,
    )


def test_source_ref_mapping_becomes_a_source_ref() -> None:
    record = {**RECORD, "source_ref": {"type": "jsonl", "source": "cat.jsonl", "location": "7"}}

    assert capability_from_record(record, "src").source_ref == SourceRef("jsonl", "cat.jsonl", "7")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, None),
        ({"has_side_effects": None}, None),
        ({"has_side_effects": False}, False),
        ({"has_side_effects": True}, True),
    ],
)
def test_side_effects_not_said_stay_unknown_through_a_record(
    given: dict[str, Any], expected: bool | None
) -> None:
    capability = capability_from_record({**RECORD, **given}, "src")

    assert capability.has_side_effects is expected
    # what an indexing worker checks again is what a producer sent: the record form
    assert capability_from_record(capability.to_dict(), "event") == capability


def _refused_one_by_one(text: str) -> bool:
    """The character-by-character rule: a control or format character other than newline,
    tab and carriage return."""
    return any(
        char not in "\n\t\r" and unicodedata.category(char) in {"Cc", "Cf", "Co", "Cn", "Cs"}
        for char in text
    )


@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=40))
def test_ascii_text_is_refused_exactly_when_a_character_is(text: str) -> None:
    try:
        refuse_invisible("tools.yaml", "description", text)
        refused = False
    except ManifestError:
        refused = True

    assert refused == _refused_one_by_one(text)
