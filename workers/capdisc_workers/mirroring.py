"""Mirroring the registry to an external vector store (``vector_store: weaviate``).

Redis stays the source of truth: after events are applied, what they changed is written to the
store too (:func:`mirror`); after a full reindex's swap, or when the reconciler finds the store
holding another number of objects than Redis has records, a tenant is written again whole
(:func:`resync`). A write the store refuses is logged, counted (``store_write_failures``) and
remembered by capability id (``keys.store_unwritten``, shown by ``capdisc status``): the
reconciler writes those again (:func:`rewrite_unwritten`) until the store takes them, so a
changed capability is not left stale there. Without an external store (None) each of these
does nothing.
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
        _mirror_tracked(client, store, tenant, upserts, deletes, space)


def rewrite_unwritten(client: redis.Redis, store: VectorStore, tenant: str, space: str) -> int:
    """Write again the changes of ``tenant`` the store did not take (``keys.store_unwritten``):
    each id still stored as an upsert, each one gone as a delete; how many it still refuses."""
    ids = sorted(as_str(i) for i in client.hkeys(keys.store_unwritten(tenant)))
    if not ids:
        return 0
    held = client.hmget(keys.caps(tenant), ids)
    upserts = [cap_id for cap_id, raw in zip(ids, held, strict=True) if raw]
    deletes = [cap_id for cap_id, raw in zip(ids, held, strict=True) if not raw]
    refused = _mirror_tracked(client, store, tenant, upserts, deletes, space)
    log.info("store_rewritten", tenant=tenant, written=len(ids) - refused, refused=refused)
    return refused


def _mirror_tracked(
    client: redis.Redis,
    store: VectorStore,
    tenant: str,
    upserts: list[str],
    deletes: list[str],
    space: str,
) -> int:
    """:func:`mirror_tenant`, remembering the ids the store did not take (with why) and
    forgetting those it took; how many it did not take."""
    try:
        refused = mirror_tenant(client, store, tenant, upserts, deletes, space)
    except CapdiscError as exc:
        log.error(
            "store_write_failed",
            tenant=tenant,
            error=str(exc),
            capability_ids=[*upserts, *deletes],
            hint="the reconciler writes them again",
        )
        refused = dict.fromkeys([*upserts, *deletes], str(exc))
    taken = [cap_id for cap_id in (*upserts, *deletes) if cap_id not in refused]
    with client.pipeline(transaction=False) as pipe:
        if taken:
            pipe.hdel(keys.store_unwritten(tenant), *taken)
        if refused:
            pipe.hset(keys.store_unwritten(tenant), mapping={i: why for i, why in refused.items()})
            pipe.hincrby(keys.COUNTERS, "store_write_failures", len(refused))
        pipe.execute()
    return len(refused)


def resync(client: redis.Redis, store: VectorStore | None, tenant: str, space: str) -> int:
    """Write every stored capability of ``tenant`` to ``store`` again and delete the
    tombstoned ones there; how many writes it refused."""
    if store is None:
        return 0
    ids = sorted(as_str(i) for i in client.hkeys(keys.caps(tenant)))
    gone = sorted(as_str(i) for i in client.hkeys(keys.tombstones(tenant)))
    failed = 0
    for start in range(0, max(len(ids), len(gone)), RESYNC_CHUNK):
        failed += _mirror_tracked(
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
) -> dict[str, str]:
    """Write one tenant's changes to the store; why it refused each id it refused."""
    store.ensure_tenant(tenant)
    objects = _stored_objects(client, tenant, upserts, space) if upserts else []
    report = store.upsert(tenant, objects) if objects else None
    if deletes:
        store.delete(tenant, deletes)
    for failure in report.failed if report is not None else ():
        log.error(
            "store_write_failed", tenant=tenant, capability_id=failure.id, reason=failure.reason
        )
    return {failure.id: failure.reason for failure in report.failed} if report is not None else {}


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
