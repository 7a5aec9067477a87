"""Stored records are parsed a chunk at a time (:func:`capdisc.registry.policy.parsed_records`)."""

from __future__ import annotations

import json

import pytest

from capdisc.registry import policy
from capdisc.registry.events import RegistryEvent


def test_records_parse_as_one_by_one_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "PARSE_CHUNK", 3)
    records = [{"capability": {"id": f"t{i}", "tags": ["a", i]}} for i in range(8)]
    raw = [json.dumps(r).encode() for r in records]

    assert policy.parsed_records(raw) == records


def test_chunk_parsing_shares_one_string_per_key() -> None:
    raw = [json.dumps({"description": i}).encode() for i in range(3)]

    keys = [next(iter(record)) for record in policy.parsed_records(raw)]

    assert keys[0] is keys[1] is keys[2]


def test_a_record_that_is_not_json_is_left_as_its_text_and_the_rest_parse() -> None:
    raw = [b'{"id": "a"}', b'{"id": ', b'{"id": "c"}']

    assert policy.parsed_records(raw) == [{"id": "a"}, b'{"id": ', {"id": "c"}]


@pytest.mark.parametrize("odd", [b"1, 2", b'{"a": 1}]'])
def test_a_record_that_is_not_one_value_is_not_taken_for_two(odd: bytes) -> None:
    assert policy.parsed_records([b'{"id": "a"}', odd]) == [{"id": "a"}, odd]


def test_a_record_nested_too_deeply_to_parse_is_left_as_its_text_and_the_rest_parse() -> None:
    deep = b"[" * 5000  # RecursionError, not ValueError: it failed every load of its tenant

    assert policy.parsed_records([b'{"id": "a"}', deep]) == [{"id": "a"}, deep]
    assert policy.stored_record(deep) is policy.UNREADABLE


CAPABILITY = {"id": "tool:a", "kind": "tool", "name": "a", "description": "A."}
RECORD = {"capability": CAPABILITY, "seq": 3, "content_hash": "h", "updated_at_ms": 5}


@pytest.mark.parametrize("form", [json.dumps(RECORD), json.dumps(RECORD).encode(), RECORD])
def test_a_stored_record_reads_from_text_bytes_or_parsed_json(form: object) -> None:
    assert policy.stored_record(form) == policy.StoredRecord(CAPABILITY, 3, "h", 5)


@pytest.mark.parametrize("value", [None, b"", ""])
def test_no_stored_value_is_no_record(value: object) -> None:
    assert policy.stored_record(value) is None


@pytest.mark.parametrize(
    "value",
    [
        b"garbage",
        b'{"id": ',
        b"[1, 2]",
        json.dumps({"seq": 1}),
        json.dumps({**RECORD, "seq": "x"}),
        json.dumps({**RECORD, "capability": "tool:a"}),
        json.dumps({**RECORD, "capability": {"id": "tool:a", "kind": "tool"}}),
        json.dumps({**RECORD, "capability": {**CAPABILITY, "name": 7}}),
    ],
)
def test_a_stored_value_that_is_no_record_reads_as_unreadable(value: object) -> None:
    record = policy.stored_record(value)

    assert record is policy.UNREADABLE and not record.readable
    assert policy.stored_capability(value) is None


@pytest.mark.parametrize("event_type", ["upsert", "delete"])
def test_an_event_replaces_or_removes_an_unreadable_record(event_type: str) -> None:
    event = RegistryEvent(type=event_type, tenant="t", capability_id="tool:a", seq=1)

    decision = policy.decide(event, policy.UNREADABLE, None, "h")

    assert decision == event_type


def test_a_reindex_of_an_unreadable_record_finds_nothing_to_embed() -> None:
    """The reconciler sends one for every record without a vector: it must not fail five
    times with a TypeError and be dead-lettered, once per reconcile, for ever."""
    event = RegistryEvent(type="reindex", tenant="t", capability_id="tool:a", seq=1)

    assert policy.decide(event, policy.UNREADABLE, None, None) == "not_found"
