"""CAPABILITY.yaml: file-based capability definitions (docs/design.md, "Source normalization").

A capability directory holds ``CAPABILITY.yaml`` and optionally ``SKILL.md`` (its full content)
and ``schema.json`` (its full JSON Schema). Parsing is strict and bounded: the byte size is
checked before anything is parsed, YAML aliases, merge keys and duplicate keys are refused, and
fields have exact types. Every rejection is a :class:`ManifestError` naming the file and field.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from capdisc.errors import ManifestError
from capdisc.models import Capability
from capdisc.registry.normalize import capability_from_record
from capdisc.registry.safeyaml import load_mapping

log = structlog.get_logger(__name__)

MANIFEST_NAME = "CAPABILITY.yaml"
SKILL_NAME = "SKILL.md"
SCHEMA_NAME = "schema.json"
DEFAULT_MAX_BYTES = 64 * 1024
MAX_SIDE_FILE_BYTES = 256 * 1024

# Manifest spelling -> record field. camelCase keys (the original design's spelling) stay
# accepted.
_ALIASES = {
    "displayName": "display_name",
    "requiredSecrets": "required_secrets",
    "requiredTools": "required_tools",
    "hasSideEffects": "has_side_effects",
    "exampleQueries": "example_queries",
    "inputSchema": "full_schema",
    "input_schema": "full_schema",
    "parameters": "full_schema",
    "skillContent": "skill_content",
}
#: Every key a manifest may use (record fields a manifest must not set are left out).
MANIFEST_FIELDS = frozenset(
    {
        "id",
        "kind",
        "name",
        "display_name",
        "description",
        "category",
        "tags",
        "required_secrets",
        "required_tools",
        "available",
        "has_side_effects",
        "relationships",
        "example_queries",
        "version",
        "full_schema",
        "skill_content",
        "examples",
        "visibility",
        *_ALIASES,
    }
)


@dataclass
class ScanResult:
    """What a scan of a registry directory found: parsed capabilities and rejected files."""

    root: Path
    capabilities: dict[Path, Capability] = field(default_factory=dict)
    errors: dict[Path, ManifestError] = field(default_factory=dict)


class ScanCache:
    """Parse results of unchanged capability directories, for repeated scans (the watcher).

    An entry is reused while the size, mtime and inode of CAPABILITY.yaml, SKILL.md and
    schema.json are all unchanged; parsing is the slow part of a scan.
    """

    def __init__(self) -> None:
        self._entries: dict[Path, tuple[tuple[Any, ...], Capability | ManifestError]] = {}

    def load(self, path: Path, root: Path, max_bytes: int) -> Capability:
        stamp = tuple(
            _stamp(path.parent / name) for name in (MANIFEST_NAME, SKILL_NAME, SCHEMA_NAME)
        )
        cached = self._entries.get(path)
        if cached is None or cached[0] != stamp:
            try:
                result: Capability | ManifestError = load_manifest(
                    path, registry_root=root, max_bytes=max_bytes
                )
            except ManifestError as exc:
                result = exc
            except Exception as exc:  # a parser gap refuses one file, not the scan
                result = _unexpected(path, exc)
            self._entries[path] = (stamp, result)
            cached = self._entries[path]
        if isinstance(cached[1], ManifestError):
            raise cached[1]
        return cached[1]


def _unexpected(path: Path, exc: Exception) -> ManifestError:
    """A manifest whose parsing raised what no check foresaw, refused like any invalid one (so
    a scan, and the watcher and stack around it, go on, and the capability's last good version
    stays), the error logged with its traceback for a bug report."""
    log.error("manifest_parse_failed_unexpectedly", path=str(path), exc_info=exc)
    return ManifestError(
        str(path),
        None,
        f"could not be parsed ({type(exc).__name__}: {exc}); this is a capdisc bug, please "
        "report it with the file; its last good version stays served until the file parses",
    )


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def scan_directory(
    root: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cache: ScanCache | None = None,
    held: Mapping[str, Path] | None = None,
) -> ScanResult:
    """Parse every ``CAPABILITY.yaml`` under ``root`` (recursively, in path order).

    Two manifests defining one id: the one the registry ``held`` it from (id -> the manifest its
    stored version came from) keeps it, else the first in path order; the other is an error
    naming both files. While the held manifest fails to parse, every other one defining its id
    is an error too, so the stored (last good) version stays until that file is fixed.
    """
    root = root.resolve()
    result = ScanResult(root=root)
    cache = cache or ScanCache()
    parsed: list[tuple[Path, Capability]] = []
    for path in _manifest_paths(root):
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        try:
            parsed.append((path, cache.load(path, root, max_bytes)))
        except ManifestError as exc:
            result.errors[path] = exc
    keepers = _keepers(parsed, held or {}, result.errors)
    for path, capability in parsed:
        keeper = keepers[capability.id]
        if keeper == path:
            result.capabilities[path] = capability
        else:
            result.errors[path] = _duplicate(path, capability.id, keeper, result.errors)
    result.errors = dict(sorted(result.errors.items()))
    return result


def _manifest_paths(root: Path) -> list[Path]:
    """Every entry named ``CAPABILITY.yaml`` under ``root``, in path order, whatever it is: a
    broken symlink (a loop, a moved target) too, so that it is refused like any file that
    cannot be read and keeps what it defined (``Path.rglob`` leaves it out, as if deleted).
    Symlinked directories are not entered."""
    return sorted(
        Path(directory) / MANIFEST_NAME
        for directory, subdirectories, files in os.walk(root)
        if MANIFEST_NAME in files or MANIFEST_NAME in subdirectories
    )


def _keepers(
    parsed: list[tuple[Path, Capability]],
    held: Mapping[str, Path],
    broken: Mapping[Path, ManifestError],
) -> dict[str, Path]:
    """For each id parsed, the manifest that keeps it: the held one if it defines the id, the
    held one still if it fails to parse (no other may replace its stored version), else the
    first in path order."""
    defined: dict[str, list[Path]] = {}
    for path, capability in parsed:
        defined.setdefault(capability.id, []).append(path)
    keepers: dict[str, Path] = {}
    for cap_id, paths in defined.items():
        holder = held.get(cap_id)
        if holder is not None and (holder in paths or holder in broken):
            keepers[cap_id] = holder
        else:
            keepers[cap_id] = paths[0]
    return keepers


def _duplicate(
    path: Path, capability_id: str, keeper: Path, broken: Mapping[Path, ManifestError]
) -> ManifestError:
    if keeper in broken:
        problem = (
            f"{capability_id!r} is already defined by {keeper}, which fails to parse: "
            "its last good version stays until that file is fixed; remove this duplicate "
            "or give it another name"
        )
    else:
        problem = f"{capability_id!r} is already defined by {keeper}"
    return ManifestError(str(path), "id", problem)


def load_manifest(
    path: Path, *, registry_root: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> Capability:
    """Parse one CAPABILITY.yaml (with its SKILL.md and schema.json) into a capability."""
    source = str(path)
    data = load_mapping(_read_text(path, max_bytes, source), source)
    record = _to_record(data, source)
    schema_origin = _schema_key(data)
    content_origin = _attach_side_files(path.parent, record, source)
    if content_origin.schema_file:
        schema_origin = str(path.parent / SCHEMA_NAME)
    root = registry_root or path.parent
    record["source_ref"] = {"type": "manifest", "source": str(root), "location": source}
    return _validated(record, source, schema_origin, content_origin.skill_file)


def parse_manifest_text(text: str, source: str) -> Capability:
    """Parse manifest text that has no directory around it (tests, API uploads)."""
    data = load_mapping(text, source)
    record = _to_record(data, source)
    record["source_ref"] = {"type": "manifest", "source": "", "location": source}
    return _validated(record, source, _schema_key(data))


def _schema_key(data: dict[str, Any]) -> str:
    return next((k for k in data if _ALIASES.get(k) == "full_schema"), "parameters")


def _validated(
    record: dict[str, Any], source: str, schema_origin: str, skill_origin: str | None = None
) -> Capability:
    """Validate, reporting schema problems under the key (or file) the schema came from and
    skill-content problems against the SKILL.md they are in."""
    try:
        return capability_from_record(record, source)
    except ManifestError as exc:
        field = exc.field or ""
        if field == "full_content" and skill_origin is not None:
            raise ManifestError(skill_origin, None, exc.problem) from exc
        if not field.startswith("full_schema"):
            raise
        rest = field.removeprefix("full_schema").lstrip(".")
        if schema_origin.endswith(SCHEMA_NAME):
            raise ManifestError(schema_origin, rest or None, exc.problem) from exc
        raise ManifestError(
            source, f"{schema_origin}{'.' if rest else ''}{rest}", exc.problem
        ) from exc


def _read_text(path: Path, max_bytes: int, source: str) -> str:
    """The file's text, read only when it is a regular file (a FIFO would block the reader for
    good, a device such as ``/dev/zero`` never end) and at most ``max_bytes`` of it."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError(
                source, None, "is not a regular file (a directory, pipe or device); make it one"
            )
        with path.open("rb") as file:
            raw = file.read(max_bytes + 1)
    except OSError as exc:
        raise ManifestError(source, None, f"cannot be read: {exc.strerror}") from exc
    if len(raw) > max_bytes:
        size = max(info.st_size, len(raw))
        raise ManifestError(
            source,
            None,
            f"is {size} bytes, the limit is {max_bytes}; shorten it or move long text to SKILL.md",
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ManifestError(source, None, f"is not valid UTF-8 (byte {exc.start})") from exc


def _to_record(data: dict[str, Any], source: str) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in data.items():
        if key not in MANIFEST_FIELDS or key == "full_schema":
            known = ", ".join(
                sorted(k for k in MANIFEST_FIELDS if k not in _ALIASES and k != "full_schema")
            )
            raise ManifestError(source, key, f"unknown field (known fields: {known}, parameters)")
        target = _ALIASES.get(key, key)
        if target in record:
            raise ManifestError(
                source, key, f"sets '{target}' a second time (under another spelling); keep one"
            )
        record[target] = value
    examples = record.pop("examples", None)
    if examples is not None:
        record["example_queries"] = _example_queries(
            record.get("example_queries"), examples, source
        )
    return record


def _example_queries(queries: Any, examples: Any, source: str) -> Any:
    """``examples`` (strings, or mappings with a ``description``) add to ``example_queries``."""
    if not isinstance(examples, list):
        raise ManifestError(source, "examples", "must be a list of mappings with a description")
    found = list(queries) if isinstance(queries, list) else []
    for index, example in enumerate(examples):
        description = example.get("description") if isinstance(example, dict) else example
        if not isinstance(description, str):
            raise ManifestError(
                source,
                f"examples[{index}]",
                "must be a string or a mapping with a 'description' string",
            )
        found.append(description)
    return found


@dataclass(frozen=True)
class _SideFiles:
    """Which side files a manifest's record was completed from."""

    skill_file: str | None
    schema_file: bool


def _attach_side_files(directory: Path, record: dict[str, Any], source: str) -> _SideFiles:
    """Load SKILL.md and schema.json into the record; where they came from. A side file that
    is there but cannot be read (a directory, a broken symlink) is an error, not left out: the
    content or schema stored from it would be dropped."""
    content_ref = record.pop("skill_content", None)
    skill_path = _inside(directory, SKILL_NAME, source, "skill_content")
    skill_there = os.path.lexists(directory / SKILL_NAME)
    if content_ref is not None:
        skill_path = _inside(directory, content_ref, source, "skill_content")
        if not skill_path.is_file():
            raise ManifestError(source, "skill_content", f"{content_ref!r} does not exist")
        skill_there = True
    skill_file = str(skill_path) if skill_there else None
    if skill_file is not None:
        record["full_content"] = _read_text(skill_path, MAX_SIDE_FILE_BYTES, skill_file)
    schema_path = _inside(directory, SCHEMA_NAME, source, "parameters")
    if not os.path.lexists(directory / SCHEMA_NAME):
        return _SideFiles(skill_file, schema_file=False)
    if record.get("full_schema") is not None:
        raise ManifestError(
            source, "parameters", f"is set and {SCHEMA_NAME} exists beside it; keep only one"
        )
    text = _read_text(schema_path, MAX_SIDE_FILE_BYTES, str(schema_path))
    try:
        record["full_schema"] = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(
            str(schema_path), None, f"is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from exc
    except RecursionError as exc:
        raise ManifestError(str(schema_path), None, "is nested too deeply to read") from exc
    except ValueError as exc:  # an integer past the 4300 digits int() converts
        raise ManifestError(
            str(schema_path), None, "holds a number too long to read; shorten it"
        ) from exc
    return _SideFiles(skill_file, schema_file=True)


def _inside(directory: Path, ref: Any, source: str, key: str) -> Path:
    """``ref`` resolved, when it is a path inside ``directory`` the system can look up; else a
    :class:`ManifestError` naming ``key`` (never the exception of a path that cannot be
    resolved, which would stop the scan and the watcher with it)."""
    if not isinstance(ref, str):
        raise ManifestError(source, key, "must be a relative path string")
    try:
        candidate = (directory / ref).resolve()
        candidate.is_file()  # a name too long for the system fails here, not while resolving
    except (OSError, RuntimeError, ValueError) as exc:
        shown = ref if len(ref) <= 80 else f"{ref[:80]}..."
        raise ManifestError(
            source,
            key,
            f"{shown!r} cannot be looked up ({_lookup_problem(exc)}); name a file "
            "in the capability directory",
        ) from exc
    if not candidate.is_relative_to(directory.resolve()):
        raise ManifestError(source, key, f"{ref!r} points outside the capability directory")
    return candidate


def _lookup_problem(exc: Exception) -> str:
    if isinstance(exc, RuntimeError):  # Path.resolve's before Python 3.13
        return "a symlink loop"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


__all__ = [
    "MANIFEST_NAME",
    "ScanCache",
    "ScanResult",
    "load_manifest",
    "parse_manifest_text",
    "scan_directory",
]
