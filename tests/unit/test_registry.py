"""Registry policy: applying an event (`decide`) and syncing a scanned source (`plan_sync`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capdisc.errors import ManifestError
from capdisc.models import Capability, SourceRef
from capdisc.registry.events import EventType, RegistryEvent
from capdisc.registry.policy import (
    Decision,
    StoredRecord,
    claimed_source,
    coalesce_window_s,
    decide,
    ownership_note,
    plan_repair,
    plan_sync,
    retry_delay_s,
)

STORED_HASH = "h-stored"


def stored_record(seq: int, content_hash: str = STORED_HASH) -> StoredRecord:
    return StoredRecord(
        capability={"id": "tool:a"}, seq=seq, content_hash=content_hash, updated_at_ms=0
    )


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


@pytest.mark.parametrize(
    ("event_type", "seq", "stored_seq", "tombstone", "content_hash", "decision"), DECIDE_CASES
)
def test_decide(
    event_type: EventType,
    seq: int,
    stored_seq: int | None,
    tombstone: int | None,
    content_hash: str | None,
    decision: str,
) -> None:
    capability = {"id": "tool:a"} if event_type == "upsert" else None
    event = RegistryEvent(
        type=event_type, tenant="acme", capability_id="tool:a", seq=seq, capability=capability
    )
    stored = stored_record(stored_seq) if stored_seq is not None else None

    assert decide(event, stored, tombstone, content_hash) == decision


@pytest.mark.parametrize(
    ("content_hash", "has_vector", "decision"),
    [
        (STORED_HASH, True, "unchanged"),
        (STORED_HASH, False, "upsert"),  # stored before this vector space existed: embed it
        ("h-new", False, "upsert"),
    ],
)
def test_unchanged_content_without_a_vector_is_embedded(
    content_hash: str, has_vector: bool, decision: str
) -> None:
    event = RegistryEvent(
        type="upsert", tenant="acme", capability_id="tool:a", seq=8, capability={"id": "tool:a"}
    )

    assert decide(event, stored_record(7), None, content_hash, has_vector) == decision


# -- ownership -----------------------------------------------------------------------------------

A, B = "/registry-a", "/registry-b"


def owned_record(owner: str, seq: int = 7) -> StoredRecord:
    return StoredRecord(
        capability={"id": "tool:a", "source_ref": {"type": "manifest", "source": owner}},
        seq=seq,
        content_hash=STORED_HASH,
        updated_at_ms=0,
    )


def event_from(
    source: str, event_type: EventType, seq: int = 8, take_over: bool = False
) -> RegistryEvent:
    capability = (
        {"id": "tool:a", "source_ref": {"type": "manifest", "source": source}}
        if event_type == "upsert"
        else None
    )
    return RegistryEvent(
        type=event_type,
        tenant="acme",
        capability_id="tool:a",
        seq=seq,
        source=source,
        capability=capability,
        take_over=take_over,
    )


# (event type, its source, take_over, stored owner or None, event seq, content hash, decision)
OWNERSHIP_CASES = [
    pytest.param("upsert", A, False, A, 8, "h-new", "upsert", id="owner-upserts"),
    pytest.param("upsert", A, False, A, 8, STORED_HASH, "unchanged", id="owner-unchanged"),
    pytest.param("upsert", B, False, A, 8, "h-new", "refused_owned", id="other-upsert-refused"),
    pytest.param("upsert", B, True, A, 8, "h-new", "upsert", id="other-upsert-takes-over"),
    pytest.param("upsert", B, False, "", 8, "h-new", "upsert", id="unowned-record-is-claimed"),
    pytest.param(
        "upsert", "", False, A, 8, "h-new", "refused_owned", id="sourceless-upsert-refused"
    ),
    pytest.param("upsert", B, False, None, 8, "h-new", "upsert", id="new-id-is-anyones"),
    pytest.param("upsert", B, False, A, 6, "h-new", "stale", id="stale-before-ownership"),
    pytest.param("delete", A, False, A, 8, None, "delete", id="owner-deletes"),
    pytest.param("delete", B, False, A, 8, None, "refused_owned", id="other-delete-refused"),
    pytest.param("delete", "cli", True, A, 8, None, "delete", id="operator-delete-takes-over"),
    pytest.param("delete", B, False, None, 8, None, "absent", id="other-delete-of-absent"),
    pytest.param("reindex", "reconciler", False, A, 1, None, "reindex", id="reindex-ignores-owner"),
]


@pytest.mark.parametrize(
    ("event_type", "source", "take_over", "owner", "seq", "content_hash", "decision"),
    OWNERSHIP_CASES,
)
def test_decide_ownership(
    event_type: EventType,
    source: str,
    take_over: bool,
    owner: str | None,
    seq: int,
    content_hash: str | None,
    decision: str,
) -> None:
    event = event_from(source, event_type, seq, take_over)
    stored = owned_record(owner) if owner is not None else None

    assert decide(event, stored, None, content_hash) == decision


def test_an_upsert_claims_for_the_source_its_capability_names() -> None:
    event = event_from(A, "upsert").copy(source=B)

    assert claimed_source(event) == A
    assert decide(event, owned_record(A), None, "h-new") == "upsert"


# (event type, its source, take_over, stored owner, decision, parts of the note; () for none)
NOTE_CASES = [
    pytest.param(
        "upsert",
        B,
        False,
        A,
        "refused_owned",
        (
            "tool:a belongs to source /registry-a",
            "source /registry-b may not replace",
            "--take-over",
        ),
        id="refused-upsert",
    ),
    pytest.param(
        "delete",
        B,
        False,
        A,
        "refused_owned",
        ("belongs to source /registry-a", "may not delete"),
        id="refused-delete",
    ),
    pytest.param(
        "upsert", B, True, A, "upsert", ("taken over from source /registry-a",), id="taken-over"
    ),
    pytest.param(
        "delete",
        "cli",
        True,
        A,
        "delete",
        ("belonged to source /registry-a", "publishing that source again brings it back"),
        id="operator-delete",
    ),
    pytest.param("upsert", A, False, A, "upsert", (), id="owner-says-nothing"),
    pytest.param("upsert", B, False, "", "upsert", (), id="unowned-says-nothing"),
]


@pytest.mark.parametrize(
    ("event_type", "source", "take_over", "owner", "decision", "parts"), NOTE_CASES
)
def test_ownership_note(
    event_type: EventType,
    source: str,
    take_over: bool,
    owner: str,
    decision: Decision,
    parts: tuple[str, ...],
) -> None:
    note = ownership_note(
        event_from(source, event_type, take_over=take_over), decision, owned_record(owner)
    )

    assert all(part in note for part in parts) and bool(note) == bool(parts)


# -- plan_sync -----------------------------------------------------------------------------------

ROOT = Path("/registry")


def manifest_path(name: str) -> Path:
    return ROOT / name / "CAPABILITY.yaml"


def capability(cap_id: str, file: str, description: str) -> Capability:
    name = cap_id.split(":", 1)[1]
    return Capability(
        id=cap_id,
        kind="tool",
        name=name,
        description=description,
        source_ref=SourceRef(type="manifest", source=str(ROOT), location=str(manifest_path(file))),
    )


def as_stored(cap: Capability) -> StoredRecord:
    return StoredRecord(
        capability=cap.to_dict(), seq=1, content_hash=cap.content_hash, updated_at_ms=0
    )


# scanned: file -> (id, description); broken: files that failed to parse;
# stored: id -> (file, description); expected: (upserted ids, deleted ids, unchanged ids)
SYNC_CASES = [
    pytest.param({"a": ("tool:a", "v1")}, [], {}, (["tool:a"], [], []), id="new-file-upserts"),
    pytest.param(
        {"a": ("tool:a", "v1")},
        [],
        {"tool:a": ("a", "v1")},
        ([], [], ["tool:a"]),
        id="unchanged-file",
    ),
    pytest.param(
        {"a": ("tool:a", "v2")},
        [],
        {"tool:a": ("a", "v1")},
        (["tool:a"], [], []),
        id="changed-file-upserts",
    ),
    pytest.param({}, [], {"tool:a": ("a", "v1")}, ([], ["tool:a"], []), id="removed-file-deletes"),
    pytest.param(
        {}, ["a"], {"tool:a": ("a", "v1")}, ([], [], []), id="broken-file-keeps-its-capability"
    ),
    pytest.param(
        {},
        ["b"],
        {"tool:a": ("a", "v1")},
        ([], ["tool:a"], []),
        id="another-broken-file-does-not-protect",
    ),
    pytest.param(
        {"a": ("tool:b", "v1")},
        [],
        {"tool:a": ("a", "v1")},
        (["tool:b"], ["tool:a"], []),
        id="renamed-id-upserts-new-and-deletes-old",
    ),
    pytest.param(
        {"a": ("tool:a", "v1"), "c": ("tool:c", "v1")},
        [],
        {"tool:a": ("a", "v1"), "tool:b": ("b", "v1"), "tool:d": ("d", "v1")},
        (["tool:c"], ["tool:b", "tool:d"], ["tool:a"]),
        id="mixed",
    ),
]


@pytest.mark.parametrize(("scanned", "broken", "stored", "expected"), SYNC_CASES)
def test_plan_sync(
    scanned: dict[str, tuple[str, str]],
    broken: list[str],
    stored: dict[str, tuple[str, str]],
    expected: tuple[list[str], list[str], list[str]],
) -> None:
    scan = {manifest_path(f): capability(cid, f, d) for f, (cid, d) in scanned.items()}
    errors = {
        manifest_path(f): ManifestError(str(manifest_path(f)), None, "broken") for f in broken
    }
    records = {cid: as_stored(capability(cid, f, d)) for cid, (f, d) in stored.items()}

    plan = plan_sync(scan, errors, records)

    assert ([c.id for c in plan.upserts], plan.deletes, plan.unchanged) == expected


# scanned: file -> id; stored (this source's): id -> file; owners: id -> another source;
# take_over; expected: (upserted ids, deleted ids, rejected files, taken-over ids)
OWNED_SYNC_CASES = [
    pytest.param(
        {"a": "tool:a"},
        {},
        {"tool:a": B},
        False,
        ([], [], ["a"], []),
        id="held-elsewhere-is-rejected",
    ),
    pytest.param(
        {"a": "tool:a"},
        {},
        {"tool:a": B},
        True,
        (["tool:a"], [], [], ["tool:a"]),
        id="take-over-upserts-it",
    ),
    pytest.param(
        {"a": "tool:a"},
        {},
        {"tool:a": ""},
        False,
        (["tool:a"], [], [], []),
        id="unowned-is-claimed",
    ),
    pytest.param(
        {"a": "tool:b"},
        {"tool:a": "a"},
        {"tool:b": B},
        False,
        ([], [], ["a"], []),
        id="rejected-file-keeps-what-it-defined",
    ),
    pytest.param(
        {"a": "tool:a", "c": "tool:c"},
        {"tool:d": "d"},
        {"tool:c": B},
        False,
        (["tool:a"], ["tool:d"], ["c"], []),
        id="mixed",
    ),
]


@pytest.mark.parametrize(("scanned", "stored", "owners", "take_over", "expected"), OWNED_SYNC_CASES)
def test_plan_sync_ownership(
    scanned: dict[str, str],
    stored: dict[str, str],
    owners: dict[str, str],
    take_over: bool,
    expected: tuple[list[str], list[str], list[str], list[str]],
) -> None:
    scan = {manifest_path(f): capability(cid, f, "v1") for f, cid in scanned.items()}
    records = {cid: as_stored(capability(cid, f, "v0")) for cid, f in stored.items()}

    plan = plan_sync(scan, {}, records, owners, take_over)

    assert ([c.id for c in plan.upserts], plan.deletes, sorted(plan.errors), plan.taken_over) == (
        expected[0],
        expected[1],
        [manifest_path(f) for f in expected[2]],
        expected[3],
    )
    for path in plan.errors:
        owner = owners[scan[path].id]
        assert f"belongs to source {owner}; " in str(plan.errors[path])
        assert "--take-over" in str(plan.errors[path])


def test_plan_sync_carries_the_scan_errors() -> None:
    error = ManifestError(str(manifest_path("a")), "name", "is required")

    plan = plan_sync({}, {manifest_path("a"): error}, {})

    assert plan.errors == {manifest_path("a"): error}


def test_plan_sync_upserts_the_scanned_capability_itself() -> None:
    cap = capability("tool:a", "a", "v2")

    plan = plan_sync(
        {manifest_path("a"): cap}, {}, {"tool:a": as_stored(capability("tool:a", "a", "v1"))}
    )

    assert plan.upserts == [cap]


# -- StoredRecord --------------------------------------------------------------------------------


def test_stored_record_round_trips_through_its_dict() -> None:
    record = as_stored(capability("tool:a", "a", "v1"))

    assert StoredRecord.from_dict(record.to_dict()) == record


def test_stored_record_without_updated_at_defaults_to_zero() -> None:
    assert StoredRecord.from_dict({"capability": {}, "seq": "3", "content_hash": "h"}) == (
        StoredRecord(capability={}, seq=3, content_hash="h", updated_at_ms=0)
    )


def test_stored_record_location_and_source_come_from_its_source_ref() -> None:
    record = as_stored(capability("tool:a", "a", "v1"))

    assert (record.location, record.source) == (str(manifest_path("a")), str(ROOT))


def test_stored_record_without_source_ref_has_empty_location() -> None:
    assert (stored_record(1).location, stored_record(1).source) == ("", "")


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0), (20, 60.0)]
)
def test_indexing_retries_back_off_doubling_to_a_cap(attempt: int, expected: float) -> None:
    assert retry_delay_s(attempt) == expected


@pytest.mark.parametrize(
    ("last_build_s", "idle_s", "expected"),
    [
        pytest.param(0.0, 0.0, 0.0, id="instant-builds"),
        pytest.param(0.004, 0.001, 0.004, id="burst-small"),
        pytest.param(0.8, 0.1, 0.8, id="burst"),
        pytest.param(0.8, 0.025, 0.8, id="edit-soon-after-a-rebuild"),
        pytest.param(0.3, 0.002, 1.2, id="sustained-records-waiting"),
        pytest.param(0.004, 0.0005, 0.016, id="sustained-small"),
        pytest.param(5.0, 0.0, 2.0, id="burst-capped"),
        pytest.param(0.8, 0.8, 0.0, id="isolated-edit-served-at-once"),
        pytest.param(0.8, 30.0, 0.0, id="after-idle"),
    ],
)
def test_the_coalescing_window_follows_the_last_rebuild_in_bursts_only(
    last_build_s: float, idle_s: float, expected: float
) -> None:
    assert coalesce_window_s(last_build_s, idle_s) == expected


# -- plan_repair ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "vectors", "missing", "orphans"),
    [
        ({"a", "b"}, {"a", "b"}, [], []),
        ({"a", "b"}, {"a"}, ["b"], []),
        ({"a"}, {"a", "z"}, [], ["z"]),
        (set(), {"z"}, [], ["z"]),
        ({"b", "a"}, set(), ["a", "b"], []),
    ],
)
def test_plan_repair(
    stored: set[str], vectors: set[str], missing: list[str], orphans: list[str]
) -> None:
    plan = plan_repair(stored, vectors)

    assert (plan.missing_vectors, plan.orphan_vectors) == (missing, orphans)
    assert plan.clean == (not missing and not orphans)
