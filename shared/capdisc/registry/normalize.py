"""Source normalization: five kinds of source records become one validated :class:`Capability`.

Every path ends in :func:`capability_from_record`, which checks a plain mapping strictly (known
fields only, exact types, identifier rules, no invisible characters, size limits, schemas the
JSON Schema meta-schema accepts) and raises :class:`ManifestError` naming the source and the
field. Normalizers only map their source's vocabulary onto the record fields (docs/design.md,
"Source normalization"); imports repair what is harmless in a third-party tool before these
checks (:mod:`capdisc.registry.tolerance`), manifests never.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from capdisc.errors import ManifestError
from capdisc.models import (
    KINDS,
    RELATION_TYPES,
    Capability,
    Kind,
    Relationship,
    RelationType,
    SourceRef,
    Visibility,
    display_name_from,
)
from capdisc.registry.safeyaml import load_mapping
from capdisc.registry.schemas import MAX_SCHEMA_DEPTH, check_schema

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ID_RE = re.compile(r"^[a-z]+:[A-Za-z0-9][A-Za-z0-9._/:-]{0,159}$")
SECRET_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_DESCRIPTION_CHARS = 4096
MAX_SHORT_TEXT_CHARS = 256
MAX_SOURCE_DESCRIPTION_CHARS = 1024
MAX_CONTENT_CHARS = 256 * 1024
MAX_LIST_ITEMS = 64

# Bidi controls and the Unicode tag block are never legitimate in a capability definition: they
# hide instructions from reviewers (ASCII smuggling). Format characters (Cf) cover U+200B-U+200F,
# U+2060, U+FEFF and the bidi embeddings; private-use (Co) and unassigned (Cn) are refused too.
_REFUSED_CATEGORIES = {"Cf", "Co", "Cn", "Cs"}
_ALLOWED_CONTROL = {"\n", "\t", "\r"}
#: The only refused characters plain ASCII text can hold (the C0 controls but newline, tab and
#: carriage return, and DEL): most text is ASCII, and needs no look at each character.
_ASCII_REFUSED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def capability_from_record(record: Mapping[str, Any], source: str) -> Capability:
    """Validate a record (the fields of :meth:`Capability.to_dict`) and build the capability.

    Raises :class:`ManifestError` naming ``source`` and the first offending field.
    """
    if not isinstance(record, Mapping):
        raise ManifestError(source, None, f"must be a mapping of fields, got {_type_name(record)}")
    unknown = sorted(set(record) - set(_CHECKS))
    if unknown:
        known = ", ".join(sorted(_CHECKS))
        raise ManifestError(source, str(unknown[0]), f"unknown field (known fields: {known})")
    for required in ("kind", "name", "description"):
        if record.get(required) in (None, ""):
            raise ManifestError(source, required, "is required")
    values = {
        key: check(source, key, record[key]) for key, check in _CHECKS.items() if key in record
    }
    kind = cast(Kind, values["kind"])
    name = cast(str, values["name"])
    values.setdefault("id", f"{kind}:{name}")
    values.setdefault("display_name", display_name_from(name))
    values.setdefault("category", "general")
    return Capability(**values)


# -- field checks ------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _text(source: str, key: str, value: Any, *, max_chars: int, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        hint = " (quote it)" if isinstance(value, (bool, int, float)) or value is None else ""
        raise ManifestError(source, key, f"must be a string, got {_type_name(value)}{hint}")
    if not allow_empty and not value.strip():
        raise ManifestError(source, key, "must not be empty")
    if len(value) > max_chars:
        raise ManifestError(source, key, f"is {len(value)} characters, the limit is {max_chars}")
    refuse_invisible(source, key, value)
    return value


def refuse_invisible(source: str, key: str, value: str) -> None:
    """Refuse ``value`` (of field ``key``) if it holds an invisible or control character other
    than a newline, a tab or a carriage return, naming the character and where it is."""
    if value.isascii() and _ASCII_REFUSED.search(value) is None:
        return
    for position, char in enumerate(value):
        if char in _ALLOWED_CONTROL:
            continue
        category = unicodedata.category(char)
        if category in _REFUSED_CATEGORIES or (category == "Cc"):
            raise ManifestError(
                source,
                key,
                f"contains the invisible or control character U+{ord(char):04X} at position "
                f"{position}{_line_and_column(value, position)}; remove it (hidden characters "
                "can smuggle instructions to a model)",
            )


def _line_and_column(value: str, position: int) -> str:
    """`` (line L, column C)`` for multi-line text, where an editor finds the character."""
    if "\n" not in value:
        return ""
    line = value.count("\n", 0, position) + 1
    column = position - (value.rfind("\n", 0, position) + 1) + 1
    return f" (line {line}, column {column})"


def _identifier(source: str, key: str, value: Any, pattern: re.Pattern[str], rule: str) -> str:
    text = _text(source, key, value, max_chars=160, allow_empty=False)
    if unicodedata.normalize("NFKC", text) != text or not pattern.fullmatch(text):
        raise ManifestError(source, key, f"{text!r} is not a valid {rule}")
    return text


def _check_name(source: str, key: str, value: Any) -> str:
    return _identifier(
        source,
        key,
        value,
        NAME_RE,
        "name (letters, digits, '.', '_', '-'; starts with a letter or digit; "
        "at most 64 characters)",
    )


def _check_id(source: str, key: str, value: Any) -> str:
    return _identifier(
        source, key, value, ID_RE, "id (form 'kind:name', for example 'tool:web-search')"
    )


def _check_kind(source: str, key: str, value: Any) -> str:
    if value not in KINDS:
        raise ManifestError(source, key, f"must be one of {', '.join(KINDS)}, got {value!r}")
    return cast(str, value)


def _check_bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ManifestError(source, key, f"must be true or false, got {_type_name(value)}")
    return value


def _check_side_effects(source: str, key: str, value: Any) -> bool | None:
    """True, false, or null: not said (never taken for read-only)."""
    return None if value is None else _check_bool(source, key, value)


def _string_list(
    source: str, key: str, value: Any, item: Callable[[str, str, Any], str] | None = None
) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ManifestError(source, key, f"must be a list of strings, got {_type_name(value)}")
    if len(value) > MAX_LIST_ITEMS:
        raise ManifestError(source, key, f"has {len(value)} items, the limit is {MAX_LIST_ITEMS}")
    checked = []
    for index, entry in enumerate(value):
        where = f"{key}[{index}]"
        if item is not None:
            checked.append(item(source, where, entry))
        else:
            checked.append(
                _text(source, where, entry, max_chars=MAX_SHORT_TEXT_CHARS, allow_empty=False)
            )
    return tuple(dict.fromkeys(checked))


def _check_tags(source: str, key: str, value: Any) -> tuple[str, ...]:
    tags = _string_list(source, key, value, _check_name)
    return tuple(dict.fromkeys(t.lower() for t in tags))


def _check_visibility(source: str, key: str, value: Any) -> Visibility:
    """``{roles: [...], users: [...]}``: who in the tenant sees the capability (both empty or
    absent: everyone in it)."""
    if isinstance(value, Visibility):
        return value
    if not isinstance(value, Mapping):
        raise ManifestError(source, key, "must be a mapping with 'roles' and/or 'users' lists")
    unknown = sorted(set(value) - {"roles", "users"})
    if unknown:
        raise ManifestError(source, f"{key}.{unknown[0]}", "unknown field (known: roles, users)")
    roles = _string_list(source, f"{key}.roles", value.get("roles") or [], _check_name)
    users = _string_list(source, f"{key}.users", value.get("users") or [], _principal)
    return Visibility(roles, users)


def visibility_of(roles: Sequence[str], users: Sequence[str], source: str) -> Visibility:
    """The visibility naming ``roles`` and ``users``, checked as a manifest's is: a
    :class:`ManifestError` naming the first that no capability may name otherwise (field
    ``visibility.roles[0]``, ``visibility.users[0]``)."""
    return _check_visibility(source, "visibility", {"roles": list(roles), "users": list(users)})


def _principal(source: str, key: str, value: Any) -> str:
    return _text(source, key, value, max_chars=MAX_SHORT_TEXT_CHARS, allow_empty=False)


def _check_secrets(source: str, key: str, value: Any) -> tuple[str, ...]:
    def secret(src: str, where: str, entry: Any) -> str:
        return _identifier(src, where, entry, SECRET_RE, "secret name (like OPENAI_API_KEY)")

    return _string_list(source, key, value, secret)


def _check_tool_refs(source: str, key: str, value: Any) -> tuple[str, ...]:
    def ref(src: str, where: str, entry: Any) -> str:
        text = _text(src, where, entry, max_chars=160, allow_empty=False)
        if not (ID_RE.fullmatch(text) or NAME_RE.fullmatch(text)):
            raise ManifestError(src, where, f"{text!r} is not a capability id or name")
        return text

    return _string_list(source, key, value, ref)


def _check_schema(source: str, key: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ManifestError(source, key, f"must be a JSON Schema object, got {_type_name(value)}")
    if value.get("type", "object") != "object":
        raise ManifestError(source, key, "the top-level schema must have type 'object'")
    props = value.get("properties", {})
    if not isinstance(props, dict):
        raise ManifestError(source, f"{key}.properties", "must be a mapping of parameter schemas")
    _check_json_value(source, key, value, depth=0)
    check_schema(source, key, value)
    return value


def _check_json_value(source: str, key: str, value: Any, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise ManifestError(source, key, f"is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ManifestError(source, key, f"has a non-string key {k!r}")
            refuse_invisible(source, f"{key}.{k}", k)
            _check_json_value(source, f"{key}.{k}", v, depth + 1)
    elif isinstance(value, list):
        for index, v in enumerate(value):
            _check_json_value(source, f"{key}[{index}]", v, depth + 1)
    elif isinstance(value, str):
        refuse_invisible(source, key, value)
    elif (isinstance(value, float) and value != value) or value in (float("inf"), float("-inf")):
        raise ManifestError(source, key, "must be a finite number")
    elif not isinstance(value, (int, float, bool)) and value is not None:
        raise ManifestError(source, key, f"{_type_name(value)} is not a JSON value (quote it)")


def _check_content(source: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    return _text(source, key, value, max_chars=MAX_CONTENT_CHARS)


def _check_relationships(source: str, key: str, value: Any) -> tuple[Relationship, ...]:
    if not isinstance(value, list):
        raise ManifestError(source, key, f"must be a list, got {_type_name(value)}")
    if len(value) > MAX_LIST_ITEMS:
        raise ManifestError(source, key, f"has {len(value)} items, the limit is {MAX_LIST_ITEMS}")
    return tuple(_relationship(source, f"{key}[{i}]", entry) for i, entry in enumerate(value))


def _relationship(source: str, where: str, entry: Any) -> Relationship:
    if isinstance(entry, str):
        return Relationship(target=_check_tool_refs(source, where, [entry])[0])
    if isinstance(entry, Mapping) and isinstance(entry.get("target"), str):
        extra = sorted(set(entry) - {"target", "type"})
        if extra:
            raise ManifestError(source, f"{where}.{extra[0]}", "unknown field (use target, type)")
        kind = entry.get("type", "related")
        if kind not in RELATION_TYPES:
            raise ManifestError(
                source, f"{where}.type", f"must be one of {', '.join(RELATION_TYPES)}, got {kind!r}"
            )
        target = _check_tool_refs(source, f"{where}.target", [entry["target"]])[0]
        return Relationship(target=target, type=cast(RelationType, kind))
    raise ManifestError(source, where, "must be a capability id or a mapping with 'target'")


def _check_source_ref(source: str, key: str, value: Any) -> SourceRef:
    if isinstance(value, SourceRef):
        return value
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise ManifestError(source, key, "must be a mapping with a 'type'")
    description = value.get("description", "")
    _text(source, f"{key}.description", description, max_chars=MAX_SOURCE_DESCRIPTION_CHARS)
    return SourceRef.from_dict(value)


def _short(source: str, key: str, value: Any) -> str:
    return _text(source, key, value, max_chars=MAX_SHORT_TEXT_CHARS)


def _description(source: str, key: str, value: Any) -> str:
    return _text(source, key, value, max_chars=MAX_DESCRIPTION_CHARS, allow_empty=False).strip()


def _queries(source: str, key: str, value: Any) -> tuple[str, ...]:
    return _string_list(source, key, value)


_CHECKS: dict[str, Callable[[str, str, Any], Any]] = {
    "id": _check_id,
    "kind": _check_kind,
    "name": _check_name,
    "display_name": _short,
    "description": _description,
    "category": _check_name,
    "tags": _check_tags,
    "required_secrets": _check_secrets,
    "required_tools": _check_tool_refs,
    "available": _check_bool,
    "has_side_effects": _check_side_effects,
    "full_schema": _check_schema,
    "full_content": _check_content,
    "source_ref": _check_source_ref,
    "relationships": _check_relationships,
    "example_queries": _queries,
    "version": _short,
    "visibility": _check_visibility,
}


# -- the five sources ----------------------------------------------------------------------------


def from_tool(tool: Mapping[str, Any], source: str = "tool") -> Capability:
    """A tool definition: ``name``, ``description`` and a JSON Schema under ``parameters``,
    ``input_schema`` or ``inputSchema``."""
    record = _pick(
        tool,
        "name",
        "description",
        "category",
        "tags",
        "required_secrets",
        "has_side_effects",
        "available",
        "display_name",
        "example_queries",
        "version",
    )
    record["kind"] = "tool"
    schema_keys = ("parameters", "input_schema", "inputSchema")
    schema = next((tool[k] for k in schema_keys if k in tool), None)
    record["full_schema"] = schema
    record["source_ref"] = {"type": "tool", "source": source, "location": str(tool.get("name"))}
    return capability_from_record(record, f"{source}:{tool.get('name')}")


def from_skill(name: str, skill_md: str, source: str = "skill") -> Capability:
    """A skill: ``SKILL.md`` with YAML front matter (``description``, ``tags``, ``requires``...)."""
    front, _body = split_front_matter(skill_md, f"{source}:{name}")
    record = _pick(
        front,
        "description",
        "category",
        "tags",
        "required_secrets",
        "display_name",
        "example_queries",
        "version",
    )
    record.update(kind="skill", name=front.get("name", name), full_content=skill_md)
    if "requires" in front or "required_tools" in front:
        record["required_tools"] = front.get("required_tools", front.get("requires"))
    record["source_ref"] = {"type": "skill", "source": source, "location": name}
    return capability_from_record(record, f"{source}:{name}")


def from_extension(entry: Mapping[str, Any], source: str = "extension-catalog") -> Capability:
    """An extension catalog entry; availability follows the catalog's ``installed`` flag."""
    record = _pick(
        entry,
        "name",
        "description",
        "category",
        "tags",
        "required_secrets",
        "display_name",
        "version",
        "example_queries",
    )
    record.update(kind="extension", available=entry.get("installed", entry.get("available", False)))
    if "tools" in entry:
        record["required_tools"] = entry["tools"]
    record["source_ref"] = {
        "type": "extension",
        "source": source,
        "location": str(entry.get("name")),
    }
    return capability_from_record(record, f"{source}:{entry.get('name')}")


def from_channel(entry: Mapping[str, Any], source: str = "channels") -> Capability:
    """A messaging platform: id ``channel:{platform}``, category always ``communication``."""
    platform = entry.get("platform", entry.get("name"))
    record = _pick(
        entry,
        "description",
        "tags",
        "required_secrets",
        "display_name",
        "version",
        "example_queries",
        "has_side_effects",
        "available",
    )
    record.update(kind="channel", name=platform, category="communication")
    record.setdefault("has_side_effects", True)
    record["source_ref"] = {"type": "channel", "source": source, "location": str(platform)}
    return capability_from_record(record, f"{source}:{platform}")


def _pick(data: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: data[k] for k in keys if k in data}


def split_front_matter(markdown: str, source: str) -> tuple[dict[str, Any], str]:
    """Split ``---``-delimited YAML front matter from a markdown document."""
    if not markdown.startswith("---"):
        return {}, markdown
    end = markdown.find("\n---", 3)
    if end < 0:
        raise ManifestError(source, None, "front matter opened with '---' is never closed")
    front = load_mapping(markdown[3:end], f"{source} (front matter)")
    return front, markdown[end + 4 :].lstrip("\n")
