"""Faults under load: Redis restarts (data kept, data lost) and discovery-worker kills while a
steady load of discover requests runs and a watcher keeps a registry directory published.

The processes are the stack's, with every setting at its default (only the embedder is the
deterministic hashing one, so that a run takes minutes, not the model's time): a durable Redis
(AOF) on a fixed port, one Celery indexing worker, two discovery workers, and, in this process,
the watcher ``capdisc up`` runs (it re-syncs the directory when Redis restarts) and the load
(:mod:`_load`). A process that dies is restarted by this script after ``RESTART_AFTER_S``, the
way a supervisor would.

Each fault is injected while the registry is changing (a third of the tools rewritten, some
deleted, new ones added, so that a sync of hundreds of events is in flight), and measured until
the registry in Redis equals the directory and every discovery worker serves its version:

- lost: tools of the directory missing from Redis or stored with other content, or without a
  vector; resurrected: tools deleted from the directory and still stored; extra: stored tools the
  directory never had;
- converged: seconds from the end of the fault (Redis back, or the worker killed) until then;
- failed answers: turns that failed while Redis was up and a discovery worker alive;
- resumed: seconds from Redis being back to the first answer of a turn sent after it;
- longest gap: the longest time between two answers, and the same outside Redis outages.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from _common import stop_processes
from _load import Load
from capdisc import keys
from capdisc.localredis import LocalRedis, free_port, start_redis
from capdisc.redistext import as_str
from capdisc.registry.manifest import scan_directory
from capdisc.registry.policy import StoredRecord
from capdisc.registry.store import tenant_version
from capdisc.status import live_workers
from capdisc_producers.publisher import Publisher
from capdisc_producers.stack import indexing_argv
from capdisc_producers.watcher import watch_directory

TENANT = "default"
INDEXING_ARGV = indexing_argv()
DISCOVERY_ARGV = [sys.executable, "-m", "capdisc_workers.discovery"]
#: How long a killed process stays down before this script (a supervisor) starts it again.
RESTART_AFTER_S = 1.0
#: How long Redis stays down in a restart.
REDIS_DOWN_S = 3.0
#: Longest wait for convergence after a fault.
CONVERGE_LIMIT_S = 180.0
#: The query of the load, and the tool it must find.
LOAD_QUERY = "convert celsius temperatures to fahrenheit"
LOAD_TOOL = "tool:temperature-converter"
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


# -- the registry directory -----------------------------------------------------------------------


def write_tool(root: Path, name: str, description: str) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "CAPABILITY.yaml").write_text(
        f"name: {name}\nkind: tool\ndescription: {json.dumps(description)}\n"
        "parameters:\n  type: object\n  properties:\n    subject: {type: string}\n"
    )


def seed_registry(root: Path, tools: int) -> None:
    write_tool(
        root, LOAD_TOOL.split(":", 1)[1], "Converts temperatures between celsius and fahrenheit."
    )
    for i in range(tools):
        word = WORDS[i % len(WORDS)]
        write_tool(root, f"fault-{i:04d}", f"Fault probe {i}: handles {word} requests.")


def change_registry(root: Path, round_no: int, tools: int) -> None:
    """Rewrite a third of the tools, delete a tenth, add a fifth as many new ones."""
    existing = sorted(p.name for p in root.iterdir() if p.name.startswith("fault-"))
    for i, name in enumerate(existing):
        if i % 10 == round_no % 10:
            shutil.rmtree(root / name)
        elif i % 3 == round_no % 3:
            write_tool(
                root,
                name,
                f"Fault probe {name}, round {round_no}: "
                f"{WORDS[(i + round_no) % len(WORDS)]} payloads.",
            )
    for j in range(tools // 5):
        write_tool(root, f"fault-r{round_no}-{j:04d}", f"Round {round_no} addition {j}.")


# -- the processes --------------------------------------------------------------------------------


@dataclass
class FaultStack:
    """Redis, one indexing worker and two discovery workers, restarted when killed."""

    base: Path
    port: int = field(default_factory=free_port)
    redis_server: LocalRedis | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
        env.update(CAPDISC_REDIS_URL=self.url, CAPDISC_EMBEDDER="hashing")
        return env

    def start(self) -> None:
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        self.start_redis()
        for name in ("indexing", "discovery-a", "discovery-b"):
            self.spawn(name)

    def start_redis(self) -> None:
        self.redis_server = start_redis(self.base / "redis", port=self.port, durable=True)

    def stop_redis(self, lose_data: bool) -> None:
        assert self.redis_server is not None
        self.redis_server.stop()
        if lose_data:
            shutil.rmtree(self.base / "redis")

    def spawn(self, name: str) -> None:
        argv = (
            [*INDEXING_ARGV, "-n", f"fault-{name}-{time.time_ns()}@%h"]
            if name == "indexing"
            else DISCOVERY_ARGV
        )
        log = (self.base / "logs" / f"{name}.log").open("ab")
        self.workers[name] = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=log, cwd=self.base
        )

    def kill(self, name: str) -> None:
        self.workers[name].send_signal(signal.SIGKILL)
        self.workers[name].wait()

    def restart_dead(self) -> list[str]:
        """Start again every worker that exited (a supervisor's job)."""
        dead = [n for n, p in self.workers.items() if p.poll() is not None]
        for name in dead:
            self.restarts += 1
            self.spawn(name)
        return dead

    def discovery_pids(self) -> set[int]:
        return {p.pid for n, p in self.workers.items() if n.startswith("discovery")}

    def stop(self) -> None:
        stop_processes(list(self.workers.values()))
        if self.redis_server is not None:
            self.redis_server.stop()


# -- convergence ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Drift:
    """How the registry in Redis differs from the directory."""

    lost: int
    resurrected: int
    extra: int
    unserved: int

    @property
    def clean(self) -> bool:
        return not (self.lost or self.resurrected or self.extra or self.unserved)


def drift(client: redis.Redis, root: Path, ever: set[str], discovery_pids: set[int]) -> Drift:
    expected = {c.id: c.content_hash for c in scan_directory(root).capabilities.values()}
    stored = {
        as_str(k): StoredRecord.from_dict(json.loads(v)).content_hash
        for k, v in client.hgetall(keys.caps(TENANT)).items()
    }
    space = client.get(keys.space(TENANT))
    vectors = (
        set(as_str(k) for k in client.hkeys(keys.vectors(TENANT, as_str(space))))
        if space
        else set()
    )
    lost = sum(1 for i, h in expected.items() if stored.get(i) != h or i not in vectors)
    resurrected = sum(1 for i in stored if i not in expected and i in ever)
    extra = sum(1 for i in stored if i not in ever)
    version = tenant_version(client, TENANT)
    serving = [
        w
        for w in live_workers(client)
        if w["kind"] == "discovery" and w.get("pid") in discovery_pids
    ]
    unserved = len(discovery_pids) - sum(
        1 for w in serving if int(w.get("versions", {}).get(TENANT, -1)) == version
    )
    return Drift(lost, resurrected, extra, unserved)


def await_convergence(
    client: redis.Redis, stack: FaultStack, root: Path, ever: set[str], since: float
) -> tuple[Drift, float | None]:
    """Poll until the registry equals the directory and every discovery worker serves it."""
    last = Drift(-1, -1, -1, -1)
    while time.monotonic() - since < CONVERGE_LIMIT_S:
        stack.restart_dead()
        try:
            last = drift(client, root, ever, stack.discovery_pids())
        except redis.RedisError:
            last = Drift(-1, -1, -1, -1)
        if last.clean:
            return last, time.monotonic() - since
        time.sleep(0.2)
    return last, None


# -- the faults -----------------------------------------------------------------------------------


@dataclass
class FaultResult:
    name: str
    drift: Drift
    converged_s: float | None
    resumed_s: float | None = None
    notes: list[str] = field(default_factory=list)


def redis_restart(stack: FaultStack, load: Load, lose_data: bool) -> tuple[float, float]:
    """Stop Redis (and its data, if ``lose_data``), start it again on the same port after
    ``REDIS_DOWN_S``; returns (when it went down, when it was back)."""
    window = load.open_window("redis_down")
    stack.stop_redis(lose_data)
    time.sleep(REDIS_DOWN_S)  # the outage itself: nothing to await
    stack.start_redis()
    window.end = time.monotonic()
    return window.start, window.end


def kill_discovery(stack: FaultStack, name: str) -> float:
    """SIGKILL one discovery worker and start it again after ``RESTART_AFTER_S``."""
    stack.kill(name)
    killed = time.monotonic()
    time.sleep(RESTART_AFTER_S)  # the supervisor's restart delay
    stack.restart_dead()
    return killed


def wait_for_acks_started(
    client: redis.Redis, before: int, at_least: int, limit_s: float = 60.0
) -> None:
    """Until the tenant's version moved ``at_least`` past ``before``: a sync is in flight."""
    deadline = time.monotonic() + limit_s
    while tenant_version(client, TENANT) < before + at_least and time.monotonic() < deadline:
        time.sleep(0.01)


def summarize(load: Load) -> dict[str, Any]:
    outages = [w for w in load.windows if w.kind == "redis_down"]
    ends = sorted(t.ended for t in load.turns if t.ok)
    gaps = list(itertools.pairwise(ends))
    outside = [b - a for a, b in gaps if not any(w.start <= b and a <= w.end for w in outages)]
    return {
        "turns": len(load.turns),
        "answered": sum(1 for t in load.turns if t.ok),
        "failed_counting": len(load.failed_counting()),
        "failed_during_outage": sum(1 for t in load.turns if not t.ok)
        - len(load.failed_counting()),
        "wrong_answers": len(load.wrong()),
        "longest_gap_s": load.longest_gap_s(),
        "longest_gap_outside_outages_s": max(outside, default=0.0),
    }


# -- the run --------------------------------------------------------------------------------------


@dataclass
class FaultRun:
    """The registry directory, the stack, the watcher and the load of one run."""

    base: Path
    tools: int
    stack: FaultStack = field(init=False)
    root: Path = field(init=False)
    ever: set[str] = field(default_factory=set)
    results: list[FaultResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stack = FaultStack(self.base)
        self.root = self.base / "registry"

    def note_directory(self) -> None:
        self.ever |= {c.id for c in scan_directory(self.root).capabilities.values()}

    def converge(
        self, name: str, since: float, client: redis.Redis, resumed: float | None = None
    ) -> FaultResult:
        found, took = await_convergence(client, self.stack, self.root, self.ever, since)
        result = FaultResult(name, found, took, resumed)
        self.results.append(result)
        print(f"  {describe(result)}", flush=True)
        return result


def describe(result: FaultResult) -> str:
    drift_ = result.drift
    took = f"{result.converged_s:.1f} s" if result.converged_s is not None else "NOT converged"
    resumed = (
        f", answers resumed {result.resumed_s:.2f} s after Redis was back"
        if result.resumed_s is not None
        else ""
    )
    return (
        f"{result.name}: lost {drift_.lost}, resurrected {drift_.resurrected}, extra "
        f"{drift_.extra}, workers not serving the stored version {drift_.unserved}; "
        f"converged {took} after the fault{resumed}"
    )


def run_faults(
    base: Path, tools: int, indexing_kill: bool = True
) -> tuple[list[FaultResult], dict[str, Any]]:
    """Every fault in turn, under load; the results and what the load saw."""
    run = FaultRun(base, tools)
    seed_registry(run.root, tools)
    run.note_directory()
    run.stack.start()
    client = redis.Redis.from_url(run.stack.url, socket_connect_timeout=1.0)
    stop = threading.Event()
    publisher = Publisher(run.stack.url)
    watcher = threading.Thread(
        target=watch_directory,
        name="watcher",
        daemon=True,
        kwargs=dict(
            client=client,
            publisher=publisher,
            root=run.root,
            tenant=TENANT,
            max_bytes=64 * 1024,
            debounce_ms=500,
            stop=stop,
        ),
    )
    watcher.start()
    load = Load(run.stack.url, TENANT, LOAD_QUERY, LOAD_TOOL)
    try:
        started = time.monotonic()
        run.converge("initial publish", started, client)
        load.start()
        _discovery_kills(run, client)
        for round_no, lose in ((1, False), (2, True)):
            _redis_restart(run, client, load, round_no, lose)
        if indexing_kill:
            _indexing_kill(run, client, 3)
    finally:
        load.finish()
        stop.set()
        watcher.join(timeout=10)
        publisher.close()
        run.stack.stop()
    return run.results, summarize(load)


def _discovery_kills(run: FaultRun, client: redis.Redis) -> None:
    for name in ("discovery-a", "discovery-b"):
        killed = kill_discovery(run.stack, name)
        run.converge(f"SIGKILL {name}", killed, client)


def _redis_restart(
    run: FaultRun, client: redis.Redis, load: Load, round_no: int, lose: bool
) -> None:
    before = tenant_version(client, TENANT)
    change_registry(run.root, round_no, run.tools)
    run.note_directory()
    wait_for_acks_started(client, before, 20)
    _down, back = redis_restart(run.stack, load, lose)
    result = run.converge(
        f"Redis restart, data {'lost' if lose else 'kept'}, mid-sync", back, client
    )
    result.resumed_s = load.resume_after(back)
    print(f"    answers resumed {result.resumed_s} s after Redis was back", flush=True)


def _indexing_kill(run: FaultRun, client: redis.Redis, round_no: int) -> None:
    before = tenant_version(client, TENANT)
    change_registry(run.root, round_no, run.tools)
    run.note_directory()
    wait_for_acks_started(client, before, 20)
    run.stack.kill("indexing")
    killed = time.monotonic()
    time.sleep(RESTART_AFTER_S)  # the supervisor's restart delay
    run.stack.restart_dead()
    run.converge("SIGKILL indexing worker mid-sync", killed, client)
