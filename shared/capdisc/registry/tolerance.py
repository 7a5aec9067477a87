"""What an import tolerates in a third-party tool, and repairs, that a manifest may not have.

Catalog files and MCP servers are written for other programs, and whoever imports them cannot
edit them; a manifest is written for capdisc by someone who can fix it. So before the strict
checks of :func:`capdisc.registry.normalize.capability_from_record`, an import (``capdisc import
jsonl``, ``capdisc import mcp``, the benchmark catalogs) repairs what is harmless, and notes each
repair:

- zero-width characters and the byte order mark (U+200B, U+200C, U+200D, U+2060, U+FEFF) are
  removed from text; every other invisible or control character (bidi controls, tag characters,
  ...) is still refused, since those can hide instructions from a reviewer;
- schema dialects: type names of other languages are read as JSON Schema types (``dict`` ->
  ``object``, ``float`` -> ``number``, ``String`` -> ``string``; ``any`` leaves the type out), a
  single ``examples`` value is put in a list, and a property's own boolean ``required`` moves to
  its parent's ``required`` list;
- a schema nested deeper than :data:`MAX_SCHEMA_DEPTH` keeps its levels down to the limit; what
  sits deeper is replaced by ``{}`` (any value) or left out.

What the repairs leave wrong (``"type": "strng"``) is refused by the strict checks, naming it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from capdisc.errors import ManifestError
from capdisc.models import Capability
from capdisc.registry.normalize import capability_from_record, refuse_invisible
from capdisc.registry.schemas import (
    ANY_TYPE,
    DROP,
    MAX_SCHEMA_DEPTH,
    json_type,
    map_subschemas,
)

#: Invisible characters that carry no instruction and that real catalogs are full of (text
#: pasted from web pages and word processors): removed from imported text.
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")
_ZERO_WIDTH = re.compile(f"[{''.join(sorted(ZERO_WIDTH))}]")
_LONG_PATH = 120


def tolerant_fields(
    fields: Mapping[str, Any], schema_key: str | None, source: str
) -> tuple[dict[str, Any], list[str]]:
    """``fields`` (the raw values an importer reads, its tool schema under ``schema_key``) with
    the repairs made, and one note per repair (``"parameters.type: type 'dict' read as
    'object'"``). Raises :class:`ManifestError` naming the field for a character that stays
    refused."""
    notes: list[str] = []
    out = dict(fields)
    schema = (
        schema_key if schema_key is not None and isinstance(out.get(schema_key), dict) else None
    )
    if schema is not None:
        out[schema] = cut_depth(out[schema], schema, notes)
    for key in list(out):
        out[key] = _without_zero_width(out[key], key, notes)
        _refuse_hidden(source, key, out[key])
    if schema is not None:  # a single example put in a list may reach past the limit: cut again
        out[schema] = cut_depth(read_dialects(out[schema], schema, notes), schema, notes)
    return out, notes


def first_paragraph(text: str, max_chars: int) -> tuple[str, bool]:
    """The first paragraph of ``text``, cut at a word to at most ``max_chars`` (an MCP server's
    description as its tools record it), and whether it was cut."""
    first = text.strip().split("\n\n", 1)[0].strip()
    if len(first) <= max_chars:
        return first, False
    return first[:max_chars].rsplit(" ", 1)[0].rstrip(), True


def validated(record: Mapping[str, Any], source: str, schema_key: str) -> Capability:
    """:func:`capability_from_record`, with a schema problem named under ``schema_key`` (the
    importer's own name of the schema, ``parameters`` or ``inputSchema``) instead of
    ``full_schema``."""
    try:
        return capability_from_record(record, source)
    except ManifestError as exc:
        field = exc.field or ""
        if not field.startswith("full_schema"):
            raise
        rest = field.removeprefix("full_schema")
        raise ManifestError(exc.source, f"{schema_key}{rest}", exc.problem) from exc


# -- invisible characters --------------------------------------------------------------------


def _without_zero_width(value: Any, key: str, notes: list[str]) -> Any:
    removed: Counter[str] = Counter()
    cleaned = _strip(value, removed)
    if removed:
        total = sum(removed.values())
        chars = ", ".join(f"U+{ord(c):04X}" for c in sorted(removed))
        plural = "s" if total > 1 else ""
        notes.append(f"{key}: removed {total} zero-width character{plural} ({chars})")
    return cleaned


def _strip(value: Any, removed: Counter[str]) -> Any:
    if isinstance(value, str):
        found = _ZERO_WIDTH.findall(value)
        if not found:
            return value
        removed.update(found)
        return _ZERO_WIDTH.sub("", value)
    if isinstance(value, dict):
        return {_strip(k, removed): _strip(v, removed) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, removed) for v in value]
    return value


def _refuse_hidden(source: str, key: str, value: Any) -> None:
    if isinstance(value, str):
        refuse_invisible(source, key, value)
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_invisible(source, f"{key}.{k}", str(k))
            _refuse_hidden(source, f"{key}.{k}", v)
    elif isinstance(value, list):
        for index, v in enumerate(value):
            _refuse_hidden(source, f"{key}[{index}]", v)


# -- depth -----------------------------------------------------------------------------------


def cut_depth(schema: dict[str, Any], key: str, notes: list[str]) -> dict[str, Any]:
    """``schema`` (field ``key``) cut to :data:`MAX_SCHEMA_DEPTH` levels: each subschema that
    does not fit keeps the levels that do, a subschema at the limit becomes ``{}``, and other
    values that do not fit are left out. Notes how many parts went and where the first was."""
    cuts: list[str] = []
    out: dict[str, Any] = _cut(schema, key, 0, cuts)
    if cuts:
        first = cuts[0] if len(cuts[0]) <= _LONG_PATH else f"{cuts[0][:50]}...{cuts[0][-60:]}"
        notes.append(
            f"{key}: nested deeper than {MAX_SCHEMA_DEPTH} levels; kept the levels down to the "
            f"limit, {len(cuts)} deeper part{'s' if len(cuts) > 1 else ''} replaced by {{}} or "
            f"left out (the first at {first})"
        )
    return out


def _fits(value: Any, levels: int) -> bool:
    """Whether ``value`` nests at most ``levels`` levels below itself."""
    if levels < 0:
        return False
    if isinstance(value, dict):
        return all(_fits(child, levels - 1) for child in value.values())
    if isinstance(value, list):
        return all(_fits(child, levels - 1) for child in value)
    return True


def _cut(node: Any, path: str, depth: int, cuts: list[str]) -> Any:
    """A subschema at ``depth`` (at most the limit) cut so that it fits."""
    if _fits(node, MAX_SCHEMA_DEPTH - depth):
        return node
    if not isinstance(node, dict) or depth >= MAX_SCHEMA_DEPTH:
        cuts.append(path)
        return {}

    def subschema(sub: Any, where: str, levels: int) -> Any:
        if depth + levels > MAX_SCHEMA_DEPTH:
            cuts.append(path + where)
            return DROP
        return _cut(sub, path + where, depth + levels, cuts)

    def other(keyword: str, value: Any) -> Any:
        if _fits(value, MAX_SCHEMA_DEPTH - depth - 1):
            return value
        cuts.append(f"{path}.{keyword}")
        return DROP

    return map_subschemas(node, subschema, other)


# -- dialects --------------------------------------------------------------------------------


def read_dialects(schema: dict[str, Any], key: str, notes: list[str]) -> dict[str, Any]:
    """``schema`` (field ``key``) with the dialects of other languages read as JSON Schema; one
    note per kind of change, naming where (the first three places)."""
    changes: dict[str, list[str]] = {}
    out = _dialect(schema, key, changes)
    for change, paths in changes.items():
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        notes.append(f"{', '.join(paths[:3])}{more}: {change}")
    return dict(out)


def _dialect(node: Any, path: str, changes: dict[str, list[str]]) -> Any:
    if not isinstance(node, dict):
        return node
    node = _lift_required(node, path, changes)
    return map_subschemas(
        node,
        lambda sub, where, _levels: _dialect(sub, path + where, changes),
        lambda keyword, value: _keyword(keyword, value, f"{path}.{keyword}", changes),
    )


def _keyword(keyword: str, value: Any, path: str, changes: dict[str, list[str]]) -> Any:
    if keyword == "type":
        return _type(value, path, changes)
    if keyword == "examples" and not isinstance(value, list):
        changes.setdefault("a single example put in a list", []).append(path)
        return [value]
    return value


def _type(value: Any, path: str, changes: dict[str, list[str]]) -> Any:
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(name, str) for name in names):
        return value  # the meta-schema check refuses it
    meant = [json_type(name) or name for name in names]
    if ANY_TYPE in meant:
        changes.setdefault(f"type {value!r} left out (any value)", []).append(path)
        return DROP
    for name, json_name in zip(names, meant, strict=True):
        if name != json_name:
            changes.setdefault(f"type {name!r} read as {json_name!r}", []).append(path)
    unique = list(dict.fromkeys(meant))
    return unique if isinstance(value, list) else unique[0]


_LIFTED = "a property's boolean 'required' moved to its parent's 'required' list"
_DROPPED = "a boolean 'required' outside 'properties' left out"


def _lift_required(
    node: dict[str, Any], path: str, changes: dict[str, list[str]]
) -> dict[str, Any]:
    """A property's boolean ``required`` (an older dialect's spelling) moved to the node's
    ``required`` list, and a boolean ``required`` of the node itself left out (when the node is
    a property, its parent has lifted it already)."""
    required = node.get("required")
    props = node.get("properties")
    props = props if isinstance(props, dict) else {}
    flagged = _flags(props)
    if not flagged and not isinstance(required, bool):
        return node
    if not isinstance(required, bool) and not _names(required):
        return node  # the meta-schema check refuses it
    out = {k: v for k, v in node.items() if k != "required"}
    kept = required if isinstance(required, list) else []
    names = list(dict.fromkeys([*kept, *(name for name, flag in flagged.items() if flag)]))
    if names:
        out["required"] = names
    if flagged:
        out["properties"] = {
            name: _without_required(s) if name in flagged else s for name, s in props.items()
        }
        changes.setdefault(_LIFTED, []).extend(f"{path}.properties.{n}.required" for n in flagged)
    if isinstance(required, bool):
        changes.setdefault(_DROPPED, []).append(f"{path}.required")
    return out


def _flags(props: dict[str, Any]) -> dict[str, bool]:
    """The properties whose schema says ``required: true`` or ``false``."""
    return {
        name: schema["required"]
        for name, schema in props.items()
        if isinstance(schema, dict) and isinstance(schema.get("required"), bool)
    }


def _names(required: Any) -> bool:
    """Whether ``required`` is absent or a list of property names."""
    return required is None or (
        isinstance(required, list) and all(isinstance(n, str) for n in required)
    )


def _without_required(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "required"}
