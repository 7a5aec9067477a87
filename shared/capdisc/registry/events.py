"""Registry events: frozen value objects that producers send and indexing workers apply.

An event travels as JSON text (the single argument of the Celery task named
:data:`capdisc.keys.TASK_APPLY_EVENT`). :meth:`RegistryEvent.decode` is the only way back and
raises :class:`EventDecodeError`, naming the part that is wrong, for anything malformed.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, cast

from capdisc.errors import EventDecodeError
from capdisc.tenants import TENANT_RE as TENANT_RE
from capdisc.tenants import shown, tenant_problem

SCHEMA_VERSION = 1
EventType = Literal["upsert", "delete", "reindex"]
EVENT_TYPES: tuple[EventType, ...] = ("upsert", "delete", "reindex")
DEFAULT_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class RegistryEvent:
    """One change to the registry: upsert or delete one capability of one tenant, or reindex
    it (embed its stored definition again, bypassing the embedding cache).

    ``seq`` orders upserts and deletes of the same capability: an event whose ``seq`` is not
    newer than what is stored changes nothing. Producers use a wall-clock nanosecond stamp of the
    observed change. A reindex carries no content and does not take part in that order.
    """

    type: EventType
    tenant: str
    capability_id: str
    seq: int
    source: str = ""
    capability: dict[str, Any] | None = None
    batch_id: str | None = None
    event_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    occurred_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    schema_version: int = SCHEMA_VERSION
    #: The producer's identity token (:mod:`capdisc.identity.auth`): with auth on, an indexing
    #: worker
    #: applies the event only if it proves the ``write`` grant for the event's tenant.
    token: str | None = field(default=None, repr=False)
    #: The producer knows another source holds the capability and moves it to ``source``
    #: (``--take-over``); without it an indexing worker refuses to change or delete a
    #: capability of another source (:func:`capdisc.registry.policy.decide`).
    take_over: bool = False

    def encode(self) -> str:
        fields = asdict(self)
        if fields["token"] is None:
            del fields["token"]  # reads as before tokens existed
        if not fields["take_over"]:
            del fields["take_over"]  # reads as before ownership existed
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)

    def copy(self, **changes: Any) -> RegistryEvent:
        return replace(self, **changes)

    @classmethod
    def decode(cls, data: str | bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> RegistryEvent:
        """Parse and check an encoded event; raise :class:`EventDecodeError` if it is not one."""
        size = len(data.encode() if isinstance(data, str) else data)
        if size > max_bytes:
            raise EventDecodeError(
                f"event is {size} bytes, the limit is {max_bytes}; split the "
                "capability's content or raise CAPDISC_EVENT_MAX_BYTES"
            )
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise EventDecodeError(f"event is not valid JSON: {exc}") from exc
        except RecursionError as exc:  # not a ValueError: the event would be lost, not refused
            raise EventDecodeError("event is nested too deeply to read") from exc
        if not isinstance(raw, dict):
            raise EventDecodeError("event must be a JSON object")
        return cls(**_checked(raw))


_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "type": (str, True),
    "tenant": (str, True),
    "capability_id": (str, True),
    "seq": (int, True),
    "source": (str, False),
    "capability": ((dict, type(None)), False),
    "batch_id": ((str, type(None)), False),
    "event_id": (str, True),
    "occurred_at_ms": (int, True),
    "schema_version": (int, True),
    "token": ((str, type(None)), False),
    "take_over": (bool, False),
}


def _checked(raw: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise EventDecodeError(f"event has unknown field '{unknown[0]}'")
    for name, (types, required) in _FIELDS.items():
        if name not in raw:
            if required:
                raise EventDecodeError(f"event field '{name}' is missing")
            continue
        value = raw[name]
        if not isinstance(value, types) or (isinstance(value, bool) and types is int):
            raise EventDecodeError(
                f"event field '{name}' has the wrong type ({type(value).__name__})"
            )
    _check_values(raw)
    raw["type"] = cast(EventType, raw["type"])
    return raw


def _check_values(raw: dict[str, Any]) -> None:
    if raw["schema_version"] != SCHEMA_VERSION:
        raise EventDecodeError(
            f"event schema_version {raw['schema_version']} is not supported "
            f"(this worker reads {SCHEMA_VERSION}); upgrade the worker"
        )
    if raw["type"] not in EVENT_TYPES:
        raise EventDecodeError(
            f"event field 'type' must be one of {', '.join(EVENT_TYPES)}, got {raw['type']!r}"
        )
    if not raw["capability_id"]:
        raise EventDecodeError("event field 'capability_id' must not be empty")
    problem = tenant_problem(raw["tenant"])
    if problem:
        raise EventDecodeError(f"event field 'tenant' {shown(raw['tenant'])} {problem}")
    if raw["type"] == "upsert" and not raw.get("capability"):
        raise EventDecodeError("event field 'capability' is required for an upsert")
