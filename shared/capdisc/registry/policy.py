"""Registry policy: what applying an event does, and what syncing a source sends. Pure functions.

:func:`decide` orders events per capability by ``seq``: stale and duplicate events change nothing,
a delete leaves a tombstone so a late upsert cannot resurrect the capability, and an unchanged
content hash costs no embedding. :func:`plan_sync` turns a scan of a source into the events that
bring the registry in line with it, keeping capabilities whose manifest is present but broken.

Ownership: a capability id belongs to the source that stored it first (its record's
``source_ref.source``: a registry directory, ``jsonl:PATH``, ``mcp:...``). Another source's
upsert or delete of it is refused (``refused_owned``), by the producer's plan first and by the
indexing worker again, unless the event says ``take_over`` (``--take-over``): then the id moves
to the new source. A record without a source (stored by hand) belongs to nobody yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from capdisc.errors import ManifestError
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent

Decision = Literal[
    "upsert", "delete", "unchanged", "stale", "absent", "reindex", "not_found", "refused_owned"
]


@dataclass(frozen=True)
class StoredRecord:
    """What Redis holds for one capability (the value of the ``caps`` hash, as JSON)."""

    capability: dict[str, Any]
    seq: int
    content_hash: str
    updated_at_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "capability": self.capability,
            "seq": self.seq,
            "content_hash": self.content_hash,
            "updated_at_ms": self.updated_at_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoredRecord:
        return cls(
            capability=dict(data["capability"]),
            seq=int(data["seq"]),
            content_hash=str(data["content_hash"]),
            updated_at_ms=int(data.get("updated_at_ms", 0)),
        )

    @property
    def readable(self) -> bool:
        """False for :data:`UNREADABLE`: a stored value that is no record."""
        return self is not UNREADABLE

    @property
    def location(self) -> str:
        return str((self.capability.get("source_ref") or {}).get("location", ""))

    @property
    def source(self) -> str:
        return str((self.capability.get("source_ref") or {}).get("source", ""))


#: What a stored value that is no record reads as (not JSON, or a field missing or of the wrong
#: type: written by hand or damaged): older than any event and owned by no source, so the next
#: upsert or delete of its id replaces or removes it; never served.
UNREADABLE = StoredRecord(capability={}, seq=-1, content_hash="", updated_at_ms=0)
#: The capability fields every stored record has (those :class:`Capability` needs).
_NEEDED = ("id", "kind", "name", "description")


def stored_record(value: Any) -> StoredRecord | None:
    """The record a ``caps`` hash value holds (JSON text, or already parsed); None for no value,
    :data:`UNREADABLE` for a value that is no record."""
    if value is None or value == b"" or value == "":
        return None
    try:
        data = json.loads(value) if isinstance(value, bytes | str) else value
        record = StoredRecord.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return UNREADABLE
    capability = record.capability
    if not all(isinstance(capability.get(name), str) for name in _NEEDED):
        return UNREADABLE
    return record


def stored_capability(value: Any) -> Capability | None:
    """The capability a ``caps`` hash value holds; None for no value or one that is no record."""
    record = stored_record(value)
    return Capability.from_dict(record.capability) if record and record.readable else None


def decide(
    event: RegistryEvent,
    stored: StoredRecord | None,
    tombstone_seq: int | None,
    content_hash: str | None,
    has_vector: bool = True,
) -> Decision:
    """What applying ``event`` does, given the stored record and tombstone of its capability;
    unchanged content without a vector in the current vector space (stored by another
    embedder or an earlier version) is upserted, so it gets embedded. A reindex re-embeds what
    is stored, whatever its sequence; there is nothing to reindex once a capability is gone, or
    when what is stored is no record (:data:`UNREADABLE`).
    An upsert or delete from a source that does not own the stored capability is refused
    unless it takes it over (:func:`refuses_owner`)."""
    if event.type == "reindex":
        return "reindex" if stored is not None and stored.readable else "not_found"
    newest = max(stored.seq if stored else -1, tombstone_seq if tombstone_seq is not None else -1)
    if event.seq <= newest:
        return "stale"
    if refuses_owner(event, stored):
        return "refused_owned"
    if event.type == "delete":
        return "delete" if stored is not None else "absent"
    if stored is not None and stored.content_hash == content_hash and has_vector:
        return "unchanged"
    return "upsert"


def claimed_source(event: RegistryEvent) -> str:
    """The source ``event`` acts for: an upsert's capability names it (the ``source_ref`` that
    will be stored), a delete's event does."""
    if event.type == "upsert":
        source_ref = (event.capability or {}).get("source_ref")
        return str(source_ref.get("source", "")) if isinstance(source_ref, dict) else ""
    return event.source


def refuses_owner(event: RegistryEvent, stored: StoredRecord | None) -> bool:
    """Whether ``event`` would change or delete a capability another source owns without
    taking it over."""
    if event.type == "reindex" or stored is None or not stored.source or event.take_over:
        return False
    return stored.source != claimed_source(event)


def ownership_note(event: RegistryEvent, decision: Decision, stored: StoredRecord | None) -> str:
    """What an outcome says about ownership: why ``refused_owned`` (naming the owner and what
    to do), or whom a take-over took the capability from; empty otherwise."""
    claimant = claimed_source(event) or "(no source)"
    if decision == "refused_owned" and stored is not None:
        verb = "replace" if event.type == "upsert" else "delete"
        return (
            f"{event.capability_id} belongs to source {stored.source}; source {claimant} may "
            f"not {verb} it. Remove it from {claimant}, or send it again with --take-over "
            f"to move it to {claimant}"
        )
    if stored is None or not stored.source or stored.source == claimant:
        return ""
    if decision == "delete":
        return f"it belonged to source {stored.source}; publishing that source again brings it back"
    if decision in ("upsert", "unchanged"):
        return f"taken over from source {stored.source}"
    return ""


#: A rebuild followed by change records within this long had records waiting when it ended: a
#: sustained stream (a bulk import), not an edit (a watcher's sync reaches Redis 18 ms or more
#: after the file write, itself after the previous version was served).
SUSTAINED_GAP_S = 0.01
#: In a sustained stream the window is this many rebuilds long: rebuilding takes at most about a
#: fifth of a bulk load's time on each discovery worker, instead of half.
SUSTAINED_FACTOR = 4.0


def coalesce_window_s(last_build_s: float, idle_s: float = 0.0, cap_s: float = 2.0) -> float:
    """How long a discovery worker gathers more change records before rebuilding. After
    ``idle_s`` of no rebuild at least as long as the last one took, none: an isolated edit is
    served at once. In a burst, as long as the last rebuild took (so rebuilding takes at most
    about half of it); when records were already waiting as the last rebuild ended (``idle_s``
    under :data:`SUSTAINED_GAP_S` and a quarter of that rebuild), :data:`SUSTAINED_FACTOR`
    times as long; at most ``cap_s``."""
    if idle_s >= last_build_s:
        return 0.0
    sustained = idle_s < min(SUSTAINED_GAP_S, last_build_s / 4)
    return max(0.0, min(cap_s, (SUSTAINED_FACTOR if sustained else 1.0) * last_build_s))


def retry_delay_s(attempt: int, base_s: float = 2.0, cap_s: float = 60.0) -> float:
    """Seconds before an event's redelivery after failed ``attempt``: doubling, capped."""
    return float(min(cap_s, base_s * 2 ** (attempt - 1)))


@dataclass
class SyncPlan:
    """The events that bring the registry in line with one scanned source."""

    upserts: list[Capability] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    #: Stored capabilities to embed again (``capdisc reindex ID...``).
    reindexes: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: dict[Path, ManifestError] = field(default_factory=dict)
    #: Ids this source acts on although another source holds them: its upserts move them here
    #: (``--take-over``), its deletes remove them anyway (``capdisc delete ID``). Their events
    #: carry ``take_over``.
    taken_over: list[str] = field(default_factory=list)


def plan_sync(
    scanned: Mapping[Path, Capability],
    errors: Mapping[Path, ManifestError],
    stored: Mapping[str, StoredRecord],
    owners: Mapping[str, str] | None = None,
    take_over: bool = False,
) -> SyncPlan:
    """Compare a scan with the stored records of the same source.

    New or changed capabilities are upserted; stored ones that no scanned file defines are
    deleted, unless the file they came from is still there but failed to parse (a broken edit
    never removes what it was meant to update). ``owners`` names the other source that holds
    a scanned id: that capability is rejected, naming its owner, unless ``take_over`` (then it
    is upserted, to move it here). A rejected file protects what it defined before, like a
    broken one.
    """
    plan = SyncPlan(errors=dict(errors))
    scanned_ids = set()
    for path, capability in scanned.items():
        scanned_ids.add(capability.id)
        owner = (owners or {}).get(capability.id)
        if owner and not take_over:
            plan.errors[path] = owned_elsewhere(path, capability.id, owner)
            continue
        record = stored.get(capability.id)
        if record is not None and record.content_hash == capability.content_hash:
            plan.unchanged.append(capability.id)
        else:
            plan.upserts.append(capability)
            if owner:
                plan.taken_over.append(capability.id)
    broken = {str(path) for path in plan.errors}
    for capability_id, record in sorted(stored.items()):
        if capability_id not in scanned_ids and record.location not in broken:
            plan.deletes.append(capability_id)
    return plan


def with_pending(
    stored: Mapping[str, StoredRecord], pending: Iterable[RegistryEvent], source: str
) -> dict[str, StoredRecord]:
    """``stored``, one source's records, as they will be once the indexing workers applied
    ``pending``, events sent and not applied yet: an upsert or delete of ``source`` newer than
    what it finds replaces or removes it, in the order of their sequences (a reindex changes no
    content; other sources' events change their own records). What :func:`plan_sync` compares a
    scan with, so that a sync counts what earlier syncs of the source sent, in this process or
    another: a manifest added and removed before its upsert was applied is then deleted."""
    view = dict(stored)
    for event in sorted(pending, key=lambda e: e.seq):
        found = view.get(event.capability_id)
        if event.source != source or (found is not None and event.seq <= found.seq):
            continue
        if event.type == "delete":
            view.pop(event.capability_id, None)
        elif event.type == "upsert" and (record := _sent_record(event)) is not None:
            view[event.capability_id] = record
    return view


def _sent_record(event: RegistryEvent) -> StoredRecord | None:
    """The record an upsert stores, as far as planning needs it; None for one that is no
    capability (the workers will refuse it)."""
    try:
        capability = Capability.from_dict(event.capability or {})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return StoredRecord(capability.to_dict(), event.seq, capability.content_hash, 0)


def owned_elsewhere(path: Path, capability_id: str, owner: str) -> ManifestError:
    """The rejection of a capability whose id another source owns."""
    return ManifestError(
        str(path),
        "id",
        f"{capability_id!r} belongs to source {owner}; rename "
        "it here, remove it from one of the two, or publish "
        "with --take-over to move it to this source",
    )


@dataclass(frozen=True)
class RepairPlan:
    """Drift between one tenant's stored records and its live vectors."""

    missing_vectors: list[str]
    orphan_vectors: list[str]

    @property
    def clean(self) -> bool:
        return not self.missing_vectors and not self.orphan_vectors


def plan_repair(stored_ids: set[str], vector_ids: set[str]) -> RepairPlan:
    """What the reconciler repairs: records the live index has no vector for (embed them
    again) and vectors of capabilities no longer stored (drop them)."""
    return RepairPlan(
        missing_vectors=sorted(stored_ids - vector_ids),
        orphan_vectors=sorted(vector_ids - stored_ids),
    )


#: Stored records parsed per :func:`json.loads` call by :func:`parsed_records`.
PARSE_CHUNK = 1024


def parsed_records(raw: Iterable[bytes | str]) -> list[Any]:
    """Each stored record's JSON, parsed. Records are parsed :data:`PARSE_CHUNK` at a time as
    one JSON array: the decoder then makes one string of each key for the whole chunk instead
    of one per record (about 300 bytes less per capability held, and a third faster); a chunk
    that does not parse is parsed record by record, and a value that is no JSON is left as its
    text (:func:`stored_record` reads it as :data:`UNREADABLE`)."""
    out: list[Any] = []
    values = [v.encode() if isinstance(v, str) else v for v in raw]
    for start in range(0, len(values), PARSE_CHUNK):
        chunk = values[start : start + PARSE_CHUNK]
        try:
            parsed = json.loads(b"[" + b",".join(chunk) + b"]")
        except (ValueError, RecursionError):  # RecursionError: one nested too deeply to parse
            parsed = None
        if not isinstance(parsed, list) or len(parsed) != len(chunk):
            parsed = [_parsed_or_text(v) for v in chunk]  # a record that is not one JSON value
        out.extend(parsed)
    return out


def _parsed_or_text(value: bytes) -> Any:
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value
