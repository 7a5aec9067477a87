"""Every retrieval change on every catalog, against plain fusion, with leave-one-catalog-out fits.

The protocol of docs/benchmarks.md ("Generalization"): a change counts as a gain only when it
beats plain fusion (:mod:`capdisc.bench.baseline`) on every catalog and costs MetaTool and
Seal-Tools no more than 0.01 recall@5. The catalogs are the development sets of
``benchmarks/data/`` (real MCP servers, a 10k+ catalog of near-duplicate MCP tools, a REST API
catalog; each with multi-step tasks and written no-tool questions), MetaTool and Seal-Tools from
``../shared/data``, and MetaTool among the 10k MCP tools as distractors.

Per catalog it prints recall@5 and NDCG@5 of plain fusion, of the engine ranking alone
(abstention off) and of the engine; the share of answerable queries the engine abstained on; and
the share of no-tool questions abstained, at the default threshold and at the threshold that
keeps 95% of answerable queries answered.

    .venv/bin/python benchmarks/generalization.py [--set KEY=VALUE ...] [--only NAME,...]
                                                  [--fit KEY=V1,V2,...] [--json PATH]
                                                  [--servers PART,...] [--by-kind]
                                                  [--full-weight W]

``--set`` runs the engine with discovery options changed (``DiscoveryConfig`` keys) beside the
defaults and prints the difference per catalog. ``--fit`` is the leave-one-catalog-out check of
a constant: for each catalog, the value that does best on all the others is chosen and its
score on the one left out is printed beside the default's. ``--servers`` sets, for the whole
run, what the capability texts carry of the MCP server a tool came from
(:class:`capdisc.retrieval.text.ServerContext`: a comma-separated subset of
``lexical,full,summary``, or ``none``: the texts of before). ``--by-kind`` adds recall@5 per
query kind (single, names-server, multi-step) where the queries have kinds, and for tasks
labelled with their steps the share of steps found (a step is found when one of its tools is
in the top 5). ``--full-weight`` sets, for the whole run, the full text's weight in each
stored vector against the summary's (:func:`capdisc.retrieval.text.combine`; 1.0: the full
text alone, one text embedded per capability instead of two).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from capdisc.bench.baseline import PlainFusion
from capdisc.bench.evaluation import (
    LabelledQuery,
    QueryVectors,
    build_snapshot,
    default_cache_dir,
    load_queries,
    ndcg_at,
    recall_at,
    run_queries,
    sample_queries,
)
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.snapshot import HybridRetriever, IndexSnapshot
from capdisc.embedders.factory import make_embedder
from capdisc.embedders.port import Embedder
from capdisc.registry.catalogs import Catalog, load_catalog
from capdisc.retrieval import text
from capdisc.retrieval.config import calibrated_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DEV = ROOT / "benchmarks" / "data"
NO_TOOL = ROOT / "benchmarks" / "no_tool_queries.jsonl"
ANSWERED = 0.95


@dataclass(frozen=True)
class Suite:
    name: str
    tools: tuple[Path, ...]
    queries: Path
    sample: int | None = None
    #: Written no-tool questions added to the suite's own (those with no relevant tool).
    extra_no_tool: Path | None = None


def _folder(root: Path, name: str, *distractors: Path, **options: Any) -> Suite:
    """The suite of ``root/name``'s ``tools.jsonl`` (plus ``distractors``) and queries."""
    tools = (root / name / "tools.jsonl", *distractors)
    return Suite(name, tools, root / name / "queries.jsonl", **options)


MCP_10K = DEV / "mcp-10k" / "tools.jsonl"
SUITES = (
    _folder(DEV, "mcp-servers"),
    _folder(DEV, "mcp-10k"),
    _folder(DEV, "rest-apis"),
    replace(
        _folder(SHARED, "metatool", MCP_10K, sample=3000, extra_no_tool=NO_TOOL),
        name="metatool+mcp-10k",
    ),
    _folder(SHARED, "metatool", sample=3000, extra_no_tool=NO_TOOL),
    _folder(SHARED, "seal-tools", extra_no_tool=NO_TOOL),
)


@dataclass
class Loaded:
    suite: Suite
    catalog: Catalog
    snapshot: IndexSnapshot
    plain: PlainFusion
    answerable: list[LabelledQuery]
    no_tool: list[LabelledQuery]
    vectors: QueryVectors


def main(
    argv: Sequence[str] | None = None,
    embedder: Embedder | None = None,
    asker: Embedder | None = None,
) -> None:
    """The table; ``embedder`` (and ``asker`` for the queries, when it embeds them apart) in
    place of ``--embedder``'s."""
    args = _arguments(argv)
    if args.servers is not None:
        text.SERVER_CONTEXT = _server_context(args.servers)
    embedder = embedder or make_embedder(args.embedder)
    cache = default_cache_dir()
    chosen = set(args.only.split(",")) if args.only else None
    suites = [s for s in SUITES if (chosen is None or s.name in chosen) and _present(s)]
    overrides = dict(_pair(item) for item in args.set)
    report: dict[str, Any] = {
        "embedder": embedder.id,
        "overrides": overrides,
        "servers": asdict(text.SERVER_CONTEXT),
        "full_weight": args.full_weight,
        "catalogs": {},
    }
    loaded = [load(suite, embedder, cache, asker, args.full_weight) for suite in suites]
    print(_header(bool(overrides)))
    for item in loaded:
        figures = measure(item, overrides)
        report["catalogs"][item.suite.name] = figures
        print(_row(item.suite.name, figures))
    if args.by_kind:
        print(
            f"\nrecall@5 by query kind (plain / rank / engine){' / changed rank' * bool(overrides)}"
        )
        for item in loaded:
            kinds = by_kind(item, overrides)
            if kinds:
                report["catalogs"][item.suite.name]["by_kind"] = kinds
                print(_kind_rows(item.suite.name, kinds))
    if args.fit:
        key, values = args.fit.split("=", 1)
        report["fit"] = leave_one_out(loaded, key, [_value(v) for v in values.split(",")])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--only", default=None, help="comma-separated catalog names")
    parser.add_argument("--fit", default=None, metavar="KEY=V1,V2,...")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--servers",
        default=None,
        metavar="PART,...",
        help="MCP server in the texts: lexical,full,summary or none (default: the code's)",
    )
    parser.add_argument("--by-kind", action="store_true", help="recall@5 per query kind")
    parser.add_argument(
        "--full-weight",
        type=float,
        default=text.FULL_TEXT_WEIGHT,
        metavar="W",
        help="the full text's weight in the stored vectors (1.0: the full text alone)",
    )
    return parser.parse_args(argv)


def _server_context(parts: str) -> text.ServerContext:
    chosen = {p.strip() for p in parts.split(",") if p.strip() and p.strip() != "none"}
    known = {f.name for f in fields(text.ServerContext)}
    if chosen - known:
        raise SystemExit(f"--servers: unknown {sorted(chosen - known)}; known: {sorted(known)}")
    return text.ServerContext(**dict.fromkeys(chosen, True))


def _present(suite: Suite) -> bool:
    return all(p.is_file() for p in (*suite.tools, suite.queries))


def _pair(item: str) -> tuple[str, Any]:
    key, value = item.split("=", 1)
    return key, _value(value)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# -- loading ---------------------------------------------------------------------------------------


def load(
    suite: Suite,
    embedder: Embedder,
    cache: Path,
    asker: Embedder | None = None,
    full_weight: float = text.FULL_TEXT_WEIGHT,
) -> Loaded:
    """``suite`` indexed with ``embedder`` (stored vectors weighting the full text by
    ``full_weight``), its queries embedded with ``asker`` (the same one unless a model embeds
    queries and documents differently)."""
    catalog = load_catalog(_joined(suite, cache))
    queries = load_queries(suite.queries, catalog)
    answerable = sample_queries([q for q in queries if q.relevant], suite.sample, 0)
    no_tool = [q for q in queries if not q.relevant]
    if suite.extra_no_tool is not None:
        no_tool += load_queries(suite.extra_no_tool, catalog)
    snapshot = build_snapshot(
        catalog.capabilities, embedder, cache_dir=cache, full_weight=full_weight
    )
    plain = PlainFusion.build(catalog.capabilities, embedder, cache)
    asked = (q.query for q in [*answerable, *no_tool])
    vectors = QueryVectors.embed(asker or embedder, asked, cache)
    return Loaded(suite, catalog, snapshot, plain, answerable, no_tool, vectors)


def _joined(suite: Suite, cache: Path) -> Path:
    """The suite's catalog as one file (several tool files are concatenated, first wins),
    written apart and renamed into place, so runs side by side never read it half written."""
    if len(suite.tools) == 1:
        return suite.tools[0]
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"catalog-{suite.name}.jsonl"
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with partial.open("w", encoding="utf-8") as out:
        for part in suite.tools:
            out.write(part.read_text(encoding="utf-8").rstrip("\n") + "\n")
    partial.replace(path)
    return path


# -- measuring -------------------------------------------------------------------------------------


def measure(item: Loaded, overrides: dict[str, Any]) -> dict[str, Any]:
    """Plain fusion, the engine's defaults and, with ``overrides``, the engine changed: keys
    ``retrieval.NAME`` set :class:`capdisc.retrieval.config.RetrievalConfig` fields, the others
    :class:`DiscoveryConfig` options."""
    figures: dict[str, Any] = {
        "tools": len(item.catalog.capabilities),
        "answerable": len(item.answerable),
        "no_tool": len(item.no_tool),
        "plain": _plain(item),
    }
    figures["defaults"] = _engine(item, DiscoveryConfig())
    if overrides:
        figures["changed"] = _changed(item, overrides)
    return figures


def _changed(item: Loaded, overrides: dict[str, Any]) -> dict[str, Any]:
    retrieval = {k.removeprefix("retrieval."): v for k, v in overrides.items() if "." in k}
    options = {k: v for k, v in overrides.items() if "." not in k}
    changed = replace(item, snapshot=_retuned(item.snapshot, retrieval))
    return _engine(changed, DiscoveryConfig().merged(options))


def _retuned(snapshot: IndexSnapshot, fields: dict[str, Any]) -> IndexSnapshot:
    """The snapshot, its index shared, with retrieval knobs changed (RetrievalConfig fields)."""
    if not fields:
        return snapshot
    base = replace(calibrated_for(snapshot.embedder_id), **fields)
    index = snapshot.retriever.index  # type: ignore[attr-defined]
    return replace(snapshot, retriever=HybridRetriever(index, snapshot.embedder_id, base))


def _plain(item: Loaded) -> dict[str, float]:
    ranked = [
        item.plain.search(q.query, item.vectors.vectors[q.query], 10).ids for q in item.answerable
    ]
    return _scores(ranked, item.answerable)


def _engine(item: Loaded, config: DiscoveryConfig) -> dict[str, Any]:
    """Ranking alone, the engine as configured, and abstention at the 95%-answered threshold."""
    free = config.merged({"abstain_threshold": 0.0})
    ranking = run_queries(item.snapshot, item.answerable, item.vectors, config=free)
    served = run_queries(
        item.snapshot, [*item.answerable, *item.no_tool], item.vectors, config=config
    )
    n = len(item.answerable)
    out: dict[str, Any] = {"ranking": _scores([r.ids for r in ranking.results], item.answerable)}
    out["engine"] = _scores([r.ids for r in served.results[:n]], item.answerable)
    out["abstained_answerable"] = _share(r.abstained for r in served.results[:n])
    out["no_tool_abstained"] = _share(r.abstained for r in served.results[n:])
    out["no_tool_abstained_at_95"] = _at_answered(item, config)
    out["latency_ms_p50"] = round(statistics.median(served.latencies_s) * 1000, 3)
    return out


def _at_answered(item: Loaded, config: DiscoveryConfig) -> float | None:
    """No-tool questions abstained at the highest top relevance that keeps 95% answered."""
    if not item.no_tool:
        return None
    loose = config.merged({"abstain_threshold": 0.0, "tier1_min_relevance": 0.0})
    run = run_queries(item.snapshot, [*item.answerable, *item.no_tool], item.vectors, config=loose)
    top = [max((m.relevance for m in r.matches), default=0.0) for r in run.results]  # type: ignore[attr-defined]
    n = len(item.answerable)
    threshold = float(np.quantile(np.asarray(top[:n]), 1.0 - ANSWERED))
    return _share(t < threshold for t in top[n:])


def by_kind(item: Loaded, overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Recall@5 of plain fusion, the ranking, the engine (and the changed ranking) per query
    ``kind``; empty when the queries have no kinds."""
    kinds = [str(q.meta.get("kind", "")) for q in item.answerable]
    if not any(kinds):
        return {}
    rankings = {
        "plain": [
            item.plain.search(q.query, item.vectors.vectors[q.query], 10).ids
            for q in item.answerable
        ],
        **_engine_rankings(item, DiscoveryConfig()),
    }
    if overrides:
        retrieval = {k.removeprefix("retrieval."): v for k, v in overrides.items() if "." in k}
        options = {k: v for k, v in overrides.items() if "." not in k}
        changed = replace(item, snapshot=_retuned(item.snapshot, retrieval))
        rankings["changed"] = _engine_rankings(changed, DiscoveryConfig().merged(options))["rank"]
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted(set(kinds)):
        rows = [i for i, k in enumerate(kinds) if k == kind]
        queries = [item.answerable[i] for i in rows]
        out[kind] = {"queries": len(rows)} | {
            name: _scores([ranked[i] for i in rows], queries)["recall@5"]
            for name, ranked in rankings.items()
        }
        steps = [_steps(q, item.catalog) for q in queries]
        if all(steps):
            out[kind]["steps@5"] = {
                name: _steps_found([ranked[i] for i in rows], steps)
                for name, ranked in rankings.items()
            }
    return out


def _engine_rankings(item: Loaded, config: DiscoveryConfig) -> dict[str, list[Sequence[str]]]:
    free = config.merged({"abstain_threshold": 0.0})
    ranking = run_queries(item.snapshot, item.answerable, item.vectors, config=free)
    served = run_queries(item.snapshot, item.answerable, item.vectors, config=config)
    return {"rank": [r.ids for r in ranking.results], "engine": [r.ids for r in served.results]}


def _scores(ranked: Sequence[Sequence[str]], queries: Sequence[LabelledQuery]) -> dict[str, float]:
    recall = [recall_at(r, q.relevant, 5) for r, q in zip(ranked, queries, strict=True)]
    ndcg = [ndcg_at(r, q.relevant, 5) for r, q in zip(ranked, queries, strict=True)]
    return {"recall@5": round(float(np.mean(recall)), 4), "ndcg@5": round(float(np.mean(ndcg)), 4)}


def _steps(query: LabelledQuery, catalog: Catalog) -> list[set[str]]:
    """The capability ids that can do each step of a multi-step task (its ``steps`` labels);
    empty when it has none."""
    found = (
        [catalog.ids[t] for t in step if t in catalog.ids] for step in query.meta.get("steps", ())
    )
    return [set(ids) for ids in found if ids]


def _steps_found(ranked: Sequence[Sequence[str]], steps: Sequence[list[set[str]]]) -> float:
    """The share of a task's steps with at least one of their tools in its top 5, averaged
    over tasks: unlike recall@5, a task whose steps each have several equivalent tools can
    reach 1."""
    shares = [
        sum(bool(step.intersection(r[:5])) for step in task) / len(task)
        for r, task in zip(ranked, steps, strict=True)
    ]
    return round(float(np.mean(shares)), 4)


def _share(flags: Any) -> float:
    values = list(flags)
    return round(sum(values) / len(values), 4) if values else 0.0


# -- leave one catalog out -------------------------------------------------------------------------


def leave_one_out(loaded: list[Loaded], key: str, values: list[Any]) -> dict[str, Any]:
    """Per catalog: the value best on the others (mean ranking recall@5) and its score here."""
    scores = {
        value: {
            item.suite.name: _changed(item, {key: value})["ranking"]["recall@5"] for item in loaded
        }
        for value in values
    }
    default = {i.suite.name: _engine(i, DiscoveryConfig())["ranking"]["recall@5"] for i in loaded}
    print(f"\nleave one catalog out: {key} in {values} (ranking recall@5)")
    out: dict[str, Any] = {"scores": {str(v): s for v, s in scores.items()}, "held_out": {}}
    for item in loaded:
        name = item.suite.name
        others = {v: statistics.mean(s[o] for o in s if o != name) for v, s in scores.items()}
        best = max(others, key=lambda v: others[v])
        out["held_out"][name] = {
            "chosen": best,
            "score": scores[best][name],
            "default": default[name],
        }
        print(
            f"  {name:<18} chosen on the others {key}={best}: {scores[best][name]:.3f} "
            f"(default {default[name]:.3f}, {scores[best][name] - default[name]:+.3f})"
        )
    return out


# -- printing --------------------------------------------------------------------------------------


def _header(changed: bool) -> str:
    head = (
        f"{'catalog':<18} {'tools':>6} {'q':>5} | {'plain':>6} {'rank':>6} {'engine':>6} "
        f"{'nDCG':>6} | {'abst.ans':>8} {'no-tool':>7} {'@95%':>6}"
    )
    tail = f" | {'changed rank':>15} {'engine':>6} {'abst.ans':>8} {'no-tool':>7} {'@95%':>6}"
    return head + (tail if changed else "")


def _row(name: str, f: dict[str, Any]) -> str:
    d = f["defaults"]
    at95 = d["no_tool_abstained_at_95"]
    row = (
        f"{name:<18} {f['tools']:>6} {f['answerable']:>5} | {f['plain']['recall@5']:>6.3f} "
        f"{d['ranking']['recall@5']:>6.3f} {d['engine']['recall@5']:>6.3f} "
        f"{d['engine']['ndcg@5']:>6.3f} | {d['abstained_answerable']:>8.3f} "
        f"{d['no_tool_abstained']:>7.3f} {at95 if at95 is not None else float('nan'):>6.3f}"
    )
    c = f.get("changed")
    if c:
        c95 = c["no_tool_abstained_at_95"]
        gain = c["ranking"]["recall@5"] - d["ranking"]["recall@5"]
        row += (
            f" | {c['ranking']['recall@5']:>6.3f} ({gain:+.3f}) "
            f"{c['engine']['recall@5']:>6.3f} {c['abstained_answerable']:>8.3f} "
            f"{c['no_tool_abstained']:>7.3f} {c95 if c95 is not None else float('nan'):>6.3f}"
        )
    return row


def _kind_rows(name: str, kinds: dict[str, dict[str, Any]]) -> str:
    rows = []
    for kind, f in kinds.items():
        figures = " / ".join(
            f"{f[k]:.3f}" for k in ("plain", "rank", "engine", "changed") if k in f
        )
        rows.append(f"  {name:<18} {kind:<13} {f['queries']:>5}  {figures}")
        if "steps@5" in f:
            found = " / ".join(f"{v:.3f}" for v in f["steps@5"].values())
            rows.append(f"  {name:<18} {'  steps found':<13} {f['queries']:>5}  {found}")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
