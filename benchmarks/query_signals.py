"""Two offline studies on the generalization catalogs: how the lexical side enters the fusion,
and query-level signals for abstention beyond the top cosine.

Both score each query with the index's own parts (the dense matrix in its search space, the
BM25 lexicon) but outside the engine: no decomposition, exact names or graph, so the fusion
figures are of the whole-query mix alone, comparable with each other and with plain fusion.

    .venv/bin/python benchmarks/query_signals.py fusion [--only NAME,...]
    .venv/bin/python benchmarks/query_signals.py abstention [--features top,z,probe,...]

``fusion`` prints recall@5 of the z-score mix (the engine's before coverage damping) and of
variants that damp the lexical z: min-max normalization, a cap at the dense top z, moments over
the dense top 100, the lexical z times the row's query coverage, or the square root of its
coverage of the query's best-covered part (the engine's damping, applied to every row), or
gated by its dense z, scaled by catalog size.

``abstention`` fits a logistic model of "answerable" over query-level features on all
catalogs but one group (catalogs that share queries are one group: the two MCP catalogs;
MetaTool, MetaTool among the MCP tools and Seal-Tools, which share their no-tool questions),
and prints, per left-out catalog, the no-tool questions abstained at the threshold keeping 95%
of answerable queries answered, against the top cosine alone; and the same for "relevant tools
removed" (each answerable query with its relevant tools taken out: a tool-like question no
tool answers). Features: ``top`` (best cosine), ``z`` (its z over the catalog: how far it stands
out of the query's background), ``gap10`` (best minus 10th), ``cov5`` (best BM25 coverage of
the query among the dense top 5), ``covlex`` (the same among the BM25 top 5), ``probe`` (the
nearest probe query's cosine).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from capdisc.bench.evaluation import default_cache_dir, recall_at
from capdisc.embedders.factory import make_embedder
from capdisc.retrieval.decompose import decompose
from generalization import SUITES, Loaded, _plain, _present, load

Array = np.ndarray[Any, np.dtype[np.float64]]
GROUPS = (
    {"mcp-servers", "mcp-10k"},
    {"rest-apis"},
    {"metatool", "metatool+mcp-10k", "seal-tools"},
)
DENSE_WEIGHT = 0.7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=["fusion", "abstention"])
    parser.add_argument("--only", default=None, help="comma-separated catalog names (fusion)")
    parser.add_argument("--features", default="top,z,probe", help="abstention features")
    args = parser.parse_args()
    embedder = make_embedder("minilm")
    chosen = set(args.only.split(",")) if args.only else None
    suites = [s for s in SUITES if (chosen is None or s.name in chosen) and _present(s)]
    loaded = (load(suite, embedder, default_cache_dir()) for suite in suites)
    if args.study == "fusion":
        for item in loaded:
            print(_fusion_row(item), flush=True)
    else:
        _abstention({item.suite.name: _query_features(item) for item in loaded}, args.features)


# -- fusion ------------------------------------------------------------------------------------


def _z(x: Array) -> Array:
    sd = float(x.std())
    return (x - x.mean()) / sd if sd > 1e-9 else np.zeros_like(x)


def _minmax(x: Array) -> Array:
    span = float(x.max() - x.min())
    return (x - x.min()) / span if span > 1e-12 else np.zeros_like(x)


def _variants(cosine: Array, bm25: Array, coverage: Array, parts: Array) -> dict[str, Array]:
    w = DENSE_WEIGHT
    dz, lz = _z(cosine), _z(bm25)
    pool = np.argsort(-cosine)[:100]
    mean, sd = float(bm25[pool].mean()), float(bm25[pool].std())
    pool_z = (bm25 - mean) / sd if sd > 1e-9 else np.zeros_like(bm25)
    size = min(1.0, math.sqrt(1000 / max(len(bm25), 1)))
    lexical = {
        "zscore": lz,
        "capped at dense top": np.minimum(lz, dz.max()),
        "capped at 2x dense top": np.minimum(lz, 2 * dz.max()),
        "moments of dense top 100": pool_z,
        "x sqrt(1000/rows)": lz * size,
        "x coverage": lz * coverage,
        "x sqrt(part coverage), positive": np.where(lz > 0, lz * np.sqrt(parts), lz),
        "x sigmoid(dense z)": lz / (1 + np.exp(-dz)),
        "x sigmoid(dense z - 1)": lz / (1 + np.exp(-(dz - 1))),
    }
    mixed = {name: w * dz + (1 - w) * side for name, side in lexical.items()}
    return {"min-max": w * _minmax(cosine) + (1 - w) * _minmax(bm25), **mixed}


def _fusion_row(item: Loaded) -> str:
    index = item.snapshot.retriever.index  # type: ignore[attr-defined]
    recalls: dict[str, list[float]] = {}
    for query in item.answerable:
        cosine, bm25, terms = _scored(index, item, query.query)
        coverage, parts = np.zeros_like(bm25), np.zeros_like(bm25)
        hit = np.flatnonzero(bm25 > 0)
        if hit.size:
            coverage[hit] = index.lexicon.coverage(terms, [int(r) for r in hit])
            split = decompose(query.query)
            sets = [terms, *(index.lexicon.term_ids(p) for p in split if len(split) > 1)]
            parts[hit] = index.lexicon.coverage_many(sets, hit.astype(np.int64)).max(axis=0)
        for name, fused in _variants(cosine, bm25, coverage, parts).items():
            top = [index.ids[i] for i in np.argsort(-fused)[:5]]
            recalls.setdefault(name, []).append(recall_at(top, query.relevant, 5))
    cells = "  ".join(f"{name} {np.mean(r):.3f}" for name, r in recalls.items())
    return f"{item.suite.name:<18} plain {_plain(item)['recall@5']:.3f}  {cells}"


def _scored(index: Any, item: Loaded, text: str) -> tuple[Array, Array, Any]:
    vector = index._project(np.asarray(item.vectors.vectors[text], dtype=np.float32))
    terms = index.lexicon.term_ids(text)
    cosine = (index.matrix @ vector).astype(np.float64)
    return cosine, index.lexicon.scores(terms).astype(np.float64), terms


# -- abstention --------------------------------------------------------------------------------


def _query_features(item: Loaded) -> dict[str, Any]:
    """Per query (answerable first, then no-tool): its features, and for answerable ones the
    same with the relevant tools removed (prefixed ``r``)."""
    index = item.snapshot.retriever.index  # type: ignore[attr-defined]
    rows = {tool: row for row, tool in enumerate(index.ids)}
    out = []
    for n, query in enumerate([*item.answerable, *item.no_tool]):
        cosine, bm25, terms = _scored(index, item, query.query)
        probe = 0.0
        if index.probe_rows is not None:
            vector = np.asarray(item.vectors.vectors[query.query], dtype=np.float32)
            probe = float((index.probe_rows @ index._project(vector)).max())
        features = _features(index, cosine, bm25, terms, float(cosine.mean()), float(cosine.std()))
        features["probe"] = probe
        if n < len(item.answerable):
            removed = [rows[t] for t in query.relevant if t in rows]
            cosine[removed], bm25[removed] = -1.0, -1.0
            mean, sd = features["mean"], features["sd"]
            masked = _features(index, cosine, bm25, terms, mean, sd)
            features |= {"r" + k: v for k, v in masked.items()} | {"rprobe": probe}
        out.append(features)
    return {"answerable": len(item.answerable), "queries": out}


def _features(
    index: Any, cosine: Array, bm25: Array, terms: Any, mean: float, sd: float
) -> dict[str, float]:
    order = np.argsort(-cosine)
    top = float(cosine[order[0]])
    by_lexicon = [int(r) for r in np.argsort(-bm25)[:5]]
    return {
        "top": top,
        "z": (top - mean) / max(sd, 1e-9),
        "gap10": top - float(cosine[order[min(9, len(order) - 1)]]),
        "cov5": float(index.lexicon.coverage(terms, [int(r) for r in order[:5]]).max()),
        "covlex": float(index.lexicon.coverage(terms, by_lexicon).max()),
        "mean": mean,
        "sd": sd,
    }


def _abstention(data: dict[str, dict[str, Any]], features: str) -> None:
    keys = features.split(",")
    print(f"abstained at 95% answered: top cosine alone -> logistic over {keys}, fitted on the")
    print("other groups' answerable (weight 1/2) and no-tool questions (weight 1/2)")
    print(f"{'left out':<18} {'no-tool questions':>20}   {'relevant removed':>18}   coefficients")
    for held in data:
        group = next(g for g in GROUPS if held in g)
        train = [name for name in data if name not in group]
        predict, beta = _fit(*_training(data, train, keys))
        queries, n = data[held]["queries"], data[held]["answerable"]
        p = predict(_matrix(queries, keys))
        removed = predict(_matrix(queries[:n], keys, "r"))
        top = np.array([q["top"] for q in queries])
        removed_top = np.array([q["rtop"] for q in queries[:n]])
        print(
            f"{held:<18} {_at95(top[:n], top[n:]):>8.3f} -> {_at95(p[:n], p[n:]):.3f}   "
            f"{_at95(top[:n], removed_top):>6.3f} -> {_at95(p[:n], removed):.3f}   "
            f"{np.round(beta, 2).tolist()}"
        )


def _matrix(queries: list[dict[str, float]], keys: list[str], prefix: str = "") -> Array:
    return np.array([[q[prefix + k] for k in keys] for q in queries])


def _training(
    data: dict[str, dict[str, Any]], names: list[str], keys: list[str]
) -> tuple[Array, Array, Array]:
    xs, ys, ws = [], [], []
    for name in names:
        queries, n = data[name]["queries"], data[name]["answerable"]
        x = _matrix(queries, keys)
        y = np.r_[np.ones(n), np.zeros(len(x) - n)]
        xs.append(x)
        ys.append(y)
        ws.append(np.where(y == 1, 0.5 / n, 0.5 / max(len(x) - n, 1)))
    return np.vstack(xs), np.concatenate(ys), np.concatenate(ws)


def _fit(x: Array, y: Array, w: Array, l2: float = 1e-2) -> tuple[Callable[[Array], Array], Array]:
    """Weighted L2 logistic regression on standardized features (Newton steps)."""
    mu, sd = x.mean(0), x.std(0) + 1e-9
    design = np.c_[np.ones(len(x)), (x - mu) / sd]
    beta = np.zeros(design.shape[1])
    ridge = l2 * np.diag(np.r_[0.0, np.ones(len(beta) - 1)])
    for _ in range(50):
        p = 1 / (1 + np.exp(-design @ beta))
        gradient = design.T @ (w * (p - y)) + ridge @ beta
        hessian = (
            (design * (w * p * (1 - p))[:, None]).T @ design + ridge + 1e-9 * np.eye(len(beta))
        )
        beta -= np.linalg.solve(hessian, gradient)

    def predict(z: Array) -> Array:
        scores: Array = 1 / (1 + np.exp(-np.c_[np.ones(len(z)), (z - mu) / sd] @ beta))
        return scores

    return predict, beta


def _at95(answerable: Array, negatives: Array) -> float:
    """Share of ``negatives`` under the score that keeps 95% of ``answerable`` answered."""
    if not len(negatives):
        return float("nan")
    return float((negatives < np.quantile(answerable, 0.05)).mean())


if __name__ == "__main__":
    main()
