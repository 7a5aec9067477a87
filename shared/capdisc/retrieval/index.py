"""The retrieval index: which capabilities a turn needs, ranked, with a calibrated relevance.

One immutable :class:`RetrievalIndex` per snapshot, built once (BM25 postings, the dense matrix,
filter masks, the exact-name table) so a query only does arithmetic:

1. **Exact name** (:mod:`capdisc.retrieval.names`). A query that names a capability ranks that
   capability first.
2. **Hybrid scores** (:mod:`capdisc.retrieval.scoring`). Dense cosine (optionally the weighted
   sum of a full-text and a summary vector per capability, folded into one matrix at build
   time) and BM25 (:mod:`capdisc.retrieval.lexical`) are fused; a row's lexical part is
   damped by how much of the request its words cover (:mod:`capdisc.retrieval.coverage`).
3. **Decomposition** (:mod:`capdisc.retrieval.decompose`). A query that chains several requests
   is split into sub-queries; each is scored the same way, and every sub-query whose best
   capability stands out (fused z >= ``subquery_min_z``, or ``few_parts_min_z`` in a request
   of at most ``few_parts`` parts) reserves a slot for it right after the whole query's best
   match (:func:`capdisc.retrieval.results.merge`). The rest of the list
   follows the whole query's ranking.
4. **Relevance and abstention** (:mod:`capdisc.retrieval.relevance`). Each entry gets a
   relevance in [0, 1]; the result abstains when no entry reaches the threshold (an exact-name
   match never abstains).

Catalogs larger than ``reduce_above`` rows are searched in a ``reduce_dims`` projection of the
vectors (half the memory traffic). Up to ``rescore_below`` rows the index also keeps the full
vectors and scores the rows a query asks for, and ``rescore_rows`` more, again with exact
cosines (:class:`ExactRows`): the projection drops the directions that tell near-duplicates
apart. Filters (:class:`capdisc.filters.SearchFilters`: kind, category, tags, availability,
ids, and the caller's visibility) are applied before top-k, as a row mask.

Catalogs larger than ``ann_above`` rows, once their HNSW graph is built, score candidate rows
only (:class:`_Pooled`): the graph's dense best and the BM25 best, with catalog-wide moments.
The BM25 side then reads no score row of the catalog's length: a query text's moments and
best rows are computed once and remembered (:mod:`capdisc.retrieval.textstats`), and the
candidates' scores are read from their documents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import numpy.typing as npt

from capdisc.access import Caller
from capdisc.captable import CapabilityTable, IdRows, PackedStrings
from capdisc.embedders.port import Matrix, Vector
from capdisc.filters import NO_FILTERS, SearchFilters
from capdisc.models import Capability
from capdisc.retrieval.config import DEFAULT_CONFIG, RetrievalConfig
from capdisc.retrieval.coverage import CoverageOf, damp_uncovered, part_coverage
from capdisc.retrieval.decompose import decompose
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.entities import annotate
from capdisc.retrieval.lexical import LexicalIndex, Scores
from capdisc.retrieval.names import NameTable, build_name_table, named_rows, row_name_keys
from capdisc.retrieval.neighbors import Graph, NeighborSlot, dense_candidates
from capdisc.retrieval.relevance import abstain_threshold, probe_cosines
from capdisc.retrieval.results import RetrievalResult, Scored, best_rows, entries, merge
from capdisc.retrieval.scoring import (
    LexicalScores,
    fuse,
    fuse_pooled,
    mix_side,
)
from capdisc.retrieval.textstats import TextMemo
from capdisc.retrieval.topk import BoolArray, candidate_pool

#: Embeds extra query texts (sub-queries): one L2-normalized row per text.
QueryEmbed = Callable[[list[str]], Matrix]
RowArray = npt.NDArray[np.int32]


@dataclass(frozen=True, eq=False)
class ExactRows:
    """A projected index's full vectors, their mean row and second-moment matrix: the exact
    cosines of a few rows and the catalog-wide moments they are standardized with."""

    matrix: Matrix
    mean_vector: Vector
    moment: Matrix

    @classmethod
    def of(cls, matrix: Matrix, gram: npt.NDArray[np.float64] | None = None) -> ExactRows:
        """``matrix``'s (``gram``: its Gram matrix, when already computed)."""
        gram = gram if gram is not None else _gram(matrix)
        return cls(matrix, _mean_row(matrix), _second_moment(gram, len(matrix)))


@dataclass(frozen=True, eq=False)
class RetrievalIndex:
    """Everything a query needs, precomputed from one set of capabilities and their vectors."""

    #: The capabilities, compressed (:mod:`capdisc.captable`); its ids and rows are the index's.
    table: CapabilityTable
    ids: PackedStrings
    matrix: Matrix
    lexicon: LexicalIndex
    names: NameTable
    #: Rows of each kind, category and tag (row indices, not per-value masks: a catalog of
    #: 100,000 capabilities with thousands of categories and tags would hold GBs of masks).
    kinds: dict[str, RowArray]
    categories: dict[str, RowArray]
    tags: dict[str, RowArray]
    available: BoolArray
    #: Visibility (:mod:`capdisc.access`): rows open to the whole tenant, rows per role, per user.
    open_rows: BoolArray
    role_rows: dict[str, RowArray]
    user_rows: dict[str, RowArray]
    #: Per row, the keys that could name its capability, as one string
    #: (:func:`capdisc.retrieval.names.row_name_keys`; checks a name's hash, and kept for the
    #: next delta).
    row_keys: PackedStrings
    rows: IdRows
    #: Mean row and second-moment matrix of ``matrix``: the catalog mean and deviation of a
    #: query's cosines, without scoring every row.
    mean_vector: Vector
    moment: Matrix
    #: ``embedding dim x reduced dim`` projection applied to query vectors, or None.
    projection: Matrix | None
    #: Per probe query (:mod:`capdisc.retrieval.probes`), its best cosine over the catalog, sorted.
    probe_cosines: tuple[float, ...] = ()
    #: The probe queries' vectors in the searched space, for the per-query abstention signal.
    probe_rows: Matrix | None = None
    #: The HNSW graph of ``matrix`` once built (large catalogs only; see ``ann_above``).
    neighbors: NeighborSlot = field(default_factory=NeighborSlot)
    #: Query texts' BM25 figures over the catalog (:mod:`capdisc.retrieval.textstats`).
    texts: TextMemo = field(default_factory=TextMemo)
    #: The full vectors of a projected index small enough to keep them (``rescore_below``).
    exact: ExactRows | None = None

    @classmethod
    def build(
        cls,
        capabilities: Sequence[Capability],
        vectors: Matrix,
        *,
        summary_vectors: Matrix | None = None,
        texts: Sequence[str] | None = None,
        probe_vectors: Matrix | None = None,
        config: RetrievalConfig = DEFAULT_CONFIG,
        previous: RetrievalIndex | None = None,
        table: CapabilityTable | None = None,
        sources: Sequence[int] | None = None,
        reduced: bool = False,
    ) -> RetrievalIndex:
        """Index ``capabilities``; ``vectors`` row ``i`` embeds capability ``i`` (L2-normalized).

        ``summary_vectors`` (optional, same shape) embed a short name-and-summary text; the dense
        score is then ``w * cos(full) + (1 - w) * cos(summary)``, folded into one matrix here.
        ``texts`` overrides the BM25 text (default
        :func:`capdisc.retrieval.documents.lexical_text`). ``probe_vectors`` embed
        :data:`capdisc.retrieval.probes.PROBES`, for the per-catalog abstention threshold.
        ``previous``: an index of mostly the same capabilities (a hot-reload delta); the
        capabilities whose record it holds unchanged keep their BM25 terms, name keys and
        facets, and its dimension reduction is kept, so an update costs a fraction of a build.
        ``table``: the capabilities as the index keeps them (default: made of ``capabilities``);
        with ``previous``, only the changed ones are read from ``capabilities``, so it may be
        the table's own :attr:`~capdisc.captable.CapabilityTable.by_row` view. ``sources``
        (with ``previous``): per row, the row of ``previous`` its record was copied from, or a
        negative number for a new or changed one (as
        :meth:`~capdisc.captable.CapabilityTable.changed` gives them), so the unchanged rows
        need not be compared record by record. ``reduced`` (with ``previous``): ``vectors``
        are rows in ``previous``'s projection already (a delta of a reduced index), so no
        full vector is projected again.
        """
        table = table if table is not None else CapabilityTable.of(capabilities)
        if len(table) != len(capabilities):
            raise ValueError(
                f"{len(capabilities)} capabilities for a table of {len(table)} (an id repeated?)"
            )
        matrix, projection, moment, exact = (
            _reduced_side(vectors, len(table), previous)
            if reduced
            else _dense_side(vectors, summary_vectors, len(table), config, previous)
        )
        reuse = _reuse(table, previous, sources) if previous is not None and texts is None else None
        lexicon = _lexicon(capabilities, texts, previous, reuse)
        row_keys = _row_keys(capabilities, previous, reuse)
        names = build_name_table(row_keys, lexicon)
        kinds, categories, tags, roles, users = _facets(capabilities, previous, reuse)
        mean_vector = _mean_row(matrix)
        return cls(
            table=table,
            ids=table.ids,
            matrix=matrix,
            lexicon=lexicon,
            names=names,
            kinds=kinds,
            categories=categories,
            tags=tags,
            available=table.available,
            open_rows=table.open,
            role_rows=roles,
            user_rows=users,
            row_keys=row_keys,
            rows=table.rows,
            mean_vector=mean_vector,
            moment=moment,
            projection=projection,
            probe_cosines=(
                probe_cosines(exact.matrix, probe_vectors, None)
                if exact is not None
                else probe_cosines(matrix, probe_vectors, projection)
            ),
            probe_rows=_probe_rows(probe_vectors, projection if exact is None else None),
            exact=exact,
        )

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def everyone(self) -> BoolArray:
        """Every row, as a read-only mask (computed once)."""
        mask = np.ones(len(self.ids), dtype=bool)
        mask.flags.writeable = False
        return mask

    @cached_property
    def all_open(self) -> bool:
        """Whether every row is open to the whole tenant (computed once)."""
        return bool(self.open_rows.all())

    # -- searching ------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        query_vector: Vector,
        k: int,
        *,
        filters: SearchFilters = NO_FILTERS,
        embed: QueryEmbed | None = None,
        config: RetrievalConfig = DEFAULT_CONFIG,
    ) -> RetrievalResult:
        """The ``k`` best capabilities for ``query`` among those ``filters`` admit (visible to
        their caller included).

        ``query_vector`` embeds ``query`` (with its entities' kinds written beside them when
        ``config.entity_types`` is on: :func:`capdisc.retrieval.entities.annotate`); ``embed``
        embeds sub-queries (without it, or with ``config.decompose`` off, the query is not
        decomposed).
        """
        allowed = self._allowed(filters)
        if k <= 0 or not allowed.any():
            return RetrievalResult((), abstained=True)
        vector = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        exact = self._exact(query, allowed) if config.exact_name else None
        text = annotate(query) if config.entity_types else query
        parts = self._subqueries(text, embed, config)
        want = max(k + len(parts) + 1, config.candidates if parts else 0)
        graph = self._graph(config)
        lexical = self._lexical([text, *parts], allowed, want, graph is not None, config)
        pooled = (
            _Pooled(self, graph, self._project(vector), lexical.text(0), want, config)
            if graph is not None
            else None
        )
        whole = pooled.score() if pooled is not None else self._score_whole(vector, lexical, config)
        coverage = part_coverage(self.lexicon, lexical.term_ids)
        whole = self._covered(whole, coverage, allowed, config)
        ranking = self._ranked(whole, allowed, (k, want), vector, exact, config)
        scored_parts = (
            self._score_parts(parts, lexical.parts(), embed, ranking, allowed, config)
            if parts and embed is not None
            else []
        )
        if pooled is not None:  # every row the merge may place gets the whole query's score
            extended = pooled.extend(whole, [exact] if exact is not None else [], scored_parts)
            if extended is not whole:
                whole = self._covered(extended, coverage, allowed, config)
                ranking = best_rows(whole, allowed, want)
        order = merge(ranking, scored_parts, k, exact, config)
        shift = self._probe_shift(vector, config)
        ranked = entries(order, whole, scored_parts, self.ids, self.lexicon, config, shift)
        threshold = self.abstain_threshold(config)
        abstained = exact is None and not any(e.relevance >= threshold for e in ranked)
        return RetrievalResult(
            ranked,
            abstained=abstained,
            subqueries=tuple(parts),
            exact_match=self.ids[exact] if exact is not None else None,
        )

    def abstain_threshold(self, config: RetrievalConfig) -> float:
        """The relevance an answer needs: the configured floor, raised to how close this
        catalog comes to the probe queries (0 never abstains)."""
        return abstain_threshold(self.probe_cosines, config)

    def _probe_shift(self, vector: Vector, config: RetrievalConfig) -> float:
        """How much closer than usual the query comes to a request that needs no capability
        (its nearest probe's cosine over ``probe_baseline``), times ``probe_penalty``: taken
        off every entry's cosine before its relevance, so small talk that happens to sit near
        a tool is less often answered."""
        if not config.probe_penalty or self.probe_rows is None:
            return 0.0
        nearest = float((self.probe_rows @ self._exactly(vector)).max())
        return config.probe_penalty * (nearest - config.probe_baseline)

    def _graph(self, config: RetrievalConfig) -> Graph | None:
        """The graph a query's candidates come from: a large catalog's, once built (None:
        score every row)."""
        graph = self.neighbors.graph
        if graph is None or config.fusion != "zscore" or not config.ann_above:
            return None
        if len(self.ids) <= config.ann_above or graph.rows != len(self.ids):
            return None
        return graph

    def _covered(
        self,
        whole: Scored,
        coverage: CoverageOf,
        allowed: BoolArray,
        config: RetrievalConfig,
    ) -> Scored:
        """``whole`` with its lexical side damped by how much of the request (or of its
        best-covered part) each best row covers (:mod:`capdisc.retrieval.coverage`)."""
        if not config.coverage_power or whole.lexical is None:
            return whole
        return damp_uncovered(whole, allowed, coverage, config.coverage_power)

    def _subqueries(
        self, query: str, embed: QueryEmbed | None, config: RetrievalConfig
    ) -> list[str]:
        if embed is None or not config.decompose or config.fusion != "zscore":
            return []
        parts = decompose(query, config.max_subqueries, implied=config.entity_types)
        return parts if len(parts) > 1 else []

    def _lexical(
        self,
        texts: list[str],
        allowed: BoolArray,
        want: int,
        pooled: bool,
        config: RetrievalConfig,
    ) -> LexicalScores:
        """The BM25 side of the query and its parts among the ``allowed`` rows: every row's
        scores, or (``pooled``: candidates only are scored) what the candidates need, from
        each text's figures over the catalog, remembered."""
        term_ids = [self.lexicon.term_ids(text) for text in texts]
        if not pooled:
            return LexicalScores.full(self.lexicon, term_ids, allowed)
        reach = max(config.ann_candidates, want, config.candidates)
        return LexicalScores.remembered(self.texts, self.lexicon, term_ids, allowed, reach)

    def _score_whole(
        self, vector: Vector, lexical: LexicalScores, config: RetrievalConfig
    ) -> Scored:
        """Every row's scores for the whole query (``lexical``: its BM25 side first)."""
        vector = self._project(vector)
        cosine: Scores = self.matrix @ vector
        term_ids, bm25 = lexical.term_ids[0], lexical.row(0)
        if config.fusion != "zscore":
            return Scored(None, cosine, fuse(cosine, bm25, config), term_ids)
        mean, deviation = _spread(vector, self.mean_vector, self.moment)
        side = lexical.side(0, config)
        fused = mix_side(cosine, mean, deviation, side, config)
        return Scored(None, cosine, fused, term_ids, side, (mean, deviation))

    def _ranked(
        self,
        whole: Scored,
        allowed: BoolArray,
        sizes: tuple[int, int],
        vector: Vector,
        exact: int | None,
        config: RetrievalConfig,
    ) -> list[int]:
        """The best rows of ``whole`` (``sizes``: the ``k`` asked for and how many ranked). With
        full vectors kept, the best ``k + 1 + rescore_rows`` of the projected scores (and the
        ``exact``-name row) are scored again with exact cosines first, in ``whole`` itself,
        and lead the ranking in the order of those."""
        k, want = sizes
        if self.exact is None or whole.dense is None or not config.rescore_rows:
            return best_rows(whole, allowed, want)
        head = min(want, k + 1) + config.rescore_rows
        rows = best_rows(whole, allowed, max(want, head))
        again = rows[:head] if exact is None or exact in rows[:head] else [*rows[:head], exact]
        _rescore(whole, np.asarray(again, dtype=np.int64), vector, self.exact, whole.dense, config)
        fused = whole.fused
        return (sorted(rows[:head], key=lambda row: (-fused[row], row)) + rows[head:])[:want]

    def _score_parts(
        self,
        parts: list[str],
        lexical: LexicalScores,
        embed: QueryEmbed,
        ranking: list[int],
        allowed: BoolArray,
        config: RetrievalConfig,
    ) -> list[Scored]:
        """Score all sub-queries at once, on candidate rows only: the whole query's fused top
        rows (``ranking``) and each sub-query's BM25 top rows. The z-scores use catalog-wide
        moments (the dense ones from the matrix moments), so they equal a full pass's."""
        vectors = self._exactly(np.asarray(embed(parts), dtype=np.float32))
        matching = [lexical.matching(i, config.candidates) for i in range(len(parts))]
        pool = candidate_pool(ranking, matching, allowed, config.candidates)
        space = self.exact or self
        cosine = vectors @ space.matrix[pool].T  # (parts, pool)
        means = vectors @ space.mean_vector
        spread = ((vectors @ space.moment) * vectors).sum(axis=1) - means**2
        fused = fuse_pooled(cosine, means, spread, lexical.at(pool), lexical.moments, config)
        term_ids = lexical.term_ids
        return [Scored(pool, cosine[i], fused[i], term_ids[i]) for i in range(len(parts))]

    def _project(self, vectors: Matrix) -> Matrix:
        """Query vectors in the space the catalog is searched in."""
        return vectors @ self.projection if self.projection is not None else vectors

    def _exactly(self, vectors: Matrix) -> Matrix:
        """Query vectors in the space rows are scored exactly in: as given when the full
        vectors are kept (:class:`ExactRows`), else the searched space."""
        return vectors if self.exact is not None else self._project(vectors)

    def _exact(self, query: str, allowed: BoolArray) -> int | None:
        """The first row ``query`` names that the search allows."""
        return next(
            (row for row in named_rows(query, self.names, self.row_keys) if allowed[row]), None
        )

    # -- filters ----------------------------------------------------------------------------------

    def _allowed(self, filters: SearchFilters) -> BoolArray:
        """Rows ``filters`` admit (:meth:`capdisc.filters.SearchFilters.admits`, as a mask;
        read-only)."""
        if self.all_open and replace(filters, caller=NO_FILTERS.caller) == NO_FILTERS:
            return self.everyone  # anyone may see every row, and nothing else is asked
        allowed = np.ones(len(self.ids), dtype=bool)
        chosen = (
            ([self.kinds.get(filters.kind)] if filters.kind is not None else [])
            + ([self.categories.get(filters.category)] if filters.category is not None else [])
            + [self.tags.get(tag) for tag in filters.tags]
        )
        for rows in chosen:
            mask = np.zeros(len(self.ids), dtype=bool)
            if rows is not None:
                mask[rows] = True
            allowed &= mask
        if filters.only_available:
            allowed &= self.available
        if filters.only_installable:
            allowed &= ~self.available
        for cap_id in filters.exclude_ids:
            row = self.rows.get(cap_id)
            if row is not None:
                allowed[row] = False
        if filters.include_ids is not None:
            allowed &= self._only(filters.include_ids)
        if not self.all_open:
            allowed &= self._visible(filters.caller)
        return allowed

    def _visible(self, caller: Caller) -> BoolArray:
        """Rows ``caller`` may see (:func:`capdisc.access.visible`, as a mask)."""
        mask = self.open_rows.copy()
        for role in caller.roles:
            rows = self.role_rows.get(role)
            if rows is not None:
                mask[rows] = True
        rows = self.user_rows.get(caller.user) if caller.user is not None else None
        if rows is not None:
            mask[rows] = True
        return mask

    def _only(self, ids: Collection[str]) -> BoolArray:
        mask = np.zeros(len(self.ids), dtype=bool)
        rows = [self.rows[i] for i in ids if i in self.rows]
        mask[rows] = True
        return mask


class _Pooled:
    """One query's scores on candidate rows only: the graph's dense best and the BM25 best
    (:data:`RetrievalConfig.ann_candidates` each), scored exactly with catalog-wide moments, so
    every candidate's fused score equals the full pass's."""

    def __init__(
        self,
        index: RetrievalIndex,
        graph: Graph,
        vector: Vector,
        lexical: LexicalScores,
        want: int,
        config: RetrievalConfig,
    ) -> None:
        """``vector``: the query's, in the searched space; ``lexical``: its BM25 side alone,
        among the rows the search admits."""
        self.index, self.graph, self.vector, self.config = index, graph, vector, config
        self.allowed = lexical.allowed
        #: Whether the search admits fewer than every row (the graph walk then checks it).
        self.restricted = self.allowed is not index.everyone
        self.size = max(config.ann_candidates, want)
        mean = float(vector @ index.mean_vector)
        self.means = np.array([mean], dtype=np.float32)
        self.variances = np.array(
            [max(float(vector @ index.moment @ vector) - mean * mean, 1e-12)], dtype=np.float32
        )
        self.lexical, self.side = lexical, lexical.side(0, config)

    def score(self) -> Scored:
        """The query's scores on its candidates."""
        index = self.index
        dense = dense_candidates(
            index.matrix,
            self.vector,
            self.size,
            self.allowed if self.restricted else None,
            self.graph,
            self.config.ann_exact_below,
        )
        matching = self.lexical.matching(0, self.size)
        return self._at(np.union1d(dense, matching))

    def extend(self, whole: Scored, rows: list[int], parts: list[Scored]) -> Scored:
        """``whole`` with the rows of ``rows`` and of the sub-queries' candidates added."""
        assert whole.rows is not None
        extra = [np.asarray(rows, dtype=np.int64)] + [p.rows for p in parts if p.rows is not None]
        pool = np.union1d(whole.rows, np.concatenate(extra))
        return whole if pool.size == whole.rows.size else self._at(pool)

    def _at(self, pool: npt.NDArray[np.int64]) -> Scored:
        cosine = self.index.matrix[pool] @ self.vector
        lexical = self.lexical
        fused = fuse_pooled(
            cosine[None, :],
            self.means,
            self.variances,
            lexical.at(pool),
            lexical.moments,
            self.config,
        )
        return Scored(pool, cosine, fused[0], lexical.term_ids[0], self.side)


# -- building ------------------------------------------------------------------------------------


DenseSide = tuple[Matrix, Matrix | None, Matrix, ExactRows | None]


def _dense_side(
    vectors: Matrix,
    summary_vectors: Matrix | None,
    count: int,
    config: RetrievalConfig,
    previous: RetrievalIndex | None,
) -> DenseSide:
    """The matrix queries are scored against, the projection it was reduced with (kept from
    ``previous`` when it has one), its second-moment matrix (from the full matrix's Gram
    matrix whenever that is computed: one product of the large matrix instead of two) and,
    for a projected catalog small enough, its full vectors (:func:`_keeps_exact`)."""
    matrix = _dense_matrix(vectors, summary_vectors, count, config.full_text_weight)
    kept = previous.projection if previous is not None else None
    if kept is not None and not _keeps_exact(count, config):  # the reduced rows' moment only
        reduced = np.ascontiguousarray(matrix @ kept)
        return reduced, kept, _second_moment(_gram(reduced), count), None
    gram = _gram(matrix)
    projection = kept if kept is not None else _projection(gram, count, config)
    if projection is None:
        return matrix, None, _second_moment(gram, count), None
    reduced = np.ascontiguousarray(matrix @ projection)
    moment = _second_moment(projection.T @ gram @ projection, count)
    exact = ExactRows.of(matrix, gram) if _keeps_exact(count, config) else None
    return reduced, projection, moment, exact


def _keeps_exact(count: int, config: RetrievalConfig) -> bool:
    """Whether a projected catalog of ``count`` rows keeps its full vectors: at most
    ``rescore_below`` rows, and not large enough for the graph."""
    limit = min(config.rescore_below, config.ann_above or config.rescore_below)
    return bool(config.rescore_rows) and 0 < count <= limit


def _spread(vector: Vector, mean_vector: Vector, moment: Matrix) -> tuple[float, float]:
    """The mean and deviation of ``vector``'s cosines over the catalog of these moments."""
    mean = float(vector @ mean_vector)
    return mean, math.sqrt(max(float(vector @ moment @ vector) - mean * mean, 1e-12))


def _rescore(
    scored: Scored,
    rows: npt.NDArray[np.int64],
    vector: Vector,
    exact: ExactRows,
    projected: tuple[float, float],
    config: RetrievalConfig,
) -> None:
    """``scored`` (every row, projected) with exact cosines at ``rows``, in place: their dense
    z-score, standardized with the full vectors' moments, replaces the projected one
    (``projected``: that pass's mean and deviation)."""
    mean, deviation = projected
    exact_mean, exact_deviation = _spread(vector, exact.mean_vector, exact.moment)
    cosine = exact.matrix[rows] @ vector
    change = (cosine - exact_mean) / exact_deviation - (scored.cosine[rows] - mean) / deviation
    scored.fused[rows] += (config.dense_weight * change).astype(np.float32)
    scored.cosine[rows] = cosine


def _reduced_side(rows: Matrix, count: int, previous: RetrievalIndex | None) -> DenseSide:
    """:func:`_dense_side` of rows in ``previous``'s projection already."""
    projection = previous.projection if previous is not None else None
    if projection is None or rows.ndim != 2 or rows.shape != (count, projection.shape[1]):
        raise ValueError(
            f"reduced rows of shape {getattr(rows, 'shape', None)} for {count} capabilities "
            "need an earlier index with a projection of that width"
        )
    matrix = np.ascontiguousarray(rows, dtype=np.float32)
    return matrix, projection, _second_moment(_gram(matrix), count), None


def _gram(matrix: Matrix) -> npt.NDArray[np.float64]:
    """``matrix.T @ matrix`` (single-precision product, double-precision result)."""
    gram: npt.NDArray[np.float64] = (matrix.T @ matrix).astype(np.float64)
    return gram


def _second_moment(gram: npt.NDArray[np.float64], rows: int) -> Matrix:
    moment: Matrix = (gram / max(rows, 1)).astype(np.float32)
    return moment


def _dense_matrix(
    vectors: Matrix, summary_vectors: Matrix | None, count: int, full_text_weight: float
) -> Matrix:
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != count:
        raise ValueError(
            f"vectors must have one row per capability: got {matrix.shape} for {count} capabilities"
        )
    if summary_vectors is not None:
        summary = np.asarray(summary_vectors, dtype=np.float32)
        if summary.shape != matrix.shape:
            raise ValueError(f"summary_vectors shape {summary.shape} != {matrix.shape}")
        matrix = full_text_weight * matrix + (1.0 - full_text_weight) * summary
    return np.ascontiguousarray(matrix, dtype=np.float32)


def _projection(gram: npt.NDArray[np.float64], rows: int, config: RetrievalConfig) -> Matrix | None:
    """Top right singular vectors of the matrix whose Gram matrix is ``gram`` (uncentered, so
    the mean direction stays)."""
    dim = gram.shape[0]
    if not config.reduce_dims or rows <= config.reduce_above or config.reduce_dims >= dim:
        return None
    _, vectors = np.linalg.eigh(gram)  # ascending eigenvalues
    basis: Matrix = np.ascontiguousarray(
        vectors[:, ::-1][:, : config.reduce_dims], dtype=np.float32
    )
    return basis


def _probe_rows(probe_vectors: Matrix | None, projection: Matrix | None) -> Matrix | None:
    if probe_vectors is None or len(probe_vectors) == 0:
        return None
    probes = np.asarray(probe_vectors, dtype=np.float32)
    return np.ascontiguousarray(probes @ projection if projection is not None else probes)


def _mean_row(matrix: Matrix) -> Vector:
    mean_vector: Vector = matrix.sum(axis=0, dtype=np.float64).astype(np.float32) / max(
        len(matrix), 1
    )
    return mean_vector


def _reuse(
    table: CapabilityTable, previous: RetrievalIndex, sources: Sequence[int] | None
) -> list[int | None]:
    """For each row of ``table``, its row in ``previous`` if it holds the same record there."""
    if sources is None:
        return _reused_rows(table, previous)
    if len(sources) != len(table):
        raise ValueError(f"{len(sources)} sources for a table of {len(table)}")
    return [source if source >= 0 else None for source in sources]


def _reused_rows(table: CapabilityTable, previous: RetrievalIndex) -> list[int | None]:
    """For each row of ``table``, its row in ``previous`` if ``previous`` holds the same record
    (byte for byte) under that id."""
    out: list[int | None] = []
    before = previous.table
    for row, cap_id in enumerate(table.ids):
        old = previous.rows.get(cap_id)
        out.append(old if old is not None and before.record(old) == table.record(row) else None)
    return out


def _lexicon(
    caps: Sequence[Capability],
    texts: Sequence[str] | None,
    previous: RetrievalIndex | None,
    reuse: list[int | None] | None,
) -> LexicalIndex:
    """BM25 over ``texts``, or over each capability's :func:`lexical_text`; capabilities that
    ``reuse`` maps to a row of ``previous`` take that row's terms instead."""
    if texts is not None:
        return LexicalIndex.build(list(texts))
    if previous is None or not reuse:
        return LexicalIndex.build([lexical_text(c) for c in caps])
    documents = [
        "" if old is not None else lexical_text(caps[row]) for row, old in enumerate(reuse)
    ]
    return LexicalIndex.build(documents, previous=previous.lexicon, reuse=reuse)


def _row_keys(
    caps: Sequence[Capability], previous: RetrievalIndex | None, reuse: list[int | None] | None
) -> PackedStrings:
    """Per capability, the keys that could name it; reused rows keep ``previous``'s (copied a
    run of rows at a time)."""
    if previous is None or not reuse:
        return PackedStrings.of(row_name_keys(c) for c in caps)
    picks = np.fromiter((-1 if old is None else old for old in reuse), np.int64, len(reuse))
    fresh = {row: row_name_keys(caps[row]) for row in np.flatnonzero(picks < 0).tolist()}
    return previous.row_keys.picked(picks, fresh)


def _facets(
    caps: Sequence[Capability], previous: RetrievalIndex | None, reuse: list[int | None] | None
) -> tuple[dict[str, RowArray], ...]:
    """Rows by kind, category, tag, visibility role and visibility user. Rows that ``reuse``
    maps to a row of ``previous`` take that row's facets (their capabilities are not read)."""
    if previous is None or not reuse:
        return _read_facets(caps, range(len(caps)))
    fresh = [row for row, old in enumerate(reuse) if old is None]
    read = _read_facets(caps, fresh)
    moved = np.full(len(previous), -1, dtype=np.int64)
    for row, old in enumerate(reuse):
        if old is not None:
            moved[old] = row
    before = (
        previous.kinds,
        previous.categories,
        previous.tags,
        previous.role_rows,
        previous.user_rows,
    )
    return tuple(_merged(_moved(old, moved), new) for old, new in zip(before, read, strict=True))


def _moved(facet: dict[str, RowArray], moved: npt.NDArray[np.int64]) -> dict[str, RowArray]:
    """``facet`` with each old row at its new row (rows not kept dropped)."""
    out: dict[str, RowArray] = {}
    for key, rows in facet.items():
        new = moved[rows]
        new = new[new >= 0]
        if new.size:
            out[key] = new.astype(np.int32)
    return out


def _merged(left: dict[str, RowArray], right: dict[str, RowArray]) -> dict[str, RowArray]:
    out = dict(left)
    for key, rows in right.items():
        out[key] = np.concatenate([out[key], rows]) if key in out else rows
    return {key: np.sort(rows) for key, rows in out.items()}


def _read_facets(
    caps: Sequence[Capability], rows: Iterable[int]
) -> tuple[dict[str, RowArray], ...]:
    """Rows by kind, category, tag, visibility role and visibility user of ``caps[row]`` for
    each of ``rows``, in one pass."""
    found: tuple[dict[str, list[int]], ...] = ({}, {}, {}, {}, {})
    kinds, categories, tags, roles, users = found
    for row in rows:
        cap = caps[row]
        kinds.setdefault(cap.kind, []).append(row)
        categories.setdefault(cap.category, []).append(row)
        for tag in cap.tags:
            tags.setdefault(tag, []).append(row)
        for role in cap.visibility.roles:
            roles.setdefault(role, []).append(row)
        for user in cap.visibility.users:
            users.setdefault(user, []).append(row)
    return tuple({key: np.asarray(rows, dtype=np.int32) for key, rows in f.items()} for f in found)
