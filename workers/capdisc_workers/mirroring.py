"""Mirroring the registry to an external vector store (``vector_store: weaviate``).

Redis stays the source of truth: after events are applied, what they changed is written to the
store too (:func:`mirror`); after a full reindex's swap, or when the reconciler finds the store
holding another number of objects than Redis has records, a tenant is written again whole
(:func:`resync`). A write the store refuses is logged and counted (``store_write_failures``);
the next publish or reindex of it writes it again. Without an external store (None) each of
these does nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import redis
import structlog

from capdisc import keys
from capdisc.errors import CapdiscError
from capdisc.redistext import as_str
from capdisc.registry.events import RegistryEvent
from capdisc.registry.policy import stored_capability
from capdisc.vectorstores.port import StoredObject, VectorStore

log = structlog.get_logger("capdisc.indexing")

#: Capabilities written (and deleted) per store call when a whole tenant is written again.
RESYNC_CHUNK = 256


def mirror(
    client: redis.Redis,
    store: VectorStore | None,
    applied: list[tuple[RegistryEvent, dict[str, Any] | None]],
    space: str,
) -> None:
    """Write what these applied events changed to ``store``: the stored record and vector of
    each upsert or reindex, each delete (by the outcome each event had)."""
    if store is None:
        return
    by_tenant: dict[str, tuple[list[str], list[str]]] = {}
    for event, outcome in applied:
        upserts, deletes = by_tenant.setdefault(event.tenant, ([], []))
        decision = (outcome or {}).get("decision")
        if decision in ("upsert", "reindex"):
            upserts.append(event.capability_id)
        elif decision == "delete":
            deletes.append(event.capability_id)
    for tenant, (upserts, deletes) in by_tenant.items():
        try:
            failed = mirror_tenant(client, store, tenant, upserts, deletes, space)
        except CapdiscError as exc:
            failed = len(upserts) + len(deletes)
            log.error("store_write_failed", tenant=tenant, error=str(exc))
        if failed:
            client.hincrby(keys.COUNTERS, "store_write_failures", failed)


def resync(client: redis.Redis, store: VectorStore | None, tenant: str, space: str) -> int:
    """Write every stored capability of ``tenant`` to ``store`` again and delete the
    tombstoned ones there; how many writes it refused."""
    if store is None:
        return 0
    ids = sorted(as_str(i) for i in client.hkeys(keys.caps(tenant)))
    gone = sorted(as_str(i) for i in client.hkeys(keys.tombstones(tenant)))
    failed = 0
    for start in range(0, max(len(ids), len(gone)), RESYNC_CHUNK):
        failed += mirror_tenant(
            client,
            store,
            tenant,
            ids[start : start + RESYNC_CHUNK],
            gone[start : start + RESYNC_CHUNK],
            space,
        )
    log.info("store_resynced", tenant=tenant, written=len(ids), deleted=len(gone), refused=failed)
    return failed


def mirror_tenant(
    client: redis.Redis,
    store: VectorStore,
    tenant: str,
    upserts: list[str],
    deletes: list[str],
    space: str,
) -> int:
    """Write one tenant's changes to the store; how many it refused."""
    store.ensure_tenant(tenant)
    objects = _stored_objects(client, tenant, upserts, space) if upserts else []
    report = store.upsert(tenant, objects) if objects else None
    if deletes:
        store.delete(tenant, deletes)
    for failure in report.failed if report is not None else ():
        log.error(
            "store_write_failed", tenant=tenant, capability_id=failure.id, reason=failure.reason
        )
    return len(report.failed) if report is not None else 0


def _stored_objects(
    client: redis.Redis, tenant: str, ids: list[str], space: str
) -> list[StoredObject]:
    """The store's objects for the ``ids`` that have both a record and a vector in ``space``."""
    records = client.hmget(keys.caps(tenant), ids)
    rows = client.hmget(keys.vectors(tenant, space), ids)
    objects = []
    for raw, vector in zip(records, rows, strict=True):
        cap = stored_capability(raw)
        if cap is not None and isinstance(vector, bytes):
            objects.append(
                StoredObject.from_capability(cap, np.frombuffer(vector, dtype=np.float32))
            )
    return objects
