"""Registry policy: applying an event (`decide`) and syncing a scanned source (`plan_sync`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capdisc.errors import ManifestError
from capdisc.events import EventType, RegistryEvent
from capdisc.models import Capability, SourceRef
from capdisc.registry import (
    StoredRecord,
    coalesce_window_s,
    decide,
    plan_repair,
    plan_sync,
    retry_delay_s,
)

STORED_HASH = "h-stored"


def stored_record(seq: int, content_hash: str = STORED_HASH) -> StoredRecord:
    return StoredRecord(capability={"id": "tool:a"}, seq=seq, content_hash=content_hash,
                        updated_at_ms=0)


# (event type, event seq, stored seq or None, tombstone seq or None, event content hash, decision)
DECIDE_CASES = [
    pytest.param("upsert", 1, None, None, "h-new", "upsert", id="new-capability"),
    pytest.param("upsert", 0, None, None, "h-new", "upsert", id="seq-zero-on-empty"),
    pytest.param("upsert", 5, 7, None, "h-new", "stale", id="stale-by-seq"),
    pytest.param("upsert", 7, 7, None, "h-new", "stale", id="duplicate-seq-upsert"),
    pytest.param("delete", 7, 7, None, None, "stale", id="duplicate-seq-delete"),
    pytest.param("delete", 6, 7, None, None, "stale", id="stale-delete"),
    pytest.param("upsert", 8, None, 8, "h-new", "stale", id="stale-after-tombstone"),
    pytest.param("upsert", 6, None, 8, "h-new", "stale", id="late-upsert-after-delete"),
    pytest.param("upsert", 9, None, 8, "h-new", "upsert", id="newer-upsert-after-delete"),
    pytest.param("upsert", 6, 5, 7, "h-new", "stale", id="tombstone-newer-than-stored"),
    pytest.param("upsert", 8, 7, None, STORED_HASH, "unchanged", id="unchanged-hash"),
    pytest.param("upsert", 8, 7, None, "h-new", "upsert", id="changed-hash"),
    pytest.param("delete", 8, 7, None, None, "delete", id="delete-existing"),
    pytest.param("delete", 8, None, None, None, "absent", id="delete-absent"),
    pytest.param("delete", 9, None, 8, None, "absent", id="delete-after-delete"),
    pytest.param("reindex", 1, 7, None, None, "reindex", id="reindex-ignores-seq"),
    pytest.param("reindex", 9, None, 8, None, "not_found", id="reindex-of-deleted"),
    pytest.param("reindex", 9, None, None, None, "not_found", id="reindex-of-unknown"),
]


@pytest.mark.parametrize(("event_type", "seq", "stored_seq", "tombstone", "content_hash",
                          "decision"), DECIDE_CASES)
def test_decide(event_type: EventType, seq: int, stored_seq: int | None, tombstone: int | None,
                content_hash: str | None, decision: str) -> None:
    capability = {"id": "tool:a"} if event_type == "upsert" else None
    event = RegistryEvent(type=event_type, tenant="acme", capability_id="tool:a", seq=seq,
                          capability=capability)
    stored = stored_record(stored_seq) if stored_seq is not None else None

    assert decide(event, stored, tombstone, content_hash) == decision


@pytest.mark.parametrize(("content_hash", "has_vector", "decision"), [
    (STORED_HASH, True, "unchanged"),
    (STORED_HASH, False, "upsert"),  # stored before this vector space existed: embed it
    ("h-new", False, "upsert"),
])
def test_unchanged_content_without_a_vector_is_embedded(content_hash: str, has_vector: bool,
                                                         decision: str) -> None:
    event = RegistryEvent(type="upsert", tenant="acme", capability_id="tool:a", seq=8,
                          capability={"id": "tool:a"})

    assert decide(event, stored_record(7), None, content_hash, has_vector) == decision


# -- plan_sync -----------------------------------------------------------------------------------

ROOT = Path("/registry")


def manifest_path(name: str) -> Path:
    return ROOT / name / "CAPABILITY.yaml"


def capability(cap_id: str, file: str, description: str) -> Capability:
    name = cap_id.split(":", 1)[1]
    return Capability(id=cap_id, kind="tool", name=name, description=description,
                      source_ref=SourceRef(type="manifest", source=str(ROOT),
                                           location=str(manifest_path(file))))


def as_stored(cap: Capability) -> StoredRecord:
    return StoredRecord(capability=cap.to_dict(), seq=1, content_hash=cap.content_hash,
                        updated_at_ms=0)


# scanned: file -> (id, description); broken: files that failed to parse;
# stored: id -> (file, description); expected: (upserted ids, deleted ids, unchanged ids)
SYNC_CASES = [
    pytest.param({"a": ("tool:a", "v1")}, [], {}, (["tool:a"], [], []), id="new-file-upserts"),
    pytest.param({"a": ("tool:a", "v1")}, [], {"tool:a": ("a", "v1")}, ([], [], ["tool:a"]),
                 id="unchanged-file"),
    pytest.param({"a": ("tool:a", "v2")}, [], {"tool:a": ("a", "v1")}, (["tool:a"], [], []),
                 id="changed-file-upserts"),
    pytest.param({}, [], {"tool:a": ("a", "v1")}, ([], ["tool:a"], []),
                 id="removed-file-deletes"),
    pytest.param({}, ["a"], {"tool:a": ("a", "v1")}, ([], [], []),
                 id="broken-file-keeps-its-capability"),
    pytest.param({}, ["b"], {"tool:a": ("a", "v1")}, ([], ["tool:a"], []),
                 id="another-broken-file-does-not-protect"),
    pytest.param({"a": ("tool:b", "v1")}, [], {"tool:a": ("a", "v1")}, (["tool:b"], ["tool:a"], []),
                 id="renamed-id-upserts-new-and-deletes-old"),
    pytest.param({"a": ("tool:a", "v1"), "c": ("tool:c", "v1")}, [],
                 {"tool:a": ("a", "v1"), "tool:b": ("b", "v1"), "tool:d": ("d", "v1")},
                 (["tool:c"], ["tool:b", "tool:d"], ["tool:a"]), id="mixed"),
]


@pytest.mark.parametrize(("scanned", "broken", "stored", "expected"), SYNC_CASES)
def test_plan_sync(
    scanned: dict[str, tuple[str, str]],
    broken: list[str],
    stored: dict[str, tuple[str, str]],
    expected: tuple[list[str], list[str], list[str]],
) -> None:
    scan = {manifest_path(f): capability(cid, f, d) for f, (cid, d) in scanned.items()}
    errors = {manifest_path(f): ManifestError(str(manifest_path(f)), None, "broken")
              for f in broken}
    records = {cid: as_stored(capability(cid, f, d)) for cid, (f, d) in stored.items()}

    plan = plan_sync(scan, errors, records)

    assert ([c.id for c in plan.upserts], plan.deletes, plan.unchanged) == expected


def test_plan_sync_carries_the_scan_errors() -> None:
    error = ManifestError(str(manifest_path("a")), "name", "is required")

    plan = plan_sync({}, {manifest_path("a"): error}, {})

    assert plan.errors == {manifest_path("a"): error}


def test_plan_sync_upserts_the_scanned_capability_itself() -> None:
    cap = capability("tool:a", "a", "v2")

    plan = plan_sync({manifest_path("a"): cap}, {}, {"tool:a": as_stored(capability(
        "tool:a", "a", "v1"))})

    assert plan.upserts == [cap]


# -- StoredRecord --------------------------------------------------------------------------------


def test_stored_record_round_trips_through_its_dict() -> None:
    record = as_stored(capability("tool:a", "a", "v1"))

    assert StoredRecord.from_dict(record.to_dict()) == record


def test_stored_record_without_updated_at_defaults_to_zero() -> None:
    assert StoredRecord.from_dict({"capability": {}, "seq": "3", "content_hash": "h"}) == (
        StoredRecord(capability={}, seq=3, content_hash="h", updated_at_ms=0))


def test_stored_record_location_and_source_come_from_its_source_ref() -> None:
    record = as_stored(capability("tool:a", "a", "v1"))

    assert (record.location, record.source) == (str(manifest_path("a")), str(ROOT))


def test_stored_record_without_source_ref_has_empty_location() -> None:
    assert (stored_record(1).location, stored_record(1).source) == ("", "")


@pytest.mark.parametrize(("attempt", "expected"), [(1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0),
                                                   (20, 60.0)])
def test_indexing_retries_back_off_doubling_to_a_cap(attempt: int, expected: float) -> None:
    assert retry_delay_s(attempt) == expected


@pytest.mark.parametrize(("last_build_s", "idle_s", "expected"), [
    pytest.param(0.0, 0.0, 0.0, id="instant-builds"),
    pytest.param(0.004, 0.001, 0.004, id="burst-small"),
    pytest.param(0.8, 0.1, 0.8, id="burst"),
    pytest.param(5.0, 0.0, 2.0, id="burst-capped"),
    pytest.param(0.8, 0.8, 0.0, id="isolated-edit-served-at-once"),
    pytest.param(0.8, 30.0, 0.0, id="after-idle"),
])
def test_the_coalescing_window_follows_the_last_rebuild_in_bursts_only(
        last_build_s: float, idle_s: float, expected: float) -> None:
    assert coalesce_window_s(last_build_s, idle_s) == expected


# -- plan_repair ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("stored", "vectors", "missing", "orphans"), [
    ({"a", "b"}, {"a", "b"}, [], []),
    ({"a", "b"}, {"a"}, ["b"], []),
    ({"a"}, {"a", "z"}, [], ["z"]),
    (set(), {"z"}, [], ["z"]),
    ({"b", "a"}, set(), ["a", "b"], []),
])
def test_plan_repair(stored: set[str], vectors: set[str], missing: list[str],
                     orphans: list[str]) -> None:
    plan = plan_repair(stored, vectors)

    assert (plan.missing_vectors, plan.orphan_vectors) == (missing, orphans)
    assert plan.clean == (not missing and not orphans)
