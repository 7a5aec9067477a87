"""The discovery request stream as a worker reads it: the consumer group, new entries, entries
another worker left pending, quarantine, and settling what was read.

Every entry a worker reads ends one way, then is acknowledged and deleted, all in one
transaction per batch (:meth:`RequestStream.settle`): a reply (the answer, or an error that
names the problem: ``bad_request``, ``internal``, ``quarantined``), a dead letter (an entry
without a usable request id, or a quarantined one; ``source`` is the requests stream), or
nothing (its deadline passed: nobody waits). Decoding an entry is
:func:`capdisc.discovery.protocol.decode_entry`; answering it is the worker's.

Quarantine: an entry pending longer than ``claim_idle_ms`` is claimed and served again (its
worker died or hangs), unless it was already delivered :data:`MAX_DELIVERIES` times: then it
took down or hung every worker that read it, and it is dead-lettered instead (with an error
reply when its request id can be read, so its client stops sending it again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from capdisc import keys
from capdisc.discovery.protocol import peek_request_id
from capdisc.discovery.replies import ErrorReply, Reply
from capdisc.errors import BadRequestError, CapdiscError, QuarantinedError
from capdisc.redact import redact_tokens
from capdisc.redistext import as_str
from capdisc.registry.deadletters import MAX_PAYLOAD_BYTES, MAX_TOTAL_BYTES, dead_letter
from capdisc_workers.outage import RETRYABLE

log = structlog.get_logger("capdisc.discovery")

#: Deliveries after which an entry nobody answered is quarantined.
MAX_DELIVERIES = 3
#: Longest text kept of a dead-lettered request entry (for inspection; never replayed).
DEAD_LETTER_CHARS = 4096
#: Entries read or reclaimed at a time.
BATCH = 16

#: A raw stream entry: its id and fields, as Redis returns them.
RawEntry = tuple[Any, Mapping[Any, Any]]


@dataclass(frozen=True)
class Pending:
    """One entry pending in the consumer group, as XPENDING reports it."""

    entry_id: str
    times_delivered: int


def triage(
    pending: Sequence[Pending], max_deliveries: int = MAX_DELIVERIES
) -> tuple[list[str], list[str]]:
    """Entries pending past the claim idle time, split into those to quarantine (delivered
    ``max_deliveries`` times or more and never answered) and those to claim and serve."""
    quarantine = [p.entry_id for p in pending if p.times_delivered >= max_deliveries]
    claim = [p.entry_id for p in pending if p.times_delivered < max_deliveries]
    return quarantine, claim


@dataclass(frozen=True)
class Outcome:
    """How one entry is settled: a reply (JSON) to push for ``request_id``, a dead letter
    (``payload``, ``reason``, ``attempts``), or neither."""

    entry_id: str
    request_id: str | None = None
    reply: str | None = None
    dead_letter: tuple[str, str, int] | None = None


def answer_safely(request_id: str, answer: Callable[[], Reply], worker_id: str) -> str:
    """The JSON reply ``answer()`` makes; any unexpected exception (Redis being unreachable
    aside: the entry is then served again later) is logged with the request id and becomes an
    ``internal`` error reply, never the worker's end."""
    try:
        return json.dumps(answer().to_dict())
    except RETRYABLE:
        raise
    except Exception as exc:
        log.exception("request_failed_internally", request_id=request_id, worker=worker_id)
        return _error(
            request_id,
            CapdiscError.code,
            f"discovery worker {worker_id} failed while answering this request "
            f"({type(exc).__name__}); the error is logged there with request id "
            f"{request_id}",
        )


def _error(request_id: str, code: str, message: str) -> str:
    return json.dumps(ErrorReply(request_id, code, message).to_dict())


def rejected(
    entry_id: str, fields: Mapping[Any, Any], request_id: str | None, reason: str
) -> Outcome:
    """A malformed entry: an error reply naming the problem when it has a usable request id,
    else a dead letter."""
    if request_id:
        return Outcome(entry_id, request_id, _error(request_id, BadRequestError.code, reason))
    return Outcome(
        entry_id, dead_letter=(entry_text(fields), f"discovery request refused: {reason}", 1)
    )


def quarantined(entry_id: str, fields: Mapping[Any, Any], times_delivered: int) -> Outcome:
    """An entry delivered ``times_delivered`` times and never answered: dead-lettered, and its
    client told (when its request id can be read) so it stops sending it again."""
    reason = (
        f"discovery request quarantined: delivered {times_delivered} times and never "
        "answered (it crashed or hung every discovery worker that took it)"
    )
    request_id = peek_request_id(fields)
    reply = (
        _error(
            request_id,
            QuarantinedError.code,
            f"{reason}; it is kept in the dead-letter stream (capdisc dlq list)",
        )
        if request_id
        else None
    )
    return Outcome(entry_id, request_id, reply, (entry_text(fields), reason, times_delivered))


def entry_text(fields: Mapping[Any, Any]) -> str:
    """A readable, bounded rendering of an entry's fields (bytes that are not UTF-8 escaped,
    identity tokens redacted)."""

    def text(value: Any) -> str:
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "backslashreplace")

    rendered = json.dumps(
        {text(k): redact_tokens(text(v))[:DEAD_LETTER_CHARS] for k, v in fields.items()},
        ensure_ascii=False,
    )
    return rendered[:DEAD_LETTER_CHARS]


#: How Redis says a consumer group is gone: never created (or lost), or deleted with its stream
#: while a read waited on it.
LOST_GROUP = ("NOGROUP", "UNBLOCKED")


class RequestStream:
    """The requests stream seen by one consumer (worker) of the discovery group."""

    def __init__(
        self,
        connection: redis.Redis,
        consumer: str,
        claim_idle_ms: int,
        reply_ttl_s: int,
        deadletter_max_bytes: int = MAX_PAYLOAD_BYTES,
        deadletters_budget_bytes: int = MAX_TOTAL_BYTES,
    ) -> None:
        self.redis = connection
        self.deadletter_max_bytes = deadletter_max_bytes
        self.deadletters_budget_bytes = deadletters_budget_bytes
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms
        self.reply_ttl_s = reply_ttl_s
        self._group_ready = False

    def read(self, block_ms: int) -> list[RawEntry]:
        """New entries for this consumer (waiting up to ``block_ms``)."""
        self._ensure_group()
        try:
            batch: Any = self.redis.xreadgroup(
                keys.DISCOVERY_GROUP,
                self.consumer,
                {keys.DISCOVERY_REQUESTS: ">"},
                count=BATCH,
                block=block_ms,
            )
        except redis.ResponseError as exc:
            self._lost_group(exc)
            return []
        return [
            (entry_id, fields) for _stream, entries in batch or [] for entry_id, fields in entries
        ]

    def reclaim(self) -> tuple[list[tuple[RawEntry, int]], list[RawEntry]]:
        """Entries pending longer than ``claim_idle_ms``, claimed by this consumer: those to
        quarantine (with how often they were delivered) and those to serve again."""
        self._ensure_group()
        try:
            pending = [
                Pending(as_str(p["message_id"]), int(p["times_delivered"]))
                for p in self.redis.xpending_range(
                    keys.DISCOVERY_REQUESTS,
                    keys.DISCOVERY_GROUP,
                    min="-",
                    max="+",
                    count=BATCH,
                    idle=self.claim_idle_ms,
                )
            ]
            to_quarantine, to_claim = triage(pending)
            delivered = {p.entry_id: p.times_delivered for p in pending}
            quarantine = [(e, delivered[as_str(e[0])]) for e in self._claim(to_quarantine)]
            return quarantine, self._claim(to_claim)
        except redis.ResponseError as exc:
            self._lost_group(exc)
            return [], []

    def _claim(self, entry_ids: list[str]) -> list[RawEntry]:
        """Take ``entry_ids`` over, those still idle only (another worker may have just
        claimed one); entries deleted meanwhile do not come back (Redis drops them)."""
        if not entry_ids:
            return []
        ids: list[Any] = list(entry_ids)
        claimed: Any = self.redis.xclaim(
            keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP, self.consumer, self.claim_idle_ms, ids
        )
        return [e for e in claimed if e and e[1]]

    def settle(self, outcomes: Sequence[Outcome]) -> None:
        """Push every reply, write every dead letter, acknowledge and delete every entry: one
        transaction, so an outage loses nothing (it raises; the caller settles again)."""
        if not outcomes:
            return
        ids = [o.entry_id for o in outcomes]
        with self.redis.pipeline(transaction=True) as pipe:
            for outcome in outcomes:
                self._queue(pipe, outcome)
            pipe.xack(keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP, *ids)
            pipe.xdel(keys.DISCOVERY_REQUESTS, *ids)
            results = pipe.execute(raise_on_error=False)
        errors = [str(r) for r in results if isinstance(r, Exception)]
        if errors:
            log.error("requests_settle_failed", entries=len(ids), errors=errors[:3])

    def _queue(self, pipe: Any, outcome: Outcome) -> None:
        if outcome.reply is not None and outcome.request_id:
            pipe.rpush(keys.reply(outcome.request_id), outcome.reply)
            pipe.expire(keys.reply(outcome.request_id), self.reply_ttl_s)
        if outcome.dead_letter is not None:
            payload, reason, attempts = outcome.dead_letter
            context = {"source": keys.DISCOVERY_REQUESTS, "entry_id": outcome.entry_id}
            if outcome.request_id:
                context["request_id"] = outcome.request_id
            dead_letter(
                pipe,
                payload,
                reason,
                attempts,
                self.deadletter_max_bytes,
                self.deadletters_budget_bytes,
                **context,
            )

    def _ensure_group(self) -> None:
        """The consumer group, created (from the stream's start: a request sent before any
        worker started is still answered) when missing: at the first read, and again when Redis
        lost it (restarted without its data)."""
        if self._group_ready:
            return
        try:
            self.redis.xgroup_create(
                keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP, id="0", mkstream=True
            )
            log.info("request_group_created", stream=keys.DISCOVERY_REQUESTS)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _lost_group(self, exc: redis.ResponseError) -> None:
        """Re-create the group at the next read when Redis lost it: ``NOGROUP``, or
        ``UNBLOCKED`` (the stream was deleted, as by a ``FLUSHALL``, under a blocked read)."""
        if not any(code in str(exc) for code in LOST_GROUP):
            raise exc
        log.warning(
            "request_group_missing",
            hint="Redis lost the consumer group (restarted without its data?); creating it again",
        )
        self._group_ready = False
