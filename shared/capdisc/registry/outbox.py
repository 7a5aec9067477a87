"""The outbox: every indexing task is recorded before it is sent and forgotten once it is done,
so a task the broker lost can be sent again.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacknowledged; a
worker killed between the two loses the message for good (celery #7950, kombu #305: reproduced by
``benchmarks/reliability.py --kill-when between-tasks``). Applying events is idempotent, so the
reconciler re-sends every recorded task that has been pending longer than a grace period and is
neither queued nor delivered: at worst a task runs twice, never zero times.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from capdisc import keys
from capdisc.errors import EventDecodeError
from capdisc.redisclock import redis_now_ms
from capdisc.redistext import as_str
from capdisc.registry.events import RegistryEvent


class TaskSender(Protocol):
    """What sends a task (a Celery app's ``send_task``)."""

    def send_task(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any: ...


@dataclass(frozen=True)
class Pending:
    """One recorded task."""

    task_id: str
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    sent_at_ms: int
    #: When the task was first sent (a re-send keeps it): how long it has gone untaken.
    first_sent_at_ms: int = 0

    def untaken_s(self, now_ms: int) -> float:
        """Seconds since the task was first sent."""
        return (now_ms - (self.first_sent_at_ms or self.sent_at_ms)) / 1000


def send(
    client: redis.Redis,
    app: TaskSender,
    name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    task_id: str | None = None,
    first_sent_at_ms: int | None = None,
) -> str:
    """Record the task in the outbox, then send it to the indexing queue; returns its id.
    ``first_sent_at_ms``: when a task sent again was first sent (default: now)."""
    task_id = task_id or uuid.uuid4().hex
    now_ms = redis_now_ms(client)
    record(client, task_id, name, args, kwargs, now_ms, first_sent_at_ms)
    publish(app, task_id, name, args, kwargs)
    return task_id


def record(
    client: Any,
    task_id: str,
    name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    now_ms: int = 0,
    first_sent_at_ms: int | None = None,
) -> None:
    """Write the task's outbox entry, on a client or queued on a transaction's pipeline (what
    the transaction writes then comes with the task that continues it: should its sender die
    before :func:`publish`, the sweep sends it)."""
    entry = {
        "name": name,
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "sent_at_ms": now_ms,
        "first_sent_at_ms": first_sent_at_ms or now_ms,
    }
    client.hset(keys.OUTBOX, task_id, json.dumps(entry))


def publish(
    app: TaskSender,
    task_id: str,
    name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> None:
    """Send a task :func:`record` wrote to the indexing queue."""
    app.send_task(
        name,
        args=list(args),
        kwargs=dict(kwargs or {}),
        task_id=task_id,
        queue=keys.INDEXING_QUEUE,
        ignore_result=True,
    )


def pending_events(client: redis.Redis, tenant: str) -> list[RegistryEvent]:
    """The registry events for ``tenant`` in the tasks recorded here: sent, and not yet applied
    (a task leaves once it finished). A payload that is no event is left out: the workers
    dead-letter it."""
    return [event for event in _waiting_events(client, tenant) if event.tenant == tenant]


def waiting_ids(client: redis.Redis) -> dict[str, set[str]]:
    """Tenant -> the capability ids that registry events in the tasks recorded here will
    change (sent, not yet applied), read in one pass over the outbox."""
    found: dict[str, set[str]] = {}
    for event in _waiting_events(client):
        found.setdefault(event.tenant, set()).add(event.capability_id)
    return found


def _waiting_events(client: redis.Redis, tenant: str | None = None) -> Iterator[RegistryEvent]:
    """The registry events in the tasks recorded here; with ``tenant``, those whose text names
    it (cheaply, without parsing the others: the caller checks the tenant)."""
    marker = f'"tenant":{json.dumps(tenant, ensure_ascii=False)}' if tenant is not None else ""
    quoted = json.dumps(marker)[1:-1].encode()  # as the task record's JSON holds the payload
    for value in client.hvals(keys.OUTBOX):
        if quoted not in (value if isinstance(value, bytes) else value.encode()):
            continue  # no event of the tenant, without parsing the task
        pending = _pending(b"", value)
        for payload in _payloads(pending) if pending is not None else ():
            if marker not in payload:  # most payloads, cheaply: another tenant's
                continue
            try:
                yield RegistryEvent.decode(payload)
            except EventDecodeError:
                continue


def _payloads(pending: Pending) -> list[str]:
    """The encoded events an apply task carries."""
    args = pending.args
    if pending.name == keys.TASK_APPLY_EVENTS and args and isinstance(args[0], list):
        return [p for p in args[0] if isinstance(p, str)]
    if pending.name == keys.TASK_APPLY_EVENT and args and isinstance(args[0], str):
        return [args[0]]
    return []


def done(client: redis.Redis, task_id: str) -> bool:
    """Forget a task that finished (succeeded, failed for good or dead-lettered); whether this
    call forgot it (False: forgotten before, by an earlier delivery of the same task, or never
    recorded)."""
    return bool(client.hdel(keys.OUTBOX, task_id))


def lost(
    client: redis.Redis,
    grace_s: float,
    now_ms: int | None = None,
    on_unreadable: Callable[[str], None] = lambda _task_id: None,
) -> list[Pending]:
    """Recorded tasks older than ``grace_s`` that are neither queued nor delivered. An entry
    that is no task record (written by hand or damaged: it can be neither sent again nor
    finished) is deleted, and its task id given to ``on_unreadable``.

    The broker is read before the outbox: a task leaves the outbox (:func:`done`) before its
    delivery is acknowledged, so one that finishes between the two reads is gone from the
    outbox read second. Read the other way round, every task that finished meanwhile looked
    lost (on a busy queue, hundreds a minute) and ran again."""
    now_ms = now_ms if now_ms is not None else redis_now_ms(client)
    present = broker_task_ids(client)
    recorded, unreadable = [], []
    for key, value in client.hgetall(keys.OUTBOX).items():
        pending = _pending(key, value)
        if pending is None:
            unreadable.append(as_str(key))
        else:
            recorded.append(pending)
    if unreadable:
        client.hdel(keys.OUTBOX, *unreadable)
    for task_id in unreadable:
        on_unreadable(task_id)
    return [
        p for p in recorded if now_ms - p.sent_at_ms >= grace_s * 1000 and p.task_id not in present
    ]


def resend(client: redis.Redis, app: TaskSender, pending: Pending) -> None:
    """Send a lost task again, under the same id."""
    first_ms = pending.first_sent_at_ms or pending.sent_at_ms
    send(client, app, pending.name, pending.args, pending.kwargs, pending.task_id, first_ms)


def broker_task_ids(client: redis.Redis) -> set[str]:
    """Ids of the tasks in the indexing queue or delivered and not yet acknowledged (kombu's
    message layout: ``headers.id``; an unacked entry is ``[message, exchange, routing key]``)."""
    with client.pipeline(transaction=True) as pipe:  # one moment: none moves between them
        pipe.lrange(keys.INDEXING_QUEUE, 0, -1)
        pipe.hvals(keys.KOMBU_UNACKED)
        queued, delivered = pipe.execute()
    return {_task_id(_json(raw)) for raw in queued} | {_task_id(_message(raw)) for raw in delivered}


def _json(raw: Any) -> Any:
    """``raw`` parsed; None for what is no JSON (another app's entry in the queue)."""
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None


def _task_id(message: Any) -> str:
    try:
        return str(message["headers"]["id"])
    except (KeyError, TypeError):
        return ""


def _pending(key: Any, value: Any) -> Pending | None:
    """The recorded task; None for a value that is no task record."""
    data = _json(value)
    if not isinstance(data, dict) or not isinstance(data.get("args"), list):
        return None
    if not isinstance(data.get("kwargs"), dict):
        return None
    try:
        return Pending(
            as_str(key),
            str(data["name"]),
            data["args"],
            data["kwargs"],
            int(data["sent_at_ms"]),
            int(data.get("first_sent_at_ms") or 0),
        )
    except (KeyError, TypeError, ValueError):
        return None


# -- deliveries whose worker is gone ------------------------------------------------------------
#
# A task delivered to a worker sits in kombu's ``unacked`` hash (and ``unacked_index``, scored by
# the delivery time) until the worker acknowledges it. kombu gives it back to the queue only once
# the visibility timeout (an hour by default) has passed. A worker that was SIGKILLed, or that
# lost its connection while it held the task (a Redis restart: the acknowledgement then goes
# nowhere), never acknowledges it, so the task would wait that hour. Instead, every live indexing
# worker lists in its heartbeat the tasks it holds; a delivery older than a grace period that no
# live worker holds is an orphan, and the sweep puts its message back at the head of the queue.
# Applying events is idempotent and ordered by sequence, so a task that runs twice changes nothing
# the second time.


@dataclass(frozen=True)
class Delivery:
    """One delivered, unacknowledged task as kombu records it."""

    tag: str
    task_id: str
    delivered_at_ms: int


@dataclass(frozen=True)
class Holder:
    """What an indexing worker's last heartbeat said: when, and which tasks it holds (``None``:
    a worker that does not say, which may hold any)."""

    worker_id: str
    seen_ms: int
    tasks: frozenset[str] | None


def holders(heartbeats: Iterable[Mapping[str, Any]]) -> list[Holder]:
    """The indexing workers among heartbeats (``capdisc:workers`` entries), live or not."""
    return [
        Holder(
            str(h.get("id", "")),
            int(h.get("last_seen_ms", 0)),
            frozenset(str(t) for t in h["tasks"]) if "tasks" in h else None,
        )
        for h in heartbeats
        if h.get("kind") == "indexing"
    ]


def orphans(
    deliveries: Sequence[Delivery],
    workers: Sequence[Holder],
    now_ms: int,
    grace_s: float,
    stale_after_s: float,
) -> list[Delivery]:
    """Deliveries older than ``grace_s`` that no live worker holds (a worker is live when its
    heartbeat is at most ``stale_after_s`` old), and that every live worker has reported on
    since (a heartbeat after the delivery): a task just received may not be listed yet."""
    live = [w for w in workers if now_ms - w.seen_ms <= stale_after_s * 1000]
    return [
        d
        for d in deliveries
        if now_ms - d.delivered_at_ms >= grace_s * 1000
        and not any(w.tasks is None or d.task_id in w.tasks for w in live)
        and all(w.seen_ms > d.delivered_at_ms for w in live)
    ]


def deliveries(client: redis.Redis) -> list[Delivery]:
    """Every delivered, unacknowledged task (kombu's ``unacked`` hash and its index)."""
    entries = client.hgetall(keys.KOMBU_UNACKED)
    if not entries:
        return []
    tags = [as_str(tag) for tag in entries]
    scores = client.zmscore(keys.KOMBU_UNACKED_INDEX, tags)
    return [
        Delivery(tag, _task_id(_message(raw)), int((score or 0) * 1000))
        for tag, raw, score in zip(tags, entries.values(), scores, strict=True)
    ]


def restore(client: redis.Redis, delivery: Delivery) -> bool:
    """Put an orphaned delivery's message back at the head of its queue, once (a worker that
    acknowledges it meanwhile wins); whether it was restored."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.KOMBU_UNACKED)  # type: ignore[no-untyped-call]
            raw = pipe.hget(keys.KOMBU_UNACKED, delivery.tag)
            if raw is None:
                return False
            payload, _exchange, routing_key = json.loads(raw)
            payload.setdefault("headers", {})["redelivered"] = True
            payload.get("properties", {}).get("delivery_info", {})["redelivered"] = True
            pipe.multi()
            pipe.hdel(keys.KOMBU_UNACKED, delivery.tag)
            pipe.zrem(keys.KOMBU_UNACKED_INDEX, delivery.tag)
            pipe.rpush(routing_key or keys.INDEXING_QUEUE, json.dumps(payload))
            pipe.execute()
        except redis.WatchError:  # acknowledged (or restored by another sweep) meanwhile
            return False
    return True


def _message(raw: Any) -> Any:
    try:
        return json.loads(raw)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
