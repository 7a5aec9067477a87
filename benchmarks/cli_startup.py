"""Start-up time of the ``capdisc`` command, against ``python -c pass`` measured in the same run.

Starts the embedded stack in a temporary project (its own Redis, one indexing and one discovery
worker, the hashing embedder so that no model load or inference counts, auth on as with
``make up``), publishes the example registry, then runs from the project directory, interleaved
(so every command sees the same machine), ``--runs`` times each:

* ``python -c pass`` (the floor: the interpreter and ``site``),
* ``capdisc --help`` and ``capdisc --version``,
* ``capdisc discover QUERY`` (end to end: start-up, finding the stack, the request, the answer
  printed).

Printed: the wall time of each (median, p99) and its ratio to ``python -c pass`` (median over
median), then the same commands again with ``PYTHONPROFILEIMPORTTIME=1``: the import time each
process reports (the sum of its top-level imports' cumulative times; a discover's request is
not in it), less the floor's, and the largest top-level imports of ``discover``. The target is
at most 0.3 s of start-up (imports) beyond the floor.

    .venv/bin/python benchmarks/cli_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))

from _common import example_registry_stack, percentile, publish_registry
from capdisc.logs import configure_logging
from capdisc.settings import Settings
from capdisc_producers.stack import REDIS_ENV

QUERY = "post a message to the team's slack channel"
#: The start-up a command may spend beyond ``python -c pass``: short enough that a command
#: feels instant.
TARGET_S = 0.3
CAPDISC = str(Path(sys.executable).with_name("capdisc"))


def commands() -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "capdisc --help": [CAPDISC, "--help"],
        "capdisc --version": [CAPDISC, "--version"],
        "capdisc discover": [CAPDISC, "discover", QUERY],
    }


def run(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    """Wall time of one run (it must succeed) and its stderr."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return took, done.stderr


def import_times(stderr: str) -> dict[str, float]:
    """Top-level module -> cumulative import seconds, from ``-X importtime`` lines."""
    tops: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if cumulative.strip().isdigit() and not name[1:].startswith(" "):
            tops[name.strip()] = tops.get(name.strip(), 0.0) + int(cumulative) / 1e6
    return tops


def figures(values: Sequence[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:7.1f} ms, p99 "
        f"{percentile(values, 99) * 1000:7.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    configure_logging("WARNING", "console")  # the stack's own lines are not figures
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env["CAPDISC_EMBEDDER"] = "hashing"
    settings = Settings.load(env).with_changes(auth=True)
    load_before = os.getloadavg()
    with example_registry_stack(settings, env) as (stack, url, registry):
        project = registry.parent
        connection = redis.Redis.from_url(url)
        stack.wait_for_workers(connection, {"indexing", "discovery"}, 120)
        report = publish_registry(connection, url, registry, settings, stack.service_token())
        cli_env = {k: v for k, v in env.items() if k != REDIS_ENV}
        # served, and the query's embedding cached in the worker, before anything is timed
        run(
            [CAPDISC, "discover", QUERY, "--min-version", str(report.index_version)],
            project,
            cli_env,
        )
        walls: dict[str, list[float]] = defaultdict(list)
        imports: dict[str, list[dict[str, float]]] = defaultdict(list)
        timed_env = {**cli_env, "PYTHONPROFILEIMPORTTIME": "1"}
        for _ in range(args.runs):
            for name, argv in commands().items():
                walls[name].append(run(argv, project, cli_env)[0])
        for _ in range(args.runs):
            for name, argv in commands().items():
                imports[name].append(import_times(run(argv, project, timed_env)[1]))
    load_after = os.getloadavg()
    print(render(walls, imports, args.runs, load_before, load_after))


def render(
    walls: dict[str, list[float]],
    imports: dict[str, list[dict[str, float]]],
    runs: int,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    floor = statistics.median(walls["python -c pass"])
    lines = [
        f"{datetime.date.today()}, {platform.node()}: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after (1 min); embedder hashing, auth on; {runs} runs each, "
        "interleaved",
        "",
        "wall time, from the project directory:",
    ]
    for name, values in walls.items():
        ratio = statistics.median(values) / floor
        lines.append(f"  {name:<20} {figures(values)}   {ratio:5.1f}x python -c pass")
    lines += [
        "",
        "import time (-X importtime: the sum of the top-level imports), less the floor's:",
    ]
    totals = {name: [sum(run.values()) for run in runs_] for name, runs_ in imports.items()}
    base = statistics.median(totals["python -c pass"])
    for name, values in totals.items():
        beyond = statistics.median(values) - base
        verdict = (
            ""
            if name == "python -c pass"
            else f"   beyond the floor {beyond * 1000:6.1f} ms: "
            + ("MET" if beyond <= TARGET_S else "NOT MET")
            + f" (target {TARGET_S * 1000:.0f} ms)"
        )
        lines.append(f"  {name:<20} {figures(values)}{verdict}")
    largest: dict[str, list[float]] = defaultdict(list)
    for run_ in imports["capdisc discover"]:
        for module, seconds in run_.items():
            largest[module].append(seconds)
    top = sorted(largest.items(), key=lambda item: -statistics.median(item[1]))[:6]
    lines += ["", "largest top-level imports of capdisc discover (median):"]
    lines += [f"  {module:<28} {statistics.median(v) * 1000:6.1f} ms" for module, v in top]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
