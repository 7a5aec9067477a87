"""The meta-schema check's quick path: a schema it passes is one the 2020-12 meta-schema passes,
and a schema the meta-schema refuses is refused with the same message either way."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from capdisc.errors import ManifestError
from capdisc.registry import schemas
from capdisc.registry.schemas import check_schema, plainly_valid

META = Draft202012Validator(Draft202012Validator.META_SCHEMA)

#: Values of every kind, right and wrong, for any keyword.
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.floats(min_value=-2, max_value=2, allow_nan=False),
    st.sampled_from(["string", "object", "strng", "", "x"]),
    st.lists(st.sampled_from(["string", "integer", "string", "city", 1]), max_size=3),
)
keywords = st.sampled_from(
    [
        *schemas._PLAIN,
        "items",
        "additionalProperties",
        "properties",
        "anyOf",
        "$ref",
        "x-vendor",
    ]
)
schema_trees = st.recursive(
    st.dictionaries(keywords, values, min_size=1, max_size=4) | st.booleans(),
    lambda inner: st.dictionaries(
        keywords,
        inner | values | st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2),
        max_size=4,
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(schema_trees)
def test_a_schema_passed_by_the_quick_path_passes_the_meta_schema(schema: Any) -> None:
    if plainly_valid(schema):
        assert META.is_valid(schema)


PROBES: list[Any] = [
    None,
    True,
    0,
    -1,
    2,
    1.5,
    "string",
    "strng",
    [],
    ["a", "a"],
    ["string", "null"],
    [1],
    {},
    {"type": "strng"},
    {"a": {"type": "strng"}},
]


@pytest.mark.parametrize("keyword", sorted([*schemas._PLAIN, "items", "additionalProperties"]))
def test_each_quick_keyword_takes_only_values_the_meta_schema_takes(keyword: str) -> None:
    for value in PROBES:
        for schema in (
            {keyword: value},
            {"properties": {"p": {keyword: value}}},
            {"items": {keyword: value}},
        ):
            assert not plainly_valid(schema) or META.is_valid(schema), schema


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"city": {"type": "string", "description": "City."}}},
        {"type": "object", "properties": {"n": {"type": ["integer", "null"], "minimum": 0}}},
        {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}},
        {"type": "object", "required": ["a"], "additionalProperties": False},
    ],
)
def test_plain_tool_schemas_take_the_quick_path(schema: dict[str, Any]) -> None:
    assert plainly_valid(schema)


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "properties": {"city": {"type": "strng"}}}, ".properties.city"),
        ({"type": "object", "required": ["a", "a"]}, ".required"),
        ({"type": "object", "properties": {"s": {"minLength": -1}}}, ".properties.s.minLength"),
        ({"type": "object", "properties": {"l": {"items": "string"}}}, ".properties.l.items"),
    ],
)
def test_a_schema_the_meta_schema_refuses_is_refused_naming_where(
    schema: dict[str, Any], where: str
) -> None:
    assert not plainly_valid(schema)
    with pytest.raises(ManifestError) as raised:
        check_schema("tools.yaml", "full_schema", schema)

    assert f"full_schema{where}" in str(raised.value)
