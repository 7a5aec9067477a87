"""Stored records are parsed a chunk at a time (:func:`capdisc.registry.policy.parsed_records`)."""

from __future__ import annotations

import json

import pytest

from capdisc.registry import policy


def test_records_parse_as_one_by_one_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "PARSE_CHUNK", 3)
    records = [{"capability": {"id": f"t{i}", "tags": ["a", i]}} for i in range(8)]
    raw = [json.dumps(r).encode() for r in records]

    assert policy.parsed_records(raw) == records


def test_chunk_parsing_shares_one_string_per_key() -> None:
    raw = [json.dumps({"description": i}).encode() for i in range(3)]

    keys = [next(iter(record)) for record in policy.parsed_records(raw)]

    assert keys[0] is keys[1] is keys[2]


def test_a_record_that_is_not_json_raises_its_own_error() -> None:
    raw = [b'{"id": "a"}', b'{"id": ', b'{"id": "c"}']

    with pytest.raises(ValueError, match="Expecting value"):
        policy.parsed_records(raw)


@pytest.mark.parametrize("odd", [b"1, 2", b"", b'{"a": 1}]'])
def test_a_record_that_is_not_one_value_is_not_taken_for_two(odd: bytes) -> None:
    with pytest.raises(ValueError):
        policy.parsed_records([b'{"id": "a"}', odd])
