"""What imports repair and what they still refuse: schema dialects, the meta-schema check,
zero-width characters against bidi and tag characters, schemas nested deeper than the limit.
Manifests repair none of it."""

from __future__ import annotations

from typing import Any

import pytest

from capdisc.errors import ManifestError
from capdisc.registry.manifest import parse_manifest_text
from capdisc.registry.normalize import capability_from_record
from capdisc.registry.schemas import MAX_SCHEMA_DEPTH, json_type
from capdisc.registry.tolerance import tolerant_fields, validated

RECORD = {"kind": "tool", "name": "lookup", "description": "Looks things up."}


def repaired(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    fields, notes = tolerant_fields({"parameters": schema}, "parameters", "test")
    out: dict[str, Any] = fields["parameters"]
    validated({**RECORD, "full_schema": out}, "test", "parameters")  # the repair is valid
    return out, notes


def prop(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": schema}}


# -- dialects --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("dict", "object"),
        ("float", "number"),
        ("tuple", "array"),
        ("String", "string"),
        ("str", "string"),
        ("Integer", "integer"),
        ("int", "integer"),
        ("Long", "integer"),
        ("Boolean", "boolean"),
        ("bool", "boolean"),
        ("Double", "number"),
        ("List", "array"),
        ("list", "array"),
        ("Array", "array"),
        ("HashMap", "object"),
        ("Map", "object"),
        ("Object", "object"),
        ("STRING", "string"),
        ("List<String>", "array"),
        ("Map<String, Object>", "object"),
        ("list[str]", "array"),
        ("String[]", "array"),
        ("NoneType", "null"),
    ],
)
def test_a_language_type_name_is_read_as_its_json_schema_type(name: str, meant: str) -> None:
    schema, notes = repaired(prop({"type": name, "description": "A."}))

    assert schema == prop({"type": meant, "description": "A."})
    assert notes == [f"parameters.properties.a.type: type {name!r} read as {meant!r}"]


@pytest.mark.parametrize("name", ["string", "integer", "number", "object", "array", "null"])
def test_a_json_schema_type_is_kept_without_a_note(name: str) -> None:
    assert repaired(prop({"type": name})) == (prop({"type": name}), [])


@pytest.mark.parametrize(
    ("schema", "expected", "notes"),
    [
        (
            {"type": "dict", "properties": {"x": {"type": "float"}}},
            {"type": "object", "properties": {"x": {"type": "number"}}},
            [
                "parameters.type: type 'dict' read as 'object'",
                "parameters.properties.x.type: type 'float' read as 'number'",
            ],
        ),
        (
            prop({"type": "any", "description": "Anything."}),
            prop({"description": "Anything."}),
            ["parameters.properties.a.type: type 'any' left out (any value)"],
        ),
        (
            prop({"type": ["String", "null"]}),
            prop({"type": ["string", "null"]}),
            ["parameters.properties.a.type: type 'String' read as 'string'"],
        ),
        (
            prop({"type": "List", "items": {"type": "dict", "properties": {}}}),
            prop({"type": "array", "items": {"type": "object", "properties": {}}}),
            [
                "parameters.properties.a.type: type 'List' read as 'array'",
                "parameters.properties.a.items.type: type 'dict' read as 'object'",
            ],
        ),
        (
            prop({"anyOf": [{"type": "int"}, {"type": "str"}]}),
            prop({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
            [
                "parameters.properties.a.anyOf[0].type: type 'int' read as 'integer'",
                "parameters.properties.a.anyOf[1].type: type 'str' read as 'string'",
            ],
        ),
        (
            prop({"type": "string", "examples": "red, green"}),
            prop({"type": "string", "examples": ["red, green"]}),
            ["parameters.properties.a.examples: a single example put in a list"],
        ),
        (
            {
                "type": "object",
                "properties": {"city": {"type": "string", "required": True}, "n": {"required": 0}},
            },
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            None,  # `"required": 0` is no boolean: the meta-schema check refuses it below
        ),
    ],
)
def test_schema_dialects_are_repaired_and_noted(
    schema: dict[str, Any], expected: dict[str, Any], notes: list[str] | None
) -> None:
    if notes is None:
        schema["properties"].pop("n")
        notes = [
            "parameters.properties.city.required: a property's boolean 'required' moved to "
            "its parent's 'required' list"
        ]
    assert repaired(schema) == (expected, notes)


def test_names_inside_data_are_not_types() -> None:
    schema = prop({"type": "object", "default": {"type": "dict"}, "enum": [{"type": "dict"}]})
    schema["properties"]["type"] = {"type": "string"}  # a parameter called "type"

    assert repaired(schema) == (schema, [])


def test_many_places_of_one_repair_make_one_note() -> None:
    schema = {"type": "object", "properties": {k: {"type": "dict"} for k in "abcde"}}

    _out, notes = repaired(schema)

    assert notes == [
        "parameters.properties.a.type, parameters.properties.b.type, "
        "parameters.properties.c.type and 2 more: type 'dict' read as 'object'"
    ]


# -- what stays refused, named by its path ---------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "field", "problem"),
    [
        (
            prop({"type": "strng"}),
            "parameters.properties.a.type",
            "'strng' is not a JSON Schema type (one of array, boolean, integer, null, number, "
            "object, string)",
        ),
        (
            prop({"type": "array", "items": {"type": "datetime"}}),
            "parameters.properties.a.items.type",
            "'datetime' is not a JSON Schema type",
        ),
        (
            prop({"type": ["string", "Optional[int]"]}),
            "parameters.properties.a.type[1]",
            "'Optional[int]' is not a JSON Schema type",
        ),
        (prop({"type": "string", "minLength": -1}), "parameters.properties.a.minLength", "-1"),
        ({"type": "object", "required": "city"}, "parameters.required", "is not of type 'array'"),
        (
            {"type": "object", "properties": {"type": "string"}},
            "parameters.properties.type",
            "'string' is not of type 'object', 'boolean'",
        ),
        (prop({"required": 0}), "parameters.properties.a.required", "is not of type 'array'"),
    ],
)
def test_what_the_repairs_leave_wrong_is_refused_naming_its_path(
    schema: dict[str, Any], field: str, problem: str
) -> None:
    with pytest.raises(ManifestError) as info:
        repaired(schema)

    assert info.value.field == field
    assert problem in info.value.problem


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("dict", "did you mean 'object'?"),
        ("any", "leave 'type' out to accept any value"),
        ("strng", "object, string)"),
    ],
)
def test_a_manifest_keeps_its_schema_as_written_and_is_told_what_it_meant(
    name: str, hint: str
) -> None:
    text = (
        "name: lookup\nkind: tool\ndescription: Looks things up.\n"
        f"parameters:\n  type: object\n  properties:\n    a:\n      type: {name}\n"
    )
    with pytest.raises(ManifestError) as info:
        parse_manifest_text(text, "CAPABILITY.yaml")

    assert info.value.field == "parameters.properties.a.type"
    assert info.value.problem.endswith(hint)


def test_the_dialect_named_by_dollar_schema_is_the_one_checked() -> None:
    tuple_items = prop({"type": "array", "items": [{"type": "string"}, {"type": "integer"}]})
    with pytest.raises(ManifestError):
        capability_from_record({**RECORD, "full_schema": tuple_items}, "t")  # 2020-12

    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **tuple_items}
    assert capability_from_record({**RECORD, "full_schema": draft7}, "t").full_schema == draft7


def test_a_pattern_for_another_regex_engine_is_not_refused() -> None:
    schema = prop({"type": "string", "pattern": r"^\p{L}+$", "format": "no-such-format"})

    assert capability_from_record({**RECORD, "full_schema": schema}, "t").full_schema == schema


def test_json_type_does_not_guess_unknown_names() -> None:
    assert [json_type(n) for n in ("Optional[int]", "datetime", "", "string ")] == [
        None,
        None,
        None,
        "string",
    ]


# -- invisible characters --------------------------------------------------------------------


@pytest.mark.parametrize("char", ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"])
def test_zero_width_characters_are_removed_from_imported_text_and_noted(char: str) -> None:
    schema = prop({"type": "string", "description": f"Ci{char}ty."})
    fields, notes = tolerant_fields(
        {"description": f"{char}Looks{char} up.", "parameters": schema}, "parameters", "t"
    )

    assert fields["description"] == "Looks up."
    assert fields["parameters"] == prop({"type": "string", "description": "City."})
    assert notes == [
        f"description: removed 2 zero-width characters (U+{ord(char):04X})",
        f"parameters: removed 1 zero-width character (U+{ord(char):04X})",
    ]


@pytest.mark.parametrize(
    ("char", "what"),
    [
        ("\u202a", "left-to-right embedding"),
        ("\u202b", "right-to-left embedding"),
        ("\u202c", "pop directional formatting"),
        ("\u202d", "left-to-right override"),
        ("\u202e", "right-to-left override"),
        ("\u2066", "left-to-right isolate"),
        ("\u2067", "right-to-left isolate"),
        ("\u2068", "first strong isolate"),
        ("\u2069", "pop directional isolate"),
        ("\U000e0001", "language tag"),
        ("\U000e0041", "tag latin capital letter a"),
        ("\U000e007f", "cancel tag"),
    ],
)
@pytest.mark.parametrize("field", ["description", "name", "parameters.properties.a.description"])
def test_bidi_and_tag_characters_are_still_refused_in_imports(
    char: str, what: str, field: str
) -> None:
    fields: dict[str, Any] = {"name": "lookup", "description": "Looks up.", "parameters": prop({})}
    if field.startswith("parameters"):
        fields["parameters"] = prop({"description": f"ok{char}ok"})
    else:
        fields[field] = f"ok{char}ok"

    with pytest.raises(ManifestError) as info:
        tolerant_fields(fields, "parameters", "t")

    assert info.value.field == field
    assert f"invisible or control character U+{ord(char):04X} at position 2" in str(info.value)


@pytest.mark.parametrize("char", ["\u200b", "\ufeff", "\u202e"])
def test_manifests_keep_refusing_every_invisible_character(char: str) -> None:
    text = f"name: lookup\nkind: tool\ndescription: Looks{char} things up.\n"
    with pytest.raises(ManifestError) as info:
        parse_manifest_text(text, "CAPABILITY.yaml")

    assert info.value.field == "description"
    assert f"U+{ord(char):04X}" in info.value.problem


# -- depth -----------------------------------------------------------------------------------


def nested(levels: int) -> dict[str, Any]:
    """A schema ``levels`` objects deep: its leaf schema sits at level ``2 * levels``, the leaf's
    values at ``2 * levels + 1``."""
    schema: dict[str, Any] = {"type": "string", "description": "The leaf."}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"p": schema}}
    return schema


def depth(value: Any) -> int:
    children = value.values() if isinstance(value, dict) else value
    if not isinstance(value, dict | list) or not children:
        return 0
    return 1 + max(depth(child) for child in children)


@pytest.mark.parametrize("levels", [16, 17, 40, 400])
def test_a_schema_deeper_than_the_limit_keeps_its_top_levels_and_is_noted(levels: int) -> None:
    schema = {**nested(levels), "required": ["p"], "description": "Top."}

    out, notes = repaired(schema)

    assert depth(out) <= MAX_SCHEMA_DEPTH
    assert out["description"] == "Top." and out["required"] == ["p"]
    inner = out
    for _ in range(15):  # the top 15 levels of properties are whole
        assert inner["type"] == "object"
        inner = inner["properties"]["p"]
    assert len(notes) == 1
    assert notes[0].startswith(f"parameters: nested deeper than {MAX_SCHEMA_DEPTH} levels")


def test_a_schema_at_the_limit_is_kept_whole() -> None:
    schema = nested(15)
    leaf = schema
    for _ in range(15):
        leaf = leaf["properties"]["p"]
    leaf["enum"] = ["x"]  # level 31, its item at 32

    assert depth(schema) == MAX_SCHEMA_DEPTH
    assert repaired(schema) == (schema, [])


def test_deep_data_is_left_out_and_a_subschema_at_the_limit_becomes_empty() -> None:
    schema = nested(15)
    leaf = schema
    for _ in range(14):
        leaf = leaf["properties"]["p"]
    leaf["properties"]["p"] = {"anyOf": [{"type": "string"}], "default": [[1]], "type": "string"}

    out, notes = repaired(schema)

    cut = out
    for _ in range(15):
        cut = cut["properties"]["p"]
    assert cut == {"anyOf": [{}], "type": "string"}  # anyOf[0] at level 32, default: [[1]] gone
    assert "2 deeper parts" in notes[0]
    assert notes[0].endswith(".properties.p.properties.p.anyOf[0])")


def test_the_strict_check_still_refuses_a_deep_schema() -> None:
    with pytest.raises(ManifestError) as info:
        capability_from_record({**RECORD, "full_schema": nested(17)}, "t")

    assert info.value.problem == f"is nested deeper than {MAX_SCHEMA_DEPTH} levels"
