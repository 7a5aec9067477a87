"""The indexing queue's transport: kombu's Redis transport, refusing an entry that is no message
and waiting out a Redis that refuses writes.

kombu pops each entry of the indexing queue (a Redis list) and decodes it inside the worker's
event loop, where an entry that is not a kombu message (something other than a capdisc producer
wrote to the list) would take the worker down: kombu's own transport ends the worker on text
that is not JSON ("Unrecoverable error"), and drops the broker connection and restarts the
consumer on a JSON object without its ``properties``. :class:`Channel` checks each entry's
envelope before kombu delivers it and hands an entry that fails to the ``refuse_entry``
transport option (the worker logs it and keeps it in the dead letters), then reads on. What is
inside a well-formed envelope (an unknown task, a body Celery cannot decode, an event capdisc
refuses) is left to Celery and the tasks, which already refuse it without stopping.

Celery selects this transport by ``broker_transport``
(:func:`capdisc_workers.celery_app.create_app`) under the name :data:`TRANSPORT` (how the
worker's log names its broker); ``redis://`` and ``rediss://`` URLs mean the same with it as
with kombu's own.
"""

from __future__ import annotations

import binascii
import json
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

import redis
import structlog
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual as kombu_virtual
from kombu.utils import json as kombu_json

from capdisc.redisclock import RedisClock
from capdisc.redisrefusal import advice, refuses_writes

#: The transport option naming what to call with a refused entry: ``(queue, entry, reason)``.
REFUSE_OPTION = "refuse_entry"
#: The name Celery finds :class:`Transport` by (its ``broker_transport`` setting).
TRANSPORT = "capdisc-redis"

Refuse = Callable[[str, str, str], None]
#: First wait before delivering a held message again, and its cap.
WAIT_FIRST_S = 0.1
WAIT_CAP_S = 2.0

log = structlog.get_logger("capdisc.indexing")
#: Redis's clock, as this worker process reads it.
CLOCK = RedisClock()
virtual_qos_append: Callable[..., None] = kombu_virtual.QoS.append
kombu_dumps: Callable[..., str] = kombu_json.dumps


class MalformedEntry(ValueError):
    """A queue entry that is not a kombu message; the message names the field."""


def checked_message(text: str) -> dict[str, Any]:
    """The kombu message ``text`` holds, its envelope checked as kombu will read it; raises
    :class:`MalformedEntry` naming what is wrong."""
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise MalformedEntry(f"not JSON ({exc})") from exc
    except RecursionError as exc:  # not a ValueError: it would end the worker
        raise MalformedEntry("nested too deeply to read") from exc
    if not isinstance(payload, dict):
        raise MalformedEntry("not a JSON object")
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        raise MalformedEntry("field 'properties': missing or not an object")
    if not isinstance(properties.get("delivery_tag"), str):
        raise MalformedEntry("field 'properties.delivery_tag': missing or not a string")
    _check_delivery_info(properties.get("delivery_info"))
    if not isinstance(payload.get("headers", {}), dict):
        raise MalformedEntry("field 'headers': not an object")
    _check_body(payload.get("body"), properties.get("body_encoding"))
    return payload


def _check_delivery_info(info: Any) -> None:
    if not isinstance(info, dict) or not all(
        isinstance(info.get(name), str) for name in ("exchange", "routing_key")
    ):
        raise MalformedEntry(
            "field 'properties.delivery_info': needs 'exchange' and 'routing_key' strings"
        )


def _check_body(body: Any, encoding: Any) -> None:
    if not body:
        return
    if not isinstance(body, str):
        raise MalformedEntry("field 'body': not a string")
    if encoding == "base64":
        try:
            binascii.a2b_base64(body.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise MalformedEntry(f"field 'body': not base64 ({exc})") from exc


def when_writable(call: Callable[[], None], what: str) -> None:
    """``call()``, again with backoff while Redis refuses its writes (full, cannot save) instead
    of ending the worker: kombu's delivery bookkeeping (recording a message delivered,
    acknowledging or rejecting it) is idempotent, and a message held here was already taken
    off the queue (were the worker killed meanwhile, the outbox sweep sends its task again)."""
    wait_s, said = WAIT_FIRST_S, False
    while True:
        try:
            call()
        except redis.RedisError as exc:
            if not refuses_writes(exc):
                raise
            if not said:
                said = True
                log.warning(
                    "queue_bookkeeping_held",
                    step=what,
                    error=str(exc),
                    hint=advice(exc) + "; the worker goes on once Redis takes writes",
                )
            time.sleep(wait_s)
            wait_s = min(WAIT_CAP_S, wait_s * 2)
            continue
        if said:
            log.warning("queue_bookkeeping_resumed", step=what)
        return


class QoS(kombu_redis.QoS):
    """kombu's record of delivered messages, waiting out a Redis that refuses writes, with
    each delivery timed on Redis's clock (the sweep compares it with workers' heartbeats,
    which are on that clock too: :mod:`capdisc.redisclock`)."""

    def append(self, message: Any, delivery_tag: str) -> None:
        when_writable(lambda: self._record(message, delivery_tag), "deliver")

    def _record(self, message: Any, delivery_tag: str) -> None:
        """kombu's ``append``, with the delivery's time read from :data:`CLOCK`."""
        delivery = message.delivery_info
        raw = kombu_dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        delivered_s = CLOCK.now_ms(self.channel.client) / 1000
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: delivered_s}).hset(
                self.unacked_key, delivery_tag, raw
            ).execute()
            virtual_qos_append(self, message, delivery_tag)

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        """kombu's ``restore_visible`` (put back on the queue the deliveries held longer than
        the visibility timeout), with "longer" measured on Redis's clock, as the deliveries
        were recorded: a host whose clock runs ahead would otherwise take every delivery a
        live worker holds for a lost one and deliver it again."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        restore: Callable[..., None] = self.restore_by_tag
        with self.channel.conn_or_acquire() as client:
            ceil = CLOCK.now_ms(client) / 1000 - self.visibility_timeout
            try:
                with kombu_redis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    visible = client.zrange(
                        self.unacked_index_key,
                        ceil,
                        0,
                        desc=True,
                        byscore=True,
                        offset=num and start,
                        num=num,
                        withscores=True,
                    )
                    for tag, _score in visible or []:
                        restore(tag, client)
            except kombu_redis.MutexHeld:
                pass

    def ack(self, delivery_tag: str) -> None:
        base: Callable[..., None] = super().ack
        when_writable(lambda: base(delivery_tag), "acknowledge")

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        base: Callable[..., None] = super().reject
        when_writable(lambda: base(delivery_tag, requeue), "reject")


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, with each popped entry's envelope checked before delivery and
    its delivery bookkeeping waiting out a Redis that refuses writes (:class:`QoS`)."""

    QoS = QoS

    def _brpop_read(self, **options: Any) -> bool:
        try:
            try:
                dest_item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # as kombu does: disconnect so that the next read reconnects
                self.client.connection.disconnect()
                raise
            if not dest_item:
                raise Empty()
            dest, item = dest_item
            dest = _text(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            self._deliver_or_refuse(dest, _text(item))
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu's "no read in flight"
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _deliver_or_refuse(self, queue: str, text: str) -> None:
        try:
            message = checked_message(text)
        except MalformedEntry as exc:
            refuse: Refuse | None = self.connection.client.transport_options.get(REFUSE_OPTION)
            if refuse is not None:
                refuse(queue, text, str(exc))
            return
        self.connection._deliver(message, queue)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


TRANSPORT_ALIASES.setdefault(TRANSPORT, f"{__name__}:Transport")
