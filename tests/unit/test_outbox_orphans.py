"""Which delivered tasks are orphans: held by no live worker past the grace period, and reported
on by every live worker since they were delivered."""

from __future__ import annotations

import pytest

from capdisc.registry.outbox import Delivery, Holder, holders, orphans

NOW_MS = 1_000_000
GRACE_S = 10.0
STALE_S = 10.0


def beat(seen_ago_s: float, *tasks: str, says: bool = True, name: str = "w1") -> Holder:
    """An indexing worker whose last heartbeat was ``seen_ago_s`` ago, listing ``tasks``."""
    return Holder(name, NOW_MS - int(seen_ago_s * 1000), frozenset(tasks) if says else None)


@pytest.mark.parametrize(
    ("age_s", "workers", "orphaned"),
    [
        (11.0, [], True),  # no worker at all: its worker is gone
        (10.0, [], True),  # exactly the grace period
        (9.9, [], False),  # just delivered: wait the grace period
        (11.0, [beat(1, "t1")], False),  # a live worker holds it (running, retrying)
        (3600.0, [beat(1, "t1")], False),  # held for an hour: still its worker's
        (11.0, [beat(1, "other")], True),  # live workers hold other tasks only
        (11.0, [beat(11, "t1")], True),  # its holder's heartbeat is gone (SIGKILL)
        (11.0, [beat(10, "t1")], False),  # ... not yet: stale after 10 s, not before
        (11.0, [beat(11, "t1"), beat(1, name="w2")], True),  # the dead holder, a live other
        (11.0, [beat(1, "other"), beat(12, "t1", name="w2")], True),
        (11.0, [beat(1, says=False)], False),  # a worker that does not list: may hold it
        (11.0, [beat(12, says=False)], True),  # ... and is gone
        (30.0, [beat(31, "other"), beat(1, name="w2")], True),  # the stale one cannot block it
        (11.0, [beat(9, "other")], True),  # reported 2 s after the delivery
        (11.0, [beat(9.5, "other"), beat(1, name="w2")], True),
        (5.0, [beat(6, "other")], False),  # young, and w1 has not reported since
    ],
)
def test_a_delivery_is_an_orphan_only_when_old_held_by_no_live_worker_and_reported_on(
    age_s: float, workers: list[Holder], orphaned: bool
) -> None:
    delivery = Delivery("tag-1", "t1", NOW_MS - int(age_s * 1000))

    found = orphans([delivery], workers, NOW_MS, GRACE_S, STALE_S)

    assert found == ([delivery] if orphaned else [])


@pytest.mark.parametrize(
    ("delivered_ago_s", "seen_ago_s", "orphaned"),
    [
        (20.0, 1.0, True),  # the live worker reported after the delivery, without it
        (20.0, 20.0, False),  # its last heartbeat is from the delivery's moment: not reported yet
        (20.0, 25.0, False),  # from before the delivery (a grace shorter than the heartbeat)
    ],
)
def test_a_live_worker_that_has_not_reported_since_the_delivery_may_hold_it(
    delivered_ago_s: float, seen_ago_s: float, orphaned: bool
) -> None:
    delivery = Delivery("tag-1", "t1", NOW_MS - int(delivered_ago_s * 1000))

    found = orphans([delivery], [beat(seen_ago_s, "other")], NOW_MS, 0.0, 30.0)

    assert found == ([delivery] if orphaned else [])


def test_orphans_keeps_the_order_of_the_deliveries() -> None:
    old = [Delivery(f"tag-{i}", f"t{i}", NOW_MS - 60_000) for i in range(5)]

    found = orphans(old, [beat(1, "t2")], NOW_MS, GRACE_S, STALE_S)

    assert found == [old[0], old[1], old[3], old[4]]


def test_holders_are_the_indexing_workers_of_the_heartbeats() -> None:
    heartbeats = [
        {"id": "indexing@a:1", "kind": "indexing", "last_seen_ms": 5, "tasks": ["t1", "t2"]},
        {"id": "indexing@b:2", "kind": "indexing", "last_seen_ms": 6},
        {"id": "discovery@c:3", "kind": "discovery", "last_seen_ms": 7, "versions": {}},
    ]

    assert holders(heartbeats) == [
        Holder("indexing@a:1", 5, frozenset({"t1", "t2"})),
        Holder("indexing@b:2", 6, None),
    ]
