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
    def read(cls, path: Path, settings: NeighborSettings = NeighborSettings()) -> NeighborIndex:
        """The graph :meth:`write` wrote to ``path``, without building it again."""
        import faiss

        faiss.omp_set_num_threads(1)
        index = cls.__new__(cls)
        index._faiss = faiss
        graph: Any = faiss.read_index(str(path))  # the type it was written as
        index._graph = graph
        index.rows = int(graph.ntotal)
        index.settings = settings
        return index


def dense_candidates(
    matrix: Matrix,
    vector: Vector,
    k: int,
    allowed: BoolArray | None,
    graph: NeighborIndex,
    exact_below: int,
) -> RowArray:
    """The ``k`` best allowed rows by inner product with ``vector``: from ``graph``, or by
    scoring the allowed rows exactly when fewer than ``exact_below`` are allowed (a selective
    filter) or the graph finds fewer than ``k`` of them."""
    available = graph.rows if allowed is None else int(np.count_nonzero(allowed))
    if allowed is not None and available <= max(exact_below, k):
        return _exact_among(matrix, vector, k, np.flatnonzero(allowed))
    found = graph.search(vector, k, allowed)
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
    """Where a retrieval index finds its graph once it is built (None until then: the index
    scans exactly). Filled at most once; reading it needs no lock."""

    def __init__(self) -> None:
        self.graph: NeighborIndex | None = None

    def fill(self, graph: NeighborIndex) -> None:
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
