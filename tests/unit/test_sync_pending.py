"""A sync plans against what is stored and what was sent and not applied yet: the pending
events of its source, newer than what they find, in the order of their sequences."""

from __future__ import annotations

import pytest

from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.policy import StoredRecord, with_pending

SOURCE = "/registry"
NEW = Capability(id="tool:x", kind="tool", name="x", description="new text")
OLD = Capability(id="tool:x", kind="tool", name="x", description="old text")


def stored(cap: Capability, seq: int) -> dict[str, StoredRecord]:
    return {cap.id: StoredRecord(cap.to_dict(), seq, cap.content_hash, 1)}


def upsert(cap: Capability, seq: int, source: str = SOURCE) -> RegistryEvent:
    return RegistryEvent("upsert", "acme", cap.id, seq, source=source, capability=cap.to_dict())


def delete(seq: int, source: str = SOURCE) -> RegistryEvent:
    return RegistryEvent("delete", "acme", NEW.id, seq, source=source)


def reindex() -> RegistryEvent:
    return RegistryEvent("reindex", "acme", NEW.id, 0, source=SOURCE)


@pytest.mark.parametrize(
    ("held", "pending", "counted"),
    [
        pytest.param({}, [], None, id="nothing-stored-nothing-sent"),
        pytest.param(stored(OLD, 1), [], OLD, id="stored-nothing-sent"),
        pytest.param({}, [upsert(NEW, 2)], NEW, id="sent-not-applied-counts-as-stored"),
        pytest.param(stored(OLD, 1), [upsert(NEW, 2)], NEW, id="a-newer-upsert-replaces"),
        pytest.param(stored(NEW, 5), [upsert(OLD, 2)], NEW, id="an-older-upsert-is-stale"),
        pytest.param(stored(OLD, 1), [delete(2)], None, id="a-newer-delete-removes"),
        pytest.param(stored(OLD, 3), [delete(2)], OLD, id="an-older-delete-is-stale"),
        pytest.param({}, [upsert(NEW, 2), delete(3)], None, id="sent-then-deleted"),
        pytest.param({}, [delete(3), upsert(NEW, 2)], None, id="sequence-order-not-send-order"),
        pytest.param(stored(OLD, 1), [delete(2), upsert(NEW, 3)], NEW, id="deleted-then-again"),
        pytest.param({}, [upsert(NEW, 2, source="mcp:x")], None, id="another-sources-events"),
        pytest.param(stored(OLD, 1), [reindex()], OLD, id="a-reindex-changes-no-content"),
    ],
)
def test_a_sync_counts_what_was_sent_and_not_applied_yet(
    held: dict[str, StoredRecord], pending: list[RegistryEvent], counted: Capability | None
) -> None:
    found = with_pending(held, pending, SOURCE).get(NEW.id)

    assert (found.content_hash if found else None) == (counted.content_hash if counted else None)


def test_an_upsert_that_is_no_capability_is_not_counted() -> None:
    broken = RegistryEvent("upsert", "acme", "tool:y", 2, source=SOURCE, capability={"id": 3})

    assert with_pending({}, [broken], SOURCE) == {}
