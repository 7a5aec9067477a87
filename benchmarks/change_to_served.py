"""Time from saving a manifest to the discovery worker serving it (issue 2 and issue 4).

Starts the embedded stack (its own Redis, one Celery indexing worker, one discovery worker,
MiniLM unless CAPDISC_EMBEDDER says otherwise), runs the watcher on a copy of the example registry,
then edits one manifest N times. Each edit is timed from the file write to the first discovery
answer made from the new index version (the client asks with ``min_version``, so the worker
answers the moment it has applied it). Printed with and without the watcher's debounce.

    .venv/bin/python benchmarks/change_to_served.py [--edits 20] [--debounce-ms 500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from _common import describe_ms
from capdisc.client import Client
from capdisc.settings import Settings
from capdisc.store import tenant_version
from capdisc_producers.publisher import Publisher
from capdisc_producers.stack import running_stack
from capdisc_producers.sync import sync_directory
from capdisc_producers.watcher import watch_directory

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--debounce-ms", type=int, default=500)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "CAPDISC_REDIS_URL"}
    settings = Settings.load(env)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        registry = project / "registry"
        shutil.copytree(ROOT / "examples" / "registry", registry)
        with running_stack(project, settings, env) as (stack, url):
            client = redis.Redis.from_url(url)
            stack.wait_for_workers(client, {"indexing", "discovery"}, 120)
            publisher = Publisher(url)
            sync_directory(client, publisher, registry, tenant=settings.tenant,
                           max_bytes=settings.manifest_max_bytes, wait_s=120)
            print(f"embedder {settings.embedder}; {len(list(registry.rglob('CAPABILITY.yaml')))}"
                  " capabilities indexed")
            served = measure(client, publisher, registry, settings.tenant, args.edits,
                             args.debounce_ms)
    debounce_s = args.debounce_ms / 1000
    print(f"change-to-served, watcher debounce {args.debounce_ms} ms: {describe_ms(served)}")
    print("change-to-served, debounce subtracted: "
          f"{describe_ms([max(0.0, s - debounce_s) for s in served])}")


def measure(client: redis.Redis, publisher: Publisher, registry: Path, tenant: str,
            edits: int, debounce_ms: int) -> list[float]:
    stop = threading.Event()
    watcher = threading.Thread(target=watch_directory, daemon=True, kwargs=dict(
        client=client, publisher=publisher, root=registry, tenant=tenant,
        max_bytes=64 * 1024, debounce_ms=debounce_ms, stop=stop))
    watcher.start()
    discovery = Client(client, tenant=tenant, timeout_s=30)
    path = next(registry.glob("*/slack-post-message/CAPABILITY.yaml"))
    timings = []
    try:
        for edit in range(edits):
            version = tenant_version(client, tenant)
            data = yaml.safe_load(path.read_text())
            data["version"] = f"1.0.{edit + 100}"
            started = time.perf_counter()
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            answer = discovery.discover("post a message to slack", min_version=version + 1)
            assert answer.index_version >= version + 1, "edit was not served in 30 s"
            timings.append(time.perf_counter() - started)
    finally:
        stop.set()
        watcher.join(timeout=10)
    return timings


if __name__ == "__main__":
    main()
