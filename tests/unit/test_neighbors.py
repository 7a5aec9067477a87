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
from capdisc.retrieval.config import DEFAULT_CONFIG, RetrievalConfig
from capdisc.retrieval.index import RetrievalIndex
from capdisc.retrieval.neighbors import (
    BackgroundBuilder,
    CarriedGraph,
    NeighborIndex,
    NeighborSlot,
    dense_candidates,
)
from capdisc.retrieval.results import RetrievalResult

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


def agrees(got: RetrievalResult, want: RetrievalResult) -> bool:
    """Whether ``got`` holds at least 90% of ``want``'s answers, a tie counting as either: the
    scores are the same fused scores, so a missed answer shows as a lower score at its place."""
    kept = sum(g.score >= w.score - 1e-5 for g, w in zip(got.entries, want.entries, strict=False))
    return len(got.entries) == len(want.entries) and kept >= 0.9 * len(want.entries)


def shows_only_allowed_and_agrees(
    pair: tuple[RetrievalIndex, RetrievalIndex], query: str, caller: Caller, category: str | None
) -> None:
    """The graph-served index of ``pair`` shows ``caller`` only what it may see in
    ``category``, and :func:`agrees` with the exact index of ``pair``."""
    exact, graphed = pair
    filters = SearchFilters(caller=caller, category=category)
    vector = EMBEDDER.embed([query])[0]
    want = exact.search(query, vector, 10, filters=filters, config=SMALL)
    got = graphed.search(query, vector, 10, filters=filters, config=SMALL)
    for cap_id in got.ids:
        capability = graphed.table[cap_id]
        assert visible(capability.visibility, caller)
        assert category is None or capability.category == category
    assert agrees(got, want)


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
    shows_only_allowed_and_agrees(indexes, query, caller, category)


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


# -- a hot reload's index carries its predecessor's graph ----------------------------------------


def test_a_carried_graph_finds_kept_rows_at_their_new_place(
    matrix: Matrix, graph: NeighborIndex
) -> None:
    sources = np.arange(ROWS, dtype=np.int64)[1:]  # row 0 deleted: every other row moves up
    carried = CarriedGraph.after(graph, sources)
    found = carried.search(matrix[7], 1)
    assert found.tolist() == [6]
    assert carried.moved == 1


def test_a_carried_graph_never_returns_a_deleted_rows_node(
    matrix: Matrix, graph: NeighborIndex
) -> None:
    sources = np.arange(ROWS, dtype=np.int64)
    sources[5] = -1  # row 5 changed: its old vector is no longer any row's
    carried = CarriedGraph.after(graph, sources)
    assert 5 not in carried.search(matrix[5], 10).tolist()
    assert carried.extra.tolist() == [5]


def test_rows_the_carried_graph_lacks_are_scored_beside_it(
    matrix: Matrix, graph: NeighborIndex
) -> None:
    changed = matrix.copy()
    changed[5] = unit_rows(1, 32, seed=99)[0]
    sources = np.arange(ROWS, dtype=np.int64)
    sources[5] = -1
    carried = CarriedGraph.after(graph, sources)
    rows = dense_candidates(changed, changed[5], 5, None, carried, exact_below=0)
    assert 5 in rows.tolist()


def test_a_carried_graph_of_a_carried_graph_maps_to_the_first_build(
    matrix: Matrix, graph: NeighborIndex
) -> None:
    once = CarriedGraph.after(graph, np.arange(1, ROWS, dtype=np.int64))  # row 0 deleted
    twice = CarriedGraph.after(once, np.arange(1, ROWS - 1, dtype=np.int64))  # and row 1
    assert twice.base is graph
    assert twice.search(matrix[9], 1).tolist() == [7]
    assert twice.moved == 2


def test_a_carried_graph_walks_only_allowed_rows(matrix: Matrix, graph: NeighborIndex) -> None:
    carried = CarriedGraph.after(graph, np.arange(1, ROWS, dtype=np.int64))
    allowed = np.zeros(ROWS - 1, dtype=bool)
    allowed[::2] = True
    rows = carried.search(matrix[100], 20, allowed)
    assert rows.size and allowed[rows].all()


def delta_snapshot(
    config: RetrievalConfig, changes: int, builder: BackgroundBuilder | None = None
) -> tuple[IndexSnapshot, IndexSnapshot, BackgroundBuilder]:
    caps, vectors = catalog()
    builder = builder or BackgroundBuilder()
    factory = functools.partial(hybrid_retriever, base=config, builder=builder)
    entries = [(c, v.tobytes()) for c, v in zip(caps, vectors, strict=True)]
    first = IndexSnapshot.build("t", 1, EMBEDDER.dim, entries, EMBEDDER.id, factory)
    assert builder.idle(60)
    changed = [replace(c, description=f"translate sql invoices {c.id}") for c in caps[:changes]]
    upserts = [(c, EMBEDDER.embed([c.description])[0].tobytes()) for c in changed]
    second = first.with_changes(2, upserts, [caps[-1].id])
    return first, second, builder


def test_a_delta_serves_with_its_predecessors_graph_and_builds_none() -> None:
    _first, second, builder = delta_snapshot(SMALL, changes=3)
    built = builder.built
    assert second.search_mode == "graph"
    assert builder.idle(60)
    assert builder.built == built
    retriever = second.retriever
    assert isinstance(retriever, HybridRetriever)
    assert isinstance(retriever.index.neighbors.graph, CarriedGraph)


def test_after_many_moved_rows_a_new_graph_is_built_while_the_carried_one_serves() -> None:
    release = threading.Event()

    def build(matrix: Matrix) -> NeighborIndex:
        if builder.built:  # the first graph is built at once, the next one when released
            release.wait(30)
        return NeighborIndex(matrix)

    builder = BackgroundBuilder(build)
    config = replace(SMALL, ann_rebuild_moved=5)
    _first, second, _ = delta_snapshot(config, changes=10, builder=builder)
    retriever = second.retriever
    assert isinstance(retriever, HybridRetriever)
    assert isinstance(retriever.index.neighbors.graph, CarriedGraph)
    release.set()
    assert builder.idle(60)
    assert isinstance(retriever.index.neighbors.graph, NeighborIndex)


@pytest.fixture(scope="module")
def after_delta() -> tuple[RetrievalIndex, RetrievalIndex]:
    _first, second, _builder = delta_snapshot(SMALL, changes=40)
    carried = second.retriever
    assert isinstance(carried, HybridRetriever)
    assert isinstance(carried.index.neighbors.graph, CarriedGraph)
    exact = RetrievalIndex.build(
        second.capabilities.by_row, second.vectors(), config=replace(SMALL, ann_above=0)
    )
    return exact, carried.index


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries, callers, categories)
def test_a_carried_graph_never_shows_an_invisible_capability_and_agrees_with_the_exact_scan(
    after_delta: tuple[RetrievalIndex, RetrievalIndex],
    query: str,
    caller: Caller,
    category: str | None,
) -> None:
    shows_only_allowed_and_agrees(after_delta, query, caller, category)
