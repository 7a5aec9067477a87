"""``capdisc status`` counts a tenant's records by reading them a piece at a time: every record
counted once, however many pieces the tenant takes."""

from __future__ import annotations

import numpy as np
import redis

from capdisc import keys
from capdisc.models import Capability
from capdisc.redisscan import SCAN_COUNT
from capdisc.registry.events import RegistryEvent
from capdisc.registry.store import apply_events
from capdisc.status import collect_status

KINDS = ("tool", "skill", "channel")


def _upsert(tenant: str, number: int) -> tuple[RegistryEvent, Capability]:
    capability = Capability(
        id=f"cap:c{number}",
        kind=KINDS[number % 3],
        name=f"c{number}",
        description=f"Capability {number}.",
    )
    source = "files" if number % 2 else "mcp:weather"
    event = RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id=capability.id,
        seq=1,
        capability={**capability.to_dict(), "source_ref": {"source": source}},
    )
    return event, Capability.from_dict(event.capability or {})


def test_status_counts_every_record_of_a_tenant_many_pieces_long_once(
    connection: redis.Redis, tenant: str
) -> None:
    size = 3 * SCAN_COUNT + 17
    items = [_upsert(tenant, n) for n in range(size)]
    apply_events(connection, items, lambda _c: np.ones(4, dtype=np.float32).tobytes(), "space")
    connection.hset(keys.caps(tenant), mapping={"cap:bad1": b"{not json", "cap:bad2": b"[]"})

    status = collect_status(connection)["tenants"][tenant]

    assert status["capabilities"] == size
    assert status["by_kind"] == {kind: len(range(i, size, 3)) for i, kind in enumerate(KINDS)}
    assert status["sources"] == {"files": size // 2, "mcp:weather": size - size // 2}
    assert status["unreadable_records"] == ["cap:bad1", "cap:bad2"]
