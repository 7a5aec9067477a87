"""Producers through Redis outages: a publish or import that loses Redis waits for it and
resumes instead of exiting.

A sync (a directory, a catalog, an MCP server's tools) compares the source with what the
registry holds and sends only the difference, and applying events is idempotent. So resuming is
running the whole sync again once Redis answers: whatever was applied before the outage is not
sent again, whatever Redis lost (a restart without its data) is, and the wait for the workers'
acknowledgements starts over for what this attempt sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import kombu.exceptions
import redis

from capdisc.errors import RedisCredentialsError, RedisUnavailableError
from capdisc_producers.sync import SyncReport

#: What a sync raises while Redis (the registry and the Celery broker) cannot be reached.
UNREACHABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    kombu.exceptions.OperationalError,
)
#: First wait between two looks at Redis, and its cap.
POLL_FIRST_S = 0.2
POLL_CAP_S = 2.0
#: How long a producer waits for Redis to come back before it gives up.
WAIT_LIMIT_S = 300.0


def through_outages(
    attempt: Callable[[], SyncReport],
    client: redis.Redis,
    say: Callable[[str], None],
    wait_limit_s: float = WAIT_LIMIT_S,
) -> SyncReport:
    """``attempt()``'s report; while Redis cannot be reached, say so once, wait until it
    answers (at most ``wait_limit_s`` each time) and run the attempt again."""
    outages = 0
    while True:
        try:
            report = attempt()
        except redis.AuthenticationError as exc:  # not an outage: no wait makes it right
            raise RedisCredentialsError.refused(exc) from exc
        except UNREACHABLE as exc:
            outages += 1
            say(
                f"redis unavailable ({exc}); waiting up to {wait_limit_s:.0f} s for it to come "
                "back, then resuming"
            )
            await_redis(client, wait_limit_s)
            say("redis is back; resuming: only what the registry does not hold yet is sent")
            continue
        report.outages = outages
        return report


def await_redis(client: redis.Redis, limit_s: float) -> float:
    """Block until Redis answers PING; how long that took. :class:`RedisUnavailableError` after
    ``limit_s``."""
    started = time.monotonic()
    delay = POLL_FIRST_S
    while True:
        try:
            client.ping()
            return time.monotonic() - started
        except redis.AuthenticationError as exc:
            raise RedisCredentialsError.refused(exc) from exc
        except UNREACHABLE as exc:
            waited = time.monotonic() - started
            if waited >= limit_s:
                raise RedisUnavailableError(
                    f"redis did not come back within {limit_s:.0f} s ({exc}); nothing sent "
                    "since is lost: run the same command again once it is up"
                ) from exc
            time.sleep(min(delay, limit_s - waited))
            delay = min(POLL_CAP_S, delay * 2)
