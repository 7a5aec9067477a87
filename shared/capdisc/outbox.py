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
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from capdisc import keys


class TaskSender(Protocol):
    """What sends a task (a Celery app's ``send_task``)."""

    def send_task(self, name: str, args: Sequence[Any] | None = None,
                  kwargs: Mapping[str, Any] | None = None, **options: Any) -> Any: ...


@dataclass(frozen=True)
class Pending:
    """One recorded task."""

    task_id: str
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    sent_at_ms: int


def send(client: redis.Redis, app: TaskSender, name: str, args: Sequence[Any] = (),
         kwargs: Mapping[str, Any] | None = None, task_id: str | None = None) -> str:
    """Record the task in the outbox, then send it to the indexing queue; returns its id."""
    task_id = task_id or uuid.uuid4().hex
    entry = {"name": name, "args": list(args), "kwargs": dict(kwargs or {}),
             "sent_at_ms": int(time.time() * 1000)}
    client.hset(keys.OUTBOX, task_id, json.dumps(entry))
    app.send_task(name, args=list(args), kwargs=dict(kwargs or {}), task_id=task_id,
                  queue=keys.INDEXING_QUEUE, ignore_result=True)
    return task_id


def done(client: redis.Redis, task_id: str) -> None:
    """Forget a task that finished (succeeded, failed for good or dead-lettered)."""
    client.hdel(keys.OUTBOX, task_id)


def lost(client: redis.Redis, grace_s: float, now_ms: int | None = None) -> list[Pending]:
    """Recorded tasks older than ``grace_s`` that are neither queued nor delivered."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    recorded = [_pending(k, v) for k, v in client.hgetall(keys.OUTBOX).items()]
    old = [p for p in recorded if now_ms - p.sent_at_ms >= grace_s * 1000]
    if not old:
        return []
    present = broker_task_ids(client)
    return [p for p in old if p.task_id not in present]


def resend(client: redis.Redis, app: TaskSender, pending: Pending) -> None:
    """Send a lost task again, under the same id."""
    send(client, app, pending.name, pending.args, pending.kwargs, pending.task_id)


def broker_task_ids(client: redis.Redis) -> set[str]:
    """Ids of the tasks in the indexing queue or delivered and not yet acknowledged (kombu's
    message layout: ``headers.id``; an unacked entry is ``[message, exchange, routing key]``)."""
    ids = set()
    for raw in client.lrange(keys.INDEXING_QUEUE, 0, -1):
        ids.add(_task_id(json.loads(raw)))
    for raw in client.hvals(keys.KOMBU_UNACKED):
        ids.add(_task_id(json.loads(raw)[0]))
    return ids


def _task_id(message: Any) -> str:
    try:
        return str(message["headers"]["id"])
    except (KeyError, TypeError):
        return ""


def _pending(key: Any, value: Any) -> Pending:
    data = json.loads(value)
    task_id = key.decode() if isinstance(key, bytes) else str(key)
    return Pending(task_id, data["name"], data["args"], data["kwargs"], int(data["sent_at_ms"]))
