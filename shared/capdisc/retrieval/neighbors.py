"""Approximate nearest neighbours for large catalogs: the dense candidates of a query without
scoring every row.

Below ``RetrievalConfig.ann_above`` rows the index scores every row exactly (a few ms at
100,000 rows is the ceiling that moves this threshold). Above it, :class:`NeighborIndex` (an
HNSW graph from ``faiss-cpu``, chosen by measurement against usearch with
``benchmarks/ann_libraries.py``: faster at the same recall, and it filters inside the graph
walk) gives each query its ``ann_candidates`` best rows by inner product, and only those and
the BM25 best rows are scored exactly.

Filters stay exact: the allowed rows (kind, tags, availability, the caller's visibility) are a
bitmap the graph walk checks, so a row the caller may not see is never a candidate; when few
rows are allowed the index scores just those rows instead (:func:`dense_candidates`), because a
graph walk through mostly excluded rows loses recall.

The graph is an accelerator, never the source of truth: a snapshot serves with the exact scan
until its graph is built (:class:`NeighborSlot`, filled by :class:`BackgroundBuilder` off the
request path), so a hot reload is never held up by a rebuild.

A hot reload does not need a new graph either: a delta's index serves with its predecessor's
(:class:`CarriedGraph`). The rows that kept their vector keep their place in it; the rows it
does not hold (added, or changed) are scored exactly beside it, and the rows gone from the
catalog are left out of every walk, like a filter's. Only once many rows have moved is a new
graph built, in the background, while the carried one serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from capdisc.embedders.port import Matrix, Vector

RowArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class NeighborSettings:
    """The graph's shape: ``links`` per node (HNSW ``M``), the candidate list while building
    (``ef_construction``) and while searching (``ef_search``, raised to the candidates asked)."""

    links: int = 32
    ef_construction: int = 80
    ef_search: int = 128


class NeighborIndex:
    """An HNSW graph over the rows of one matrix (unit vectors, inner product). Immutable once
    built; searched from any thread.

    The graph keeps its own copy of the vectors as 8-bit codes (one byte a dimension, against
    four for float32): it only picks candidates, which the index then scores exactly from its
    float32 matrix. Measured at 100,000 rows (``benchmarks/ann_libraries.py``): the same
    recall@10 after that exact scoring as a float32 graph, a faster walk, and 464 bytes a row
    against 1,040."""

    def __init__(self, matrix: Matrix, settings: NeighborSettings = NeighborSettings()) -> None:
        import faiss  # imported here: only catalogs above the threshold need it

        faiss.omp_set_num_threads(1)  # a build in the background leaves a core to requests
        rows, dim = matrix.shape
        codes: Any = faiss.ScalarQuantizer.QT_8bit  # an int the stubs call a ScalarQuantizer
        graph = faiss.IndexHNSWSQ(dim, codes, settings.links, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = settings.ef_construction
        if rows:
            vectors = np.ascontiguousarray(matrix, dtype=np.float32)
            graph.train(vectors)  # the per-dimension ranges of the 8-bit codes
            graph.add(vectors)
        self._faiss = faiss
        self._graph = graph
        self.rows = rows
        self.settings = settings

    #: Rows the graph does not hold (scored exactly beside it): none, it was built for them.
    extra: RowArray = np.zeros(0, dtype=np.int64)
    #: Rows moved since the graph was built: none.
    moved = 0

    def labels(self) -> RowArray:
        """Per row, its node in the graph: the row itself."""
        return np.arange(self.rows, dtype=np.int64)

    def search(self, vector: Vector, k: int, allowed: BoolArray | None = None) -> RowArray:
        """Rows of (about) the ``k`` nearest vectors among ``allowed`` (None: every row),
        nearest first."""
        if k <= 0 or self.rows == 0:
            return np.zeros(0, dtype=np.int64)
        faiss = self._faiss
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        ef = max(self.settings.ef_search, k)
        if allowed is None:
            params = faiss.SearchParametersHNSW(efSearch=ef)
            _, labels = self._graph.search(query, min(k, self.rows), params=params)
        else:
            bits = np.packbits(allowed, bitorder="little")  # kept alive during the search
            selector = faiss.IDSelectorBitmap(self.rows, faiss.swig_ptr(bits))
            params = faiss.SearchParametersHNSW(sel=selector, efSearch=ef)
            _, labels = self._graph.search(query, min(k, self.rows), params=params)
        found: RowArray = labels[0][labels[0] >= 0].astype(np.int64)
        return found

    def write(self, path: Path) -> None:
        """Write the graph to ``path`` in faiss's own format (:meth:`read` maps it back)."""
        self._faiss.write_index(self._graph, str(path))

    @classmethod
    def read(
        cls, path: Path, settings: NeighborSettings = NeighborSettings(), *, mmap: bool = False
    ) -> NeighborIndex:
        """The graph :meth:`write` wrote to ``path``, without building it again; with ``mmap``
        its vector codes stay in the file, mapped (the links are read into memory): at
        100,000 rows 28 MB resident after the read against 45 MB. The file must then not be
        changed while the graph lives (snapshot files never are)."""
        import faiss

        faiss.omp_set_num_threads(1)
        index = cls.__new__(cls)
        index._faiss = faiss
        flags = faiss.IO_FLAG_MMAP_IFC if mmap else 0
        graph: Any = faiss.read_index(str(path), flags)  # the type it was written as
        index._graph = graph
        index.rows = int(graph.ntotal)
        index.settings = settings
        return index


class CarriedGraph:
    """An earlier index's graph serving a later index of mostly the same rows.

    ``nodes[row]`` is the node of the graph that holds ``row``'s vector, or -1 when the graph
    does not hold it (the row was added, or its vector changed): those rows are :attr:`extra`,
    scored exactly beside the walk (:func:`dense_candidates`). A node no row holds any more
    (deleted, or changed) is never returned: each walk allows only the nodes still held."""

    def __init__(self, base: NeighborIndex, nodes: RowArray) -> None:
        self.base = base
        self.rows = len(nodes)
        self._nodes = nodes
        self._held = np.flatnonzero(nodes >= 0)
        self._row_of = np.full(base.rows, -1, dtype=np.int64)
        self._row_of[nodes[self._held]] = self._held
        self._live = self._row_of >= 0
        self.extra: RowArray = np.flatnonzero(nodes < 0)
        #: Rows that moved since ``base`` was built: added or changed ones, and deleted nodes.
        self.moved = int(self.extra.size + base.rows - self._held.size)

    @classmethod
    def after(
        cls, graph: NeighborIndex | CarriedGraph, sources: npt.NDArray[np.integer]
    ) -> CarriedGraph:
        """``graph`` (of an earlier index) for an index whose row ``i`` was row
        ``sources[i]`` of that index, or is new (or changed) when ``sources[i]`` is negative."""
        picks = np.asarray(sources, dtype=np.int64)
        earlier = graph.labels()
        nodes = np.where(picks >= 0, earlier[np.maximum(picks, 0)], -1)
        return cls(graph.base if isinstance(graph, CarriedGraph) else graph, nodes)

    def labels(self) -> RowArray:
        """Per row, its node in the base graph, or -1 when the graph does not hold it."""
        return self._nodes

    def search(self, vector: Vector, k: int, allowed: BoolArray | None = None) -> RowArray:
        """Rows of (about) the ``k`` nearest vectors among the ``allowed`` rows the graph
        holds (None: all of them), nearest first."""
        if allowed is None:
            nodes = None if self._held.size == self.base.rows else self._live
        else:
            nodes = np.zeros(self.base.rows, dtype=bool)
            nodes[self._nodes[self._held]] = allowed[self._held]
        return self._row_of[self.base.search(vector, k, nodes)]

    def write(self, path: Path) -> None:
        """Write the base graph (the row-to-node map is the caller's to keep)."""
        self.base.write(path)


#: What serves a query's dense candidates: a graph built for the index, or one carried over.
Graph = NeighborIndex | CarriedGraph


def dense_candidates(
    matrix: Matrix,
    vector: Vector,
    k: int,
    allowed: BoolArray | None,
    graph: Graph,
    exact_below: int,
) -> RowArray:
    """The ``k`` best allowed rows by inner product with ``vector``: from ``graph`` (and the
    best of the rows it does not hold, scored exactly), or by scoring the allowed rows exactly
    when fewer than ``exact_below`` are allowed (a selective filter) or the graph finds fewer
    than ``k`` of them."""
    available = graph.rows if allowed is None else int(np.count_nonzero(allowed))
    if allowed is not None and available <= max(exact_below, k):
        return _exact_among(matrix, vector, k, np.flatnonzero(allowed))
    found = graph.search(vector, k, allowed)
    extra = graph.extra if allowed is None else graph.extra[allowed[graph.extra]]
    if extra.size:
        found = np.concatenate([found, _exact_among(matrix, vector, k, extra)])
    if found.size >= min(k, available):
        return found
    rows = np.flatnonzero(allowed) if allowed is not None else np.arange(graph.rows)
    return _exact_among(matrix, vector, k, rows)


def _exact_among(matrix: Matrix, vector: Vector, k: int, rows: RowArray) -> RowArray:
    if rows.size <= k:
        return rows.astype(np.int64)
    scores = matrix[rows] @ vector
    best = np.argpartition(-scores, k - 1)[:k]
    return rows[best].astype(np.int64)


class NeighborSlot:
    """Where a retrieval index finds its graph (None until there is one: the index scans
    exactly). Filled with a carried graph and then a built one at most; reading it needs no
    lock (one attribute read)."""

    def __init__(self) -> None:
        self.graph: Graph | None = None

    def fill(self, graph: Graph) -> None:
        self.graph = graph


class BackgroundBuilder:
    """Builds graphs on one daemon thread, newest request first: a request superseded before
    its turn (a newer snapshot of the same key arrived) is dropped, so a burst of hot reloads
    costs one build, and the request path never waits for one."""

    def __init__(self, build: Callable[[Matrix], NeighborIndex] = NeighborIndex) -> None:
        self._build = build
        self._pending: dict[object, tuple[Matrix, NeighborSlot]] = {}
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self.built = 0

    def submit(self, key: object, matrix: Matrix, slot: NeighborSlot) -> None:
        """Build a graph of ``matrix`` into ``slot``, replacing any request of ``key`` not
        yet started."""
        with self._wake:
            self._pending[key] = (matrix, slot)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="capdisc-neighbors", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def idle(self, timeout_s: float) -> bool:
        """Wait until no request is pending or being built; False on timeout."""
        with self._wake:
            return self._wake.wait_for(lambda: not self._pending and not self._busy, timeout_s)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: bool(self._pending))
                key = next(iter(self._pending))
                matrix, slot = self._pending.pop(key)
                self._busy = True
            try:
                slot.fill(self._build(matrix))
                self.built += 1
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()
