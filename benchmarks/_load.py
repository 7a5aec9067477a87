"""A steady load of discover requests, and what it saw: for the fault benchmarks.

One thread sends a discover request every ``interval_s`` (each on its own fresh connection
pool, as a separate agent would) and records when it was sent, when it ended and how: answered
(with the expected id among the matches or not), or failed (timed out, an error reply, Redis
unreachable). Faults are recorded beside it as time windows, so the report can say which failures
happened while Redis was down, and which while Redis was up and at least one discovery worker was
alive (those are the ones that count against the service).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import redis

from capdisc.client import Client
from capdisc.errors import CapdiscError


@dataclass(frozen=True)
class Turn:
    """One discover request of the load."""

    sent: float
    ended: float
    ok: bool
    correct: bool
    error: str = ""


@dataclass
class Window:
    """A time window of one fault: Redis down, or no discovery worker alive."""

    kind: str
    start: float
    end: float = float("inf")

    def covers(self, moment: float) -> bool:
        return self.start <= moment <= self.end


@dataclass
class Load:
    """Sends ``query`` to ``tenant`` every ``interval_s`` until stopped."""

    url: str
    tenant: str
    query: str
    expected_id: str
    interval_s: float = 0.05
    timeout_s: float = 5.0
    turns: list[Turn] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def open_window(self, kind: str) -> Window:
        window = Window(kind, time.monotonic())
        self.windows.append(window)
        return window

    def _run(self) -> None:
        connection = redis.Redis.from_url(self.url, socket_connect_timeout=1.0, socket_timeout=5.0)
        client = Client(
            connection, tenant=self.tenant, timeout_s=self.timeout_s, resend_after_s=1.0
        )
        next_at = time.monotonic()
        while not self.stop.is_set():
            self.turns.append(self._turn(client))
            next_at = max(next_at + self.interval_s, time.monotonic())
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        connection.close()

    def _turn(self, client: Client) -> Turn:
        sent = time.monotonic()
        try:
            answer = client.discover(self.query, limit=5)
        except (CapdiscError, redis.RedisError, OSError) as exc:
            return Turn(sent, time.monotonic(), False, False, f"{type(exc).__name__}: {exc}")
        return Turn(sent, time.monotonic(), True, self.expected_id in answer.ids)

    # -- what it saw ---------------------------------------------------------------------------

    def failed_counting(self) -> list[Turn]:
        """Failed turns sent while Redis was up and some discovery worker alive (a turn that
        overlapped a Redis outage does not count: nothing could be sent or answered then)."""
        outages = [w for w in self.windows if w.kind in ("redis_down", "no_discovery")]
        return [
            t
            for t in self.turns
            if not t.ok and not any(w.start <= t.ended and t.sent <= w.end for w in outages)
        ]

    def wrong(self) -> list[Turn]:
        return [t for t in self.turns if t.ok and not t.correct]

    def longest_gap_s(self) -> float:
        """The longest time between two consecutive answers (end times)."""
        ends = sorted(t.ended for t in self.turns if t.ok)
        return max((b - a for a, b in itertools.pairwise(ends)), default=0.0)

    def resume_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` (Redis back) to the first answer of a turn sent after it."""
        answered = [t.ended for t in self.turns if t.ok and t.sent >= moment]
        return min(answered) - moment if answered else None
