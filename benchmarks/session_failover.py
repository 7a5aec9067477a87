"""Exactly-once session effects while a discovery worker dies.

Starts the embedded stack plus a second discovery worker, publishes the example registry, and
runs --turns session turns over --sessions sessions from --clients client threads (each turn:
a discovery in the session, then a recorded call of its best match with arguments unique to the
turn; each thread has its own sessions, so turns of a session stay in order). Midway one of the
two discovery workers is killed with SIGKILL. Requests it held are answered anyway: the client
re-sends an unanswered request under the same id, and the survivor reclaims requests left
pending (XAUTOCLAIM). Checked afterwards, per session: every turn answered; each recorded call
counted once (use count equals the calls made); each discovery applied once (the best match's
bound/refreshed events equal the discoveries made).

    .venv/bin/python benchmarks/session_failover.py [--turns 1000] [--sessions 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _common import describe_ms, example_registry_stack, publish_registry
from capdisc.client import Client
from capdisc.sessions import store
from capdisc.settings import Settings
from capdisc.status import live_workers
from capdisc_producers.stack import REDIS_ENV, Stack
from session_overhead import QUERIES

DISCOVERY_ARGV = [sys.executable, "-m", "capdisc_workers.discovery"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=None, help="turn (default: middle)")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != REDIS_ENV}
    env.update(CAPDISC_CLAIM_IDLE_MS="2000", CAPDISC_HEARTBEAT_INTERVAL_S="0.2")
    settings = Settings.load(env)
    with example_registry_stack(settings, env) as (stack, url, registry):
        ok = run(stack, url, settings, env, registry, args)
    sys.exit(0 if ok else 1)


def run(
    stack: Stack,
    url: str,
    settings: Settings,
    env: dict[str, str],
    registry: Path,
    args: argparse.Namespace,
) -> bool:
    connection = redis.Redis.from_url(url)
    stack.spawn("discovery-2", DISCOVERY_ARGV, {**env, REDIS_ENV: url})
    _await_discovery_workers(connection, 2)
    report = publish_registry(connection, url, registry, settings)
    client = Client(connection, tenant=settings.tenant, timeout_s=60, resend_after_s=1.0)
    for query in QUERIES:
        client.discover(query, min_version=report.index_version)
    victim = sorted(w["pid"] for w in live_workers(connection) if w["kind"] == "discovery")[0]
    kill_at = args.kill_at if args.kill_at is not None else args.turns // 2
    print(
        f"embedder {settings.embedder}; {args.turns} turns over {args.sessions} sessions; "
        f"SIGKILL of discovery worker pid {victim} at turn {kill_at}"
    )
    made = turns(client, args, kill_at, victim)
    return verify(client, connection, settings.tenant, made)


def turns(
    client: Client, args: argparse.Namespace, kill_at: int, victim: int
) -> dict[str, Counter[str]]:
    """The turns, from --clients threads (each its own sessions), so that requests are in
    flight in the victim when it is killed."""
    made: dict[str, Counter[str]] = {}
    times: list[float] = []
    workers: Counter[str] = Counter()
    lock = threading.Lock()
    next_turn = iter(range(args.turns))

    def client_loop(number: int) -> None:
        own = Client(
            redis.Redis(connection_pool=client.redis.connection_pool),
            tenant=client.tenant,
            timeout_s=60,
            resend_after_s=1.0,
        )
        while True:
            with lock:
                turn = next(next_turn, None)
                if turn == kill_at:
                    os.kill(victim, signal.SIGKILL)
            if turn is None:
                return
            _turn(own, turn, args.sessions, args.clients, number, made, times, workers, lock)

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"turns answered: {len(times)} of {args.turns}; turn time {describe_ms(times)}")
    print(f"answered by: {dict(workers)}")
    return made


def _turn(
    client: Client,
    turn: int,
    sessions: int,
    clients: int,
    number: int,
    made: dict[str, Counter[str]],
    times: list[float],
    workers: Counter[str],
    lock: threading.Lock,
) -> None:
    """One turn of a session of client thread ``number``: discover, then call the best."""
    index = (turn % max(1, sessions // clients)) * clients + number
    session = f"failover-{index}"
    started = time.perf_counter()
    answer = client.discover(QUERIES[index % len(QUERIES)], session=session, request_id=f"d-{turn}")
    called = answer.ids[0] if answer.ids else None  # nothing found: nothing to call
    if called:
        client.record_tool_call(session, called, {"turn": turn}, request_id=f"c-{turn}")
    with lock:
        counts = made.setdefault(session, Counter())
        counts["discoveries"] += 1
        if called:
            counts[f"call:{called}"] += 1
        times.append(time.perf_counter() - started)
        workers[answer.worker] += 1


def verify(
    client: Client, connection: redis.Redis, tenant: str, made: dict[str, Counter[str]]
) -> bool:
    problems = []
    for session, counts in made.items():
        working = {b["id"]: b for b in client.working_set(session)["bound"]}
        for key, expected in counts.items():
            if key.startswith("call:"):
                tool = key.removeprefix("call:")
                got = working.get(tool, {}).get("use_count", 0)
                if got != expected:
                    problems.append(f"{session}: {tool} use count {got}, calls made {expected}")
        top = next((k.removeprefix("call:") for k in counts if k.startswith("call:")), None)
        if top is None:
            continue
        applied = _binding_events(connection, tenant, session, top)
        if applied != counts["discoveries"]:
            problems.append(
                f"{session}: {applied} binding events for {top}, "
                f"{counts['discoveries']} discoveries made"
            )
    verdict = "PASS" if not problems else "FAIL"
    print(f"calls counted twice or lost, discoveries applied twice or lost: {len(problems)}")
    for problem in problems[:20]:
        print(f"  {problem}")
    print(f"target: no turn unanswered, no call counted twice: {verdict}")
    return not problems


def _binding_events(connection: redis.Redis, tenant: str, session: str, tool: str) -> int:
    entries = connection.xrange(store.stream_key(connection, tenant, session))
    return sum(
        1
        for _id, fields in entries
        if tool in fields[b"tool"].decode().split(",")
        and fields[b"type"].decode() in ("bound", "refreshed", "restored")
    )


def _await_discovery_workers(connection: redis.Redis, count: int) -> None:
    deadline = time.monotonic() + 120
    while sum(1 for w in live_workers(connection) if w["kind"] == "discovery") < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"fewer than {count} discovery workers started")
        time.sleep(0.1)


if __name__ == "__main__":
    main()
