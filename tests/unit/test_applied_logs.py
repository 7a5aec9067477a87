"""How an indexing worker logs what a transaction applied: one line a transaction, events
out of the ordinary on their own."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from capdisc.registry.store import Outcome
from capdisc_workers.indexing import log_applied


def outcome(decision: str, version: int = 7, reason: str = "") -> Outcome:
    return Outcome(f"e-{decision}", f"tool:{decision}", decision, version, reason)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("applied", "level"),
    [
        (outcome("upsert"), "debug"),
        (outcome("unchanged"), "debug"),
        (outcome("delete"), "debug"),
        (outcome("reindex"), "debug"),
        (outcome("stale"), "info"),
        (outcome("refused_owned", reason="owned by jsonl:a"), "info"),
        (outcome("upsert", reason="taken over from source jsonl:a"), "info"),
    ],
)
def test_each_event_is_logged_at_debug_unless_out_of_the_ordinary(
    applied: Outcome, level: str
) -> None:
    with capture_logs() as logs:
        log_applied("acme", "task-1", [applied])

    (event,) = [e for e in logs if e["event"] == "event_applied"]
    assert event["log_level"] == level
    assert event["capability_id"] == applied.capability_id


def test_a_transaction_gets_one_line_with_its_decisions_counted() -> None:
    applied = [outcome("upsert", 5), outcome("upsert", 6), outcome("stale", 6)]

    with capture_logs() as logs:
        log_applied("acme", "task-1", applied)

    (summary,) = [e for e in logs if e["event"] == "events_applied"]
    assert summary["log_level"] == "info"
    assert (summary["tenant"], summary["task_id"], summary["events"]) == ("acme", "task-1", 3)
    assert summary["decisions"] == {"upsert": 2, "stale": 1}
    assert summary["index_version"] == 6


def test_nothing_applied_logs_nothing() -> None:
    with capture_logs() as logs:
        log_applied("acme", "task-1", [])

    assert logs == []
