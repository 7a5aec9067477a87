"""``capdisc bench``: measure discovery on a labelled catalog (retrieval quality, tokens).

    capdisc bench retrieval --tools T.jsonl --queries Q.jsonl [--sample N] [--seed S] [--json]
                            [--embedder minilm|hashing]
    capdisc bench tokens (--tools T.jsonl | --registry DIR) [--queries Q.jsonl] [--sample N]
                         [--seed S] [--json] [--embedder minilm|hashing]

The catalog and queries use the format of ``shared/data`` (see :mod:`capdisc.registry.catalogs`
and :mod:`capdisc.bench.evaluation`).
Embeddings are cached under ``benchmarks/.cache/`` (or ``CAPDISC_BENCH_CACHE``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from capdisc.bench.evaluation import (
    build_snapshot,
    default_cache_dir,
    load_queries,
    query_texts,
    run_retrieval_benchmark,
    sample_queries,
)
from capdisc.bench.tokenreport import token_report
from capdisc.embedders.factory import make_embedder
from capdisc.embedders.port import CachedQueryEmbedder
from capdisc.errors import CapdiscError
from capdisc.models import Capability
from capdisc.registry.catalogs import load_catalog
from capdisc.registry.manifest import scan_directory
from capdisc.retrieval.text import summary_text
from capdisc.settings import Settings
from capdisc_producers.exits import exit_status

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
#: What ``capdisc bench``'s exit codes mean.
BENCH_EXITS = exit_status(
    "a catalog or queries file could not be read or scored (the reason is printed)",
    "a usage error",
)
_ORDER = ("recall@1", "recall@3", "recall@5", "recall@10", "ndcg@5", "complete@5", "hit@5", "mrr")


@click.group()
def bench() -> None:
    """Benchmarks of the discovery engine."""


@bench.command("retrieval", epilog=BENCH_EXITS)
@click.option("--tools", "tools_path", type=_FILE, required=True, help="tools.jsonl catalog")
@click.option(
    "--queries",
    "queries_path",
    type=_FILE,
    required=True,
    help="queries.jsonl with relevant tool ids (an empty list: nothing fits)",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    help="Run a random sample of this many queries (default: all)",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample")
@click.option(
    "--embedder",
    type=click.Choice(["minilm", "hashing"]),
    default="minilm",
    show_default=True,
    help="Embedder for the catalog and the queries",
)
@click.option(
    "--no-abstain",
    "no_abstain",
    is_flag=True,
    help="Rank without abstaining (abstain_threshold 0): ranking measured apart from abstention",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object")
def retrieval(
    tools_path: Path,
    queries_path: Path,
    sample: int | None,
    seed: int,
    embedder: str,
    no_abstain: bool,
    as_json: bool,
) -> None:
    """Index TOOLS with the discovery engine, run QUERIES and print the retrieval figures.

    Each line of TOOLS is read on its own: a line that is no valid tool is refused and listed
    with its line and reason (in --json, "refused": [{"line", "reason"}]), the rest is scored;
    a query whose relevant tools were all refused is left out and counted
    ("dropped_queries"). Repairs made to catalog lines are printed as warnings ("notes")."""
    try:
        figures = run_retrieval_benchmark(
            tools_path,
            queries_path,
            sample=sample,
            seed=seed,
            embedder=make_embedder(embedder),
            abstain=not no_abstain,
        )
    except (CapdiscError, OSError, ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(figures))
        return
    for note in figures.get("notes", ()):
        click.echo(f"warning: line {note['line']}: {note['note']}", err=True)
    click.echo(format_figures(figures))


def format_figures(figures: dict[str, Any]) -> str:
    """The figures as aligned text lines, then the catalog lines refused and the queries left
    out for them."""
    lines = [f"{figures['queries']} queries over {figures['tools']} tools"]
    lines += [f"  {key:<12} {figures[key]:.3f}" for key in _ORDER if key in figures]
    latency = figures["latency_ms"]
    lines.append(
        f"  {'latency':<12} median {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms "
        "(query vectors precomputed)"
    )
    fresh = figures.get("latency_with_embedding_ms")
    if fresh:
        lines.append(
            f"  {'':<12} median {fresh['p50']:.2f} ms, p99 {fresh['p99']:.2f} ms "
            f"(the model embedding each query, {fresh['n']} queries)"
        )
    if "abstained_answerable" in figures:
        off = "" if figures.get("abstain", True) else " (abstention off)"
        lines.append(
            f"  {'abstained':<12} {figures['abstained_answerable']:.3f} of answerable queries{off}"
        )
    for key in ("abstain_accuracy", "answer_rate"):
        if key in figures:
            lines.append(f"  {key:<12} {figures[key]:.3f}")
    refused = figures.get("refused", [])
    if refused:
        lines.append(f"refused {len(refused)} catalog line{'s' if len(refused) > 1 else ''}:")
        lines += [f"  line {r['line']}: {r['reason']}" for r in refused]
    if figures.get("dropped_queries"):
        lines.append(
            f"left out {figures['dropped_queries']} queries whose relevant tools were all refused"
        )
    return "\n".join(lines)


@bench.command("tokens", epilog=BENCH_EXITS)
@click.option("--tools", "tools_path", type=_FILE, default=None, help="tools.jsonl catalog")
@click.option(
    "--registry",
    "registry_path",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A directory of CAPABILITY.yaml manifests, instead of --tools",
)
@click.option(
    "--queries",
    "queries_path",
    type=_FILE,
    default=None,
    help="queries.jsonl (default: each capability's summary as a query)",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Number of turns to measure",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample")
@click.option(
    "--embedder",
    type=click.Choice(["minilm", "hashing"]),
    default="minilm",
    show_default=True,
    help="Embedder for the catalog and the queries",
)
@click.option(
    "--counter",
    type=click.Choice(["heuristic", "cl100k"]),
    default=None,
    help="Token counter on both sides (default: the token_counter setting)",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object")
@click.pass_context
def tokens(
    ctx: click.Context,
    tools_path: Path | None,
    registry_path: Path | None,
    queries_path: Path | None,
    sample: int,
    seed: int,
    embedder: str,
    counter: str | None,
    as_json: bool,
) -> None:
    """Tokens of a static dump of every tool against capdisc's tiered answer per turn."""
    if (tools_path is None) == (registry_path is None):
        raise click.UsageError("give exactly one of --tools and --registry")
    settings = ctx.obj["settings"] if ctx.obj else Settings.load()
    try:
        caps, texts = _catalog(tools_path, registry_path, queries_path)
        model = make_embedder(embedder)
        snapshot = build_snapshot(caps, model, cache_dir=default_cache_dir())
        queries = sample_queries(texts, sample, seed)
        config = settings.discovery.merged({"token_counter": counter} if counter else None)
        report = token_report(snapshot, queries, CachedQueryEmbedder(model), config)
    except (CapdiscError, OSError, ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(report) if as_json else format_tokens(report))


def _catalog(
    tools_path: Path | None, registry_path: Path | None, queries_path: Path | None
) -> tuple[list[Capability], list[str]]:
    if tools_path is not None:
        catalog = load_catalog(tools_path)
        for refusal in catalog.refused:
            click.echo(f"refused: line {refusal.line}: {refusal.reason}", err=True)
        caps = list(catalog.capabilities)
        texts = (
            [q.query for q in load_queries(queries_path, catalog)]
            if queries_path
            else [summary_text(c) for c in caps]
        )
        return caps, texts
    assert registry_path is not None
    scan = scan_directory(registry_path)
    for path, error in scan.errors.items():
        click.echo(f"refused: {path}: {error.problem}", err=True)
    caps = list(scan.capabilities.values())
    if not caps:
        why = f"{len(scan.errors)} refused, listed above" if scan.errors else "no CAPABILITY.yaml"
        raise CapdiscError(f"no capability could be read from {registry_path} ({why})")
    if queries_path is None:
        return caps, [summary_text(c) for c in caps]
    return caps, query_texts(queries_path)


def format_tokens(report: dict[str, Any]) -> str:
    """The token report as text lines."""
    turn = report["turn_tokens"]
    return "\n".join(
        [
            f"{report['capabilities']} capabilities, {report['queries']} turns, "
            f"counter {report['counter']}",
            f"  static dump (every tool schema)      {report['static_dump_tokens']:>9,} tokens",
            f"  tiered answer per turn, median       {turn['median']:>9,.0f} tokens "
            f"(max {turn['max']:,}; tier budgets {report['budget_tokens']:,})",
            f"  with the found tools' definitions    {turn['with_tools_median']:>9,.0f} tokens "
            f"(max {turn['with_tools_max']:,})",
            f"  saving at the median                 {report['saving']:>9.1%} "
            f"({report['saving_with_tools']:.1%} with tool definitions)",
            f"  turns over a tier budget             {report['over_budget_turns']:>9}",
        ]
    )
