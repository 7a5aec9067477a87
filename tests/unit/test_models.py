"""The Capability value: JSON form, round trips and the content hash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capdisc.models import Capability, Relationship, SourceRef, canonical_json

FULL = Capability(
    id="tool:web-search",
    kind="tool",
    name="web-search",
    description="Searches the public web.",
    display_name="Web Search",
    category="information",
    tags=("search", "web"),
    required_secrets=("SEARCH_API_KEY",),
    required_tools=("tool:web-fetch",),
    available=False,
    has_side_effects=True,
    full_schema={"type": "object", "properties": {"query": {"type": "string"}}},
    full_content="# Web search\n",
    source_ref=SourceRef(type="manifest", source="/registry", location="/registry/a.yaml"),
    relationships=(
        Relationship("tool:web-fetch", "composed_with"),
        Relationship("tool:news-search"),
    ),
    example_queries=("latest news",),
    version="2.0.0",
)
MINIMAL = Capability(id="tool:clock", kind="tool", name="clock", description="Tells the time.")


def test_to_dict_of_a_minimal_capability() -> None:
    assert MINIMAL.to_dict() == {
        "id": "tool:clock",
        "kind": "tool",
        "name": "clock",
        "display_name": "",
        "description": "Tells the time.",
        "category": "general",
        "tags": [],
        "required_secrets": [],
        "required_tools": [],
        "available": True,
        "has_side_effects": None,
        "full_schema": None,
        "full_content": None,
        "source_ref": {"type": "tool", "source": "", "location": ""},
        "relationships": [],
        "example_queries": [],
        "version": "",
    }


@pytest.mark.parametrize("capability", [FULL, MINIMAL], ids=["full", "minimal"])
def test_from_dict_of_to_dict_is_the_same_capability(capability: Capability) -> None:
    assert Capability.from_dict(capability.to_dict()) == capability


def test_round_trip_survives_json_text() -> None:
    assert Capability.from_dict(json.loads(json.dumps(FULL.to_dict()))) == FULL


def test_from_dict_ignores_keys_that_are_not_fields() -> None:
    assert Capability.from_dict({**MINIMAL.to_dict(), "score": 0.9}) == MINIMAL


def test_from_dict_without_source_ref_defaults_to_a_tool_source() -> None:
    data = {k: v for k, v in MINIMAL.to_dict().items() if k != "source_ref"}

    assert Capability.from_dict(data).source_ref == SourceRef(type="tool")


def test_relationship_without_type_is_related() -> None:
    data = {**MINIMAL.to_dict(), "relationships": [{"target": "tool:a"}]}

    assert Capability.from_dict(data).relationships == (Relationship("tool:a", "related"),)


def test_content_hash_is_equal_for_equal_content() -> None:
    twin = Capability.from_dict(json.loads(json.dumps(FULL.to_dict())))

    assert twin is not FULL
    assert twin.content_hash == FULL.content_hash


def test_content_hash_of_a_fixed_capability_is_pinned() -> None:
    # sha256 of the canonical JSON of test_to_dict_of_a_minimal_capability's dict. Stored
    # records keep this hash: if it moves, every capability is stored again on the next sync.
    assert MINIMAL.content_hash == (
        "dae6f1b2cd221ba056bcff3f0be3eca81036d405a34a357d7ade60db11a00972"
    )


def test_declared_side_effects_keep_the_hash_they_had_before_unknown_existed() -> None:
    # Only capabilities that never said whether they have side effects hash differently from
    # before (they were stored as false): they are stored once more, from cached embeddings.
    assert MINIMAL.with_changes(has_side_effects=False).content_hash == (
        "43efae8d64a07820100e5b5a02c237009800483c6dcac74101028b9550572a4b"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", "tool:web-search-2"),
        ("kind", "skill"),
        ("name", "web-search-2"),
        ("description", "Searches the public web!"),
        ("display_name", "Search"),
        ("category", "general"),
        ("tags", ("search",)),
        ("tags", ("web", "search")),
        ("required_secrets", ()),
        ("required_tools", ("tool:other",)),
        ("available", True),
        ("has_side_effects", False),
        ("full_schema", {"type": "object"}),
        ("full_schema", None),
        ("full_content", "# Web search"),
        ("source_ref", SourceRef(type="manifest", source="/registry", location="/registry/b.yaml")),
        (
            "relationships",
            (Relationship("tool:web-fetch", "related"), Relationship("tool:news-search")),
        ),
        ("example_queries", ()),
        ("version", "2.0.1"),
    ],
)
def test_content_hash_changes_when_a_field_changes(field: str, value: Any) -> None:
    changed = FULL.with_changes(**{field: value})

    assert changed != FULL
    assert changed.content_hash != FULL.content_hash


def test_with_changes_leaves_the_original_alone() -> None:
    MINIMAL.with_changes(description="Changed.")

    assert MINIMAL.description == "Tells the time."


@pytest.mark.parametrize(
    ("schema", "names"),
    [
        ({"type": "object", "properties": {"b": {}, "a": {}}}, ("b", "a")),
        ({"type": "object"}, ()),
        ({"type": "object", "properties": ["a"]}, ()),
        (None, ()),
    ],
)
def test_parameter_names_are_the_schema_properties(
    schema: dict[str, Any] | None, names: tuple[str, ...]
) -> None:
    assert MINIMAL.with_changes(full_schema=schema).parameter_names == names


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": [1, 2]}, '{"a":[1,2],"b":1}'),
        ({"z": {"y": None, "x": True}}, '{"z":{"x":true,"y":null}}'),
        ("café", '"café"'),
        ([], "[]"),
    ],
)
def test_canonical_json_is_compact_sorted_and_keeps_unicode(value: Any, text: str) -> None:
    assert canonical_json(value) == text
