"""The in-process index of one tenant: capabilities, vectors, a retriever, the graph, Tier 0.

An :class:`IndexSnapshot` never changes: :meth:`IndexSnapshot.with_changes` returns a new one,
built completely (retriever and graph included) before a discovery worker swaps it in, so a
request never sees a half-applied update and never pays for a rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from typing import TYPE_CHECKING, NamedTuple, Protocol

import networkx as nx
import numpy as np

from capdisc.access import ANONYMOUS, Caller
from capdisc.captable import CapabilityTable
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.graph import build_graph
from capdisc.discovery.tiers import tier0_text
from capdisc.embedders.port import Matrix, Vector
from capdisc.filters import SearchFilters
from capdisc.models import Capability
from capdisc.registry.flags import Mark
from capdisc.retrieval.config import RetrievalConfig, calibrated_for
from capdisc.retrieval.entities import annotate
from capdisc.retrieval.index import QueryEmbed, RetrievalIndex
from capdisc.retrieval.neighbors import BackgroundBuilder, CarriedGraph
from capdisc.tokens import make_counter

if TYPE_CHECKING:
    from capdisc.vectorstores.port import VectorStore

#: Tier 0 texts kept per snapshot (one per budget, counter and caller of restricted catalogs).
TIER0_CACHE = 256
#: Rows of vectors a delta copies at a time: 12 MB of 384-wide vectors.
MOVED_SLICE = 8_192
#: Query texts a retrieval index remembered: each text's BM25 terms and the best rows it kept.
RecentTexts = list[tuple[tuple[str, ...], int]]


@dataclass(frozen=True)
class Hit:
    """One retrieved capability: its ranking score and a calibrated 0..1 relevance."""

    id: str
    score: float
    relevance: float


@dataclass(frozen=True)
class Retrieved:
    """Retrieval's answer: ranked hits, or an abstention when nothing is relevant."""

    hits: tuple[Hit, ...]
    abstained: bool = False
    #: The capability the query named, kept first whatever its relevance.
    exact_match: str | None = None


class Retriever(Protocol):
    """Port: ranks the capabilities of one snapshot for a query."""

    def search(
        self,
        query: str,
        query_vector: Vector,
        k: int,
        filters: SearchFilters,
        config: DiscoveryConfig,
        embed: QueryEmbed | None = None,
    ) -> Retrieved: ...


class HybridRetriever:
    """The engine's retriever: :class:`capdisc.retrieval.index.RetrievalIndex` (BM25 and dense
    fused, the exact-name path, query decomposition, calibrated relevance and abstention)."""

    def __init__(
        self,
        index: RetrievalIndex,
        embedder_id: str,
        base: RetrievalConfig | None = None,
        lineage: object | None = None,
    ) -> None:
        """``base``: the retrieval knobs per-call options apply over (default: the defaults
        with ``embedder_id``'s calibration). ``lineage``: what the retrievers of one tenant's
        successive snapshots share (a newer one's graph build replaces an older one's)."""
        self.index = index
        self._base = base if base is not None else calibrated_for(embedder_id)
        self._configs: dict[tuple[object, ...], RetrievalConfig] = {}
        self.lineage = lineage if lineage is not None else object()

    def search(
        self,
        query: str,
        query_vector: Vector,
        k: int,
        filters: SearchFilters,
        config: DiscoveryConfig,
        embed: QueryEmbed | None = None,
    ) -> Retrieved:
        found = self.index.search(
            query,
            query_vector,
            k,
            filters=filters,
            embed=embed,
            config=self.retrieval_config(config),
        )
        hits = tuple(Hit(e.capability_id, e.score, e.relevance) for e in found.entries)
        return Retrieved(hits, found.abstained, found.exact_match)

    def retrieval_config(self, config: DiscoveryConfig) -> RetrievalConfig:
        """The retrieval knobs of a discovery config, over this embedder's calibration."""
        key = (
            config.fusion,
            config.dense_weight,
            config.exact_name_match,
            config.decompose_queries,
            config.entity_types,
            config.abstain_threshold,
        )
        cached = self._configs.get(key)
        if cached is None:
            cached = replace(
                self._base,
                fusion=config.fusion,
                dense_weight=config.dense_weight,
                exact_name=config.exact_name_match,
                decompose=config.decompose_queries,
                entity_types=config.entity_types,
            )
            if config.abstain_threshold is not None:  # exactly this, not adapted
                cached = replace(
                    cached, abstain_threshold=config.abstain_threshold, adaptive_abstain=False
                )
            if len(self._configs) < 64:  # per-call overrides: keep the cache small
                self._configs[key] = cached
        return cached


class StoreRetriever:
    """A retriever over an external vector store (Weaviate): one hybrid query per turn that
    carries the query vector, the dense weight as alpha and every filter, visibility included.
    Scores are the store's fused ones (0..1, relative to the query's best), so relevance is that
    score and the store never abstains."""

    def __init__(self, store: VectorStore, tenant: str) -> None:
        self.store = store
        self.tenant = tenant

    def search(
        self,
        query: str,
        query_vector: Vector,
        k: int,
        filters: SearchFilters,
        config: DiscoveryConfig,
        embed: QueryEmbed | None = None,
    ) -> Retrieved:
        text = annotate(query) if config.entity_types else query  # as the vector was embedded
        hits = self.store.search(
            self.tenant, text, query_vector, k, alpha=config.dense_weight, filters=filters
        )
        return Retrieved(tuple(Hit(h.id, h.score, h.score) for h in hits))


def store_retriever(store: VectorStore, tenant: str) -> RetrieverFactory:
    """A :data:`RetrieverFactory` whose retrievers search ``store`` for ``tenant``."""

    def factory(
        capabilities: Sequence[Capability],
        table: CapabilityTable,
        matrix: Matrix,
        embedder_id: str,
        probes: Matrix | None = None,
        previous: Retriever | None = None,
    ) -> Retriever:
        return StoreRetriever(store, tenant)

    return factory


class CosineRetriever:
    """Plain exact cosine search, relevance = cosine, never abstains: the simplest retriever,
    for tests of the engine's policy (minimum relevance, graph, tiers) with known scores."""

    def __init__(self, capabilities: Sequence[Capability], matrix: Matrix) -> None:
        self._caps = capabilities
        self._matrix = matrix

    def search(
        self,
        query: str,
        query_vector: Vector,
        k: int,
        filters: SearchFilters,
        config: DiscoveryConfig,
        embed: QueryEmbed | None = None,
    ) -> Retrieved:
        if not self._caps or k <= 0:
            return Retrieved(())
        scores = self._matrix @ np.asarray(query_vector, dtype=np.float32)
        admitted = np.array([filters.admits(c) for c in self._caps])
        scores = np.where(admitted, scores, -np.inf)
        order = np.argsort(-scores, kind="stable")[:k]
        return Retrieved(
            tuple(
                Hit(self._caps[i].id, float(scores[i]), float(scores[i]))
                for i in order
                if np.isfinite(scores[i])
            )
        )


#: Builds a snapshot's retriever from its capabilities (in row order: parsed objects, or the
#: table's own row view, from which only changed capabilities are read), the table that holds
#: them, their stored vectors, the embedder id, the embedded probe queries
#: (:mod:`capdisc.retrieval.probes`; None: no per-catalog abstention) and the previous
#: snapshot's retriever (None: build from scratch; else reuse what is unchanged).
RetrieverFactory = Callable[
    [Sequence[Capability], CapabilityTable, Matrix, str, Matrix | None, Retriever | None],
    Retriever,
]


@cache
def graph_builder() -> BackgroundBuilder:
    """This process's graph builder: it builds the HNSW graphs of large catalogs for every
    snapshot, off the request path (created on first use)."""
    return BackgroundBuilder()


def hybrid_retriever(
    capabilities: Sequence[Capability],
    table: CapabilityTable,
    matrix: Matrix,
    embedder_id: str,
    probes: Matrix | None = None,
    previous: Retriever | None = None,
    *,
    base: RetrievalConfig | None = None,
    builder: BackgroundBuilder | None = None,
) -> Retriever:
    """The default :data:`RetrieverFactory`. A catalog above ``ann_above`` rows also gets its
    HNSW graph, built in the background by ``builder`` (default :func:`graph_builder`); it
    serves with the exact scan until then. A delta's index (``capabilities`` is a delta's
    :class:`_Readable`) serves with ``previous``'s graph carried over instead, and a new
    graph is built only once ``ann_rebuild_moved`` rows have moved since it was."""
    prior = previous if isinstance(previous, HybridRetriever) else None
    config = base if base is not None else calibrated_for(embedder_id)
    index = RetrievalIndex.build(
        capabilities,
        matrix,
        probe_vectors=probes,
        config=config,
        previous=prior.index if prior is not None else None,
        table=table,
        sources=capabilities.sources if isinstance(capabilities, _Readable) else None,
        reduced=isinstance(capabilities, _Readable) and capabilities.reduced,
    )
    retriever = HybridRetriever(
        index, embedder_id, base, lineage=prior.lineage if prior is not None else None
    )
    if config.ann_above and len(index) > config.ann_above:
        carried = _carried(index, prior, capabilities)
        if carried is not None:
            index.neighbors.fill(carried)
        if carried is None or carried.moved > config.ann_rebuild_moved:
            (builder or graph_builder()).submit(retriever.lineage, index.matrix, index.neighbors)
    return retriever


def _carried(
    index: RetrievalIndex, prior: HybridRetriever | None, capabilities: Sequence[Capability]
) -> CarriedGraph | None:
    """``prior``'s graph carried over to ``index``, its delta's, when it has one in the same
    space (the delta kept its projection)."""
    if prior is None or not isinstance(capabilities, _Readable):
        return None
    graph = prior.index.neighbors.graph
    if graph is None or index.projection is not prior.index.projection:
        return None
    return CarriedGraph.after(graph, np.asarray(capabilities.sources, dtype=np.int64))


def cosine_retriever(
    capabilities: Sequence[Capability],
    table: CapabilityTable,
    matrix: Matrix,
    embedder_id: str,
    probes: Matrix | None = None,
    previous: Retriever | None = None,
) -> Retriever:
    """A :data:`RetrieverFactory` of :class:`CosineRetriever`."""
    return CosineRetriever(table.by_row, matrix)


def _gather(
    entries: Iterable[tuple[Capability, bytes]], dim: int
) -> tuple[dict[str, Capability], Matrix]:
    """The capabilities by id and their vectors as one matrix, row ``i`` for the ``i``-th id.
    The vectors are copied into one growing buffer as they come, so an entry's bytes can be
    freed as soon as it is read (a large load holds no second copy of every vector)."""
    caps: dict[str, Capability] = {}
    rows: dict[str, int] = {}
    width = dim * 4
    buffer = bytearray()
    for capability, vector in entries:
        if len(vector) != width:
            continue  # a vector of another model or size: left for a reindex
        caps[capability.id] = capability  # a repeated id: the later entry wins
        row = rows.setdefault(capability.id, len(rows))
        if row * width == len(buffer):
            buffer += vector
        else:
            buffer[row * width : (row + 1) * width] = vector
    matrix = np.frombuffer(buffer, dtype=np.float32).reshape(len(rows), dim)
    return caps, matrix


def _reduced_index(retriever: Retriever) -> RetrievalIndex | None:
    """The retrieval index of a hybrid retriever that reduced its vectors and kept no full
    ones (a catalog above ``rescore_below``), else None."""
    if not isinstance(retriever, HybridRetriever):
        return None
    index = retriever.index
    return index if index.projection is not None and index.exact is None else None


def _kept(matrix: Matrix, retriever: Retriever, dim: int) -> Matrix:
    """What a snapshot of ``dim``-wide vectors keeps of them beside ``retriever``: nothing (an
    empty matrix of that width) when the retriever holds them reduced, else ``matrix``."""
    if _reduced_index(retriever) is None:
        return matrix
    return np.zeros((0, dim), dtype=np.float32)


class _Listed(NamedTuple):
    """A capability as Tier 0 lists it (:class:`capdisc.discovery.tiers.Listed`)."""

    category: str
    name: str


def _empty_table() -> CapabilityTable:
    return CapabilityTable.of(())


@dataclass(frozen=True)
class IndexSnapshot:
    """One tenant's searchable state at one index version.

    ``capabilities`` is a :class:`~capdisc.captable.CapabilityTable`: each capability is parsed
    when it is read, so per-turn code reads the few it renders. ``embedder_id`` names the
    embedder the vectors (and query vectors) come from: it selects the relevance calibration
    and abstention threshold; ``probes`` are that embedder's vectors of
    :data:`capdisc.retrieval.probes.PROBES`, which adapt the threshold to the catalog.
    ``marks`` are those of the served capabilities the tool-poisoning scan flagged
    (:mod:`capdisc.registry.flags`); capabilities the tenant's policy withholds are not in a
    snapshot at all.

    ``matrix`` holds the stored vectors, except when the retriever keeps them reduced to its
    projection only (a hybrid retriever above ``rescore_below`` rows): then it is empty, and
    :meth:`vectors` gives them back from the reduced rows (1.5 KB less per capability held).
    """

    tenant: str
    version: int
    dim: int
    ids: Sequence[str] = ()
    capabilities: CapabilityTable = field(default_factory=_empty_table)
    matrix: Matrix = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    retriever: Retriever = field(default=None, repr=False)  # type: ignore[assignment]
    embedder_id: str = ""
    factory: RetrieverFactory = field(default=hybrid_retriever, repr=False, compare=False)
    probes: Matrix | None = field(default=None, repr=False, compare=False)
    marks: Mapping[str, Mark] = field(default_factory=dict, repr=False)
    _tier0: dict[tuple[int, str, Caller], str] = field(
        default_factory=dict, repr=False, compare=False
    )

    @cached_property
    def graph(self) -> nx.Graph:
        """The capability graph, built on first use: only graph re-ranking needs it (it reads
        every capability)."""
        return build_graph(self.capabilities.values())

    @classmethod
    def build(
        cls,
        tenant: str,
        version: int,
        dim: int,
        entries: Iterable[tuple[Capability, bytes]],
        embedder_id: str = "",
        retriever: RetrieverFactory = hybrid_retriever,
        probes: Matrix | None = None,
        previous: IndexSnapshot | None = None,
        marks: Mapping[str, Mark] | None = None,
    ) -> IndexSnapshot:
        caps, matrix = _gather(entries, dim)
        parsed = tuple(caps.values())
        table = CapabilityTable.of(parsed)
        del caps
        return cls._made(
            tenant,
            version,
            dim,
            parsed,
            table,
            matrix,
            embedder_id,
            retriever,
            probes,
            previous,
            marks or {},
        )

    @classmethod
    def _made(
        cls,
        tenant: str,
        version: int,
        dim: int,
        readable: Sequence[Capability],
        table: CapabilityTable,
        matrix: Matrix,
        embedder_id: str,
        factory: RetrieverFactory,
        probes: Matrix | None,
        previous: IndexSnapshot | None,
        marks: Mapping[str, Mark],
    ) -> IndexSnapshot:
        made = factory(
            readable,
            table,
            matrix,
            embedder_id,
            probes,
            previous.retriever if previous is not None else None,
        )
        if isinstance(readable, _Readable) and readable.reduced and _reduced_index(made) is None:
            raise ValueError("a delta of reduced rows needs a retriever that keeps them reduced")
        return cls(
            tenant,
            version,
            dim,
            table.ids,
            table,
            _kept(matrix, made, dim),
            made,
            embedder_id,
            factory,
            probes,
            {i: m for i, m in marks.items() if i in table},
        )

    def __len__(self) -> int:
        return len(self.ids)

    def vectors(self) -> Matrix:
        """The stored vectors, row ``i`` for ``ids[i]``: :attr:`matrix`, or when the retriever
        keeps them reduced, the reduced rows mapped back (``rows @ projection.T``). Projected
        again, those give the very same reduced rows, so a delta built from them scores as
        the snapshot it came from; beside the originals they lose only what the projection
        dropped."""
        if len(self.matrix) == len(self.ids):
            return self.matrix
        reduced, projection = self._reduced()
        full: Matrix = np.ascontiguousarray(reduced @ projection.T, dtype=np.float32)
        return full

    def _reduced(self) -> tuple[Matrix, Matrix]:
        """The reduced rows and the projection of a snapshot that keeps no full vectors."""
        index = _reduced_index(self.retriever)
        if index is None or index.projection is None:
            raise ValueError(f"snapshot {self.tenant} v{self.version} holds no vectors")
        return index.matrix, index.projection

    @property
    def search_mode(self) -> str:
        """``graph`` once a large catalog's HNSW graph serves its queries, else ``exact``."""
        retriever = self.retriever
        if isinstance(retriever, HybridRetriever) and retriever.index.neighbors.graph is not None:
            return "graph"
        return "exact"

    def with_changes(
        self,
        version: int,
        upserts: Iterable[tuple[Capability, bytes]],
        deletes: Iterable[str],
        marks: Mapping[str, Mark] | None = None,
    ) -> IndexSnapshot:
        """A new snapshot at ``version`` with ``upserts`` replaced (at their rows) or added and
        ``deletes`` gone; an upserted capability's mark is its entry in ``marks`` (none if
        absent). An upsert whose vector is of another size is dropped (left for a reindex).
        Unchanged capabilities are neither parsed nor compressed again."""
        width = self.dim * 4
        latest: dict[str, tuple[Capability, bytes]] = {}
        for capability, vector in upserts:
            latest[capability.id] = (capability, vector)
        fresh = [(c, v) for c, v in latest.values() if len(v) == width]
        gone = [*deletes, *(cid for cid, (_, v) in latest.items() if len(v) != width)]
        table, sources = self.capabilities.changed([c for c, _ in fresh], gone)
        matrix, reduced = self._moved_vectors(sources, [v for _, v in fresh])
        kept = {i: m for i, m in self.marks.items() if i not in latest}
        kept.update(marks or {})
        return IndexSnapshot._made(
            self.tenant,
            version,
            self.dim,
            _Readable(table, [c for c, _ in fresh], sources, reduced),
            table,
            matrix,
            self.embedder_id,
            self.factory,
            self.probes,
            self,
            kept,
        )

    def recent_texts(self, limit: int) -> RecentTexts:
        """Up to ``limit`` query texts whose BM25 figures this snapshot's retrieval index
        remembered last (:meth:`~capdisc.retrieval.textstats.TextMemo.recent`; none without
        one), as their terms: what the snapshot that replaces it is warmed with
        (:meth:`warm`)."""
        retriever = self.retriever
        if not isinstance(retriever, HybridRetriever):
            return []
        index = retriever.index
        return [(index.lexicon.terms_of(ids), kept) for ids, kept in index.texts.recent(limit)]

    def warm(self, texts: RecentTexts, go_on: Callable[[], bool] = lambda: True) -> int:
        """Remember ``texts``' BM25 figures over this catalog (as :meth:`recent_texts` of the
        snapshot this one replaces gives them), so the busy queries' first turns here cost no
        more than their next ones; stops early once ``go_on`` says no. How many were
        computed (0 without a retrieval index)."""
        retriever = self.retriever
        if not isinstance(retriever, HybridRetriever):
            return 0
        lexicon = retriever.index.lexicon
        ids = [(lexicon.ids_of(terms), kept) for terms, kept in texts]
        return retriever.index.texts.warm(lexicon, [(i, kept) for i, kept in ids if i.size], go_on)

    def _moved_vectors(self, sources: list[int], fresh: list[bytes]) -> tuple[Matrix, bool]:
        """The vectors of a table whose row ``i`` was row ``sources[i]`` here (or, when
        negative, is ``fresh[-1 - sources[i]]``), and whether they are reduced rows.

        When the retriever keeps its vectors reduced, so are these: kept rows are copied as
        they are and new ones projected, and no full vector is made (at a million rows, 1.5 GB
        and two products of the whole matrix less). Kept rows are copied a slice at a time."""
        index = _reduced_index(self.retriever)
        source = index.matrix if index is not None else self.matrix
        matrix = np.empty((len(sources), source.shape[1]), dtype=np.float32)
        picks = np.asarray(sources, dtype=np.int64)
        kept = np.flatnonzero(picks >= 0)
        for start in range(0, kept.size, MOVED_SLICE):
            rows = kept[start : start + MOVED_SLICE]
            matrix[rows] = source[picks[rows]]
        new = np.flatnonzero(picks < 0)
        if new.size:
            vectors = np.stack(
                [np.frombuffer(fresh[-1 - int(p)], dtype=np.float32) for p in picks[new]]
            )
            projection = index.projection if index is not None else None
            matrix[new] = vectors @ projection if projection is not None else vectors
        return matrix, index is not None

    def search(
        self, query: Vector, k: int, kind: str | None = None
    ) -> list[tuple[Capability, float]]:
        """Plain dense top-``k`` by cosine (optionally of one ``kind``), best first."""
        found = CosineRetriever(self.capabilities.by_row, self.vectors()).search(
            "", query, k, SearchFilters(kind=kind), DiscoveryConfig()
        )
        return [(self.capabilities[h.id], h.score) for h in found.hits]

    def tier0(self, budget_tokens: int, counter_name: str, caller: Caller = ANONYMOUS) -> str:
        """Tier 0 for this snapshot, of the capabilities ``caller`` may see, computed once per
        budget, counter and (when some capabilities are restricted) caller."""
        if self.all_open:
            caller = ANONYMOUS
        key = (budget_tokens, counter_name, caller)
        if key not in self._tier0:
            if len(self._tier0) >= TIER0_CACHE:
                self._tier0.clear()
            table = self.capabilities
            rows = range(len(table)) if self.all_open else table.visible_rows(caller)
            self._tier0[key] = tier0_text(
                (_Listed(table.category(row), table.names[row]) for row in rows),
                budget_tokens,
                make_counter(counter_name),
            )
        return self._tier0[key]

    @cached_property
    def has_installable(self) -> bool:
        """Whether any capability is not available yet (so offering installables can help)."""
        return not bool(self.capabilities.available.all())

    @cached_property
    def all_open(self) -> bool:
        """Whether every capability is visible to the whole tenant."""
        return self.capabilities.all_open


class _Readable(Sequence[Capability]):
    """A delta's capabilities by row: the upserted ones as given, the rest parsed from the
    table when read (a hybrid retriever reads only the changed ones). ``sources``: per row,
    its row in the snapshot the delta applies to (negative: new or changed). ``reduced``: the
    delta's matrix holds reduced rows, in the projection of that snapshot's retriever (only
    a hybrid retriever that reduced its vectors is handed those)."""

    def __init__(
        self,
        table: CapabilityTable,
        fresh: list[Capability],
        sources: list[int],
        reduced: bool = False,
    ) -> None:
        self.table, self.fresh, self.sources, self.reduced = table, fresh, sources, reduced

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> Capability:  # type: ignore[override]
        source = self.sources[index]
        return self.fresh[-1 - source] if source < 0 else self.table.row(index)
