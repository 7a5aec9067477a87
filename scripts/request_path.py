"""Trace one discover request through a real discovery worker and print the path it takes:
the files it crosses, in order of first visit, and how often a call goes from a lower layer to
a higher one (a return to a higher layer: a callback or a policy reached from below). Layers are
the ones `.importlinter` declares for the library; the worker itself is above them all.

    .venv/bin/python scripts/request_path.py

It starts a private Redis (capdisc.localredis), writes the example registry with the hashing
embedder as an indexing worker would, builds a discovery worker on it and traces
``_handle`` of one decoded request with a tool format in a session (the longest path), from
the decoded stream entry to the reply's JSON. Stream I/O around it (read, settle) is not
traced: it is the same for every request.
"""

from __future__ import annotations

import configparser
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for folder in ("shared", "workers", "producers"):
    sys.path.insert(0, str(ROOT / folder))

import redis  # noqa: E402

from capdisc.discovery.protocol import DiscoverRequest, decode_entry  # noqa: E402
from capdisc.embedders.hashing import HashingEmbedder  # noqa: E402
from capdisc.localredis import start_redis  # noqa: E402
from capdisc.registry.events import RegistryEvent  # noqa: E402
from capdisc.registry.manifest import scan_directory  # noqa: E402
from capdisc.registry.store import apply_event  # noqa: E402
from capdisc.retrieval.text import combine, embedding_texts, vector_space  # noqa: E402
from capdisc.settings import Settings  # noqa: E402
from capdisc_workers.discovery import DiscoveryWorker  # noqa: E402

TENANT = "default"


def layer_ranks() -> dict[str, int]:
    """capdisc package or module -> its layer (0 the lowest), from .importlinter."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    layers = parser["importlinter:contract:library-layers"]["layers"].split("\n")
    rows = [row for row in (line.strip() for line in layers) if row]
    ranks: dict[str, int] = {}
    for rank, row in enumerate(reversed(rows)):
        for name in row.replace("|", " ").replace(":", " ").split():
            ranks[f"capdisc.{name}"] = rank
    return ranks


def module_of(path: str) -> str | None:
    for top in ("shared", "workers", "producers"):
        base = ROOT / top
        if path.startswith(str(base)):
            return ".".join(Path(path).relative_to(base).with_suffix("").parts)
    return None


def rank_of(module: str, ranks: dict[str, int]) -> int:
    parts = module.split(".")
    for size in (2, 1):
        if ".".join(parts[:size]) in ranks:
            return ranks[".".join(parts[:size])]
    return max(ranks.values()) + 1  # the workers and producers, above the library


@contextmanager
def traced(calls: list[tuple[str, str]]) -> Iterator[None]:
    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee = module_of(frame.f_code.co_filename)
        caller = module_of(frame.f_back.f_code.co_filename)
        if callee and caller and callee != caller:
            calls.append((caller, callee))

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def publish_examples(client: redis.Redis, embedder: HashingEmbedder) -> None:
    space = vector_space(embedder.id)
    for cap in scan_directory(ROOT / "examples" / "registry").capabilities.values():
        event = RegistryEvent(
            type="upsert", tenant=TENANT, capability_id=cap.id, seq=1, capability=cap.to_dict()
        )
        full, summary = embedder.embed(list(embedding_texts(cap)))
        vector = combine(full, summary).tobytes()
        apply_event(client, event, cap, lambda _c, v=vector: v, space)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(Path(tmp), durable=False)
        try:
            client = redis.Redis.from_url(server.url)
            settings = Settings(redis_url=server.url, embedder="hashing")
            publish_examples(client, HashingEmbedder(settings.hashing_dim))
            worker = DiscoveryWorker(settings, client)
            worker.follower.load_all()
            request = DiscoverRequest(
                "refund a stripe payment", tenant=TENANT, session="trace", tool_format="mcp"
            )
            entry = decode_entry({"payload": request.encode()})
            calls: list[tuple[str, str]] = []
            with traced(calls):
                json.dumps(worker._handle(entry).to_dict())
            report(calls)
        finally:
            server.stop()


def report(calls: list[tuple[str, str]]) -> None:
    ranks = layer_ranks()
    files = list(dict.fromkeys(m for pair in calls for m in pair))
    upward = [(a, b) for a, b in calls if rank_of(b, ranks) > rank_of(a, ranks)]
    packages = list(dict.fromkeys(_package(m) for m in files))
    print(f"files crossed: {len(files)} in {len(packages)} packages ({', '.join(packages)})")
    for module in files:
        print(f"  {module}")
    print(
        f"calls into a higher layer: {len(upward)} "
        f"({len(set(upward))} distinct caller -> callee pairs)"
    )
    for caller, callee in sorted(set(upward)):
        print(f"  {caller} -> {callee}")


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


if __name__ == "__main__":
    main()
