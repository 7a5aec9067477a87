"""The HNSW graph of large catalogs: its candidates, the exact fallback for selective filters,
the background builder, and a retrieval index that answers the same with and without it."""

from __future__ import annotations

import functools
import threading
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capdisc.access import Caller, visible
from capdisc.captable import CapabilityTable
from capdisc.discovery.snapshot import HybridRetriever, IndexSnapshot, hybrid_retriever
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import Matrix
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Visibility
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.index import RetrievalIndex
from capdisc.retrieval.neighbors import (
    BackgroundBuilder,
    NeighborIndex,
    NeighborSlot,
    dense_candidates,
)

pytest.importorskip("faiss")

ROWS = 3000
#: The graph is used above 1,000 rows here (20,000 by default) so a small catalog exercises it.
SMALL = replace(DEFAULT_CONFIG, ann_above=1000, ann_candidates=64, ann_exact_below=200)
EMBEDDER = HashingEmbedder(128)
WORDS = ["weather", "invoice", "calendar", "email", "stock", "translate", "image", "map", "sql"]
ROLES = ["ops", "finance", "hr"]


def unit_rows(rows: int, dim: int, seed: int) -> Matrix:
    matrix = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix


def exact_best(matrix: Matrix, vector: Matrix, k: int, allowed: np.ndarray) -> set[int]:
    scores = np.where(allowed, matrix @ vector, -np.inf)
    return {int(r) for r in np.argsort(-scores)[:k] if allowed[r]}


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return unit_rows(ROWS, 32, seed=3)


@pytest.fixture(scope="module")
def graph(matrix: Matrix) -> NeighborIndex:
    return NeighborIndex(matrix)


def test_the_graph_finds_nearly_every_exact_neighbour(matrix: Matrix, graph: NeighborIndex) -> None:
    queries = unit_rows(50, 32, seed=4)
    everyone = np.ones(ROWS, dtype=bool)
    found = [
        len(set(graph.search(q, 10).tolist()) & exact_best(matrix, q, 10, everyone))
        for q in queries
    ]
    assert sum(found) / (10 * len(queries)) >= 0.95


def test_the_graph_holds_its_vectors_as_one_byte_a_dimension(graph: NeighborIndex) -> None:
    import faiss

    flat = faiss.IndexHNSWFlat(32, graph.settings.links, faiss.METRIC_INNER_PRODUCT)
    flat.add(unit_rows(ROWS, 32, seed=3))

    saved = faiss.serialize_index(flat).nbytes - faiss.serialize_index(graph._graph).nbytes

    assert saved >= ROWS * 32 * 2  # 4 bytes a dimension as float32, 1 as a code (+ links)


def test_a_filtered_search_returns_only_allowed_rows(matrix: Matrix, graph: NeighborIndex) -> None:
    allowed = np.random.default_rng(5).random(ROWS) < 0.5
    rows = graph.search(matrix[7], 20, allowed)
    assert rows.size == 20
    assert allowed[rows].all()


def test_a_selective_filter_is_scored_exactly(matrix: Matrix, graph: NeighborIndex) -> None:
    allowed = np.zeros(ROWS, dtype=bool)
    allowed[::100] = True  # 30 rows
    query = unit_rows(1, 32, seed=6)[0]
    rows = dense_candidates(matrix, query, 5, allowed, graph, exact_below=100)
    assert set(rows.tolist()) == exact_best(matrix, query, 5, allowed)


def test_fewer_allowed_rows_than_asked_returns_them_all(
    matrix: Matrix, graph: NeighborIndex
) -> None:
    allowed = np.zeros(ROWS, dtype=bool)
    allowed[[3, 9]] = True
    rows = dense_candidates(matrix, matrix[0], 10, allowed, graph, exact_below=0)
    assert sorted(rows.tolist()) == [3, 9]


def test_the_builder_builds_only_the_newest_request_of_a_key() -> None:
    started, release = threading.Event(), threading.Event()
    built: list[int] = []

    def build(matrix: Matrix) -> NeighborIndex:
        started.set()
        release.wait(30)
        built.append(len(matrix))
        return NeighborIndex(matrix)

    builder = BackgroundBuilder(build)
    first, stale, newest = NeighborSlot(), NeighborSlot(), NeighborSlot()
    builder.submit("a", unit_rows(10, 8, 1), first)
    assert started.wait(30)
    builder.submit("b", unit_rows(20, 8, 1), stale)
    builder.submit("b", unit_rows(30, 8, 1), newest)
    release.set()
    assert builder.idle(30)
    assert built == [10, 30]
    assert first.graph is not None and newest.graph is not None
    assert stale.graph is None


# -- a retrieval index with its graph answers as it does without --------------------------------


def catalog() -> tuple[list[Capability], Matrix]:
    rng = np.random.default_rng(11)
    caps = []
    for i in range(ROWS):
        words = " ".join(rng.choice(WORDS, size=3))
        roles = (ROLES[i % 3],) if i % 4 == 0 else ()
        users = ("u1",) if i % 7 == 0 else ()
        caps.append(
            Capability(
                id=f"tool:t{i}",
                kind="tool",
                name=f"t{i}",
                description=f"{words} helper number {i}",
                category=WORDS[i % len(WORDS)],
                visibility=Visibility(roles, users),
            )
        )
    return caps, EMBEDDER.embed([c.description for c in caps])


@pytest.fixture(scope="module")
def indexes() -> tuple[RetrievalIndex, RetrievalIndex]:
    caps, vectors = catalog()
    exact = RetrievalIndex.build(caps, vectors, config=SMALL)
    approximate = RetrievalIndex.build(caps, vectors, config=SMALL)
    approximate.neighbors.fill(NeighborIndex(approximate.matrix))
    return exact, approximate


callers = st.builds(
    Caller.of, st.lists(st.sampled_from(ROLES), max_size=2), st.sampled_from([None, "u1", "u2"])
)
queries = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
categories = st.sampled_from([None, *WORDS])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries, callers, categories)
def test_the_graph_never_shows_an_invisible_capability_and_agrees_with_the_exact_scan(
    indexes: tuple[RetrievalIndex, RetrievalIndex],
    query: str,
    caller: Caller,
    category: str | None,
) -> None:
    exact, approximate = indexes
    filters = SearchFilters(caller=caller, category=category)
    vector = EMBEDDER.embed([query])[0]
    want = exact.search(query, vector, 10, filters=filters, config=SMALL)
    got = approximate.search(query, vector, 10, filters=filters, config=SMALL)
    for cap_id in got.ids:
        capability = approximate.table[cap_id]
        assert visible(capability.visibility, caller)
        assert category is None or capability.category == category
    assert len(set(got.ids) & set(want.ids)) >= 0.9 * len(want.ids)


def test_a_large_catalog_gets_its_graph_in_the_background() -> None:
    caps, vectors = catalog()
    builder = BackgroundBuilder()
    retriever = hybrid_retriever(
        tuple(caps), CapabilityTable.of(caps), vectors, EMBEDDER.id, base=SMALL, builder=builder
    )
    assert isinstance(retriever, HybridRetriever)
    assert builder.idle(60)
    assert retriever.index.neighbors.graph is not None


def test_a_catalog_under_the_threshold_gets_no_graph() -> None:
    caps, vectors = catalog()
    builder = BackgroundBuilder()
    config = replace(SMALL, ann_above=ROWS)
    retriever = hybrid_retriever(
        tuple(caps), CapabilityTable.of(caps), vectors, EMBEDDER.id, base=config, builder=builder
    )
    assert isinstance(retriever, HybridRetriever)
    assert builder.idle(60)
    assert retriever.index.neighbors.graph is None


def test_a_snapshot_says_whether_its_graph_serves() -> None:
    caps, vectors = catalog()
    release = threading.Event()

    def build(matrix: Matrix) -> NeighborIndex:
        release.wait(30)
        return NeighborIndex(matrix)

    builder = BackgroundBuilder(build)
    factory = functools.partial(hybrid_retriever, base=SMALL, builder=builder)
    entries = [(c, v.tobytes()) for c, v in zip(caps, vectors, strict=True)]
    snapshot = IndexSnapshot.build("t", 1, EMBEDDER.dim, entries, EMBEDDER.id, factory)
    assert snapshot.search_mode == "exact"
    release.set()
    assert builder.idle(60)
    assert snapshot.search_mode == "graph"
