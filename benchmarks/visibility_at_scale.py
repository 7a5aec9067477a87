"""The visibility property at registry scale, with the HNSW graph serving: no answer shows a
capability its caller may not see, and none outside the query's filters.

The benchmark catalog of ``--size`` capabilities (``_catalog.py``; hashing-embedder vectors, the
same arithmetic as any 384-dimensional model) gets restricted visibility on most rows: a third
open to the whole tenant, the rest shared with one of a dozen roles or one of a few hundred
users, so a caller sees anything from almost every row to a few hundred. One retrieval index is
built, its graph filled, and ``--queries`` random searches (Seal-Tools queries, random callers,
and a random category or availability filter on a third of them) are checked answer by answer;
each search is also run with the graph set aside (every row scored), and the graph's recall@10
of those answers is printed beside the count of leaks, which must be 0.

    .venv/bin/python benchmarks/visibility_at_scale.py [--size 100000] [--queries 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _catalog import load_catalog, seal_queries, stand_in_vectors
from capdisc.access import Caller, visible
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Visibility
from capdisc.retrieval.index import RetrievalIndex
from capdisc.retrieval.neighbors import NeighborIndex

ROLES = [f"team-{i}" for i in range(12)]
USERS = [f"user-{i}" for i in range(300)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    caps = [restricted(c, rng) for c in load_catalog(args.size)]
    embedder = HashingEmbedder(384)
    started = time.perf_counter()
    index = RetrievalIndex.build(caps, stand_in_vectors(caps, embedder))
    print(f"{len(caps):,} capabilities indexed in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    index.neighbors.fill(NeighborIndex(index.matrix))
    print(f"HNSW graph built in {time.perf_counter() - started:.1f} s")
    check(index, embedder, searches(args.queries, categories(caps), rng))


def restricted(capability: Capability, rng: random.Random) -> Capability:
    """``capability`` open to all (a third), or shared with one role or one user."""
    draw = rng.random()
    if draw < 1 / 3:
        return capability
    if draw < 2 / 3:
        return replace(capability, visibility=Visibility(roles=(rng.choice(ROLES),)))
    return replace(capability, visibility=Visibility(users=(rng.choice(USERS),)))


def categories(caps: list[Capability]) -> list[str]:
    return sorted({c.category for c in caps})


def searches(count: int, known: list[str], rng: random.Random) -> list[tuple[str, SearchFilters]]:
    """Queries with a random caller (anonymous, a role or two, a user, both), a third of them
    with a category or availability filter too."""
    texts = list(dict.fromkeys(seal_queries()))
    out = []
    for _ in range(count):
        roles = rng.sample(ROLES, rng.choice([0, 0, 1, 2]))
        user = rng.choice([None, rng.choice(USERS)])
        filters = SearchFilters(caller=Caller.of(roles, user))
        draw = rng.random()
        if draw < 1 / 6:
            filters = replace(filters, category=rng.choice(known))
        elif draw < 1 / 3:
            filters = replace(filters, only_available=True)
        out.append((rng.choice(texts), filters))
    return out


def check(
    index: RetrievalIndex,
    embedder: HashingEmbedder,
    queries: list[tuple[str, SearchFilters]],
) -> None:
    leaks = answers = 0
    shares = []
    for query, filters in queries:
        vector = embedder.embed([query])[0]
        got = index.search(query, vector, 10, filters=filters, embed=embedder.embed)
        want = index_search_exact(index, query, vector, filters, embedder)
        for cap_id in got.ids:
            answers += 1
            capability = index.table[cap_id]
            if not filters.admits(capability) or not visible(capability.visibility, filters.caller):
                leaks += 1
        if want:
            shares.append(len(set(want) & set(got.ids)) / len(want))
    print(
        f"{len(queries):,} searches, {answers:,} answers: {leaks} show a capability the caller "
        f"may not see or the filters exclude (must be 0: {'PASS' if leaks == 0 else 'FAIL'})"
    )
    print(f"recall@10 of the exact scan's answers: {statistics.fmean(shares):.4f}")
    if leaks:
        raise SystemExit(1)


def index_search_exact(
    index: RetrievalIndex,
    query: str,
    vector: np.ndarray,
    filters: SearchFilters,
    embedder: HashingEmbedder,
) -> tuple[str, ...]:
    """The same search with the graph set aside: every row scored."""
    graph, index.neighbors.graph = index.neighbors.graph, None
    try:
        return index.search(query, vector, 10, filters=filters, embed=embedder.embed).ids
    finally:
        index.neighbors.graph = graph


if __name__ == "__main__":
    main()
