"""Where MetaTool's remaining misses are, and why the changes that close the gap were rejected.

MetaTool labels 54% of its queries with 47 "merged" tools: one-line umbrella descriptions the
dataset's authors wrote for clusters of similar plugins (FinanceTool, PDF&URLTool, ...), most of
them named "...Tool". The plugins of those clusters are still in the catalog and carry the
queries' vocabulary. This script splits recall@5 and NDCG@5 by the kind of tool a query is
labelled with, for the engine's fusion and for three changes that each raise the MetaTool
figure, measured the same way on Seal-Tools:

- a length prior (a fused-score bonus for short capability texts);
- a query prefix ("tool: " before every query the model sees);
- dense pseudo-relevance feedback (the query vector moved towards its three best matches).

A change that helps retrieval should help queries labelled with ordinary plugins too; one that
only lifts the merged tools learns the dataset's label prior. The engine's BM25 text and vectors
are used (same cache as ``retrieval.py``); ranking here is the plain fused ranking, without
decomposition or abstention, so the figures match the "z-score fusion" row of ``retrieval.py``.

    .venv/bin/python benchmarks/metatool_labels.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from capdisc.bench.evaluation import (
    LabelledQuery,
    default_cache_dir,
    embed_cached,
    load_queries,
    ndcg_at,
    recall_at,
    sample_queries,
)
from capdisc.embedders.factory import make_embedder
from capdisc.embedders.port import Embedder, Matrix
from capdisc.models import Capability
from capdisc.registry.catalogs import load_catalog
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.lexical import LexicalIndex
from capdisc.retrieval.scoring import fuse
from capdisc.retrieval.text import combine, full_text, summary_text

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PREFIX = "tool: "
#: One way of scoring every query of a setting: a (queries x capabilities) score matrix.
Variant = Callable[["Setting"], np.ndarray]


class Setting:
    """One catalog and query set, embedded and scored once."""

    def __init__(
        self,
        caps: tuple[Capability, ...],
        queries: list[LabelledQuery],
        embedder: Embedder,
        cache: Path,
    ) -> None:
        self.caps, self.queries, self.embedder, self.cache = caps, queries, embedder, cache
        self.ids = np.array([c.id for c in caps])
        full = embed_cached(embedder, [full_text(c) for c in caps], cache)
        summary = embed_cached(embedder, [summary_text(c) for c in caps], cache)
        self.matrix = np.stack([combine(f, s) for f, s in zip(full, summary, strict=True)])
        lexicon = LexicalIndex.build([lexical_text(c) for c in caps])
        self.bm25 = np.stack([lexicon.scores(lexicon.term_ids(q.query)) for q in queries])
        logs = np.log(np.maximum(lexicon.doc_len, 1.0))
        self.brevity = logs.mean() - logs
        self.plain = self.embed("")

    def embed(self, prefix: str) -> Matrix:
        return embed_cached(self.embedder, [prefix + q.query for q in self.queries], self.cache)

    def fused(self, vectors: Matrix) -> np.ndarray:
        """The engine's fusion (:func:`capdisc.retrieval.scoring.fuse`) of each query's scores."""
        cosines = (vectors @ self.matrix.T).astype(np.float32)
        return np.stack(
            [fuse(c, b, DEFAULT_CONFIG) for c, b in zip(cosines, self.bm25, strict=True)]
        )


def engine(s: Setting) -> np.ndarray:
    return s.fused(s.plain)


def length_prior(s: Setting) -> np.ndarray:
    return s.fused(s.plain) + 0.3 * s.brevity


def query_prefix(s: Setting) -> np.ndarray:
    return s.fused(s.embed(PREFIX))


def feedback(s: Setting) -> np.ndarray:
    first = s.fused(s.plain)
    best = np.argsort(-first, axis=1)[:, :3]
    return s.fused(s.plain + 0.5 * s.matrix[best].mean(axis=1))


VARIANTS: dict[str, Variant] = {
    "engine fusion": engine,
    "+ length prior": length_prior,
    f"+ query prefix {PREFIX!r}": query_prefix,
    "+ feedback": feedback,
}


def scores_by_group(
    s: Setting, fused: np.ndarray, groups: dict[str, np.ndarray]
) -> dict[str, tuple[float, float]]:
    top = np.argsort(-fused, axis=1)[:, :5]
    found = [[str(s.ids[r]) for r in row] for row in top]
    r = np.array([recall_at(f, q.relevant, 5) for f, q in zip(found, s.queries, strict=True)])
    n = np.array([ndcg_at(f, q.relevant) for f, q in zip(found, s.queries, strict=True)])
    return {name: (float(r[mask].mean()), float(n[mask].mean())) for name, mask in groups.items()}


def report(title: str, s: Setting, groups: dict[str, np.ndarray]) -> None:
    print(f"{title}")
    header = "".join(f"{f'{g} (n={int(m.sum())})':>30}" for g, m in groups.items())
    print(f"  {'recall@5 / NDCG@5':<28}{header}")
    for name, variant in VARIANTS.items():
        figures = scores_by_group(s, variant(s), groups)
        print(f"  {name:<28}" + "".join(f"{f'{r:.3f} / {n:.3f}':>30}" for r, n in figures.values()))
    print()


def main() -> None:
    embedder, cache = make_embedder("minilm"), default_cache_dir()
    catalog = load_catalog(DATA / "metatool" / "tools.jsonl")
    every = load_queries(DATA / "metatool" / "queries.jsonl", catalog)
    sample = sample_queries(every, 3000, 0)
    kind = {c.id: c.category for c in catalog.capabilities}
    named = {c.id: "tool" in c.display_name.lower() for c in catalog.capabilities}
    meta = Setting(catalog.capabilities, sample, embedder, cache)
    merged = np.array([kind[q.relevant[0]] == "merged_tool" for q in sample])
    tool_named = np.array([named[q.relevant[0]] for q in sample])
    report(
        "MetaTool (3,000-query sample, seed 0), by the tool a query is labelled with",
        meta,
        {"all": np.ones(len(sample), bool), "merged tools": merged, "plugins": ~merged},
    )
    report(
        'MetaTool, by whether that tool\'s name contains "Tool"',
        meta,
        {"named ...Tool": tool_named, "other names": ~tool_named},
    )
    seal_catalog = load_catalog(DATA / "seal-tools" / "tools.jsonl")
    seal = load_queries(DATA / "seal-tools" / "queries.jsonl", seal_catalog)
    report(
        "Seal-Tools (all 2,054)",
        Setting(seal_catalog.capabilities, seal, embedder, cache),
        {"all": np.ones(len(seal), bool)},
    )


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
