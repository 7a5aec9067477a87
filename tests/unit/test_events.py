"""Registry events: JSON encoding and the strict decoder."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capdisc.errors import EventDecodeError
from capdisc.registry.events import SCHEMA_VERSION, RegistryEvent
from capdisc.tenants import TENANT_RULE

UPSERT = RegistryEvent(
    type="upsert",
    tenant="acme",
    capability_id="tool:web-search",
    seq=1_700_000_000_000_000_001,
    source="/registry",
    capability={"id": "tool:web-search", "name": "web-search"},
    batch_id="b-1",
    event_id="e" * 32,
    occurred_at_ms=1_700_000_000_000,
)
DELETE = RegistryEvent(
    type="delete",
    tenant="acme",
    capability_id="tool:web-search",
    seq=2,
    event_id="d" * 32,
    occurred_at_ms=5,
)


def fields(event: RegistryEvent = UPSERT, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(event.encode())
    data.update(changes)
    return data


def without(name: str) -> dict[str, Any]:
    data = fields()
    del data[name]
    return data


@pytest.mark.parametrize("event", [UPSERT, DELETE], ids=["upsert", "delete"])
def test_decode_of_encode_is_the_same_event(event: RegistryEvent) -> None:
    assert RegistryEvent.decode(event.encode()) == event


def test_decode_accepts_bytes() -> None:
    assert RegistryEvent.decode(UPSERT.encode().encode()) == UPSERT


def test_encode_is_compact_json_of_every_field() -> None:
    assert DELETE.encode() == (
        '{"type":"delete","tenant":"acme","capability_id":"tool:web-search","seq":2,"source":"",'
        '"capability":null,"batch_id":null,"event_id":"dddddddddddddddddddddddddddddddd",'
        '"occurred_at_ms":5,"schema_version":1}'
    )


def test_new_events_get_a_unique_id_and_the_current_schema_version() -> None:
    first = RegistryEvent(type="delete", tenant="acme", capability_id="tool:a", seq=1)
    second = RegistryEvent(type="delete", tenant="acme", capability_id="tool:a", seq=1)

    assert first.event_id != second.event_id
    assert len(first.event_id) == 32
    assert first.schema_version == SCHEMA_VERSION == 1


def test_optional_fields_may_be_absent() -> None:
    data = fields(DELETE)
    for name in ("source", "capability", "batch_id"):
        del data[name]

    assert RegistryEvent.decode(json.dumps(data)) == DELETE


def test_event_of_exactly_the_size_limit_is_accepted() -> None:
    text = UPSERT.encode()

    assert RegistryEvent.decode(text, max_bytes=len(text)) == UPSERT


def test_copy_changes_only_the_named_fields() -> None:
    assert UPSERT.copy(seq=9) == RegistryEvent(**{**fields(), "seq": 9})


@pytest.mark.parametrize(
    "text", ["{not json", b'{"type": "\xff"}', ""], ids=["not-json", "not-utf8", "empty"]
)
def test_text_that_is_not_json_is_a_decode_error(text: str | bytes) -> None:
    with pytest.raises(EventDecodeError, match=r"^event is not valid JSON: "):
        RegistryEvent.decode(text)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param([1, 2], "event must be a JSON object", id="list"),
        pytest.param(None, "event must be a JSON object", id="null"),
        pytest.param(without("seq"), "event field 'seq' is missing", id="missing-seq"),
        pytest.param(without("tenant"), "event field 'tenant' is missing", id="missing-tenant"),
        pytest.param(fields(colour="red"), "event has unknown field 'colour'", id="unknown-field"),
        pytest.param(
            fields(seq="5"), "event field 'seq' has the wrong type (str)", id="seq-string"
        ),
        pytest.param(
            fields(seq=1.5), "event field 'seq' has the wrong type (float)", id="seq-float"
        ),
        pytest.param(
            fields(seq=True), "event field 'seq' has the wrong type (bool)", id="seq-bool"
        ),
        pytest.param(
            fields(schema_version=False),
            "event field 'schema_version' has the wrong type (bool)",
            id="schema-version-bool",
        ),
        pytest.param(
            fields(capability=["x"]),
            "event field 'capability' has the wrong type (list)",
            id="capability-list",
        ),
        pytest.param(
            fields(tenant=None),
            "event field 'tenant' has the wrong type (NoneType)",
            id="tenant-null",
        ),
        pytest.param(
            fields(schema_version=2),
            "event schema_version 2 is not supported (this worker reads 1); upgrade the worker",
            id="schema-version-2",
        ),
        pytest.param(
            fields(type="patch"),
            "event field 'type' must be one of upsert, delete, reindex, got 'patch'",
            id="bad-type",
        ),
        pytest.param(
            fields(tenant="acme corp"),
            f"event field 'tenant' 'acme corp' is not a valid tenant name: use {TENANT_RULE}",
            id="tenant-space",
        ),
        pytest.param(
            fields(tenant="-acme"),
            f"event field 'tenant' '-acme' is not a valid tenant name: use {TENANT_RULE}",
            id="tenant-leading-dash",
        ),
        pytest.param(
            fields(tenant="a" * 10_240),
            f"event field 'tenant' '{'a' * 39}... (10240 characters) is not a valid tenant "
            f"name: use {TENANT_RULE}",
            id="tenant-10kb",
        ),
        pytest.param(
            fields(take_over="yes"),
            "event field 'take_over' has the wrong type (str)",
            id="take-over-string",
        ),
        pytest.param(
            fields(capability=None),
            "event field 'capability' is required for an upsert",
            id="upsert-null-capability",
        ),
        pytest.param(
            fields(capability={}),
            "event field 'capability' is required for an upsert",
            id="upsert-empty-capability",
        ),
    ],
)
def test_malformed_event_is_a_decode_error_naming_the_part(data: Any, message: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        RegistryEvent.decode(json.dumps(data))

    assert str(info.value) == message


def test_oversize_event_is_refused_before_parsing() -> None:
    with pytest.raises(EventDecodeError) as info:
        RegistryEvent.decode("x" * 101, max_bytes=100)

    assert str(info.value) == (
        "event is 101 bytes, the limit is 100; split the capability's "
        "content or raise CAPDISC_EVENT_MAX_BYTES"
    )


def test_event_size_is_counted_in_utf8_bytes() -> None:
    text = json.dumps(fields(source="é" * 60), ensure_ascii=False)

    with pytest.raises(EventDecodeError, match=r"^event is \d+ bytes"):
        RegistryEvent.decode(text, max_bytes=len(text))


def test_take_over_is_encoded_only_when_set_and_round_trips() -> None:
    taking = DELETE.copy(take_over=True)

    assert "take_over" not in json.loads(DELETE.encode())
    assert json.loads(taking.encode())["take_over"] is True
    assert RegistryEvent.decode(taking.encode()) == taking
    assert RegistryEvent.decode(DELETE.encode()).take_over is False
