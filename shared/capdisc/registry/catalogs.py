"""Tool catalogs in files as capabilities: ``tools.jsonl``, one tool a line.

The format is the one of ``shared/data`` and of ``capdisc import jsonl``: ``id``, ``name``,
``description``, ``parameters`` (or ``input_schema``, ``inputSchema``), ``category``, optional
``name_for_human`` (or ``title``, as MCP servers list it) and ``description_for_model``. A line
in the shape of OpenAI's tool lists (``{"type": "function", "function": {...}}``) is read as
the tool inside it. Catalog names may break the manifest rules
(``PDF&URLTool``, categories with spaces and slashes), so the reader maps them onto valid
identifiers (id ``tool:<name>``) and keeps the mapping for labels that name tools.

Each line is read on its own: through the repairs an import makes
(:mod:`capdisc.registry.tolerance`, each one noted with its line), then the strict checks of
:func:`capdisc.registry.normalize.capability_from_record`. A line that is still no valid tool is
refused with its line number and the reason naming the field; the other lines are read all the
same. :func:`load_catalog` serves the benchmarks, :func:`read_jsonl_catalog` the importer.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capdisc.errors import ManifestError
from capdisc.identifiers import humanize
from capdisc.models import Capability
from capdisc.registry.normalize import MAX_DESCRIPTION_CHARS, MAX_SOURCE_DESCRIPTION_CHARS
from capdisc.registry.tolerance import first_paragraph, tolerant_fields, validated

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._/:-]+")
_TEXT_FIELDS = (
    "id",
    "name",
    "description",
    "description_for_model",
    "name_for_human",
    "title",
    "category",
)
_SCHEMA_KEYS = ("parameters", "input_schema", "inputSchema")


@dataclass(frozen=True)
class Refusal:
    """A catalog line that is no valid tool: its number and the error (naming the field)."""

    line: int
    error: ManifestError

    @property
    def reason(self) -> str:
        """The problem without the file and line: ``field 'parameters.type': ...``."""
        problem = self.error.problem
        return f"field '{self.error.field}': {problem}" if self.error.field else problem


@dataclass(frozen=True)
class Note:
    """A repair made to a catalog line (:mod:`capdisc.registry.tolerance`)."""

    line: int
    text: str


@dataclass(frozen=True)
class Catalog:
    """A catalog as capabilities, the dataset tool id -> capability id mapping, the lines refused,
    the repairs made, and the ids and names the refused lines gave their tools (so that labels
    naming them are known to be refused, not unknown)."""

    capabilities: tuple[Capability, ...]
    ids: Mapping[str, str]
    refused: tuple[Refusal, ...] = ()
    notes: tuple[Note, ...] = ()
    refused_labels: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class JsonlImport:
    """A catalog file read for ``capdisc import jsonl``: its capabilities keyed by ``FILE:LINE``,
    the lines refused and the repairs made."""

    path: Path
    found: dict[Path, Capability]
    refused: tuple[Refusal, ...] = ()
    notes: tuple[Note, ...] = ()

    @property
    def errors(self) -> dict[Path, ManifestError]:
        """The refused lines' errors keyed by ``FILE:LINE``."""
        return {Path(f"{self.path}:{r.line}"): r.error for r in self.refused}


def capability_from_benchmark_tool(
    record: Mapping[str, Any],
    taken: set[str] | None = None,
    source: str = "benchmark",
    *,
    notes: list[str] | None = None,
    servers: bool = False,
) -> Capability:
    """One ``tools.jsonl`` record as a valid tool capability (lenient about names, repaired the
    way imports are, each repair appended to ``notes``). An id already in ``taken`` gets a
    suffix (``-2``); the id given is added to it.

    ``description_for_model`` (plugin manifests) is appended to the description as a second
    paragraph; ``name_for_human`` becomes the display name, else the name with its identifier
    parts split ("getWeather" -> "Get Weather").

    With ``servers``, a record naming its ``server`` (the development catalogs; also
    ``server_name``, ``serverName``, ``mcp_server``, ``mcpServer``) is a tool of that server, as
    ``capdisc import mcp`` files one: ``source_ref`` of type ``mcp`` (source ``mcp:SERVER``),
    under its ``category`` (the server's short name, as in the tool ids; the server's name when
    the record has no category).
    """
    record = _unwrapped(record)
    schema_key = next((k for k in _SCHEMA_KEYS if record.get(k)), "parameters")
    where = f"{source}:{record.get('id') or record.get('name') or 'tool'}"
    wanted = (*_TEXT_FIELDS, *(_SERVER_FIELDS if servers else ()), schema_key)
    picked = {k: record[k] for k in wanted if k in record}
    fields, repairs = tolerant_fields(picked, schema_key, where)
    if not str(fields.get("id") or fields.get("name") or "").strip():
        raise ManifestError(where, "name", "is missing: give the tool a 'name' (or an 'id')")
    raw_id = str(fields.get("id") or fields.get("name"))
    name = _safe(str(fields.get("name") or raw_id), _UNSAFE_NAME, 64)
    display = str(fields.get("name_for_human") or fields.get("title") or "").strip() or humanize(
        name
    )
    category = str(fields.get("category") or _server(fields) or "general").lower()
    category = category.replace(" ", "-")
    schema = fields.get(schema_key)
    if schema is not None and not isinstance(schema, dict):
        shown = json.dumps(schema, ensure_ascii=False)
        shown = shown if len(shown) <= 40 else f"{shown[:40]}..."
        repairs.append(f"{schema_key}: {shown} is no JSON Schema (an object); left out")
    description = _description(fields) or display
    if len(description) > MAX_DESCRIPTION_CHARS:
        repairs.append(
            f"description: {len(description)} characters, cut to the first {MAX_DESCRIPTION_CHARS}"
        )
    tool = {
        "id": _free_id(_safe(raw_id, _UNSAFE_ID, 150), taken),
        "kind": "tool",
        "name": name,
        "display_name": display[:256],
        "description": description[:MAX_DESCRIPTION_CHARS],
        "category": _safe(category, _UNSAFE_NAME, 64),
        "full_schema": schema if isinstance(schema, dict) else None,
        "source_ref": _source_ref(fields, source, raw_id),
    }
    capability = validated(tool, where, schema_key)
    if taken is not None:
        taken.add(capability.id)
    if notes is not None:
        notes.extend(repairs)
    return capability


#: The names tool lists give a tool's server, and what the server says of itself, first found
#: first read.
_SERVER_NAME_FIELDS = ("server", "server_name", "serverName", "mcp_server", "mcpServer")
_SERVER_DESCRIPTION_FIELDS = ("server_description", "serverDescription")
_SERVER_FIELDS = (*_SERVER_NAME_FIELDS, *_SERVER_DESCRIPTION_FIELDS)


def _unwrapped(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The tool of a line shaped as OpenAI's tool lists have it (``{"type": "function",
    "function": {"name": ..., ...}}``), with the line's other fields (a server, a category)
    beside it; any other line as it is."""
    inner = record.get("function")
    if "name" in record or not isinstance(inner, Mapping) or not inner.get("name"):
        return record
    if record.get("type", "function") != "function":
        return record
    outer = {k: v for k, v in record.items() if k not in ("type", "function")}
    return {**outer, **inner}


def _server(fields: Mapping[str, Any]) -> str:
    """The server a record names, under any of :data:`_SERVER_NAME_FIELDS` ("": none)."""
    return next(
        (str(fields[k]).strip() for k in _SERVER_NAME_FIELDS if str(fields.get(k) or "").strip()),
        "",
    )


def _source_ref(fields: Mapping[str, Any], source: str, raw_id: str) -> dict[str, str]:
    """Where the tool came from: its server, with the server's description as ``capdisc import
    mcp`` records it, when the record names one (read only when the caller asked for servers),
    else the catalog."""
    server = _server(fields)
    if not server:
        return {"type": "jsonl", "source": source, "location": raw_id}
    about = next((str(fields[k]) for k in _SERVER_DESCRIPTION_FIELDS if fields.get(k)), "")
    return {
        "type": "mcp",
        "source": f"mcp:{server}",
        "location": str(fields.get("name") or raw_id),
        "description": first_paragraph(about, MAX_SOURCE_DESCRIPTION_CHARS)[0],
    }


def _safe(text: str, pattern: re.Pattern[str], limit: int) -> str:
    cleaned = pattern.sub("_", text.strip()).strip("._-/:")
    return (cleaned or "tool")[:limit]


def _free_id(base: str, taken: set[str] | None) -> str:
    cap_id, n = f"tool:{base}", 2
    while taken is not None and cap_id in taken:
        cap_id, n = f"tool:{base}-{n}", n + 1
    return cap_id


def _description(fields: Mapping[str, Any]) -> str:
    description = str(fields.get("description") or "").strip()
    for_model = str(fields.get("description_for_model") or "").strip()
    if for_model and for_model != description:
        return f"{description}\n\n{for_model}" if description else for_model
    return description


# -- reading files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    """One non-blank line of a catalog: its JSON object (when it is one), and the capability
    with the repairs made, or the error."""

    number: int
    record: Mapping[str, Any] | None
    capability: Capability | None = None
    error: ManifestError | None = None
    notes: tuple[str, ...] = ()


def load_catalog(path: Path) -> Catalog:
    """Read a ``tools.jsonl`` catalog (the source named after its directory), each line on its
    own. Query labels may name a tool by its ``id`` or, when no other tool has that name or
    id, by its ``name``."""
    lines = list(_lines(path, path.parent.name, servers=True))
    kept = [(line.record or {}, line.capability) for line in lines if line.capability is not None]
    return Catalog(
        capabilities=tuple(capability for _, capability in kept),
        ids=_label_map(kept),
        refused=_refusals(lines),
        notes=_notes(lines),
        refused_labels=frozenset(
            label for line in lines if line.error is not None for label in _labels(line.record)
        ),
    )


def read_jsonl_catalog(path: Path, source: str) -> JsonlImport:
    """A ``tools.jsonl`` file as capabilities of ``source`` for ``capdisc import jsonl``: each
    keyed by ``FILE:LINE``; each line that is no valid tool refused with an error naming the
    line and the field (the other lines still import)."""
    lines = list(_lines(path, source))
    found = {
        Path(f"{path}:{line.number}"): line.capability
        for line in lines
        if line.capability is not None
    }
    return JsonlImport(path, found, _refusals(lines), _notes(lines))


def read_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Where each non-blank line of ``path`` is (``FILE:LINE``) and its JSON object (a labelled
    query file, whose lines are all needed: a bad one raises :class:`ManifestError` naming
    it)."""
    for _number, where, line in _numbered_lines(path):
        yield where, _json_object(_utf8(line, where), where)


def _lines(path: Path, source: str, *, servers: bool = False) -> Iterator[_Line]:
    taken: set[str] = set()
    for number, where, line in _numbered_lines(path):
        try:
            text = _utf8(line, where)
        except ManifestError as exc:  # this line refused; the others are still read
            yield _Line(number, None, error=exc)
            continue
        yield _line(text, number, where, taken, source, servers)


def _numbered_lines(path: Path) -> Iterator[tuple[int, str, bytes]]:
    """Each non-blank line of ``path`` as bytes (a BOM before the first dropped), with its
    number and ``FILE:LINE``: decoded one at a time, so bytes that are not UTF-8 cost their
    own line only."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if number == 1:
                line = line.removeprefix(codecs.BOM_UTF8)
            if line.strip():
                yield number, f"{path}:{number}", line


def _utf8(line: bytes, where: str) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            where, None, f"is not UTF-8 text (byte 0x{line[exc.start]:02x} at offset {exc.start})"
        ) from exc


def _line(text: str, number: int, where: str, taken: set[str], source: str, servers: bool) -> _Line:
    record: dict[str, Any] | None = None
    notes: list[str] = []
    try:
        record = _json_object(text, where)
        capability = capability_from_benchmark_tool(
            record, taken, source, notes=notes, servers=servers
        )
    except ManifestError as exc:
        return _Line(number, record, error=ManifestError(where, exc.field, exc.problem))
    except RecursionError:
        return _Line(number, record, error=ManifestError(where, None, "is nested too deeply"))
    return _Line(number, record, capability, notes=tuple(notes))


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError
        raise ManifestError(where, None, f"is not JSON: {exc}") from exc
    if not isinstance(record, dict):
        raise ManifestError(where, None, "must be a JSON object")
    return record


def _refusals(lines: list[_Line]) -> tuple[Refusal, ...]:
    return tuple(Refusal(line.number, line.error) for line in lines if line.error is not None)


def _notes(lines: list[_Line]) -> tuple[Note, ...]:
    return tuple(Note(line.number, text) for line in lines for text in line.notes)


def _labels(record: Mapping[str, Any] | None) -> set[str]:
    """The labels a line's tool could be named by: its id and its name."""
    if record is None:
        return set()
    return {str(record[k]) for k in ("id", "name") if record.get(k)}


def _label_map(kept: list[tuple[Mapping[str, Any], Capability]]) -> dict[str, str]:
    """Dataset tool id -> capability id, and each name no other tool has or uses as its id."""
    ids: dict[str, str] = {}
    names: dict[str, list[str]] = {}
    for record, capability in kept:
        ids[str(record.get("id") or record.get("name"))] = capability.id
        if record.get("name"):
            names.setdefault(str(record["name"]), []).append(capability.id)
    for name, owners in names.items():
        if len(owners) == 1 and name not in ids:
            ids[name] = owners[0]
    return ids
