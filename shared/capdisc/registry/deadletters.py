"""The dead-letter stream: events the indexing workers could not apply, with the reason.

An event lands here (:func:`dead_letter`) when it cannot be decoded, carries an invalid
capability, or its embedding still fails after ``indexing_max_attempts`` deliveries.
``capdisc dlq list`` shows them (:func:`list_dead_letters`); ``capdisc dlq replay`` sends them to
the indexing queue again (after the cause is fixed: a provider back up, a worker with a new
model) and removes them from the stream (:func:`replay_each`, one outcome per id);
``capdisc dlq drop`` removes them unsent (:func:`drop`, :func:`drop_all`).

Discovery workers put here the request stream entries they cannot answer: unreadable ones (no
usable request id to reply to) and quarantined ones (delivered again and again, never
answered). Their ``source`` is the requests stream. They are kept for inspection and are never
replayed: they are not registry events, their clients stopped waiting long ago, and a
quarantined one would only take a worker down again.

The stream is bounded twice, oldest first: by entries (:data:`~capdisc.keys.DEADLETTERS_MAXLEN`)
and by the bytes its entries' fields hold (``deadletters_max_bytes``), so a burst of large bad
events cannot fill Redis's memory. The bytes held and the letters the budget dropped are kept
in :data:`~capdisc.keys.DEADLETTERS_BUDGET` by Lua scripts that add and remove entries and count
in one step (:func:`budget` reads them).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from capdisc import keys
from capdisc.redact import redact_tokens
from capdisc.redistext import as_str

#: The most of a payload a dead letter keeps, in UTF-8 bytes, unless told otherwise (the
#: ``deadletter_payload_max_bytes`` setting); a longer one is cut short and cannot be replayed.
MAX_PAYLOAD_BYTES = 1024 * 1024
#: The most bytes the dead letters' fields hold together, unless told otherwise (the
#: ``deadletters_max_bytes`` setting); past it the oldest go.
MAX_TOTAL_BYTES = 256 * 1024 * 1024
#: What a dead letter's id looks like (its stream entry id): ``1700000000000-0``.
ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
#: How many dead letters are read or removed per Redis call.
PAGE = 1000

#: The outcome of each id named to :func:`replay_each` and :func:`drop`.
REPLAYED = "replayed"
DROPPED = "dropped"
NOT_FOUND = "not found"
REFUSED_REQUEST = "refused: a discovery request"
REFUSED_TASK = "refused: an indexing task given up"
REFUSED_TRUNCATED = "refused: payload cut short"


#: Adds one entry and drops the oldest while the stream holds more entries or bytes than allowed
#: (the newest is always kept). An entry's size is its field names' and values' bytes. The
#: first add after an upgrade counts what the stream already holds.
_SIZE_OF = """
local function size_of(fields)
  local n = 0
  for i = 1, #fields do n = n + #fields[i] end
  return n
end
"""
_ADD = (
    _SIZE_OF
    + """
local stream, budget = KEYS[1], KEYS[2]
local max_entries, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('HEXISTS', budget, 'bytes') == 0 then
  local held, start = 0, '-'
  while true do
    local page = redis.call('XRANGE', stream, start, '+', 'COUNT', 100)
    for _, entry in ipairs(page) do held = held + size_of(entry[2]) end
    if #page < 100 then break end
    start = '(' .. page[#page][1]
  end
  redis.call('HSET', budget, 'bytes', held)
end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = redis.call('XADD', stream, '*', unpack(fields))
local total = redis.call('HINCRBY', budget, 'bytes', size_of(fields))
local count = redis.call('XLEN', stream)
local dropped = 0
while count > 1 and (count > max_entries or total > max_bytes) do
  local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
  redis.call('XDEL', stream, oldest[1])
  total = redis.call('HINCRBY', budget, 'bytes', -size_of(oldest[2]))
  count = count - 1
  dropped = dropped + 1
end
if count <= 1 then
  redis.call('HSET', budget, 'bytes', size_of(fields))
end
if dropped > 0 then
  redis.call('HINCRBY', budget, 'dropped', dropped)
end
return id
"""
)
#: Removes the entries named (full ids) and takes their bytes off the count; per id, 1 when
#: it was there.
_REMOVE = (
    _SIZE_OF
    + """
local stream, budget = KEYS[1], KEYS[2]
local removed = {}
for i = 1, #ARGV do
  local entry = redis.call('XRANGE', stream, ARGV[i], ARGV[i])[1]
  removed[i] = 0
  if entry then
    redis.call('XDEL', stream, ARGV[i])
    redis.call('HINCRBY', budget, 'bytes', -size_of(entry[2]))
    removed[i] = 1
  end
end
if redis.call('XLEN', stream) == 0 then
  redis.call('HSET', budget, 'bytes', 0)
end
return removed
"""
)


@dataclass(frozen=True)
class Budget:
    """What the dead letters hold against their byte budget."""

    #: The bytes of the fields of the dead letters there are now.
    held_bytes: int
    #: How many dead letters were dropped, oldest first, to stay within the budget or the
    #: entry cap, since the stream began.
    dropped: int


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered event, as stored, with what could be read of it."""

    entry_id: str
    reason: str
    attempts: int
    at_ms: int
    payload: str
    #: Where it came from: the indexing queue, the discovery requests stream, or the outbox (a
    #: task no indexing worker took, given up).
    source: str = keys.INDEXING_QUEUE
    #: A discovery request's id, when it had a usable one.
    request_id: str | None = None
    #: The payload's size in UTF-8 bytes when it was longer than a dead letter keeps (only
    #: its start is kept, and it cannot be replayed); None when it is whole.
    truncated_from_bytes: int | None = None

    @property
    def is_discovery_request(self) -> bool:
        return self.source == keys.DISCOVERY_REQUESTS

    @property
    def event(self) -> dict[str, Any]:
        """The event's fields when the payload is JSON, else empty."""
        try:
            decoded = json.loads(self.payload)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
            return {}
        return decoded if isinstance(decoded, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        event = self.event
        if self.is_discovery_request:
            event = {}
        return {
            "id": self.entry_id,
            "reason": self.reason,
            "attempts": self.attempts,
            "at_ms": self.at_ms,
            "source": self.source,
            "request_id": self.request_id,
            "event_id": event.get("event_id"),
            "tenant": event.get("tenant"),
            "capability_id": event.get("capability_id"),
            "type": event.get("type"),
            "truncated_from_bytes": self.truncated_from_bytes,
        }


def dead_letter(
    client: redis.Redis,
    payload: str | bytes,
    reason: str,
    attempts: int = 1,
    max_bytes: int = MAX_PAYLOAD_BYTES,
    budget_bytes: int = MAX_TOTAL_BYTES,
    **context: str,
) -> None:
    """Keep an event that could not be applied, with the reason, for ``capdisc dlq``.
    ``context`` adds fields: a discovery request's ``source`` (the requests stream),
    ``entry_id`` and ``request_id``. ``client`` is a Redis client or a pipeline.
    An identity token in the payload is not kept (a replay carries the replayer's). A payload
    longer than ``max_bytes`` (UTF-8) keeps only its start, marked with its whole size
    (``truncated_from_bytes``): a few huge events must not hold Redis's memory. The oldest
    dead letters go while all of them hold more than ``budget_bytes`` (the newest stays)."""
    text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
    text = redact_tokens(text)
    fields: dict[Any, Any] = {
        "payload": text,
        "reason": reason,
        "attempts": attempts,
        "at_ms": int(time.time() * 1000),
    }
    encoded = text.encode("utf-8", errors="replace")
    if len(encoded) > max_bytes:
        fields["payload"] = encoded[:max_bytes].decode("utf-8", errors="ignore")
        fields["truncated_from_bytes"] = len(encoded)
    fields.update(context)
    pairs = [str(part) for item in fields.items() for part in item]
    client.register_script(_ADD)(
        keys=[keys.DEADLETTERS, keys.DEADLETTERS_BUDGET],
        args=[keys.DEADLETTERS_MAXLEN, budget_bytes, *pairs],
    )


def budget(client: redis.Redis) -> Budget:
    """The bytes the dead letters hold and how many the bounds dropped."""
    held, dropped = client.hmget(keys.DEADLETTERS_BUDGET, ["bytes", "dropped"])
    return Budget(held_bytes=int(held or 0), dropped=int(dropped or 0))


def _remove(client: redis.Redis, entry_ids: Sequence[str]) -> list[bool]:
    """Remove the named dead letters (full entry ids), their bytes taken off the count; per
    id, whether it was there."""
    removed: Any = client.register_script(_REMOVE)(
        keys=[keys.DEADLETTERS, keys.DEADLETTERS_BUDGET], args=list(entry_ids)
    )
    return [bool(flag) for flag in removed]


def list_dead_letters(client: redis.Redis, limit: int = 100) -> list[DeadLetter]:
    """The oldest ``limit`` dead letters."""
    entries: Any = client.xrange(keys.DEADLETTERS, count=limit)
    return [_dead_letter(entry_id, fields) for entry_id, fields in entries]


def read_dead_letter(client: redis.Redis, entry_id: str) -> DeadLetter | None:
    """The dead letter with id ``entry_id``; None when there is none (or the text is no id)."""
    if not ENTRY_ID.fullmatch(entry_id):
        return None
    entries: Any = client.xrange(keys.DEADLETTERS, min=entry_id, max=entry_id, count=1)
    return _dead_letter(*entries[0]) if entries else None


def replay(
    client: redis.Redis, send: Callable[[str], None], entry_ids: Sequence[str] | None = None
) -> list[str]:
    """Send the given dead letters (all when ``entry_ids`` is None) to the indexing queue again
    and remove each from the stream once sent; returns the replayed entry ids. Unknown ids and
    discovery requests (never replayed) are skipped."""
    outcomes = replay_each(client, send, entry_ids)
    return [entry_id for entry_id, outcome in outcomes.items() if outcome == REPLAYED]


def replay_each(
    client: redis.Redis, send: Callable[[str], None], entry_ids: Sequence[str] | None = None
) -> dict[str, str]:
    """Send the given dead letters (every one there is now when ``entry_ids`` is None) to the
    indexing queue again, each removed from the stream once sent, and say per id what became
    of it: :data:`REPLAYED`, :data:`NOT_FOUND`, or :data:`REFUSED_REQUEST` for a discovery
    request and :data:`REFUSED_TASK` for an indexing task no worker took (source: the outbox),
    which are never sent and stay listed, and :data:`REFUSED_TRUNCATED` for one whose payload
    was cut short (sending its start would be sending another event). An event that fails
    again comes back with a new id; with ``entry_ids`` None it is not sent a second time."""
    letters = _every_letter(client) if entry_ids is None else _named_letters(client, entry_ids)
    outcomes: dict[str, str] = {}
    for entry_id, letter in letters:
        if letter is None:
            outcomes[entry_id] = NOT_FOUND
        elif letter.is_discovery_request:
            outcomes[entry_id] = REFUSED_REQUEST
        elif letter.source == keys.OUTBOX:
            outcomes[entry_id] = REFUSED_TASK
        elif letter.truncated_from_bytes is not None:
            outcomes[entry_id] = REFUSED_TRUNCATED
        else:
            send(letter.payload)
            outcomes[entry_id] = REPLAYED if _remove(client, [entry_id])[0] else NOT_FOUND
    return outcomes


def drop(client: redis.Redis, entry_ids: Sequence[str]) -> dict[str, str]:
    """Remove the given dead letters unsent, registry events and discovery requests alike; per
    id, :data:`DROPPED` or :data:`NOT_FOUND`."""
    wanted = list(dict.fromkeys(entry_ids))
    removed: set[str] = set()
    for start in range(0, len(wanted), PAGE):
        page = [i for i in wanted[start : start + PAGE] if ENTRY_ID.fullmatch(i)]
        flags = _remove(client, page) if page else []
        removed.update(i for i, flag in zip(page, flags, strict=True) if flag)
    return {i: DROPPED if i in removed else NOT_FOUND for i in wanted}


def drop_all(client: redis.Redis) -> dict[str, str]:
    """Remove every dead letter there is now (one added meanwhile stays); per id, what
    :func:`drop` says."""
    return drop(client, [entry_id for entry_id, _letter in _every_letter(client)])


def _named_letters(
    client: redis.Redis, entry_ids: Sequence[str]
) -> list[tuple[str, DeadLetter | None]]:
    return [(i, read_dead_letter(client, i)) for i in dict.fromkeys(entry_ids)]


def _every_letter(client: redis.Redis) -> list[tuple[str, DeadLetter | None]]:
    """Every dead letter up to the newest one now, oldest first, read a page at a time."""
    newest: Any = client.xrevrange(keys.DEADLETTERS, count=1)
    if not newest:
        return []
    last, start = as_str(newest[0][0]), "-"
    letters: list[tuple[str, DeadLetter | None]] = []
    while True:
        page: Any = client.xrange(keys.DEADLETTERS, min=start, max=last, count=PAGE)
        letters += [(as_str(i), _dead_letter(i, fields)) for i, fields in page]
        if len(page) < PAGE:
            return letters
        start = f"({letters[-1][0]}"


def with_token(payload: str, token: str | None) -> str:
    """A dead-lettered event's payload as it is replayed: carrying the replayer's identity
    token (dead letters keep none), or none. A payload that is not a JSON object is left as it
    is (the indexing worker dead-letters it again, with the reason)."""
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError):
        return payload
    if not isinstance(event, dict) or (not token and "token" not in event):
        return payload  # byte for byte
    event.pop("token", None)
    if token:
        event["token"] = token
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def _dead_letter(entry_id: Any, raw: Any) -> DeadLetter:
    """A dead letter as far as it can be read: one another program wrote to the stream (bytes
    that are not UTF-8, counts that are no numbers) is listed all the same, never a failure of
    the whole listing."""
    fields = {_readable(k): _readable(v) for k, v in raw.items()}
    attempts, at_ms = _count(fields.get("attempts")), _count(fields.get("at_ms"))
    return DeadLetter(
        entry_id=as_str(entry_id),
        reason=fields.get("reason", ""),
        attempts=1 if attempts is None else attempts,
        at_ms=at_ms or 0,
        payload=fields.get("payload", ""),
        source=fields.get("source", keys.INDEXING_QUEUE),
        request_id=fields.get("request_id") or None,
        truncated_from_bytes=_count(fields.get("truncated_from_bytes")),
    )


def _readable(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _count(text: str | None) -> int | None:
    """``text`` as a whole number (at most 18 digits); None when it is none."""
    if text and len(text) <= 18 and text.isascii() and text.isdigit():
        return int(text)
    return None
