"""redis-py's reply parser: hiredis (C) against its own pure-Python RESP3 parser.

Every capdisc process talks to Redis through redis-py, which parses replies in Python unless
the ``hiredis`` package is installed. This benchmark fills a Redis of its own with --size
capabilities (the records and vectors of ``redis_full_read.py``) and times, with each parser,
alternating, --rounds times each:

- ``full read``: :func:`capdisc.registry.store.read_snapshot`, a discovery worker's read of a
  tenant whole (start without a snapshot, Redis lost its data);
- ``status``: :func:`capdisc.status.collect_status`, what ``capdisc status`` reads;
- ``small replies``: 5,000 GETs of a 4 KB value and 5,000 PINGs, back to back (a turn's
  round trips carry replies of this size), the median of each.

The pure parser is the baseline, measured in the same run; the figures printed are medians
over the rounds, and the hiredis figure against it.

    .venv/bin/python benchmarks/redis_parser.py [--size 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis._parsers import _HiredisParser, _RESP3Parser

sys.path.insert(0, str(Path(__file__).parent))

from capdisc.localredis import start_redis
from capdisc.registry.store import read_snapshot
from capdisc.status import collect_status
from redis_full_read import SPACE, TENANT, fill

PARSERS: dict[str, Any] = {"pure Python": _RESP3Parser, "hiredis": _HiredisParser}
SMALL = 5000


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def per_call_ms(call: Callable[[], object], times: int = SMALL) -> float:
    """The median of ``times`` calls, in ms."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def one_round(url: str, parser: Any, size: int) -> dict[str, float]:
    client = redis.Redis.from_url(url, parser_class=parser, socket_timeout=120)
    client.set("bench:answer", b"x" * 4096)
    found = len(read_snapshot(client, TENANT, SPACE).records)
    if found != size:
        raise SystemExit(f"read {found} capabilities, not {size}")
    return {
        "full read (s)": timed(lambda: read_snapshot(client, TENANT, SPACE)),
        "status (s)": timed(lambda: collect_status(client)),
        "GET 4 KB (ms)": per_call_ms(lambda: client.get("bench:answer")),
        "PING (ms)": per_call_ms(client.ping),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in PARSERS}
    with tempfile.TemporaryDirectory() as directory:
        server = start_redis(Path(directory), durable=False)
        try:
            fill(redis.Redis.from_url(server.url), args.size)
            for _round in range(args.rounds):
                for name, parser_class in PARSERS.items():
                    runs[name].append(one_round(server.url, parser_class, args.size))
        finally:
            server.stop()
    report(args, runs)


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    print(f"{args.size:,} capabilities; medians of {args.rounds} rounds, parsers alternating")
    figures = list(next(iter(runs.values()))[0])
    print(f"{'parser':12} " + "  ".join(f"{f:>14}" for f in figures))
    medians = {
        name: {f: statistics.median(r[f] for r in results) for f in figures}
        for name, results in runs.items()
    }
    for name, m in medians.items():
        print(f"{name:12} " + "  ".join(f"{m[f]:14.4f}" for f in figures))
    base, new = medians["pure Python"], medians["hiredis"]
    print(f"{'hiredis / pure':12} " + "  ".join(f"{new[f] / base[f]:13.2f}x" for f in figures))


if __name__ == "__main__":
    main()
