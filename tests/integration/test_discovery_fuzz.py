"""Thousands of malformed request entries (bytes that are not UTF-8, missing and wrong-typed
fields, huge values, unknown ops, broken session documents), interleaved with valid discovery
requests, against two live discovery workers of a stack of this test's own. Every valid request
is answered correctly, every malformed one gets an error reply or is dead-lettered (exactly
one of the two), the workers are the same processes at the end, and nothing is left pending."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from capdisc import keys
from capdisc.client import Client
from capdisc.discovery.protocol import MAX_REQUEST_BYTES
from capdisc.status import live_workers

from .private import PrivateStack, copy_registry, dead_letters_by_entry, publish_and_serve

TENANT = "fuzz"
SEED = 20240611
MALFORMED = 2400
VALID = 300
QUERIES = [
    "open a pull request",
    "post a message to the team's slack channel",
    "convert 100 dollars to euros",
    "search my gmail for invoices",
    "send an sms",
]

Entry = dict[Any, Any]
#: A generated entry: its fields, and the request id it was given (None: none readable).
Generated = tuple[Entry, str | None]


def _payload(rid: str | None, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"query": "open a pull request", "tenant": TENANT, "limit": 5}
    if rid is not None:
        base["request_id"] = rid
    return {**base, **fields}


def _entry(payload: dict[str, Any] | bytes, **extra: Any) -> Entry:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return {b"payload": body, **{k.encode(): v for k, v in extra.items()}}


#: Values each field must refuse.
WRONG_VALUES: dict[str, list[Any]] = {
    "query": [None, 5, 1.5, True, [], {}, "", "   ", "x" * 5000],
    "tenant": [None, 5, [], "a b", "", "-x", "t" * 65],
    "limit": ["3", 0, -1, 10**30, 1.5, True, []],
    "kind": ["gadget", 5, [], ""],
    "category": [5, [], "", "c" * 300],
    "tags": ["x", [1], [None], {}, ["t"] * 1001],
    "only_available": ["yes", 1, None],
    "min_version": [-1, "1", 2**60, 1.5, None],
    "tool_format": ["xml", 5],
    "options": [[], "x", 5, {"nope": 1}, {"tier1_top_k": -5}],
    "session": ["bad id!", 5, ""],
    "profile": [5, ""],
    "roles": ["r", [""], [5]],
    "user": ["", 5],
    "colour": ["red"],  # no such field
}
BROKEN_DOCUMENTS: list[Any] = [
    {"bound": []},
    {"created_ms": "x", "bound": {}},
    {"created_ms": 1.5},
    {"created_ms": -1},
    {"created_ms": 10**20},
    {"created_ms": 1, "bound": {"t": [1, 2]}},
    {"created_ms": 1, "bound": {"t": [1, 2, "3"]}},
    {"created_ms": 1, "bound": {"": [1, 1, 1]}},
    {"created_ms": 1, "loop_evicted": "t"},
    {"created_ms": 1, "profile": 7},
    {"created_ms": 1, "calls": []},
    [],
    "session",
    None,
    5,
]


def wrong_type(rng: random.Random, rid: str) -> Generated:
    name = rng.choice(sorted(WRONG_VALUES))
    return _entry(_payload(rid, **{name: rng.choice(WRONG_VALUES[name])})), rid


def missing_field(rng: random.Random, rid: str) -> Generated:
    if rng.random() < 0.5:
        payload = _payload(rid)
        del payload["query"]
        return _entry(payload), rid
    return _entry(_payload(None)), None


def bad_bytes(rng: random.Random, rid: str) -> Generated:
    garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 48))) + b"\xff"
    where = rng.randrange(4)
    if where == 0:
        return {b"payload": garbage}, None
    if where == 1:
        return {garbage: b"x", b"payload": json.dumps(_payload(rid)).encode()}, rid
    if where == 2:
        return _entry(_payload(rid), op=garbage), rid
    return _entry(json.dumps(_payload(rid)).encode().replace(b"pull", garbage)), None


def not_a_request(rng: random.Random, rid: str) -> Generated:
    bodies = [
        b"{",
        b"nope",
        b"[1,",
        b'{"query":}',
        b"",
        b"null",
        b"42",
        b'"s"',
        b"[]",
        b"true",
        b"[" * 5000 + b"]" * 5000,
        b'{"query": "x", "limit": NaN}',
        b'{"query": "\\udc80"}',
        b"9" * 5000,
    ]
    return {b"payload": rng.choice(bodies)}, None


def huge(rng: random.Random, rid: str) -> Generated:
    choice = rng.randrange(4)
    if choice == 0 and rng.random() < 0.1:  # a few only: they are big
        return _entry(_payload(rid, query="q" * (MAX_REQUEST_BYTES + 10))), None
    if choice == 1:
        nested: Any = 0
        for _ in range(rng.randrange(33, 200)):
            nested = [nested]
        return _entry(_payload(rid, options={"deep": nested})), rid
    if choice == 2:
        return _entry(_payload(rid, min_version=10 ** rng.randrange(17, 300))), rid
    return _entry(_payload(rid), deadline_ms="9" * rng.randrange(17, 40)), rid


def unknown_op(rng: random.Random, rid: str) -> Generated:
    if rng.random() < 0.5:
        op = rng.choice(["frobnicate", "DISCOVER", "", "sessions", "delete"])
        return _entry(_payload(rid), op=op), rid
    payload = {
        "op": rng.choice(["delete", "CALL", "", 5, None]),
        "session": "s-1",
        "request_id": rid,
        "tenant": TENANT,
    }
    return _entry(payload, op="session"), rid


def broken_session(rng: random.Random, rid: str) -> Generated:
    base = {"session": f"s-{rid}", "request_id": rid, "tenant": TENANT}
    choice = rng.randrange(4)
    if choice == 0:
        return _entry(
            {**base, "op": "import", "data": rng.choice(BROKEN_DOCUMENTS)}, op="session"
        ), rid
    if choice == 1:
        return _entry({**base, "op": "call"}, op="session"), rid  # no tool_id
    if choice == 2:
        return _entry({**base, "op": "show", "session": "no spaces!"}, op="session"), rid
    return _entry({"op": "show", "request_id": rid}, op="session"), rid  # no session


def bad_entry_fields(rng: random.Random, rid: str) -> Generated:
    choice = rng.randrange(3)
    if choice == 0:
        return _entry(_payload(rid), colour="red"), rid
    if choice == 1:
        return {b"op": b"discover"}, None
    return _entry(_payload(rid), deadline_ms=rng.choice(["soon", "-5", "1.5", ""])), rid


GENERATORS: list[Callable[[random.Random, str], Generated]] = [
    wrong_type,
    missing_field,
    bad_bytes,
    not_a_request,
    huge,
    unknown_op,
    broken_session,
    bad_entry_fields,
]


def generated(
    rng: random.Random,
) -> tuple[list[tuple[Entry, str | None, str | None]], dict[str, str]]:
    """The entries to send, in order: (fields, the request id a malformed one was given, the
    query of a valid one), malformed and valid interleaved; and the valid ids' queries."""
    entries: list[tuple[Entry, str | None, str | None]] = []
    valid: dict[str, str] = {}
    for index in range(MALFORMED):
        fields, rid = rng.choice(GENERATORS)(rng, f"bad-{index}")
        entries.append((fields, rid, None))
    deadline_ms = int((time.time() + 300) * 1000)
    for index in range(VALID):
        rid, query = f"ok-{index}", rng.choice(QUERIES)
        valid[rid] = query
        fields = _entry(_payload(rid, query=query), deadline_ms=deadline_ms)
        entries.insert(rng.randrange(len(entries) + 1), (fields, None, query))
    return entries, valid


def drained(connection: redis.Redis) -> bool:
    pending = connection.xpending(keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP)["pending"]
    return connection.xlen(keys.DISCOVERY_REQUESTS) == 0 and pending == 0


def test_malformed_entries_never_stop_the_workers_and_valid_ones_are_answered(
    tmp_path: Path,
) -> None:
    with PrivateStack(tmp_path, durable=False) as stack:
        stack.spawn_indexing()
        workers = [stack.spawn_discovery(f"discovery-{n}") for n in range(2)]
        publish_and_serve(stack, copy_registry(tmp_path / "registry"), TENANT, discovery_workers=2)
        connection = stack.connection()
        with Client(connection, tenant=TENANT, timeout_s=20) as client:
            expected = {q: client.discover(q, limit=5).ids for q in QUERIES}
        assert expected["open a pull request"][0] == "tool:github-create-pull-request"
        entries, valid = generated(random.Random(SEED))

        ids = []
        for start in range(0, len(entries), 200):
            with connection.pipeline(transaction=False) as pipe:
                for fields, _rid, _query in entries[start : start + 200]:
                    pipe.xadd(keys.DISCOVERY_REQUESTS, fields)
                ids += [i.decode() for i in pipe.execute()]
        deadline = time.monotonic() + 45
        while not drained(connection):
            assert time.monotonic() < deadline, "the workers did not drain the request stream"
            time.sleep(0.1)

        replies = _replies(connection, [rid for _f, rid, _q in entries if rid] + list(valid))
        letters = dead_letters_by_entry(connection)
        for rid, query in valid.items():
            assert len(replies[rid]) == 1, f"valid request {rid} answered {len(replies[rid])}x"
            assert "error" not in replies[rid][0], replies[rid][0]
            assert [c["id"] for c in replies[rid][0]["capabilities"]] == expected[query]
        for entry_id, (fields, rid, query) in zip(ids, entries, strict=True):
            if query is not None:
                continue
            answered = replies.get(rid, []) if rid else []
            assert all("error" in r for r in answered), (fields, answered)
            outcomes = len(answered) + (entry_id in letters)
            assert outcomes == 1, f"malformed entry {fields!r:.200} ended {outcomes} ways"
        assert all(w.poll() is None for w in workers)
        alive = [w for w in live_workers(connection, 5.0) if w["kind"] == "discovery"]
        assert sorted(w["pid"] for w in alive) == sorted(w.pid for w in workers)
        served_by = {replies[rid][0]["worker"] for rid in valid}
        assert len(served_by) == 2, f"only {served_by} answered"


def _replies(connection: redis.Redis, request_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    with connection.pipeline(transaction=False) as pipe:
        for rid in request_ids:
            pipe.lrange(keys.reply(rid), 0, -1)
        lists = pipe.execute()
    return {rid: [json.loads(r) for r in raw] for rid, raw in zip(request_ids, lists, strict=True)}
