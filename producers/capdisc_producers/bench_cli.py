"""``capdisc bench``: measure discovery on a labelled catalog (issue 3, item 8).

    capdisc bench retrieval --tools T.jsonl --queries Q.jsonl [--sample N] [--seed S] [--json]
                            [--embedder minilm|hashing]

The catalog and queries use the format of ``shared/data`` (see :mod:`capdisc.evaluation`).
Embeddings are cached under ``benchmarks/.cache/`` (or ``CAPDISC_BENCH_CACHE``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from capdisc.embedding import make_embedder
from capdisc.errors import CapdiscError
from capdisc.evaluation import run_retrieval_benchmark

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_ORDER = ("recall@1", "recall@3", "recall@5", "recall@10", "ndcg@5", "complete@5", "hit@5", "mrr")


@click.group()
def bench() -> None:
    """Benchmarks of the discovery engine."""


@bench.command("retrieval")
@click.option("--tools", "tools_path", type=_FILE, required=True, help="tools.jsonl catalog")
@click.option("--queries", "queries_path", type=_FILE, required=True,
              help="queries.jsonl with relevant tool ids (an empty list: nothing fits)")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="Run a random sample of this many queries (default: all)")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample")
@click.option("--embedder", type=click.Choice(["minilm", "hashing"]), default="minilm",
              show_default=True, help="Embedder for the catalog and the queries")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object")
def retrieval(tools_path: Path, queries_path: Path, sample: int | None, seed: int,
              embedder: str, as_json: bool) -> None:
    """Index TOOLS with the discovery engine, run QUERIES and print the retrieval figures."""
    try:
        figures = run_retrieval_benchmark(tools_path, queries_path, sample=sample, seed=seed,
                                          embedder=make_embedder(embedder))
    except (CapdiscError, OSError, ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(figures) if as_json else format_figures(figures))


def format_figures(figures: dict[str, Any]) -> str:
    """The figures as aligned text lines."""
    lines = [f"{figures['queries']} queries over {figures['tools']} tools"]
    lines += [f"  {key:<12} {figures[key]:.3f}" for key in _ORDER if key in figures]
    latency = figures["latency_ms"]
    lines.append(f"  {'latency':<12} median {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms")
    for key in ("abstain_accuracy", "answer_rate"):
        if key in figures:
            lines.append(f"  {key:<12} {figures[key]:.3f}")
    return "\n".join(lines)
