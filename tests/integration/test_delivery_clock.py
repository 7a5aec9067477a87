"""kombu puts a delivered task back on its queue once it has been held longer than the
visibility timeout. Deliveries are timed on Redis's clock, so that comparison is on Redis's
clock too: a worker whose host clock runs ahead must not take live deliveries for lost ones."""

from __future__ import annotations

import time
from collections.abc import Iterator

import kombu
import pytest
import redis
from kombu.transport import redis as kombu_redis

from capdisc.redisclock import redis_now_ms
from capdisc_workers.queueguard import TRANSPORT

from .conftest import Stack

QUEUE = "delivery-clock-check"
VISIBILITY_TIMEOUT_S = 3600


@pytest.fixture
def channel(stack: Stack) -> Iterator[kombu_redis.Channel]:
    """A channel of the indexing transport on a database of the suite's Redis no worker uses,
    holding one delivered, unacknowledged message of :data:`QUEUE`."""
    url = stack.url.rsplit("/", 1)[0] + "/9"
    redis.Redis.from_url(url).flushdb()
    options = {"visibility_timeout": VISIBILITY_TIMEOUT_S}
    with kombu.Connection(url, transport=TRANSPORT, transport_options=options) as connection:
        queue = kombu.Queue(QUEUE, kombu.Exchange(QUEUE, type="direct"), routing_key=QUEUE)
        connection.Producer().publish(
            {"n": 1}, exchange=queue.exchange, routing_key=QUEUE, declare=[queue]
        )
        channel = connection.default_channel
        assert channel.basic_get(QUEUE, no_ack=False) is not None
        yield channel
        redis.Redis.from_url(url).flushdb()


def test_a_host_clock_hours_ahead_leaves_a_held_delivery_with_its_worker(
    channel: kombu_redis.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kombu_redis, "time", lambda: time.time() + 2 * VISIBILITY_TIMEOUT_S)
    channel.qos.restore_visible(interval=1)
    assert channel.client.llen(QUEUE) == 0
    assert channel.client.zcard(channel.qos.unacked_index_key) == 1


def test_a_delivery_held_past_the_timeout_on_redis_clock_goes_back_on_its_queue(
    channel: kombu_redis.Channel,
) -> None:
    client = channel.client
    (tag,) = client.zrange(channel.qos.unacked_index_key, 0, -1)
    held_since_s = redis_now_ms(client) / 1000 - VISIBILITY_TIMEOUT_S - 60
    client.zadd(channel.qos.unacked_index_key, {tag: held_since_s})
    channel.qos.restore_visible(interval=1)
    assert client.llen(QUEUE) == 1
    assert client.zcard(channel.qos.unacked_index_key) == 0
