"""Tool input schemas as JSON Schema: the meta-schema check every capability's schema passes,
the type names other languages use for JSON Schema's types, and the keywords that hold
subschemas.

:func:`check_schema` is one of the strict checks of
:func:`capdisc.registry.normalize.capability_from_record`: a schema the JSON Schema meta-schema
refuses (the meta-schema of the dialect its ``$schema`` names, else 2020-12) is refused, naming
the path of the problem (``full_schema.properties.city.type``). ``format`` is not asserted: a
``pattern`` written for another regular-expression engine is no reason to refuse a tool.

:func:`json_type` and :func:`map_subschemas` serve the repairs an import makes before that check
(:mod:`capdisc.registry.tolerance`); a manifest gets :func:`json_type` only as a hint in its
error ("did you mean 'object'?").
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.validators import validator_for

from capdisc.errors import ManifestError

#: How deep a schema may nest (each mapping and list is a level; the schema itself is level 0).
MAX_SCHEMA_DEPTH = 32
JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
#: What :func:`json_type` answers for a name that means "any type": no ``type`` at all.
ANY_TYPE = "any"

#: Type names of programming languages and other schema dialects, lowercased, and the JSON
#: Schema type each one means.
TYPE_NAMES: Mapping[str, str] = {
    **{name: name for name in JSON_TYPES},
    **dict.fromkeys(("str", "char", "character", "text"), "string"),
    **dict.fromkeys(
        ("int", "long", "short", "byte", "int32", "int64", "uint", "bigint"), "integer"
    ),
    **dict.fromkeys(("float", "double", "decimal", "float32", "float64"), "number"),
    "bool": "boolean",
    **dict.fromkeys(("list", "tuple", "set", "arraylist"), "array"),
    **dict.fromkeys(("dict", "dictionary", "map", "hashmap"), "object"),
    **dict.fromkeys(("none", "nonetype", "nil"), "null"),
    ANY_TYPE: ANY_TYPE,
}
#: A type name, optionally with type arguments: ``List<String>``, ``dict[str, Any]``.
_TYPE_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:<.*>|\[.*\])?\s*", re.DOTALL)

#: Keywords whose value is one subschema.
_ONE = frozenset(
    {
        "additionalItems",
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
#: Keywords whose value is a list of subschemas (``items`` too, in its form before 2020-12).
_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
#: Keywords whose value maps names to subschemas.
SCHEMA_MAPS = frozenset(
    {"$defs", "definitions", "dependentSchemas", "patternProperties", "properties"}
)


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


#: Returned by a visitor of :func:`map_subschemas`: leave this value out.
DROP: Final = _Drop()
#: ``visit(subschema, path, levels)``: the subschema's replacement, or :data:`DROP`. ``path`` is
#: its place under the node (``.properties.city``, ``.anyOf[0]``), ``levels`` how many levels
#: deeper than the node it sits (1 under a keyword, 2 inside a keyword's list or mapping).
Visit = Callable[[Any, str, int], Any]
#: ``other(keyword, value)``: the replacement of a keyword's value that is no subschema.
Other = Callable[[str, Any], Any]


def json_type(name: str) -> str | None:
    """The JSON Schema type a type name means, case aside: ``dict`` -> ``object``, ``String``
    -> ``string``, ``List<String>`` and ``int[]`` -> ``array``, ``any`` -> :data:`ANY_TYPE`;
    None for a name it does not know."""
    if name.rstrip().endswith("[]"):
        return "array"
    match = _TYPE_NAME.fullmatch(name)
    return TYPE_NAMES.get(match.group(1).lower()) if match else None


def map_subschemas(node: Mapping[str, Any], visit: Visit, other: Other) -> dict[str, Any]:
    """``node`` (a schema) rebuilt with ``visit`` applied to each subschema it holds and
    ``other`` to every other keyword's value; a keyword whose value becomes :data:`DROP`, or
    whose list of subschemas becomes empty, is left out."""
    out: dict[str, Any] = {}
    for keyword, value in node.items():
        mapped = _mapped(keyword, value, visit, other)
        if mapped is not DROP:
            out[keyword] = mapped
    return out


def _mapped(keyword: str, value: Any, visit: Visit, other: Other) -> Any:
    if keyword in SCHEMA_MAPS and isinstance(value, dict):
        entries = {name: visit(v, f".{keyword}.{name}", 2) for name, v in value.items()}
        return {name: v for name, v in entries.items() if v is not DROP}
    if keyword in _LISTS and isinstance(value, list) and value:
        items = [visit(v, f".{keyword}[{i}]", 2) for i, v in enumerate(value)]
        return [v for v in items if v is not DROP] or DROP
    if keyword in _ONE and isinstance(value, dict | bool):
        return visit(value, f".{keyword}", 1)
    return other(keyword, value)


# -- the meta-schema check -------------------------------------------------------------------


_META: dict[type[Any], Any] = {}
#: Outcomes of checks already made, by the hash of the schema's JSON text: tools that share a
#: schema are checked once (the meta-schema check costs most of a millisecond).
_CHECKED: dict[bytes, tuple[str, str] | None] = {}
_CHECKED_MAX = 8192


def check_schema(source: str, key: str, schema: Mapping[str, Any]) -> None:
    """Refuse ``schema`` (the value of field ``key``, plain JSON) if the JSON Schema meta-schema
    does: :class:`ManifestError` naming the path of the problem and what is wrong."""
    digest = hashlib.blake2b(json.dumps(schema, sort_keys=True).encode(), digest_size=16).digest()
    if digest not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[digest] = _first_problem(schema)
    found = _CHECKED[digest]
    if found is not None:
        raise ManifestError(source, f"{key}{found[0]}", found[1])


def _first_problem(schema: Mapping[str, Any]) -> tuple[str, str] | None:
    """The path and the problem of the meta-schema's most relevant error on ``schema``."""
    if "$schema" not in schema and plainly_valid(schema):
        return None
    error = best_match(_meta_validator(schema).iter_errors(schema))
    if error is None:
        return None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path, _problem(error)


def plainly_valid(schema: Any) -> bool:
    """Whether ``schema`` surely passes the 2020-12 meta-schema, seen without ``jsonschema``:
    it uses only the plain keywords most tool schemas are made of (:data:`_PLAIN`), each with
    a value of the form the meta-schema asks for, its subschemas likewise. False means "not
    seen to": the meta-schema check decides (the full check costs most of a millisecond a
    schema; this one a few microseconds)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        if keyword in _SUBSCHEMA:
            if not plainly_valid(value):
                return False
        elif keyword == "properties":
            if not isinstance(value, dict) or not all(plainly_valid(v) for v in value.values()):
                return False
        else:
            check = _PLAIN.get(keyword)
            if check is None or not check(value):
                return False
    return True


def _is_type(value: Any) -> bool:
    if isinstance(value, str):
        return value in JSON_TYPES
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, str) and v in JSON_TYPES for v in value)
        and len(set(value)) == len(value)
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_names(value: Any) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(v, str) for v in value)
        and len(set(value)) == len(value)
    )


#: Keywords whose value is one subschema.
_SUBSCHEMA = frozenset({"items", "additionalProperties"})
#: The other plain keywords, each with the check its value must pass (2020-12's meta-schema:
#: the validation, meta-data and format-annotation vocabularies).
_PLAIN: Mapping[str, Callable[[Any], bool]] = {
    "type": _is_type,
    **dict.fromkeys(("description", "title", "pattern", "format"), lambda v: isinstance(v, str)),
    **dict.fromkeys(("enum", "examples"), lambda v: isinstance(v, list)),
    **dict.fromkeys(("default", "const"), lambda _v: True),
    "required": _is_names,
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"), _is_number),
    **dict.fromkeys(
        ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"),
        _is_count,
    ),
    **dict.fromkeys(
        ("uniqueItems", "deprecated", "readOnly", "writeOnly"), lambda v: isinstance(v, bool)
    ),
}


def _meta_validator(schema: Mapping[str, Any]) -> Any:
    """The validator of the meta-schema ``$schema`` names (2020-12 when it names none or one
    the ``jsonschema`` package does not know), made once per dialect."""
    dialect = schema.get("$schema")
    kind = (
        validator_for(schema, default=Draft202012Validator)
        if isinstance(dialect, str)
        else Draft202012Validator
    )
    if kind not in _META:
        _META[kind] = kind(kind.META_SCHEMA)
    return _META[kind]


def _problem(error: ValidationError) -> str:
    if any(
        pair == ("properties", "type") for pair in itertools.pairwise(error.absolute_schema_path)
    ):
        names = error.instance if isinstance(error.instance, list) else [error.instance]
        bad = next((name for name in names if name not in JSON_TYPES), None)
        if bad is not None:
            return type_problem(bad)
    message = error.message
    return message if len(message) <= 200 else f"{message[:197]}..."


def type_problem(name: Any) -> str:
    """Why ``name`` is no JSON Schema type, with the type it probably means."""
    meant = json_type(name) if isinstance(name, str) else None
    if meant == ANY_TYPE:
        hint = "; leave 'type' out to accept any value"
    else:
        hint = f"; did you mean {meant!r}?" if meant else ""
    return f"{name!r} is not a JSON Schema type (one of {', '.join(JSON_TYPES)}){hint}"
