"""Bring the registry in line with a directory of CAPABILITY.yaml manifests.

Scan, compare with what the registry holds for that directory (:func:`capdisc.registry.plan_sync`),
send only the upserts and deletes that change something, and record which manifests were
rejected and why (``capdisc status`` shows them). A broken manifest never removes the capability
it was meant to update.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from capdisc import keys
from capdisc.events import RegistryEvent
from capdisc.manifest import ScanCache, scan_directory
from capdisc.registry import SyncPlan, plan_sync
from capdisc.store import as_str, stored_by_source
from capdisc_producers.publisher import Publisher, wait_for_acks


@dataclass
class SyncReport:
    """What one sync of a directory did."""

    root: Path
    plan: SyncPlan
    batch_id: str
    sent: int
    outcomes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def index_version(self) -> int:
        return max((int(o.get("version", 0)) for o in self.outcomes), default=0)

    @property
    def complete(self) -> bool:
        return len(self.outcomes) >= self.sent

    def summary(self) -> str:
        plan = self.plan
        return (f"{self.root}: {len(plan.upserts)} upserted, {len(plan.deletes)} deleted, "
                f"{len(plan.unchanged)} unchanged, {len(plan.errors)} rejected")


def sync_directory(client: redis.Redis, publisher: Publisher, root: Path, *, tenant: str,
                   max_bytes: int, wait_s: float = 0.0, cache: ScanCache | None = None
                   ) -> SyncReport:
    """Scan ``root`` and publish what changed; with ``wait_s`` wait for the workers to apply it.
    A ``cache`` kept across calls skips re-parsing unchanged manifests."""
    root = root.resolve()
    scan = scan_directory(root, max_bytes=max_bytes, cache=cache)
    plan = plan_sync(scan.capabilities, scan.errors, stored_by_source(client, tenant, str(root)))
    _record_errors(client, tenant, root, plan)
    batch_id = uuid.uuid4().hex
    events = events_for(plan, tenant, str(root), batch_id)
    sent = publisher.send(events)
    report = SyncReport(root=root, plan=plan, batch_id=batch_id, sent=sent)
    if wait_s > 0 and sent:
        report.outcomes = wait_for_acks(client, batch_id, sent, wait_s)
    return report


def events_for(plan: SyncPlan, tenant: str, source: str, batch_id: str,
               seq: int | None = None) -> list[RegistryEvent]:
    """The upsert and delete events of ``plan``, all with one sequence (now, by default)."""
    seq = seq if seq is not None else time.time_ns()
    events = [RegistryEvent(type="upsert", tenant=tenant, capability_id=cap.id, seq=seq,
                            source=source, capability=cap.to_dict(), batch_id=batch_id)
              for cap in plan.upserts]
    events += [RegistryEvent(type="delete", tenant=tenant, capability_id=cap_id, seq=seq,
                             source=source, batch_id=batch_id)
               for cap_id in plan.deletes]
    return events


def _record_errors(client: redis.Redis, tenant: str, root: Path, plan: SyncPlan) -> None:
    key = keys.manifest_errors(tenant)
    stale = [k for k in client.hkeys(key)
             if as_str(k).startswith(str(root)) and Path(as_str(k)) not in plan.errors]
    with client.pipeline(transaction=True) as pipe:
        if stale:
            pipe.hdel(key, *stale)
        for path, error in plan.errors.items():
            pipe.hset(key, str(path), str(error))
        pipe.sadd(keys.TENANTS, tenant)
        pipe.execute()
