"""Floor processes for the speed benchmarks: answer requests without doing any work.

``list``: BLPOP a request list, RPUSH the reply (the bare Redis request/reply hand-off).
``stream``: capdisc's own transport (XREADGROUP on a stream, RPUSH the reply, XACK+XDEL).
"""

from __future__ import annotations

import contextlib
import json
import sys

import redis

REQUESTS = "bench:echo:requests"
STREAM = "bench:echo:stream"
GROUP = "echo"


def serve_list(client: redis.Redis) -> None:
    while True:
        popped = client.blpop([REQUESTS], timeout=1)
        if popped:
            request = json.loads(popped[1])
            client.rpush(request["reply"], popped[1])


def serve_stream(client: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    while True:
        batch = client.xreadgroup(GROUP, "echo", {STREAM: ">"}, count=16, block=1000)
        for _stream, entries in batch or []:
            with client.pipeline(transaction=False) as pipe:
                for entry_id, fields in entries:
                    request = json.loads(fields[b"payload"])
                    pipe.rpush(request["reply"], fields[b"payload"])
                    pipe.xack(STREAM, GROUP, entry_id)
                    pipe.xdel(STREAM, entry_id)
                pipe.execute()


if __name__ == "__main__":
    connection = redis.Redis.from_url(sys.argv[2])
    (serve_list if sys.argv[1] == "list" else serve_stream)(connection)
