"""Which delivered tasks are orphans: held by no live worker past the grace period."""

from __future__ import annotations

import pytest

from capdisc.outbox import Delivery, orphans

NOW_MS = 1_000_000
GRACE_S = 10.0


@pytest.mark.parametrize(("age_s", "held", "orphaned"), [
    (11.0, set(), True),                 # a dead worker's task, delivered long ago
    (10.0, set(), True),                 # exactly the grace period
    (9.9, set(), False),                 # just delivered: its worker may not have said so yet
    (11.0, {"t1"}, False),               # a live worker holds it (running, or a retry's wait)
    (11.0, {"other"}, True),             # live workers hold other tasks, not this one
    (3600.0, {"t1"}, False),             # held for an hour: still its worker's
])
def test_a_delivery_is_an_orphan_only_when_old_and_held_by_no_live_worker(
        age_s: float, held: set[str], orphaned: bool) -> None:
    delivery = Delivery("tag-1", "t1", NOW_MS - int(age_s * 1000))

    assert orphans([delivery], held, NOW_MS, GRACE_S) == ([delivery] if orphaned else [])


def test_orphans_keeps_the_order_of_the_deliveries() -> None:
    old = [Delivery(f"tag-{i}", f"t{i}", NOW_MS - 60_000) for i in range(5)]

    assert orphans(old, {"t2"}, NOW_MS, GRACE_S) == [old[0], old[1], old[3], old[4]]
