"""Prometheus metrics of a worker process, served on ``metrics_port`` when it is set.

Counters and histograms are updated where the work happens (a discovery request answered, an
indexing task run); the registry's state (index versions, queue depth, dead letters, pending
requests) is read from Redis when Prometheus scrapes, so it is never stale and costs nothing
between scrapes. A scrape while Redis is away leaves those out and says so in
``capdisc_redis_up``; the worker never notices.

==============================================  ==========================================
metric                                          what
==============================================  ==========================================
``capdisc_requests_total{op,outcome}``          discovery requests answered; ``outcome`` is
                                                ``ok`` or the error code of the reply
``capdisc_request_seconds{op}``                 time to answer one (histogram)
``capdisc_model_seconds``                       of a discover turn that embedded its query,
                                                the time in the query model (histogram)
``capdisc_tasks_total{task,outcome}``           indexing tasks run (``ok``, ``retry``,
                                                ``failed``)
``capdisc_task_seconds{task}``                  time of one indexing task (histogram)
``capdisc_events_total{decision}``              registry events applied, by decision
``capdisc_index_version{tenant}``               each tenant's stored index version
``capdisc_served_version{tenant}``              the version this discovery worker serves
``capdisc_queue_depth``                         tasks waiting on the indexing queue
``capdisc_dead_letters``                        entries in the dead-letter stream
``capdisc_dead_letter_bytes``                   the bytes they hold (``deadletters_max_bytes``)
``capdisc_dead_letters_dropped_total``          dead letters dropped, oldest first, to keep
                                                the stream within its bounds
``capdisc_requests_pending``                    discovery requests read but not answered
``capdisc_redis_up``                            1 when the last scrape reached Redis
``process_start_time_seconds`` and friends      the process (restarts show as a new start)
==============================================  ==========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import redis
import structlog
from prometheus_client import Counter, Histogram, start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from capdisc import keys
from capdisc.redistext import as_str

log = structlog.get_logger("capdisc.metrics")

#: Seconds buckets for per-turn answers (ms-scale) and indexing tasks (up to minutes).
REQUEST_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
TASK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

REQUESTS = Counter("capdisc_requests", "Discovery requests answered", ["op", "outcome"])
REQUEST_SECONDS = Histogram(
    "capdisc_request_seconds",
    "Time to answer a discovery request",
    ["op"],
    buckets=REQUEST_BUCKETS,
)
MODEL_SECONDS = Histogram(
    "capdisc_model_seconds",
    "Time a discovery turn spent in the query model (turns whose vectors were not cached)",
    buckets=REQUEST_BUCKETS,
)
TASKS = Counter("capdisc_tasks", "Indexing tasks run", ["task", "outcome"])
TASK_SECONDS = Histogram(
    "capdisc_task_seconds", "Time of one indexing task", ["task"], buckets=TASK_BUCKETS
)
EVENTS = Counter("capdisc_events", "Registry events applied", ["decision"])


class RegistryGauges(Collector):
    """The registry's state as Prometheus reads it, from Redis at scrape time.
    ``served`` gives the versions this process serves (a discovery worker), if any."""

    def __init__(
        self,
        connect: Callable[[], redis.Redis],
        served: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._connect = connect
        self._served = served
        self._client: redis.Redis | None = None

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("capdisc_redis_up", "1 when this scrape reached Redis")
        try:
            yield from self._from_redis()
            up.add_metric([], 1.0)
        except redis.RedisError as exc:
            log.warning("metrics_redis_unavailable", error=str(exc))
            up.add_metric([], 0.0)
        yield up
        if self._served is not None:
            served = GaugeMetricFamily(
                "capdisc_served_version", "Index version this worker serves", labels=["tenant"]
            )
            for tenant, version in sorted(self._served().items()):
                served.add_metric([tenant], float(version))
            yield served

    def _from_redis(self) -> Iterator[Metric]:
        client = self._client = self._client or self._connect()
        tenants = sorted(as_str(t) for t in client.smembers(keys.TENANTS))
        with client.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.get(keys.version(tenant))
            pipe.llen(keys.INDEXING_QUEUE)
            pipe.xlen(keys.DEADLETTERS)
            pipe.hmget(keys.DEADLETTERS_BUDGET, ["bytes", "dropped"])
            pipe.exists(keys.DISCOVERY_REQUESTS)
            *versions, depth, letters, (held, dropped), has_requests = pipe.execute()
        pending = _pending_requests(client) if has_requests else 0
        stored = GaugeMetricFamily(
            "capdisc_index_version", "Stored index version", labels=["tenant"]
        )
        for tenant, version in zip(tenants, versions, strict=True):
            stored.add_metric([tenant], float(int(version or 0)))
        yield stored
        yield GaugeMetricFamily(
            "capdisc_queue_depth", "Tasks on the indexing queue", value=float(depth)
        )
        yield GaugeMetricFamily(
            "capdisc_dead_letters", "Entries in the dead-letter stream", value=float(letters)
        )
        yield GaugeMetricFamily(
            "capdisc_dead_letter_bytes",
            "Bytes the dead letters' fields hold (bounded by deadletters_max_bytes)",
            value=float(int(held or 0)),
        )
        yield CounterMetricFamily(
            "capdisc_dead_letters_dropped",
            "Dead letters dropped, oldest first, to keep the stream within its bounds",
            value=float(int(dropped or 0)),
        )
        yield GaugeMetricFamily(
            "capdisc_requests_pending",
            "Discovery requests read but not answered",
            value=float(pending),
        )


def _pending_requests(client: redis.Redis) -> int:
    try:
        summary = client.xpending(keys.DISCOVERY_REQUESTS, keys.DISCOVERY_GROUP)
    except redis.ResponseError:  # no consumer group yet
        return 0
    return int(summary.get("pending", 0)) if isinstance(summary, dict) else 0


def serve_metrics(port: int | None, host: str, gauges: RegistryGauges) -> int | None:
    """Serve ``/metrics`` on ``host:port`` (0: any free port) with the registry gauges; the
    port bound, or None when ``port`` is None (metrics off) or cannot be bound: the worker
    serves without metrics rather than not at all, and says so (``metrics_not_served``)."""
    if port is None:
        return None
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:  # the port is taken, or the address is not this host's
        log.error(
            "metrics_not_served",
            port=port,
            host=host,
            reason=str(exc),
            hint="give each worker on a host its own CAPDISC_METRICS_PORT (0: any free "
            "port); this worker serves without metrics",
        )
        return None
    REGISTRY.register(gauges)
    bound: int = server.server_port
    log.info("metrics_serving", port=bound, path="/metrics")
    return bound
