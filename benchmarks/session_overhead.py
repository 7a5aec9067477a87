"""The added cost of session handling per turn: discovery in a session against the
same discovery without one, measured in the same run, turn by turn.

Starts the embedded stack (its own Redis, one indexing worker, one discovery worker; the
embedder CAPDISC_EMBEDDER names, MiniLM by default), publishes the example registry, warms the
query cache, then runs --turns turns, each query asked once without a session and once in a
session (alternating which goes first), so both see the same machine. Printed: round trip and
in-worker time of both (median, p99), the per-turn difference (median, p99), and the cost of
recording a tool call. Target: under 0.5 ms median added.

    .venv/bin/python benchmarks/session_overhead.py [--turns 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _common import example_registry_stack, percentile, publish_registry
from capdisc.client import Answer, Client
from capdisc.settings import Settings
from capdisc_producers.stack import REDIS_ENV

QUERIES = [
    "post a message to slack",
    "search my gmail for invoices",
    "open a pull request",
    "convert 100 usd to eur",
    "send an sms to a customer",
    "create a jira issue",
    "look up a salesforce account",
    "summarize a pdf",
    "translate this text to german",
    "what's the weather in paris",
    "refund a stripe payment",
    "query the sales database",
    "schedule a meeting tomorrow",
    "find a zendesk ticket",
    "plan a terraform change",
    "play a song on spotify",
    "turn off the living room lights",
    "ocr a scanned receipt",
    "post to the team's discord",
    "search the knowledge base for onboarding",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != REDIS_ENV}
    settings = Settings.load(env)
    with example_registry_stack(settings, env) as (stack, url, registry):
        connection = redis.Redis.from_url(url)
        stack.wait_for_workers(connection, {"indexing", "discovery"}, 120)
        report = publish_registry(connection, url, registry, settings)
        client = Client(connection, tenant=settings.tenant, timeout_s=30)
        for query in QUERIES:  # warm: model loaded, query vectors cached
            client.discover(query, min_version=report.index_version)
        print(
            f"embedder {settings.embedder}; {len(QUERIES)} queries over "
            f"{report.index_version} index versions of the example registry; "
            f"{args.turns} turns"
        )
        measure(client, args.turns)


def measure(client: Client, turns: int) -> None:
    plain: list[tuple[float, float]] = []
    session: list[tuple[float, float]] = []
    calls: list[tuple[float, float]] = []
    session_id = f"bench-{uuid.uuid4().hex[:8]}"
    for turn in range(turns):
        query = QUERIES[turn % len(QUERIES)]
        order = (False, True) if turn % 2 else (True, False)
        for in_session in order:
            timed = _timed(client, query, session_id if in_session else None)
            (session if in_session else plain).append(timed)
        answer = client.discover(query, session=session_id)
        if answer.ids:
            started = time.perf_counter()
            outcome = client.record_tool_call(session_id, answer.ids[0], {"turn": turn})
            calls.append((time.perf_counter() - started, float(outcome.get("took_ms", 0.0))))
    report(plain, session, calls)


def _timed(client: Client, query: str, session: str | None) -> tuple[float, float]:
    started = time.perf_counter()
    answer: Answer = client.discover(query, session=session)
    return time.perf_counter() - started, answer.took_ms


def report(
    plain: list[tuple[float, float]],
    session: list[tuple[float, float]],
    calls: list[tuple[float, float]],
) -> None:
    def line(label: str, rows: list[tuple[float, float]]) -> None:
        trip = [r[0] * 1000 for r in rows]
        inside = [r[1] for r in rows]
        print(
            f"  {label:<28} round trip median {statistics.median(trip):.3f} ms, p99 "
            f"{percentile(trip, 99):.3f} ms; in the worker median "
            f"{statistics.median(inside):.3f} ms, p99 {percentile(inside, 99):.3f} ms"
        )

    line("discover, no session", plain)
    line("discover, in a session", session)
    line("record_tool_call", calls)
    added = [(s[0] - p[0]) * 1000 for p, s in zip(plain, session, strict=True)]
    added_inside = [s[1] - p[1] for p, s in zip(plain, session, strict=True)]
    median = statistics.median(added)
    print(
        f"  added by the session, per turn: median {median:.3f} ms, p99 "
        f"{percentile(added, 99):.3f} ms (in the worker: median "
        f"{statistics.median(added_inside):.3f} ms, p99 {percentile(added_inside, 99):.3f} ms)"
    )
    verdict = "MET" if median < 0.5 else "NOT MET"
    print(f"  target: under 0.5 ms median added: {verdict}")


if __name__ == "__main__":
    main()
