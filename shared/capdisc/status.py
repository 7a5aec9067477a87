"""What ``capdisc status`` shows: index versions, counts per kind, workers, queues, errors,
and per tenant its tool-poisoning policy and flags; and what ``capdisc status --check`` finds
missing (:func:`health_failures`)."""

from __future__ import annotations

import json
from typing import Any

import redis

from capdisc import keys
from capdisc.errors import FlagError
from capdisc.redisclock import redis_now_ms
from capdisc.redistext import as_str
from capdisc.registry import counts as record_counts
from capdisc.registry import flags
from capdisc.registry.deadletters import budget
from capdisc.registry.flagstore import read_flags, tenant_policy

DEFAULT_STALE_AFTER_S = 10.0


def heartbeat(client: redis.Redis, worker_id: str, info: dict[str, Any]) -> None:
    """Record that a worker is alive (and what it serves)."""
    entry = {**info, "id": worker_id, "last_seen_ms": redis_now_ms(client)}
    client.hset(keys.WORKERS, worker_id, json.dumps(entry))


def forget_worker(client: redis.Redis, worker_id: str) -> None:
    client.hdel(keys.WORKERS, worker_id)


#: Heartbeats forgotten per script call.
FORGET_BATCH = 500

#: KEYS: the heartbeats hash. ARGV: the cutoff (ms), then worker ids. Forgets each of those
#: whose heartbeat is still at or before the cutoff (or unreadable): one that beat since the
#: caller read it stays.
_FORGET_GONE = """
local gone = 0
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local ok, entry = pcall(cjson.decode, raw)
    local seen = ok and type(entry) == 'table' and entry['last_seen_ms']
    if type(seen) ~= 'number' or seen <= tonumber(ARGV[1]) then
      redis.call('HDEL', KEYS[1], ARGV[i])
      gone = gone + 1
    end
  end
end
return gone
"""


def read_heartbeats(client: redis.Redis) -> dict[str, Any]:
    """Every entry of ``capdisc:workers`` by worker id, parsed (None: not JSON)."""
    return {as_str(k): _json(v) for k, v in client.hgetall(keys.WORKERS).items()}


def gone_workers(heartbeats: dict[str, Any], now_ms: int, forget_after_s: float) -> list[str]:
    """The ids among ``heartbeats`` (:func:`read_heartbeats`) to forget at ``now_ms``: no
    heartbeat within ``forget_after_s``, or an entry that is no heartbeat at all."""
    cutoff_ms = now_ms - forget_after_s * 1000
    return sorted(
        worker_id
        for worker_id, entry in heartbeats.items()
        if not _is_heartbeat(entry) or entry["last_seen_ms"] <= cutoff_ms
    )


def forget_gone_workers(
    client: redis.Redis, heartbeats: dict[str, Any], now_ms: int, forget_after_s: float
) -> list[str]:
    """Forget the workers :func:`gone_workers` names, unless one beat meanwhile; their ids."""
    gone = gone_workers(heartbeats, now_ms, forget_after_s)
    script = client.register_script(_FORGET_GONE)
    cutoff_ms = now_ms - int(forget_after_s * 1000)
    for start in range(0, len(gone), FORGET_BATCH):
        script(keys=[keys.WORKERS], args=[cutoff_ms, *gone[start : start + FORGET_BATCH]])
    return gone


def live_workers(
    client: redis.Redis, stale_after_s: float = DEFAULT_STALE_AFTER_S
) -> list[dict[str, Any]]:
    now_ms = redis_now_ms(client)
    workers = [w for v in client.hgetall(keys.WORKERS).values() if _is_heartbeat(w := _json(v))]
    return sorted(
        (w for w in workers if now_ms - w["last_seen_ms"] <= stale_after_s * 1000),
        key=lambda w: (w["kind"], w["id"]),
    )


#: The kinds of worker a stack needs to serve, and how to start one of each.
NEEDED_WORKERS = {
    "discovery": "python -m capdisc_workers.discovery",
    "indexing": "celery -A capdisc_workers.celery_app worker -Q indexing",
}


def health_failures(workers: list[dict[str, Any]], stale_after_s: float) -> list[str]:
    """One line per kind of worker that none of the live ``workers`` (:func:`live_workers`)
    is, saying how to start one; empty when the stack has what it needs to serve."""
    kinds = {w.get("kind") for w in workers}
    return [
        f"{kind} workers: none live (no heartbeat within {stale_after_s:g} s); start one "
        f"({command}), or see why it stopped (capdisc status lists the workers seen)"
        for kind, command in NEEDED_WORKERS.items()
        if kind not in kinds
    ]


def record_supervised(client: redis.Redis, children: dict[str, dict[str, Any]]) -> None:
    """Record what ``capdisc up`` knows of the processes it supervises (by child name)."""
    now_ms = redis_now_ms(client)
    client.hset(
        keys.SUPERVISED,
        mapping={
            name: json.dumps({**child, "updated_ms": now_ms}) for name, child in children.items()
        },
    )


def supervised(
    client: redis.Redis, stale_after_s: float = DEFAULT_STALE_AFTER_S
) -> dict[str, dict[str, Any]]:
    """The children of a running ``capdisc up`` (pid, restarts, last exit), by name; empty when
    no ``up`` recorded them within ``stale_after_s``."""
    now_ms = redis_now_ms(client)
    children = {as_str(k): _json(v) for k, v in client.hgetall(keys.SUPERVISED).items()}
    return {
        name: child
        for name, child in sorted(children.items())
        if isinstance(child, dict)
        and isinstance(child.get("updated_ms", 0), int | float)
        and now_ms - child.get("updated_ms", 0) <= stale_after_s * 1000
    }


def _json(raw: Any) -> Any:
    """``raw`` parsed; None for a value that is no JSON (written by hand or damaged), or is
    nested too deeply to parse (RecursionError: it failed every sweep and status)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _is_heartbeat(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("kind"), str)
        and isinstance(entry.get("id"), str)
        and isinstance(entry.get("last_seen_ms"), int | float)
    )


def collect_status(
    client: redis.Redis,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
    poisoning_policy: flags.Policy = "warn",
) -> dict[str, Any]:
    """Everything ``capdisc status`` shows; ``poisoning_policy`` is the workers' setting, the
    policy of a tenant that has none of its own."""
    tenants = {}
    for raw_tenant in sorted(client.smembers(keys.TENANTS)):
        tenant = as_str(raw_tenant)
        tenants[tenant] = _tenant_status(client, tenant)
        tenants[tenant]["poisoning"] = poisoning_status(client, tenant, poisoning_policy)
    default = tenants.get("default") or next(iter(tenants.values()), None)
    counters = {as_str(k): int(v) for k, v in client.hgetall(keys.COUNTERS).items()}
    return {
        "index_version": default["index_version"] if default else 0,
        "capabilities": default["capabilities"] if default else 0,
        "by_kind": default["by_kind"] if default else {},
        "tenants": tenants,
        # each live worker's last heartbeat as sent: a discovery worker's versions served, where
        # each tenant was loaded from and, with snapshot_dir set, the snapshots it last wrote
        "workers": live_workers(client, stale_after_s),
        # the processes `capdisc up` supervises: pid, restarts, last exit reason
        "supervised": supervised(client, stale_after_s),
        "queues": _queues(client),
        "dead_letters": int(client.xlen(keys.DEADLETTERS)),
        # the bytes they hold against deadletters_max_bytes; the oldest dropped to keep to it
        **_dead_letter_budget(client),
        # queued for an indexing worker, or delivered and not yet acknowledged
        "pending_events": int(client.llen(keys.INDEXING_QUEUE))
        + int(client.hlen(keys.KOMBU_UNACKED)),
        "embedding_calls": counters.get("embedding_calls", 0),
        "drift_repaired": counters.get("drift_repaired", 0),
        # indexing tasks sent and not yet done; tasks_resent: the ones the broker lost
        "tasks_in_flight": int(client.hlen(keys.OUTBOX)),
        "tasks_resent": counters.get("tasks_resent", 0),
        "last_reconcile": _json_or_none(client.get(keys.RECONCILE_LAST)),
    }


def _dead_letter_budget(client: redis.Redis) -> dict[str, int]:
    held = budget(client)
    return {"dead_letter_bytes": held.held_bytes, "dead_letters_dropped": held.dropped}


def _json_or_none(raw: Any) -> Any:
    return _json(raw) if raw else None


def _tenant_status(client: redis.Redis, tenant: str) -> dict[str, Any]:
    counts = _record_counts(client, tenant)
    errors = {as_str(k): as_str(v) for k, v in client.hgetall(keys.manifest_errors(tenant)).items()}
    space = client.get(keys.space(tenant))
    building = {as_str(k): as_str(v) for k, v in client.hgetall(keys.reindex(tenant)).items()}
    if building:
        building["done"] = str(client.scard(keys.reindex_done(tenant, building["job"])))
    return {
        "index_version": int(client.get(keys.version(tenant)) or 0),
        "vector_space": as_str(space) if space else None,
        "reindex": building or None,
        "sources": dict(sorted(counts.sources.items())),
        "live_sessions": int(client.zcard(keys.sessions(tenant))),
        "capabilities": sum(counts.kinds.values()),
        "by_kind": dict(sorted(counts.kinds.items())),
        "manifest_errors": errors,
        # stored values that are no record (written by hand or damaged): never served
        "unreadable_records": counts.unreadable_ids,
        # capability id -> why the external vector store did not take its last change
        "store_unwritten": {
            as_str(k): as_str(v) for k, v in client.hgetall(keys.store_unwritten(tenant)).items()
        },
        # tasks of reconciler repairs (a task's worth of records each) waiting for the window
        "repair_backlog_tasks": int(client.llen(keys.repair_backlog(tenant))),
    }


def _record_counts(client: redis.Redis, tenant: str) -> record_counts.RecordCounts:
    """``tenant``'s records by kind and source: the counts kept beside them, or, where there
    are none yet or they name values that are no record (whose ids status lists), counted by
    reading every record."""
    kept = record_counts.kept(client, tenant)
    if kept is not None and not kept.unreadable:
        return kept
    return record_counts.read(client, tenant)


def poisoning_status(
    client: redis.Redis, tenant: str, default: flags.Policy = "warn"
) -> dict[str, Any]:
    """``tenant``'s policy (``policy_set``: its own, else ``default``), how many flags are in
    each state and, per flagged capability, its state, rule codes and where they fired (never
    the excerpts: ``capdisc flags list`` shows those to a reviewer)."""
    try:
        own = tenant_policy(client, tenant)
    except FlagError:  # written by hand: the workers serve it as quarantine
        own = "quarantine"
    return {
        "policy": own or default,
        "policy_set": own is not None,
        **flags.summary(read_flags(client, tenant)),
    }


def _queues(client: redis.Redis) -> dict[str, int]:
    pending = 0
    if client.exists(keys.DISCOVERY_REQUESTS):
        try:
            groups = client.xinfo_groups(keys.DISCOVERY_REQUESTS)
        except redis.ResponseError:
            groups = []
        pending = sum(int(g.get("pending", 0)) + int(g.get("lag") or 0) for g in groups)
    return {
        keys.INDEXING_QUEUE: int(client.llen(keys.INDEXING_QUEUE)),
        "discovery_requests": pending,
    }
