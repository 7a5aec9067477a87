"""The capability model: one normalized descriptor for tools, skills, extensions and channels.

A :class:`Capability` is a frozen value. ``to_dict``/``from_dict`` give its JSON form (the form it
has in events and in Redis); ``content_hash`` identifies its content, so an unchanged capability
is recognised wherever it comes from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Literal, cast

Kind = Literal["tool", "skill", "extension", "channel"]
KINDS: tuple[Kind, ...] = ("tool", "skill", "extension", "channel")

RelationType = Literal["related", "composed_with", "depends_on"]
RELATION_TYPES: tuple[RelationType, ...] = ("related", "composed_with", "depends_on")

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class SourceRef:
    """Where a capability came from, so tooling can go back to it.

    ``type`` is the normalizer that made it (``tool``, ``skill``, ``extension``, ``channel``,
    ``manifest``, ``jsonl``, ``mcp``); ``source`` names the collection it belongs to (a registry
    directory, an MCP server, a catalog file); ``location`` the one file or record;
    ``description`` what the collection says of itself (an MCP server's
    ``serverInfo.description``), empty when it says nothing.
    """

    type: str
    source: str = ""
    location: str = ""
    description: str = ""

    def to_dict(self) -> JSONDict:
        out: JSONDict = {"type": self.type, "source": self.source, "location": self.location}
        if self.description:  # left out when empty: hashes of earlier records unchanged
            out["description"] = self.description
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceRef:
        return cls(
            type=str(data.get("type", "")),
            source=str(data.get("source", "")),
            location=str(data.get("location", "")),
            description=str(data.get("description", "")),
        )


@dataclass(frozen=True)
class Relationship:
    """A declared edge from one capability to another (the graph's manifest edges)."""

    target: str
    type: RelationType = "related"

    def to_dict(self) -> JSONDict:
        return {"target": self.target, "type": self.type}


@dataclass(frozen=True)
class Visibility:
    """Who in the tenant (the organisation) sees a capability: every member when no roles and no
    users are named, else holders of any of ``roles`` and the ``users``
    (:func:`capdisc.access.visible`)."""

    roles: tuple[str, ...] = ()
    users: tuple[str, ...] = ()

    @property
    def open(self) -> bool:
        return not self.roles and not self.users

    def to_dict(self) -> JSONDict:
        return {"roles": list(self.roles), "users": list(self.users)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Visibility:
        data = data or {}
        return cls(tuple(data.get("roles") or ()), tuple(data.get("users") or ()))


@dataclass(frozen=True)
class Capability:
    """One capability, normalized from any source (docs/design.md, "Source normalization")."""

    id: str
    kind: Kind
    name: str
    description: str
    display_name: str = ""
    category: str = "general"
    tags: tuple[str, ...] = ()
    required_secrets: tuple[str, ...] = ()
    required_tools: tuple[str, ...] = ()
    available: bool = True
    #: Whether calling it changes anything outside (None: its source did not say, so it is
    #: never advertised as read-only).
    has_side_effects: bool | None = None
    full_schema: JSONDict | None = None
    full_content: str | None = None
    source_ref: SourceRef = field(default_factory=lambda: SourceRef(type="tool"))
    relationships: tuple[Relationship, ...] = ()
    example_queries: tuple[str, ...] = ()
    version: str = ""
    visibility: Visibility = field(default_factory=Visibility)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Top-level parameter names of the tool's JSON Schema (empty for non-tools)."""
        props = (self.full_schema or {}).get("properties")
        return tuple(props) if isinstance(props, dict) else ()

    @cached_property
    def content_hash(self) -> str:
        """sha256 over the canonical JSON of every field: equal hashes mean equal capabilities
        (computed once: the capability is immutable)."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()

    def to_dict(self) -> JSONDict:
        data = self._fields_dict()
        if not self.visibility.open:  # open stays out: hashes of open capabilities unchanged
            data["visibility"] = self.visibility.to_dict()
        return data

    def _fields_dict(self) -> JSONDict:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "display_name": self.display_name,
            "description": self.description,
            "category": self.category,
            "tags": list(self.tags),
            "required_secrets": list(self.required_secrets),
            "required_tools": list(self.required_tools),
            "available": self.available,
            "has_side_effects": self.has_side_effects,
            "full_schema": self.full_schema,
            "full_content": self.full_content,
            "source_ref": self.source_ref.to_dict(),
            "relationships": [r.to_dict() for r in self.relationships],
            "example_queries": list(self.example_queries),
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capability:
        """Rebuild from :meth:`to_dict` output. Trusted input: validate untrusted records with
        :func:`capdisc.registry.normalize.capability_from_record` instead."""
        values: dict[str, Any] = {k: v for k, v in data.items() if k in _CAPABILITY_FIELDS}
        for key in ("tags", "required_secrets", "required_tools", "example_queries"):
            values[key] = tuple(values.get(key) or ())
        values["relationships"] = tuple(
            Relationship(target=str(r["target"]), type=cast(RelationType, r.get("type", "related")))
            for r in values.get("relationships") or ()
        )
        values["source_ref"] = SourceRef.from_dict(values.get("source_ref") or {"type": "tool"})
        values["visibility"] = Visibility.from_dict(values.get("visibility"))
        return cls(**values)

    def with_changes(self, **changes: Any) -> Capability:
        return replace(self, **changes)


#: Capability's field names (:meth:`Capability.from_dict` runs for every record read).
_CAPABILITY_FIELDS = frozenset(f.name for f in fields(Capability))


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON: the one serialization hashes are taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def display_name_from(name: str) -> str:
    """``web-search`` -> ``Web Search``: capitalize each name segment."""
    parts = [p for p in name.replace("_", "-").replace(".", "-").split("-") if p]
    return " ".join(p[:1].upper() + p[1:] for p in parts) or name
