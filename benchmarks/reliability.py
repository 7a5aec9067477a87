"""Reliability under faults, with every setting at its default: indexing-worker kills under
duplicates and reordering, then Redis restarts (data kept, data lost) and discovery-worker kills
under a steady load of discover requests.

Part one starts its own Redis, one Celery indexing worker (the stack's command line, the hashing
embedder unless --embedder says otherwise) and one discovery worker. Makes --events registry
events over --ids capabilities from a fixed seed: several versions of each (increasing seq) and
deletes (some capabilities end deleted, some are deleted before they ever existed); then 10%
duplicates (the same encoded event sent twice) and reordering (up to 10% of the events moved past
a newer event of the same capability, and 5% late upserts sent after the delete that supersedes
them, which must not resurrect anything). The events are published in chunks of tasks while a
killer SIGKILLs the indexing worker at a random point (by acks, from the seed) of each
1/(kills+1) of them (--kill-when mid-task: at the first moment after it that a task is in
flight; between-tasks: that none is, the hand-off from one task to the next), and starts a fresh
one after --restart-after-s, as a supervisor would. The dead worker's tasks come back through
the indexing workers' sweep (a delivery no live worker holds goes back to the queue), not the
visibility timeout, which stays at its default of an hour.

When every event is acknowledged and nothing is queued or unacknowledged, the stored registry is
compared with the one the events define (the highest seq wins per capability; a delete leaves a
tombstone): lost (expected but missing, or not its newest content), resurrected (deleted but
present), extra, records without a vector or with the vector of other content, vectors without
a record, events whose effect was applied twice, dead letters, and the version and count the
discovery worker serves. Counted: kills, tasks in flight at a kill, redelivered events.
Target: zero lost and zero resurrected capabilities under the run.

Part two (:mod:`_faults`; skip it with --no-faults): a registry directory kept published by the
watcher, two discovery workers under a steady load of discover requests, and in turn: each
discovery worker SIGKILLed, Redis restarted mid-sync with its data and without it, the indexing
worker SIGKILLed mid-sync. Printed per fault: lost, resurrected, extra, time to converge; for the
load: failed answers (while Redis was up and a discovery worker alive, and while Redis was down),
how soon answers resumed after Redis was back, and the longest gap without answers. Targets: 0
lost, 0 resurrected, converged <= 60 s after the fault, no failed answer while a discovery worker
is alive, answers resume <= 2 s after Redis is back.

    .venv/bin/python benchmarks/reliability.py [--events 1000] [--kills 5] [--embedder hashing]
        [--kill-when any|mid-task|between-tasks] [--seed 0] [--no-faults] [--fault-tools 300]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis

from _common import stop_processes
from _faults import run_faults
from _load import Load
from capdisc import keys
from capdisc.client import Client
from capdisc.embedders.factory import make_embedder
from capdisc.embedders.port import Embedder
from capdisc.errors import CapdiscError
from capdisc.localredis import LocalRedis, start_redis
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry.events import RegistryEvent
from capdisc.registry.normalize import capability_from_record, from_tool
from capdisc.registry.policy import StoredRecord
from capdisc.registry.store import tenant_version
from capdisc.retrieval.text import combine, embedding_texts, vector_space
from capdisc.status import live_workers
from capdisc_producers.publisher import BATCH, Publisher
from capdisc_producers.stack import DISCOVERY_ARGV, indexing_argv

TENANT = "reliability"
INDEXING_ARGV = indexing_argv()
WORDS = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
)
#: Decisions that change the index (bump the version).
EFFECTIVE = ("upsert", "delete")


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on the way out
    base = Path(tempfile.mkdtemp(prefix="capdisc-reliability-"))
    batch_id = f"reliability-{uuid.uuid4().hex[:8]}"
    workload = build_workload(args.events, args.ids, args.seed, batch_id)
    print(workload.describe(), flush=True)
    result = run(args, base, workload)
    failures = report(args, workload, result)
    if not args.no_faults:
        failures += faults_under_load(args, base / "faults")
    if failures or args.keep:
        print(f"logs and Redis files kept in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    sys.exit(1 if failures else 0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events", type=int, default=1000, help="events sent, duplicates and late upserts included"
    )
    parser.add_argument(
        "--ids", type=int, default=300, help="capability ids (at most half the distinct events)"
    )
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--embedder", choices=("hashing", "minilm"), default="hashing")
    parser.add_argument(
        "--visibility-timeout-s",
        type=int,
        default=None,
        help="override the setting (default: its default, one hour)",
    )
    parser.add_argument(
        "--kill-when",
        choices=("any", "mid-task", "between-tasks"),
        default="any",
        help="at a kill point: kill at once, or wait for a task to be in flight, or for none to be",
    )
    parser.add_argument("--batch-size", type=int, default=BATCH, help="events per task")
    parser.add_argument("--chunk", type=int, default=100, help="events per publish call")
    parser.add_argument(
        "--backlog", type=int, default=300, help="most events sent ahead of the acknowledged ones"
    )
    parser.add_argument("--no-discovery", action="store_true", help="run no discovery worker")
    parser.add_argument(
        "--reconcile-s",
        type=float,
        default=None,
        help="override the reconciler interval (default: the setting's)",
    )
    parser.add_argument(
        "--outbox-grace-s",
        type=float,
        default=None,
        help="override the setting (default: the setting's)",
    )
    parser.add_argument(
        "--restart-after-s",
        type=float,
        default=1.0,
        help="how long a killed indexing worker stays down (a supervisor's restart delay)",
    )
    parser.add_argument(
        "--fault-tools",
        type=int,
        default=300,
        help="tools of the registry the fault scenarios keep published",
    )
    parser.add_argument(
        "--no-faults",
        action="store_true",
        help="skip the Redis restarts and discovery-worker kills under load",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the logs and Redis files")
    return parser.parse_args()


# -- the workload ---------------------------------------------------------------------------------


@dataclass
class Workload:
    """Events in send order (a duplicate is the same event object again) and what they mean."""

    sends: list[RegistryEvent]
    ids: int
    duplicates: int
    late_upserts: int

    @property
    def distinct(self) -> dict[str, RegistryEvent]:
        return {e.event_id: e for e in self.sends}

    def expected(self) -> dict[str, RegistryEvent]:
        """The newest event of each capability: the registry the events define."""
        newest: dict[str, RegistryEvent] = {}
        for event in self.distinct.values():
            if event.capability_id not in newest or event.seq > newest[event.capability_id].seq:
                newest[event.capability_id] = event
        return newest

    def arriving_stale(self) -> int:
        """Distinct events sent after a newer event of the same capability."""
        newest_sent: dict[str, int] = {}
        seen: set[str] = set()
        stale = 0
        for event in self.sends:
            if event.event_id in seen:
                continue
            seen.add(event.event_id)
            if event.seq < newest_sent.get(event.capability_id, -1):
                stale += 1
            newest_sent[event.capability_id] = max(
                event.seq, newest_sent.get(event.capability_id, -1)
            )
        return stale

    def describe(self) -> str:
        distinct = list(self.distinct.values())
        kinds = Counter(e.type for e in distinct)
        ending = Counter(e.type for e in self.expected().values())
        return (
            f"workload: {len(self.sends)} events sent over {self.ids} capabilities: "
            f"{len(distinct)} distinct ({kinds['upsert']} upserts, {kinds['delete']} "
            f"deletes), {self.duplicates} duplicates, {self.arriving_stale()} sent after a "
            f"newer event of their capability ({self.late_upserts} of them late upserts "
            f"after a delete); {ending['upsert']} capabilities should end present, "
            f"{ending['delete']} deleted"
        )


def build_workload(events: int, ids: int, seed: int, batch_id: str) -> Workload:
    rng = random.Random(seed)
    duplicates, late = events // 10, events // 20
    base = events - duplicates - late
    names = [f"rel-{i:04d}" for i in range(max(1, min(ids, base // 2)))]
    timeline = _timeline(rng, names, base, batch_id)
    order = _reordered(rng, timeline, events // 10)
    order = _with_late_upserts(rng, order, late, batch_id)
    order = _with_duplicates(rng, order, duplicates)
    return Workload(order, len(names), duplicates, late)


def _timeline(
    rng: random.Random, names: list[str], count: int, batch_id: str
) -> list[RegistryEvent]:
    """``count`` events in seq order: each capability first appears (5% of them as a delete of
    something never created), then random new versions (75%) and deletes (25%)."""
    revision: Counter[str] = Counter()
    timeline = []
    for step in range(count):
        name = names[step] if step < len(names) else rng.choice(names)
        first = step < len(names)
        delete = rng.random() < (0.05 if first else 0.25)
        seq = (step + 1) * 10
        if delete:
            timeline.append(_delete(name, seq, batch_id))
        else:
            revision[name] += 1
            timeline.append(_upsert(name, revision[name], seq, batch_id))
    return timeline


def _reordered(rng: random.Random, order: list[RegistryEvent], moves: int) -> list[RegistryEvent]:
    """Move up to ``moves`` random events past the next newer event of their capability (and
    up to 50 places further)."""
    order = list(order)
    for _ in range(moves):
        index = rng.randrange(len(order))
        event = order[index]
        newer = next(
            (
                j
                for j in range(index + 1, len(order))
                if order[j].capability_id == event.capability_id
            ),
            None,
        )
        if newer is not None:
            order.pop(index)
            order.insert(min(len(order), newer + rng.randint(0, 50)), event)
    return order


def _with_late_upserts(
    rng: random.Random, order: list[RegistryEvent], count: int, batch_id: str
) -> list[RegistryEvent]:
    """Upserts older than a delete (seq just below it), sent at some point after it."""
    order = list(order)
    deletes = [i for i, e in enumerate(order) if e.type == "delete"]
    for _ in range(count if deletes else 0):
        position = rng.choice(deletes)
        delete = order[position]
        late = _upsert(
            delete.capability_id.split(":", 1)[1],
            9000 + rng.randrange(1000),
            delete.seq - 1 - rng.randrange(5),
            batch_id,
        )
        order.insert(rng.randint(position + 1, len(order)), late)
        deletes = [i for i, e in enumerate(order) if e.type == "delete"]
    return order


def _with_duplicates(
    rng: random.Random, order: list[RegistryEvent], count: int
) -> list[RegistryEvent]:
    """The same event sent again: right after it half the time, else later."""
    order = list(order)
    for _ in range(count):
        index = rng.randrange(len(order))
        later = index + 1 if rng.random() < 0.5 else rng.randint(index + 1, len(order))
        order.insert(later, order[index])
    return order


def _upsert(name: str, revision: int, seq: int, batch_id: str) -> RegistryEvent:
    word = WORDS[revision % len(WORDS)]
    capability = from_tool(
        {
            "name": name,
            "version": f"1.0.{revision}",
            "description": f"Reliability probe {name}, revision {revision}: {word} payloads. "
            f"Answers {word} requests about {name.replace('-', ' ')}.",
            "parameters": {
                "type": "object",
                "properties": {"subject": {"type": "string", "description": f"{word} subject"}},
            },
            "tags": ["reliability", word],
        },
        source="reliability",
    )
    return RegistryEvent(
        type="upsert",
        tenant=TENANT,
        capability_id=capability.id,
        seq=seq,
        source="reliability",
        capability=capability.to_dict(),
        batch_id=batch_id,
    )


def _delete(name: str, seq: int, batch_id: str) -> RegistryEvent:
    return RegistryEvent(
        type="delete",
        tenant=TENANT,
        capability_id=f"tool:{name}",
        seq=seq,
        source="reliability",
        batch_id=batch_id,
    )


# -- the processes --------------------------------------------------------------------------------


@dataclass
class Processes:
    """Redis, the indexing worker (killed and restarted) and the discovery worker."""

    base: Path
    env: dict[str, str]
    redis_server: LocalRedis | None = None
    indexing: subprocess.Popen[bytes] | None = None
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)
    generation: int = 0

    @property
    def url(self) -> str:
        assert self.redis_server is not None
        return self.redis_server.url

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.base / "logs" / f"{name}.log").open("ab")
        return subprocess.Popen(argv, env=self.env, stdout=log, stderr=log, cwd=self.base)

    def start_indexing(self) -> None:
        self.generation += 1
        self.indexing = self.spawn(
            f"indexing-{self.generation}",
            [*INDEXING_ARGV, "-n", f"reliability-{self.generation}-{os.getpid()}@%h"],
        )

    def kill_indexing(self) -> None:
        assert self.indexing is not None
        self.indexing.send_signal(signal.SIGKILL)
        self.indexing.wait()

    def stop(self) -> None:
        stop_processes([self.indexing, *self.others])
        if self.redis_server is not None:
            self.redis_server.stop()


def start_redis_for(args: argparse.Namespace, base: Path) -> Processes:
    """Redis, and the environment of the workers that will use it."""
    (base / "logs").mkdir(parents=True, exist_ok=True)
    server = start_redis(base / "redis", durable=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env.update(
        CAPDISC_REDIS_URL=server.url, CAPDISC_EMBEDDER=args.embedder, CAPDISC_LOG_LEVEL="INFO"
    )
    overrides = {
        "CAPDISC_VISIBILITY_TIMEOUT_S": args.visibility_timeout_s,
        "CAPDISC_RECONCILE_INTERVAL_S": args.reconcile_s,
        "CAPDISC_OUTBOX_GRACE_S": args.outbox_grace_s,
    }
    env.update({name: str(value) for name, value in overrides.items() if value is not None})
    return Processes(base, env, server)


def start_workers(args: argparse.Namespace, procs: Processes) -> None:
    procs.start_indexing()
    kinds = {"indexing"}
    if not args.no_discovery:
        procs.others.append(procs.spawn("discovery", DISCOVERY_ARGV))
        kinds.add("discovery")
    wait_for_workers(redis.Redis.from_url(procs.url), procs, kinds, 180)


def wait_for_workers(
    client: redis.Redis, procs: Processes, kinds: set[str], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while kinds - {w["kind"] for w in live_workers(client)}:
        dead = [p for p in [procs.indexing, *procs.others] if p and p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise SystemExit(f"workers did not start; see {procs.base / 'logs'}")
        time.sleep(0.1)


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Kill:
    at_acks: int
    in_flight: int
    queued: int


@dataclass
class RunResult:
    outcomes: list[dict[str, Any]]
    kills: list[Kill]
    restarts: int
    retries: int
    elapsed_s: float
    complete: bool
    pending: int
    dead_letters: int
    stored: dict[str, StoredRecord]
    tombstones: dict[str, int]
    vectors: dict[str, bytes]
    version: int
    changes: list[tuple[int, str]]
    served: tuple[int, int] | None
    resent: int = 0


def run(args: argparse.Namespace, base: Path, workload: Workload) -> RunResult:
    procs = start_redis_for(args, base)
    try:
        start_workers(args, procs)
        client = redis.Redis.from_url(procs.url)
        ack_key = keys.acks(workload.sends[0].batch_id or "")
        killer = Killer(
            client,
            procs,
            ack_key,
            kill_points(args, len(workload.sends)),
            args.kill_when,
            args.restart_after_s,
        )
        thread = threading.Thread(target=killer.run, daemon=True)
        started = time.monotonic()
        thread.start()
        publish(procs.url, client, ack_key, workload, args)
        outcomes, complete = wait_until_applied(client, ack_key, workload, started + args.timeout_s)
        elapsed = time.monotonic() - started
        killer.stop.set()
        thread.join()
        return collect(client, args, outcomes, killer.kills, procs, elapsed, complete)
    finally:
        procs.stop()


def kill_points(args: argparse.Namespace, total: int) -> list[int]:
    """An ack count within half a spacing of each of ``kills`` evenly spaced points, drawn
    from the seed: kills at arbitrary moments of the run, not aligned with task boundaries."""
    rng = random.Random(args.seed + 1)
    size = total / (args.kills + 1)
    return [int(size * (k + 1) + rng.uniform(-size / 2, size / 2)) for k in range(args.kills)]


@dataclass
class Killer:
    """SIGKILLs the indexing worker once the acks reach each kill point (``when``: at once, or
    at the first moment a task is in flight, or none is) and starts a fresh one after
    ``restart_after_s`` (so the dead worker's task is old enough to be restored)."""

    client: redis.Redis
    procs: Processes
    ack_key: str
    points: list[int]
    when: str
    restart_after_s: float
    stop: threading.Event = field(default_factory=threading.Event)
    kills: list[Kill] = field(default_factory=list)

    def run(self) -> None:
        for point in self.points:
            while not self._due(point):
                if self.stop.wait(0.002):
                    return
            self._kill()
            if self.stop.wait(self.restart_after_s):
                return
            self.procs.start_indexing()

    def _due(self, point: int) -> bool:
        if int(self.client.llen(self.ack_key)) < point:
            return False
        if self.when == "any":
            return True
        in_flight = int(self.client.hlen(keys.KOMBU_UNACKED)) > 0
        return in_flight == (self.when == "mid-task")

    def _kill(self) -> None:
        self.procs.kill_indexing()
        kill = Kill(
            int(self.client.llen(self.ack_key)),
            int(self.client.hlen(keys.KOMBU_UNACKED)),
            int(self.client.llen(keys.INDEXING_QUEUE)),
        )
        self.kills.append(kill)
        print(
            f"  kill {len(self.kills)}: SIGKILL at {kill.at_acks} acks, {kill.in_flight} "
            f"task(s) unacknowledged, {kill.queued} queued",
            flush=True,
        )


def publish(
    url: str, client: redis.Redis, ack_key: str, workload: Workload, args: argparse.Namespace
) -> None:
    """Send the events in chunks, keeping at most ``--backlog`` ahead of the acks (unless
    nothing is left queued or in flight: lost events must not hold the rest back)."""
    publisher = Publisher(url)
    try:
        for start in range(0, len(workload.sends), args.chunk):
            while start - int(client.llen(ack_key)) > args.backlog and pending_events(client):
                time.sleep(0.01)
            publisher.send(workload.sends[start : start + args.chunk], batch_size=args.batch_size)
    finally:
        publisher.close()


#: Seconds with nothing queued, nothing unacknowledged and no new ack after which the events
#: still unapplied are lost (no worker can ever get them).
QUIET_S = 5.0


def wait_until_applied(
    client: redis.Redis, ack_key: str, workload: Workload, deadline: float
) -> tuple[list[dict[str, Any]], bool]:
    """All acks, once every event has as many as it was sent and nothing is left queued or
    unacknowledged; False with them when the deadline passed or the rest is lost."""
    needed = Counter(e.event_id for e in workload.sends)
    outcomes: list[dict[str, Any]] = []
    progress = time.monotonic()
    while True:
        fresh = [json.loads(raw) for raw in client.lrange(ack_key, len(outcomes), -1)]
        outcomes += fresh
        got = Counter(o.get("event_id") for o in outcomes)
        done = all(got[event_id] >= n for event_id, n in needed.items())
        pending = pending_events(client)
        if done and pending == 0:
            return outcomes, True
        now = time.monotonic()
        progress = now if fresh or pending else progress
        if now > deadline or now - progress > QUIET_S:
            return outcomes, False
        time.sleep(0.05)


def pending_events(client: redis.Redis) -> int:
    """Tasks queued, delivered and unacknowledged, or sent and not yet done (the outbox: a
    task the broker lost stays there until the reconciler sends it again)."""
    return (
        int(client.llen(keys.INDEXING_QUEUE))
        + int(client.hlen(keys.KOMBU_UNACKED))
        + int(client.hlen(keys.OUTBOX))
    )


def collect(
    client: redis.Redis,
    args: argparse.Namespace,
    outcomes: list[dict[str, Any]],
    kills: list[Kill],
    procs: Processes,
    elapsed: float,
    complete: bool,
) -> RunResult:
    space = vector_space(make_embedder(args.embedder).id)
    version = tenant_version(client, TENANT)
    stored = {
        as_str(k): StoredRecord.from_dict(json.loads(v))
        for k, v in client.hgetall(keys.caps(TENANT)).items()
    }
    return RunResult(
        outcomes=outcomes,
        kills=kills,
        restarts=procs.generation - 1,
        retries=logged(procs.base / "logs", "events_retry"),
        elapsed_s=elapsed,
        complete=complete,
        pending=pending_events(client),
        dead_letters=int(client.xlen(keys.DEADLETTERS)),
        stored=stored,
        tombstones={as_str(k): int(v) for k, v in client.hgetall(keys.tombstones(TENANT)).items()},
        vectors={as_str(k): v for k, v in client.hgetall(keys.vectors(TENANT, space)).items()},
        version=version,
        changes=changes(client),
        served=None if args.no_discovery else served(client, version),
        resent=int(client.hget(keys.COUNTERS, "tasks_resent") or 0),
    )


def logged(log_dir: Path, event: str) -> int:
    """How many times the indexing workers logged ``event``."""
    needle = f'"event": "{event}"'
    return sum(
        log.read_text(errors="replace").count(needle) for log in log_dir.glob("indexing-*.log")
    )


def changes(client: redis.Redis) -> list[tuple[int, str]]:
    """``(version, capability id)`` of the tenant's change records, in stream order."""
    return [
        (int(f[b"version"]), as_str(f[b"id"]))
        for _id, f in client.xrange(keys.CHANGES)
        if f[b"tenant"] == TENANT.encode()
    ]


def served(client: redis.Redis, version: int) -> tuple[int, int]:
    """The index version and capability count the discovery worker serves ((-1, -1): it
    did not answer)."""
    try:
        answer = Client(client, tenant=TENANT, timeout_s=60).discover(
            "reliability probe", min_version=version
        )
    except CapdiscError as exc:
        print(f"discovery failed: {exc}")
        return -1, -1
    return answer.index_version, int(answer.raw.get("total_indexed", -1))


# -- faults under load -----------------------------------------------------------------------------

#: Targets of the fault scenarios.
CONVERGE_TARGET_S = 60.0
RESUME_TARGET_S = 2.0


def faults_under_load(args: argparse.Namespace, base: Path) -> list[str]:
    """Run the fault scenarios of :mod:`_faults`, print their figures; the failures."""
    print(
        f"\nfaults under load: {args.fault_tools} tools kept published by the watcher, two "
        "discovery workers, every setting at its default but the hashing embedder, a "
        f"discover request every {Load.interval_s * 1000:.0f} ms"
    )
    results, load = run_faults(base, args.fault_tools)
    failures = []
    for result in results:
        if result.drift.lost or result.drift.resurrected or result.drift.extra:
            failures.append(f"{result.name}: lost, resurrected or extra capabilities")
        if result.converged_s is None or result.converged_s > CONVERGE_TARGET_S:
            failures.append(f"{result.name}: not converged within {CONVERGE_TARGET_S:.0f} s")
        if result.resumed_s is not None and result.resumed_s > RESUME_TARGET_S:
            failures.append(f"{result.name}: answers resumed after {result.resumed_s:.2f} s")
    print(
        f"load: {load['turns']} discover requests, {load['answered']} answered, "
        f"{load['wrong_answers']} answered wrongly; failed while Redis was up and a discovery "
        f"worker alive: {load['failed_counting']}; failed while Redis was down: "
        f"{load['failed_during_outage']}; longest gap between answers "
        f"{load['longest_gap_s']:.2f} s ({load['longest_gap_outside_outages_s']:.2f} s outside "
        "Redis outages)"
    )
    if load["failed_counting"] or load["wrong_answers"]:
        failures.append("failed or wrong answers while a discovery worker was alive")
    verdict_ = "FAIL (" + "; ".join(failures) + ")" if failures else "PASS"
    print(
        f"target: 0 lost, 0 resurrected, converged <= {CONVERGE_TARGET_S:.0f} s after each "
        "fault, no failed answer while a discovery worker is alive, answers resume <= "
        f"{RESUME_TARGET_S:.0f} s after Redis is back: {verdict_}"
    )
    return failures


# -- the verdict ----------------------------------------------------------------------------------


def report(args: argparse.Namespace, workload: Workload, result: RunResult) -> list[str]:
    """Print the figures; return the failures (empty: PASS)."""
    expected = workload.expected()
    state = compare_state(expected, result)
    effects = count_effects(workload, result)
    wrong_vectors = check_vectors(make_embedder(args.embedder), result)
    print_run(args, workload, result, effects)
    print(
        f"final registry: {len(result.stored)} stored, version {result.version}; "
        f"lost {len(state['lost'])} (missing {len(state['missing'])}, older content "
        f"{len(state['stale'])}, delete not applied {len(state['not_deleted'])}; "
        f"{len(state['lost_applied'])} of them after their newest event was applied), "
        f"resurrected {len(state['resurrected'])}, extra {len(state['extra'])}, tombstones "
        f"not at the delete's seq {len(state['tombstones'])}"
    )
    print(
        f"vectors: records without one {len(state['no_vector'])}, vectors without a record "
        f"{len(state['orphan_vectors'])}, vectors of other content {len(wrong_vectors)}"
    )
    failures = verdict(args, result, state, effects, wrong_vectors, expected)
    explain(workload, result, failures, state)
    target = "zero lost and zero resurrected capabilities under kills, duplicates, reordering"
    print(f"target: {target}: {'FAIL (' + '; '.join(failures) + ')' if failures else 'PASS'}")
    return failures


def compare_state(expected: dict[str, RegistryEvent], result: RunResult) -> dict[str, list[str]]:
    """The differences from the expected registry. Lost: an expected upsert missing or older
    (``missing``, ``stale``), or an expected delete never applied (``not_deleted``); of those,
    ``lost_applied`` had their newest event acknowledged (an ordering bug, not a lost event).
    Resurrected: present again although its newest event, a delete, was applied."""
    acked = {str(o.get("event_id")) for o in result.outcomes}
    state: dict[str, list[str]] = {
        k: [] for k in ("missing", "stale", "not_deleted", "resurrected", "tombstones")
    }
    for cap_id, event in sorted(expected.items()):
        record = result.stored.get(cap_id)
        if event.type == "delete":
            if record is not None:
                state["resurrected" if event.event_id in acked else "not_deleted"].append(cap_id)
            if result.tombstones.get(cap_id) != event.seq:
                state["tombstones"].append(cap_id)
        elif record is None:
            state["missing"].append(cap_id)
        elif (record.seq, record.content_hash) != (event.seq, _content_hash(event)):
            state["stale"].append(cap_id)
    state["lost"] = state["missing"] + state["stale"] + state["not_deleted"]
    state["lost_applied"] = [i for i in state["lost"] if expected[i].event_id in acked]
    state["extra"] = sorted(set(result.stored) - set(expected))
    state["no_vector"] = sorted(set(result.stored) - set(result.vectors))
    state["orphan_vectors"] = sorted(set(result.vectors) - set(result.stored))
    return state


def _content_hash(event: RegistryEvent) -> str:
    return capability_from_record(event.capability or {}, "expected").content_hash


def count_effects(workload: Workload, result: RunResult) -> dict[str, Any]:
    sent = Counter(e.event_id for e in workload.sends)
    acks = Counter(o.get("event_id") for o in result.outcomes)
    effective = Counter(
        o.get("event_id") for o in result.outcomes if o.get("decision") in EFFECTIVE
    )
    events_of = Counter(e.capability_id for e in workload.distinct.values())
    writes_of = Counter(cap_id for _version, cap_id in result.changes)
    return {
        "decisions": Counter(str(o.get("decision")) for o in result.outcomes),
        "redelivered": sum(max(0, acks[i] - n) for i, n in sent.items()),
        "unacked_sends": sum(max(0, n - acks[i]) for i, n in sent.items()),
        "short": sorted(i for i, n in sent.items() if acks[i] < n),
        "unapplied": sorted(i for i in sent if not acks[i]),
        "applied_twice": sorted(i for i, n in effective.items() if n > 1),
        "unacked_writes": len(result.changes) - sum(effective.values()),
        "overwritten": sorted(i for i, n in writes_of.items() if n > events_of[i]),
    }


def check_vectors(embedder: Embedder, result: RunResult) -> list[str]:
    """Stored records whose vector is not the embedding of their stored content."""
    ids = sorted(set(result.stored) & set(result.vectors))
    caps = [Capability.from_dict(result.stored[i].capability) for i in ids]
    texts = [embedding_texts(c) for c in caps]
    rows = embedder.embed([t for pair in texts for t in pair]) if texts else []
    wrong = []
    for index, cap_id in enumerate(ids):
        want = combine(rows[2 * index], rows[2 * index + 1])
        got = np.frombuffer(result.vectors[cap_id], dtype=np.float32)
        cosine = float(want @ got) / float(np.linalg.norm(want) * np.linalg.norm(got) or 1.0)
        if got.shape != want.shape or cosine < 0.999:
            wrong.append(cap_id)
    return wrong


def print_run(
    args: argparse.Namespace, workload: Workload, result: RunResult, effects: dict[str, Any]
) -> None:
    in_flight = sum(1 for k in result.kills if k.in_flight)
    decisions = ", ".join(f"{d} {n}" for d, n in sorted(effects["decisions"].items()))
    timeout = (
        f"{args.visibility_timeout_s} s"
        if args.visibility_timeout_s is not None
        else "default (1 h)"
    )
    print(
        f"run: embedder {args.embedder}, visibility timeout {timeout}, "
        f"{args.batch_size} events per task; {len(result.kills)} kills (of {args.kills}) "
        f"with a task unacknowledged at {in_flight} of them, {result.restarts} restarts; "
        f"{'applied' if result.complete else 'NOT all applied'} in {result.elapsed_s:.1f} s; "
        "tasks given back by the sweep (their worker was gone) or re-sent from the outbox: "
        f"{result.resent}"
    )
    lost = " and nowhere in the broker" if effects["unacked_sends"] and not result.pending else ""
    print(
        f"acks: {len(result.outcomes)} for {len(workload.sends)} events sent "
        f"({effects['redelivered']} redelivered; {effects['unacked_sends']} sends never "
        f"acknowledged{lost}, {len(effects['unapplied'])} distinct events never applied); "
        f"decisions: {decisions}; embedding retries {result.retries}; "
        f"{effects['unacked_writes']} writes applied but not acknowledged; dead letters "
        f"{result.dead_letters}; still queued or unacknowledged {result.pending}"
    )
    if result.served is not None:
        print(
            f"discovery worker serves version {result.served[0]} with {result.served[1]} "
            f"capabilities (stored: version {result.version}, {len(result.stored)})"
        )


def verdict(
    args: argparse.Namespace,
    result: RunResult,
    state: dict[str, list[str]],
    effects: dict[str, Any],
    wrong_vectors: list[str],
    expected: dict[str, RegistryEvent],
) -> list[str]:
    present = sum(1 for e in expected.values() if e.type == "upsert")
    checks = {
        "lost capabilities": len(state["lost"]),
        "resurrected capabilities": len(state["resurrected"]),
        "extra capabilities": len(state["extra"]),
        "tombstones not at the delete's seq": len(state["tombstones"]),
        "records without a vector": len(state["no_vector"]),
        "vectors without a record": len(state["orphan_vectors"]),
        "vectors of other content": len(wrong_vectors),
        "sends never acknowledged": effects["unacked_sends"],
        "events applied twice": len(effects["applied_twice"]),
        "dead letters": result.dead_letters,
        "kills missing": args.kills - len(result.kills),
        "capabilities written more often than they have events": len(effects["overwritten"]),
        "change records not versions 1..N": int(
            [v for v, _id in result.changes] != list(range(1, result.version + 1))
        ),
    }
    failures = [f"{n} {name}" for name, n in checks.items() if n]
    if result.served is not None and result.served != (result.version, present):
        failures.append(f"discovery serves {result.served}, not ({result.version}, {present})")
    return failures


def explain(
    workload: Workload, result: RunResult, failures: list[str], state: dict[str, list[str]]
) -> None:
    """For a failure: the history of up to five of the capabilities concerned."""
    if not failures:
        return
    acks: dict[str, list[str]] = {}
    for outcome in result.outcomes:
        acks.setdefault(str(outcome.get("event_id")), []).append(str(outcome.get("decision")))
    short = set(count_effects(workload, result)["short"])
    positions = [p for p, e in enumerate(workload.sends) if e.event_id in short]
    if positions:
        print(
            f"  events acknowledged fewer times than sent: {len(positions)} sends, at "
            f"positions {_ranges(positions)}"
        )
    concerned = list(dict.fromkeys(state["resurrected"] + state["lost_applied"] + state["lost"]))[
        :5
    ]
    for cap_id in concerned:
        record = result.stored.get(cap_id)
        print(
            f"  {cap_id}: stored seq {record.seq if record else None}, tombstone "
            f"{result.tombstones.get(cap_id)}; sent in this order:"
        )
        for position, event in enumerate(workload.sends):
            if event.capability_id == cap_id:
                print(
                    f"    #{position} {event.type} seq {event.seq} event {event.event_id[:8]}"
                    f" acks {acks.get(event.event_id, [])}"
                )


def _ranges(positions: list[int]) -> str:
    spans: list[list[int]] = []
    for p in positions:
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


if __name__ == "__main__":
    main()
