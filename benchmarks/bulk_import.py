"""Bulk import at registry scale: a cold import, then the same import again unchanged.

For each embedder, a fresh embedded stack (its own Redis in a temporary directory, one Celery
indexing worker, one discovery worker, ``CAPDISC_EMBEDDER`` set) imports the benchmark catalog
of ``--size`` capabilities (the Seal-Tools and MetaTool tools, then provider/region variants, see
``_catalog.py``) written as a ``tools.jsonl`` file, the way ``capdisc import jsonl`` does it
(:func:`capdisc_producers.importer.import_jsonl`, waiting for every event's ack). Printed: wall
time from reading the file to the last ack, capabilities a second, embedding calls (the
``embedding_calls`` counter of ``capdisc status``: texts embedded), the time until the discovery
worker answers from the final index version; then the same import again, unchanged: its wall
time and embedding calls. Last, the targets (10,000 in <= 60 s with the local embedder;
0 embedding calls on the re-import; the import within 1.15 x the model's own time) as MET /
NOT MET. With ``--floor-after`` the floor is timed again once the import is served, and the
import is compared with the mean of the two (both ratios printed): the machine's speed can
drift between a floor and an import several minutes apart.

The model's own time (the floor) is measured in the same run, in this process, while the fresh
stack is idle (workers ready, nothing sent yet): the embedder the workers make from the same
settings (:func:`capdisc.resources.embedder_for`) embeds exactly the distinct texts the import
will embed (:func:`capdisc.retrieval.text.embedding_texts` of each capability as a worker
parses it from its event, each text once), after one warm-up call. The import's wall time is
printed beside it with the ratio. The machine's load average (``os.getloadavg``) is printed at
the start and the end of each measurement, and the CPU seconds each stack process used during
the import (from ``/proc``, where there is one): the stack shares its cores with whatever else
runs.

    .venv/bin/python benchmarks/bulk_import.py [--size 10000] [--embedders hashing,minilm]
                                               [--json PATH] [--timeout 3600] [--floor-after]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import load_catalog
from capdisc.client import Client
from capdisc.models import Capability
from capdisc.registry.catalogs import read_jsonl_catalog
from capdisc.registry.normalize import capability_from_record
from capdisc.registry.store import tenant_version
from capdisc.resources import embedder_for
from capdisc.retrieval.text import embedding_texts
from capdisc.settings import Settings
from capdisc.status import collect_status
from capdisc_producers.importer import import_jsonl
from capdisc_producers.publisher import Publisher
from capdisc_producers.stack import running_stack
from capdisc_producers.sync import Progress

TARGET_SIZE = 10_000
TARGET_S = 60.0
#: The import's wall time may be at most this many times the model's own time on its texts.
TARGET_FLOOR_RATIO = 1.15
LOCAL_EMBEDDER = "minilm"
WORKER_START_S = 300.0
READY_QUERY = "send an email to a customer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=TARGET_SIZE)
    parser.add_argument(
        "--embedders",
        default="hashing,minilm",
        help="comma-separated CAPDISC_EMBEDDER values, one fresh stack each",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--floor-after",
        action="store_true",
        help="time the model's own floor again after the import and compare the import with "
        "the mean of both (the machine's speed drifts between them)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="longest wait for the import's acks, in seconds",
    )
    args = parser.parse_args()
    embedders = [name.strip() for name in args.embedders.split(",") if name.strip()]
    load_start = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores; load average at start {_load(load_start)}")
    caps = load_catalog(args.size)
    results = []
    with tempfile.TemporaryDirectory(prefix="capdisc-bulk-") as tmp:
        catalog = write_catalog(caps, Path(tmp) / "tools.jsonl")
        print(
            f"catalog: {len(caps)} capabilities written to a tools.jsonl file "
            f"({catalog.stat().st_size / 1e6:.1f} MB)"
        )
        for name in embedders:
            results.append(run_embedder(name, catalog, args.timeout, args.floor_after))
    verdicts = print_targets(results, len(caps))
    load_end = os.getloadavg()
    print(f"load average at the end {_load(load_end)} (1, 5, 15 min; {os.cpu_count()} cores)")
    if args.json:
        machine = {
            "cores": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in load_end],
        }
        figures = {"size": len(caps), "machine": machine, "runs": results, "targets": verdicts}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures written to {args.json}")


def write_catalog(caps: list[Capability], path: Path) -> Path:
    """``caps`` in the ``tools.jsonl`` format of ``shared/data`` (what ``import jsonl`` reads)."""
    with path.open("w", encoding="utf-8") as handle:
        for cap in caps:
            record = {
                "id": cap.name,
                "name": cap.name,
                "description": cap.description,
                "parameters": cap.full_schema,
                "category": cap.category,
            }
            handle.write(json.dumps(record) + "\n")
    return path


def stack_env(embedder: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CAPDISC_REDIS_URL"}
    env["CAPDISC_EMBEDDER"] = embedder
    return env


def run_embedder(
    embedder: str, catalog: Path, timeout_s: float, floor_after: bool = False
) -> dict[str, Any]:
    """A fresh stack with ``embedder``: the cold import, the served version, the re-import;
    with ``floor_after``, the floor timed again after the import."""
    env = stack_env(embedder)
    settings = Settings.load(env)
    with (
        tempfile.TemporaryDirectory(prefix="capdisc-bulk-stack-") as project,
        running_stack(Path(project), settings, env) as (stack, url),
    ):
        client = redis.Redis.from_url(url)
        started = time.perf_counter()
        stack.wait_for_workers(client, {"indexing", "discovery"}, WORKER_START_S)
        result: dict[str, Any] = {
            "embedder": embedder,
            "workers_ready_s": round(time.perf_counter() - started, 2),
        }
        print(
            f"\nembedder {embedder}: stack started, workers ready in "
            f"{result['workers_ready_s']:.1f} s"
        )
        floor = model_floor(settings, catalog)
        result["floor"] = floor
        print_floor("model's own time (the floor)", floor)
        publisher = Publisher(url)
        try:
            pids = stack.supervisor.pids()
            first = timed_import(client, publisher, catalog, settings.tenant, timeout_s, pids)
            first["served"] = time_to_served(url, settings.tenant, first, timeout_s)
            floors = [floor["model_s"]]
            if floor_after:
                result["floor_after"] = model_floor(settings, catalog)
                print_floor("the floor again, after the import", result["floor_after"])
                floors.append(result["floor_after"]["model_s"])
                first["floor_ratios"] = [round(first["wall_s"] / f, 3) for f in floors]
            first["floor_s"] = round(sum(floors) / len(floors), 3)
            first["floor_ratio"] = round(first["wall_s"] / first["floor_s"], 3)
            print_import("import", first)
            again = timed_import(client, publisher, catalog, settings.tenant, timeout_s)
            print_import("same import again, unchanged", again)
        finally:
            publisher.close()
    return {**result, "import": first, "reimport": again}


def print_floor(label: str, floor: dict[str, Any]) -> None:
    print(
        f"  {label}: {floor['model_s']:.2f} s for "
        f"{floor['texts']:,} distinct texts ({floor['texts_per_s']:.0f} texts/s, "
        f"{floor['cpu_s']:.1f} s of CPU, {floor['embedder_id']}, in this process while the "
        "stack is idle; load "
        f"{_load(floor['loadavg_start'])} -> {_load(floor['loadavg_end'])})"
    )


def model_floor(settings: Settings, catalog: Path) -> dict[str, Any]:
    """The model's own time on exactly the distinct texts the import of ``catalog`` will embed
    (each capability as a worker builds it from its event), with the embedder a worker makes
    from ``settings``, in this process, after a warm-up call (which loads the model)."""
    read = read_jsonl_catalog(catalog.resolve(), f"jsonl:{catalog.resolve()}")
    texts = list(
        dict.fromkeys(
            text
            for cap in read.found.values()
            for text in embedding_texts(capability_from_record(cap.to_dict(), "floor"))
        )
    )
    embedder = embedder_for(settings)
    embedder.embed(texts[:64])  # loads the model (its many-text session too); not timed
    load_start = os.getloadavg()
    started, cpu_started = time.perf_counter(), time.process_time()
    vectors = embedder.embed(texts)
    model_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    assert len(vectors) == len(texts)
    return {
        "embedder_id": embedder.id,
        "texts": len(texts),
        "model_s": round(model_s, 3),
        "texts_per_s": round(len(texts) / model_s, 1),
        "cpu_s": round(cpu_s, 2),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def process_cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system, all threads) each named process and this one used so far,
    from ``/proc`` (nothing where there is none)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in {**pids, "benchmark": os.getpid()}.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return out


def _load(loadavg: tuple[float, ...] | list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in loadavg)


def timed_import(
    client: redis.Redis,
    publisher: Publisher,
    catalog: Path,
    tenant: str,
    timeout_s: float,
    pids: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One ``import jsonl`` of ``catalog``, waiting for every ack; the embedding calls it cost
    (read outside the timed part: ``collect_status`` reads every record); with ``pids``, the
    CPU seconds each of those processes (and this one) used during the timed part."""
    calls_before = collect_status(client)["embedding_calls"]
    cpu_before = process_cpu_s(pids) if pids is not None else {}
    started = time.perf_counter()
    report = import_jsonl(
        client,
        publisher,
        catalog,
        tenant=tenant,
        wait_s=timeout_s,
        progress=progress_printer(started),
    )
    wall_s = time.perf_counter() - started
    cpu_s = {
        name: round(used - cpu_before.get(name, 0.0), 2)
        for name, used in (process_cpu_s(pids) if pids is not None else {}).items()
    }
    calls = collect_status(client)["embedding_calls"] - calls_before
    plan = report.plan
    return {
        "wall_s": round(wall_s, 3),
        "lines": len(plan.upserts) + len(plan.unchanged) + len(plan.errors),
        "upserts": len(plan.upserts),
        "deletes": len(plan.deletes),
        "unchanged": len(plan.unchanged),
        "rejected_lines": len(plan.errors),
        "events_sent": report.sent,
        "events_applied": len(report.outcomes),
        "complete": report.complete,
        "embedding_calls": calls,
        "decisions": dict(Counter(str(o.get("decision")) for o in report.outcomes)),
        "index_version": report.index_version or tenant_version(client, tenant),
        "caps_per_s": round(len(plan.upserts) / wall_s, 1) if plan.upserts else None,
        **({"cpu_s": cpu_s} if pids is not None else {}),
    }


def progress_printer(started: float, every: int = 1000) -> Progress:
    """A ``progress`` callback that prints a line to stderr every ``every`` applied events."""
    applied = [0]

    def progress(stage: str, count: int) -> None:
        if stage != "applied":
            return
        before, applied[0] = applied[0], applied[0] + count
        if applied[0] // every > before // every:
            print(
                f"  ... {applied[0]} events applied, {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    return progress


def time_to_served(
    url: str, tenant: str, first: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    """How long after the last ack the discovery worker answers from the final version (asked
    again while it answers from an older one: a worker waits at most ``discover_timeout_s``
    for ``min_version``, then answers from what it has)."""
    version = first["index_version"]
    started = time.perf_counter()
    with Client.from_url(url, tenant=tenant, timeout_s=timeout_s) as discovery:
        answer = discovery.discover(READY_QUERY, min_version=version)
        while answer.index_version < version and time.perf_counter() - started < timeout_s:
            answer = discovery.discover(READY_QUERY, min_version=version)
    after_ack_s = time.perf_counter() - started
    return {
        "index_version": answer.index_version,
        "total_indexed": answer.raw.get("total_indexed"),
        "after_last_ack_s": round(after_ack_s, 3),
        "after_import_start_s": round(first["wall_s"] + after_ack_s, 3),
    }


def print_import(label: str, figures: dict[str, Any]) -> None:
    rate = f"{figures['caps_per_s']:.1f} caps/s" if figures["upserts"] else "nothing to upsert"
    print(
        f"  {label}: {figures['wall_s']:.2f} s wall, {rate}; {figures['upserts']} upserted, "
        f"{figures['unchanged']} unchanged, {figures['rejected_lines']} rejected lines; "
        f"{figures['events_sent']} events sent, {figures['events_applied']} acked; "
        f"embedding calls (texts embedded) {figures['embedding_calls']}; index version "
        f"{figures['index_version']}"
    )
    if "floor_ratio" in figures:
        cpu = ", ".join(f"{name} {s:.1f} s" for name, s in figures["cpu_s"].items())
        both = (
            " (the mean of the floors before and after it; against each: "
            + " / ".join(f"{r:.2f} x" for r in figures["floor_ratios"])
            + ")"
            if "floor_ratios" in figures
            else ""
        )
        print(
            f"  import {figures['wall_s']:.2f} s against the model's own "
            f"{figures['floor_s']:.2f} s{both}: {figures['floor_ratio']:.2f} x"
            f"; CPU during the import: {cpu}; load after it {_load(os.getloadavg())}"
        )
    if not figures["complete"]:
        print(
            f"  INCOMPLETE: only {figures['events_applied']} of {figures['events_sent']} "
            "events were acked before --timeout"
        )
    if "served" in figures:
        served = figures["served"]
        print(
            f"  discovery worker serves index version {served['index_version']} "
            f"({served['total_indexed']} capabilities) {served['after_import_start_s']:.2f} s "
            f"after the import started ({served['after_last_ack_s']:.2f} s after the last ack)"
        )


def print_targets(results: list[dict[str, Any]], size: int) -> dict[str, str]:
    print()
    verdicts = {
        "import_local_embedder": import_target(results, size),
        "reimport_zero_calls": reimport_target(results),
        "import_within_floor_ratio": floor_target(results),
    }
    return verdicts


def local_run(results: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    """The run with the local embedder; None, having printed ``label`` as not measured."""
    local = next((r for r in results if r["embedder"] == LOCAL_EMBEDDER), None)
    if local is None:
        print(f"{label}: NOT MEASURED ({LOCAL_EMBEDDER} not in --embedders)")
    return local


def import_target(results: list[dict[str, Any]], size: int) -> str:
    label = (
        f"target, {TARGET_SIZE:,} capabilities imported in <= {TARGET_S:.0f} s with "
        f"the local embedder ({LOCAL_EMBEDDER})"
    )
    local = local_run(results, label)
    if local is None:
        return "not measured"
    figures = local["import"]
    needed = TARGET_SIZE / TARGET_S
    met = figures["complete"] and figures["wall_s"] <= TARGET_S * size / TARGET_SIZE
    scaled = (
        ""
        if size == TARGET_SIZE
        else (f"; measured at {size:,}, so compared by rate with {needed:.1f} caps/s")
    )
    verdict = "MET" if met else "NOT MET"
    print(
        f"{label}: {verdict} ({figures['wall_s']:.1f} s for {size:,}, "
        f"{figures['caps_per_s']} caps/s{scaled})"
    )
    return verdict


def floor_target(results: list[dict[str, Any]]) -> str:
    label = (
        f"target, the import within {TARGET_FLOOR_RATIO:.2f} x the model's own time on its "
        f"texts, measured in the same run ({LOCAL_EMBEDDER})"
    )
    local = local_run(results, label)
    if local is None:
        return "not measured"
    figures = local["import"]
    met = figures["complete"] and figures["floor_ratio"] <= TARGET_FLOOR_RATIO
    verdict = "MET" if met else "NOT MET"
    print(
        f"{label}: {verdict} ({figures['wall_s']:.1f} s against {figures['floor_s']:.1f} s: "
        f"{figures['floor_ratio']:.2f} x)"
    )
    return verdict


def reimport_target(results: list[dict[str, Any]]) -> str:
    calls = {r["embedder"]: r["reimport"]["embedding_calls"] for r in results}
    verdict = "MET" if calls and not any(calls.values()) else "NOT MET"
    shown = ", ".join(f"{name} {n}" for name, n in calls.items()) or "no runs"
    print(f"target, 0 embedding calls on the unchanged re-import: {verdict} ({shown})")
    return verdict


if __name__ == "__main__":
    main()
