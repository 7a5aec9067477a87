"""What a watcher sent and the workers may not have applied yet counts as stored when it plans
its next sync, until it is stored with that content, deleted, or old."""

from __future__ import annotations

import pytest

from capdisc.models import Capability
from capdisc.registry.policy import StoredRecord, SyncPlan
from capdisc_producers.sync import InFlight

SENT = Capability(id="tool:x", kind="tool", name="x", description="new text")
OLDER = Capability(id="tool:x", kind="tool", name="x", description="old text")


def stored_as(cap: Capability) -> dict[str, StoredRecord]:
    return {cap.id: StoredRecord(cap.to_dict(), 1, cap.content_hash, 1)}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("stored", "later_s", "deleted", "counted_hash"),
    [
        ({}, 1.0, False, SENT.content_hash),  # not applied yet: counts as stored
        (stored_as(OLDER), 1.0, False, SENT.content_hash),  # the older version is still there
        (stored_as(SENT), 1.0, False, SENT.content_hash),  # applied: Redis says so itself
        ({}, 121.0, False, None),  # sent long ago and never stored (refused): sent again
        ({}, 1.0, True, None),  # deleted since
    ],
)
def test_a_sent_capability_counts_as_stored_until_applied_deleted_or_old(
    stored: dict[str, StoredRecord], later_s: float, deleted: bool, counted_hash: str | None
) -> None:
    clock = Clock()
    in_flight = InFlight(kept_s=120.0, clock=clock)
    in_flight.sent(SyncPlan(upserts=[SENT]))
    if deleted:
        in_flight.sent(SyncPlan(deletes=[SENT.id]))
    clock.now = later_s

    counted = in_flight.with_stored(stored).get(SENT.id)

    assert (counted.content_hash if counted else None) == counted_hash


def test_one_applied_is_forgotten() -> None:
    in_flight = InFlight()
    in_flight.sent(SyncPlan(upserts=[SENT]))

    in_flight.with_stored(stored_as(SENT))

    assert in_flight.with_stored({}) == {}
