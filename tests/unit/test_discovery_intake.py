"""The discovery worker's decisions as pure functions: which pending entries are quarantined,
how a refused, quarantined or failing request is settled, when a tenant is reloaded (also after
Redis lost its data), the reconnect backoff and the once-per-outage log lines."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from capdisc import keys
from capdisc.discovery.replies import SessionReply
from capdisc.registry.deadletters import DeadLetter
from capdisc_workers.follower import needs_reload
from capdisc_workers.intake import (
    DEAD_LETTER_CHARS,
    MAX_DELIVERIES,
    Pending,
    answer_safely,
    entry_text,
    quarantined,
    rejected,
    triage,
)
from capdisc_workers.outage import Backoff, RedisHealth


@pytest.mark.parametrize(
    ("delivered", "quarantine", "claim"),
    [
        ([], [], []),
        ([("1-0", 1)], [], ["1-0"]),
        ([("1-0", 2)], [], ["1-0"]),
        ([("1-0", 3)], ["1-0"], []),
        ([("1-0", 7)], ["1-0"], []),
        ([("1-0", 1), ("2-0", 3), ("3-0", 2), ("4-0", 4)], ["2-0", "4-0"], ["1-0", "3-0"]),
    ],
)
def test_triage_quarantines_entries_delivered_max_deliveries_times(
    delivered: list[tuple[str, int]], quarantine: list[str], claim: list[str]
) -> None:
    pending = [Pending(entry_id, times) for entry_id, times in delivered]

    assert MAX_DELIVERIES == 3
    assert triage(pending) == (quarantine, claim)


def test_triage_honours_another_threshold() -> None:
    assert triage([Pending("1-0", 1), Pending("2-0", 2)], max_deliveries=2) == (["2-0"], ["1-0"])


def test_a_refused_entry_with_a_request_id_gets_an_error_reply_and_no_dead_letter() -> None:
    outcome = rejected(
        "5-0", {b"payload": b"{}"}, "r-1", "discovery request field 'query' is required"
    )

    assert outcome.dead_letter is None and outcome.request_id == "r-1"
    assert json.loads(outcome.reply or "") == {
        "request_id": "r-1",
        "error": "bad_request",
        "message": "discovery request field 'query' is required",
    }


def test_a_refused_entry_without_a_request_id_is_dead_lettered_readably() -> None:
    outcome = rejected(
        "5-0",
        {b"payload": b"\xff\xfe garbage"},
        None,
        "request entry field 'payload' is not UTF-8 text",
    )

    assert outcome.reply is None and outcome.request_id is None
    payload, reason, attempts = outcome.dead_letter or ("", "", 0)
    assert json.loads(payload) == {"payload": "\\xff\\xfe garbage"}
    assert reason == "discovery request refused: request entry field 'payload' is not UTF-8 text"
    assert attempts == 1


def test_a_quarantined_entry_is_dead_lettered_and_its_client_told() -> None:
    fields = {b"payload": json.dumps({"query": "boom", "request_id": "r-9"}).encode()}

    outcome = quarantined("7-0", fields, 3)

    payload, reason, attempts = outcome.dead_letter or ("", "", 0)
    assert attempts == 3 and "delivered 3 times and never answered" in reason
    assert json.loads(payload)["payload"] == fields[b"payload"].decode()
    reply = json.loads(outcome.reply or "")
    assert (reply["request_id"], reply["error"]) == ("r-9", "quarantined")
    assert "capdisc dlq list" in reply["message"]


def test_a_quarantined_entry_without_a_request_id_is_only_dead_lettered() -> None:
    outcome = quarantined("7-0", {b"junk": b"\x00"}, 4)

    assert outcome.reply is None and outcome.dead_letter is not None


def test_entry_text_is_bounded_and_escapes_bytes_that_are_not_utf8() -> None:
    text = entry_text({b"payload": b"\xff" * 100_000, b"op": b"session"})

    assert len(text) <= DEAD_LETTER_CHARS
    assert text.startswith('{"payload": "\\\\xff\\\\xff')


def test_answer_safely_turns_an_unexpected_error_into_an_internal_reply() -> None:
    def broken() -> SessionReply:
        return SessionReply("r-1", {}["created_ms"])

    reply = json.loads(answer_safely("r-1", broken, "discovery@h:1"))

    assert (reply["request_id"], reply["error"]) == ("r-1", "internal")
    assert "discovery worker discovery@h:1 failed" in reply["message"]
    assert "KeyError" in reply["message"] and "logged there with request id r-1" in reply["message"]


def test_answer_safely_turns_an_unserializable_reply_into_an_internal_reply() -> None:
    reply = json.loads(answer_safely("r-2", lambda: SessionReply("r-2", {"x": {1, 2}}), "w"))

    assert reply["error"] == "internal" and "TypeError" in reply["message"]


@pytest.mark.parametrize(
    "error",
    [redis.ConnectionError("gone"), redis.TimeoutError("slow"), redis.BusyLoadingError("loading")],
)
def test_answer_safely_lets_redis_being_away_through(error: Exception) -> None:
    def away() -> SessionReply:
        raise error

    with pytest.raises(type(error)):
        answer_safely("r-1", away, "w")


def test_answer_safely_passes_a_good_reply_through() -> None:
    reply = SessionReply("r-1", {"ids": [1]}, "w", 1.5)

    assert json.loads(answer_safely("r-1", lambda: reply, "w")) == reply.to_dict()


@pytest.mark.parametrize(
    ("served", "stored", "stale", "failed_at", "reload"),
    [
        (None, 0, False, None, True),  # not served yet
        (None, 5, False, None, True),
        (5, 5, False, None, False),  # up to date
        (5, 7, False, None, True),  # behind: a record missed
        (5, 3, False, None, True),  # ahead of the store: its data was reset
        (5, 0, False, None, False),  # gone from the store: keep serving
        (5, 7, False, 7, False),  # that version failed to load already
        (98, 0, True, None, False),  # Redis lost its data, not published again yet
        (98, 4, True, None, True),  # published again: reload whole
        (98, 98, True, None, True),  # even at the very same version number
        (98, 4, True, 4, False),
    ],
)
def test_needs_reload(
    served: int | None, stored: int, stale: bool, failed_at: int | None, reload: bool
) -> None:
    assert needs_reload(served, stored, stale=stale, failed_at=failed_at) is reload


def test_backoff_doubles_from_a_tenth_of_a_second_to_its_cap_and_resets() -> None:
    backoff = Backoff()

    delays = [backoff.next() for _ in range(7)]
    backoff.reset()

    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert backoff.next() == 0.1


class ListLog:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


def test_redis_health_says_once_when_redis_goes_and_once_when_every_loop_is_back() -> None:
    log, now = ListLog(), [100.0]
    health = RedisHealth(log, clock=lambda: now[0])

    health.ok("requests")
    for _ in range(5):
        health.failed("requests", redis.ConnectionError("refused"))
        health.failed("changes", redis.ConnectionError("refused"))
    now[0] = 103.5
    health.ok("requests")
    health.failed("requests", redis.ConnectionError("flap"))  # still the same outage
    health.ok("requests")
    assert health.down
    health.ok("changes")

    assert [e for e, _f in log.events] == ["redis_unavailable", "redis_reconnected"]
    assert log.events[1][1] == {"outage_s": 3.5}
    assert not health.down


def test_a_discovery_dead_letter_is_told_apart_from_an_event() -> None:
    request = DeadLetter(
        "1-0", "refused", 1, 0, "{}", source=keys.DISCOVERY_REQUESTS, request_id="r-1"
    )
    event = DeadLetter("2-0", "bad", 1, 0, json.dumps({"tenant": "t", "capability_id": "x"}))

    assert request.is_discovery_request and not event.is_discovery_request
    assert request.to_dict()["request_id"] == "r-1" and request.to_dict()["tenant"] is None
    assert event.to_dict()["source"] == keys.INDEXING_QUEUE
    assert event.to_dict()["capability_id"] == "x"
