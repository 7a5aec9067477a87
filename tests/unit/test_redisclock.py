"""Redis's clock as a process reads it: this host's time plus a measured offset."""

from __future__ import annotations

import time

import redis

from capdisc.redisclock import RedisClock, redis_now_ms


class TimeServer:
    """Answers ``TIME`` as a Redis whose clock is ``offset_s`` from this host's; ``away``
    makes it unreachable."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s
        self.away = False
        self.calls = 0

    def time(self) -> tuple[int, int]:
        self.calls += 1
        if self.away:
            raise redis.ConnectionError("Connection refused")
        now = time.time() + self.offset_s
        return int(now), int((now % 1) * 1_000_000)


def test_redis_now_is_the_servers_time_in_milliseconds() -> None:
    assert abs(redis_now_ms(TimeServer(3600)) - (time.time() + 3600) * 1000) < 1000


def test_the_clock_reads_the_servers_time_though_this_hosts_is_an_hour_off() -> None:
    server = TimeServer(-3600)

    assert abs(RedisClock().now_ms(server) - (time.time() - 3600) * 1000) < 1000


def test_the_offset_is_measured_once_per_resync_period() -> None:
    server, clock = TimeServer(60), RedisClock(resync_s=3600)

    for _ in range(5):
        clock.now_ms(server)

    assert server.calls == 1


def test_the_offset_is_measured_again_once_due() -> None:
    server, clock = TimeServer(60), RedisClock(resync_s=0)
    clock.now_ms(server)
    server.offset_s = 120

    assert abs(clock.now_ms(server) - (time.time() + 120) * 1000) < 1000


def test_an_unreachable_redis_keeps_the_last_offset() -> None:
    server, clock = TimeServer(60), RedisClock(resync_s=0)
    clock.now_ms(server)
    server.away = True

    assert abs(clock.now_ms(server) - (time.time() + 60) * 1000) < 1000


class NoTimeAllowed:
    """A Redis user whose ACL does not allow ``TIME``."""

    def time(self) -> tuple[int, int]:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run 'time'")


def test_a_user_refused_time_gets_this_hosts_clock() -> None:
    assert abs(redis_now_ms(NoTimeAllowed()) - time.time() * 1000) < 1000
