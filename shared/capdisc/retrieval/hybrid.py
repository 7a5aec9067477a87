"""Hybrid retrieval: which capabilities a turn needs, ranked, with a calibrated relevance.

One immutable :class:`RetrievalIndex` per snapshot, built once (BM25 postings, the dense matrix,
filter masks, the exact-name table) so a query only does arithmetic:

1. **Exact name.** A query that names a capability (its id, its name as written, or its display
   name) ranks that capability first. Names that are ordinary words of the catalog ("search",
   "local") do not count, so prose does not trigger it.
2. **Hybrid scores.** Dense cosine (optionally the weighted sum of a full-text and a summary
   vector per capability, folded into one matrix at build time) and BM25 are each z-normalized
   over the catalog and mixed convexly, ``dense_weight`` on the dense side. Chosen by measurement
   against RRF and max/min-max normalized fusion (``docs/benchmarks.md``).
3. **Decomposition.** A query that chains several requests ("... Then ... Finally ...") is split
   into sub-queries; each is scored the same way, and every sub-query whose best capability
   stands out (fused z >= ``subquery_min_z``) reserves a slot for it right after the whole
   query's best match. The rest of the list follows the whole query's ranking.
4. **Relevance and abstention.** Each entry gets a relevance in [0, 1]: a logistic model of
   its dense cosine with the query text (whole query or sub-query) it scored best on, fitted
   on held-out data (:func:`capdisc.bench.evaluation.calibrated`) with "nothing fits" queries made
   by removing each query's relevant tools. The result abstains when no entry reaches
   ``abstain_threshold`` (an exact-name match never abstains).

Catalogs larger than ``reduce_above`` rows are searched in a ``reduce_dims`` projection of the
vectors (within 0.002 recall@5 of exact on both benchmarks, half the memory traffic). Filters
(kind, category, tags, availability, excluded ids) are applied before top-k.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from capdisc.access import ANONYMOUS, Caller
from capdisc.embedders.port import Matrix, Vector
from capdisc.models import Capability
from capdisc.retrieval.lexical import STOPWORDS, LexicalIndex, Scores, split_identifiers, words

#: Embeds extra query texts (sub-queries): one L2-normalized row per text.
QueryEmbed = Callable[[list[str]], Matrix]
Fusion = Literal["zscore", "rrf", "dense", "lexical"]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
RowArray = npt.NDArray[np.int32]


@dataclass(frozen=True)
class RetrievalConfig:
    """Retrieval knobs. Defaults were fitted on the tuning splits with the MiniLM embedder."""

    fusion: Fusion = "zscore"
    #: Convex weight of the dense z-score (the lexical one gets ``1 - dense_weight``).
    dense_weight: float = 0.7
    #: Weight of the full-text vector against the summary vector, when both are given.
    full_text_weight: float = 0.5
    rrf_k: int = 60
    exact_name: bool = True
    decompose: bool = True
    max_subqueries: int = 8
    #: A sub-query reserves a slot for its best capability when that one's fused z reaches this.
    subquery_min_z: float = 6.0
    #: Rows a sub-query is scored on: this many best of the whole query plus as many BM25 best
    #: of the sub-query.
    candidates: int = 64
    #: Catalogs of more than ``reduce_above`` rows search a ``reduce_dims``-dimensional
    #: projection of the vectors (the top right singular vectors of the matrix): half the memory
    #: traffic of a full pass, measured within 0.002 recall@5 of exact (0 disables).
    reduce_dims: int = 192
    reduce_above: int = 2000
    #: Logistic relevance model: ``sigmoid(bias + w_cos * cos + w_cov * coverage + w_z * z)``,
    #: fitted for the MiniLM embedder by :func:`capdisc.bench.evaluation.calibrated` on the tuning
    #: splits (MetaTool queries outside the evaluation sample, Seal-Tools dev): answerable
    #: queries against the same queries with their relevant tools removed. Coverage and z were
    #: measured and dropped (weight 0): they made real no-tool queries look answerable.
    relevance_bias: float = -2.082
    relevance_cosine: float = 4.684
    relevance_coverage: float = 0.0
    relevance_z: float = 0.0
    #: Abstain when no entry's relevance reaches this floor (0 never abstains): the highest
    #: that keeps 96.5% of each tuning split's answerable queries answered
    #: (:func:`capdisc.bench.evaluation.calibrated`). Embedder-specific, like the above.
    abstain_threshold: float = 0.2838
    #: Raise the threshold, per catalog, to the relevance of the ``probe_quantile`` of the
    #: probe queries' best cosines (:mod:`capdisc.retrieval.probes`), when the index has probe
    #: vectors.
    adaptive_abstain: bool = True
    probe_quantile: float = 0.6
    #: Compute every evidence feature (BM25 coverage too) even when the relevance model does
    #: not use it: for calibration runs.
    collect_evidence: bool = False


DEFAULT_CONFIG = RetrievalConfig()


@dataclass(frozen=True)
class Calibration:
    """An embedder's relevance model and abstention threshold (see :class:`RetrievalConfig`)."""

    bias: float
    cosine: float
    abstain_threshold: float


#: Fitted per embedder by ``benchmarks/retrieval.py --calibrate``. An embedder without an entry
#: keeps the MiniLM relevance model but never abstains (its cosines mean something else).
CALIBRATIONS: dict[str, Calibration] = {
    "minilm-l6-int8": Calibration(DEFAULT_CONFIG.relevance_bias,
                                  DEFAULT_CONFIG.relevance_cosine,
                                  DEFAULT_CONFIG.abstain_threshold),
}


def calibrated_for(embedder_id: str, config: RetrievalConfig = DEFAULT_CONFIG
                   ) -> RetrievalConfig:
    """``config`` with the relevance model and threshold fitted for ``embedder_id``."""
    fit = CALIBRATIONS.get(embedder_id)
    if fit is None:
        return replace(config, abstain_threshold=0.0)
    return replace(config, relevance_bias=fit.bias, relevance_cosine=fit.cosine,
                   abstain_threshold=fit.abstain_threshold)


@dataclass(frozen=True)
class RankedCapability:
    """One ranked capability: its fused score (z units, higher is better), its calibrated
    relevance in [0, 1], and the evidence the relevance was computed from (dense cosine, BM25
    term coverage, fused z of the query text it matched best)."""

    capability_id: str
    score: float
    relevance: float
    evidence: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RetrievalResult:
    """Ranked entries, best first, and whether the retriever says nothing fits."""

    entries: tuple[RankedCapability, ...]
    abstained: bool
    subqueries: tuple[str, ...] = ()
    exact_match: str | None = None

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(e.capability_id for e in self.entries)


# -- query decomposition ---------------------------------------------------------------------------

_SENTENCE = re.compile(r"(?<=[.!?;])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_CHAIN = re.compile(r"(?:[,;]\s*|\s+)(?:and then|after that|and also|and finally|then)\s+",
                    re.IGNORECASE)
_LEAD = re.compile(
    r"^(?:(?:and|also|additionally|furthermore|moreover|besides|then|next|finally|lastly|"
    r"first|firstly|second|secondly|third|thirdly|after that|afterwards|subsequently|"
    r"in addition|once (?:that|this) is done|after (?:this|that))\b[\s,:]*)+",
    re.IGNORECASE)
_MIN_SUBQUERY_WORDS = 3
_SAMPLE = 512


def decompose(query: str, max_parts: int = 8) -> list[str]:
    """The separate requests of a query: sentences, then chained clauses ("and then ...").

    Leading discourse markers ("Additionally,", "Finally,") are dropped, and so are fragments of
    fewer than three words. One part (or none) means the query is a single request. Memoized:
    a turn splits its query once to embed the parts and once to score them.
    """
    return list(_decompose(query, max_parts))


@functools.lru_cache(maxsize=4096)
def _decompose(query: str, max_parts: int) -> tuple[str, ...]:
    parts: list[str] = []
    for sentence in _SENTENCE.split(query):
        for clause in _CHAIN.split(sentence.strip()):
            text = _LEAD.sub("", clause.strip()).strip()
            if len(words(text)) >= _MIN_SUBQUERY_WORDS:
                parts.append(text)
    return tuple(parts[:max_parts])


# -- capability text for BM25 ----------------------------------------------------------------------


def lexical_text(capability: Capability) -> str:
    """What BM25 matches: names (identifiers split), description, category, tags, parameters
    with their descriptions, dependencies and example queries."""
    lines = [capability.name, capability.display_name, capability.description,
             split_identifiers(capability.category), " ".join(capability.tags)]
    lines.extend(_parameter_lines(capability))
    lines.extend(capability.required_tools)
    lines.extend(capability.example_queries)
    return "\n".join(line for line in lines if line)


def _parameter_lines(capability: Capability) -> Iterable[str]:
    properties = (capability.full_schema or {}).get("properties")
    if not isinstance(properties, dict):
        return
    for name, spec in properties.items():
        description = spec.get("description") if isinstance(spec, dict) else None
        yield f"{name} {description}" if isinstance(description, str) else str(name)


# -- the exact-name table --------------------------------------------------------------------------

_RAW_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/&-]*[A-Za-z0-9]|[A-Za-z0-9]")
_WORD = re.compile(r"[^\W_]+")
_MAX_NAME_WORDS = 6

NameKey = tuple[str, ...]


def _name_keys(capability: Capability) -> set[NameKey]:
    """The keys a query can name ``capability`` by: its id and name as written (one token,
    any case) and its display name (one token any case, or several words as capitalized)."""
    keys: set[NameKey] = {(capability.id.lower(),), (capability.name.lower(),)}
    display = _WORD.findall(capability.display_name)
    if len(display) == 1:
        keys.add((display[0].lower(),))
    elif 1 < len(display) <= _MAX_NAME_WORDS:
        keys.add(tuple(display))
    return keys


def _reused_rows(caps: Sequence[Capability], previous: RetrievalIndex) -> list[int | None]:
    """For each capability, its row in ``previous`` if ``previous`` holds this very object."""
    out: list[int | None] = []
    for capability in caps:
        row = previous.rows.get(capability.id)
        out.append(row if row is not None and previous.capabilities[row] is capability else None)
    return out


def _row_name_keys(capability: Capability) -> frozenset[NameKey]:
    """The keys that could name ``capability`` in the table (:func:`_distinctive` ones)."""
    return frozenset(key for key in _name_keys(capability) if _distinctive(key))


def _build_name_table(row_keys: Sequence[frozenset[NameKey]], lexicon: LexicalIndex
                      ) -> dict[NameKey, int]:
    """Name key -> row, keeping only keys that identify one capability and are not ordinary
    words of the catalog (a one-word key must appear in at most one capability's text)."""
    owner: dict[NameKey, int] = {}
    shared: set[NameKey] = set()
    for row, keys in enumerate(row_keys):
        for key in keys:
            if owner.setdefault(key, row) != row:
                shared.add(key)
    plain = [key[0] for key in owner if len(key) == 1 and key[0].isalpha()
             and key not in shared]
    frequencies = lexicon.document_frequencies(plain)
    return {key: row for key, row in owner.items()
            if key not in shared and (len(key) > 1 or frequencies.get(key[0], 0) <= 1)}


def _distinctive(key: NameKey) -> bool:
    """Whether ``key`` can name a capability at all: several words, or one word of three
    characters or more that is not a stop word (an ordinary word must also be rare)."""
    if len(key) > 1:
        return True
    word = key[0]
    return len(word) >= 3 and word not in STOPWORDS and any(c.isalpha() for c in word)


def _query_keys(query: str, starts: Collection[str]) -> Iterable[NameKey]:
    """Candidate name keys of a query: its raw tokens, then the runs of words that begin like a
    several-word name (longest first)."""
    for raw in _RAW_TOKEN.findall(query):
        yield (raw.lower(),)
    tokens = _WORD.findall(query)
    for start, token in enumerate(tokens):
        if token in starts:
            for n in range(min(_MAX_NAME_WORDS, len(tokens) - start), 1, -1):
                yield tuple(tokens[start:start + n])


# -- the index -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scored:
    """One query text's scores on ``rows`` (all rows for the whole query, candidates for a
    sub-query)."""

    rows: IntArray | None  # None: every row, in catalog order
    cosine: Scores
    fused: Scores
    term_ids: IntArray  # the text's BM25 terms (coverage is computed for the final rows only)

    def at(self, row: int) -> int | None:
        """Position of catalog ``row`` in these scores, None when it was not scored."""
        if self.rows is None:
            return row
        at = int(np.searchsorted(self.rows, row))  # sub-query rows are sorted (np.union1d)
        return at if at < self.rows.size and int(self.rows[at]) == row else None


@dataclass(frozen=True, eq=False)
class RetrievalIndex:
    """Everything a query needs, precomputed from one set of capabilities and their vectors."""

    capabilities: tuple[Capability, ...]
    ids: tuple[str, ...]
    matrix: Matrix
    lexicon: LexicalIndex
    names: dict[NameKey, int]
    #: First words of the several-word names, so a query's word runs are looked up only there.
    name_starts: frozenset[str]
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
    #: Per row, the keys that could name its capability (kept for the next delta).
    row_keys: tuple[frozenset[NameKey], ...]
    rows: dict[str, int]
    #: Mean row and second-moment matrix of ``matrix``: the catalog mean and deviation of a
    #: query's cosines, without scoring every row.
    mean_vector: Vector
    moment: Matrix
    #: ``embedding dim x reduced dim`` projection applied to query vectors, or None.
    projection: Matrix | None
    #: Per probe query (:mod:`capdisc.retrieval.probes`), its best cosine over the catalog, sorted.
    probe_cosines: tuple[float, ...] = ()

    @classmethod
    def build(cls, capabilities: Sequence[Capability], vectors: Matrix, *,
              summary_vectors: Matrix | None = None, texts: Sequence[str] | None = None,
              probe_vectors: Matrix | None = None,
              config: RetrievalConfig = DEFAULT_CONFIG,
              previous: RetrievalIndex | None = None) -> RetrievalIndex:
        """Index ``capabilities``; ``vectors`` row ``i`` embeds capability ``i`` (L2-normalized).

        ``summary_vectors`` (optional, same shape) embed a short name-and-summary text; the dense
        score is then ``w * cos(full) + (1 - w) * cos(summary)``, folded into one matrix here.
        ``texts`` overrides the BM25 text (default :func:`lexical_text`). ``probe_vectors``
        embed :data:`capdisc.retrieval.probes.PROBES`, for the per-catalog abstention threshold.
        ``previous``: an index of mostly the same capabilities (a hot-reload delta); the
        capabilities it holds (the same objects) keep their BM25 terms, and its dimension
        reduction is kept, so an update costs a fraction of a build.
        """
        caps = tuple(capabilities)
        matrix = _dense_matrix(vectors, summary_vectors, len(caps), config.full_text_weight)
        projection = (previous.projection if previous is not None
                      and previous.projection is not None else _projection(matrix, config))
        if projection is not None:
            matrix = np.ascontiguousarray(matrix @ projection)
        reuse = _reused_rows(caps, previous) if previous is not None and texts is None else None
        lexicon = LexicalIndex.build(
            list(texts) if texts is not None else
            ["" if reuse and reuse[i] is not None else lexical_text(c)
             for i, c in enumerate(caps)],
            previous=previous.lexicon if previous is not None and reuse else None, reuse=reuse)
        ids = tuple(c.id for c in caps)
        n = max(len(caps), 1)
        row_keys = tuple(previous.row_keys[r] if previous is not None and reuse
                         and (r := reuse[i]) is not None else _row_name_keys(c)
                         for i, c in enumerate(caps))
        names = _build_name_table(row_keys, lexicon)
        kinds, categories, tags, roles, users = _facets(caps)
        return cls(
            capabilities=caps, ids=ids, matrix=matrix, lexicon=lexicon, names=names,
            name_starts=frozenset(key[0] for key in names if len(key) > 1),
            kinds=kinds, categories=categories, tags=tags,
            available=np.array([c.available for c in caps], dtype=bool),
            open_rows=np.array([c.visibility.open for c in caps], dtype=bool),
            role_rows=roles, user_rows=users, row_keys=row_keys,
            rows={cid: i for i, cid in enumerate(ids)},
            mean_vector=matrix.sum(axis=0, dtype=np.float64).astype(np.float32) / n,
            moment=(matrix.T.astype(np.float64) @ matrix / n).astype(np.float32),
            projection=projection,
            probe_cosines=_probe_cosines(matrix, probe_vectors, projection),
        )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def all_open(self) -> bool:
        return bool(self.open_rows.all())

    # -- searching ------------------------------------------------------------------------------

    def search(self, query: str, query_vector: Vector, k: int, *, kind: str | None = None,
               category: str | None = None, tags: Collection[str] = (),
               only_available: bool = False, exclude: Collection[str] = (),
               include: Collection[str] | None = None, only_installable: bool = False,
               caller: Caller = ANONYMOUS, embed: QueryEmbed | None = None,
               config: RetrievalConfig = DEFAULT_CONFIG) -> RetrievalResult:
        """The ``k`` best capabilities for ``query`` among those the filters allow.

        ``query_vector`` embeds ``query``; ``embed`` embeds sub-queries (without it, or with
        ``config.decompose`` off, the query is not decomposed).
        """
        allowed = self._allowed(kind, category, tags, only_available, exclude)
        if include is not None:
            allowed &= self._only(include)
        if only_installable:
            allowed &= ~self.available
        if not self.all_open:
            allowed &= self._visible(caller)
        if k <= 0 or not allowed.any():
            return RetrievalResult((), abstained=True)
        vector = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        whole = self._score_whole(query, vector, config)
        parts = self._subqueries(query, embed, config)
        ranking = top_rows(whole.fused, allowed,
                           max(k + len(parts) + 1, config.candidates if parts else 0))
        scored_parts = (self._score_parts(parts, embed, whole, ranking, allowed, config)
                        if parts and embed is not None else [])
        exact = self._exact(query, allowed) if config.exact_name else None
        order = _merge(ranking, scored_parts, k, exact, config)
        entries = self._entries(order, whole, scored_parts, config)
        threshold = self.abstain_threshold(config)
        abstained = exact is None and not any(e.relevance >= threshold for e in entries)
        return RetrievalResult(entries, abstained=abstained, subqueries=tuple(parts),
                               exact_match=self.ids[exact] if exact is not None else None)

    def abstain_threshold(self, config: RetrievalConfig) -> float:
        """The relevance an answer needs: the configured floor, raised to how close this
        catalog comes to the probe queries (0 never abstains)."""
        floor = config.abstain_threshold
        if floor <= 0 or not config.adaptive_abstain or not self.probe_cosines:
            return floor
        cosine = _quantile(self.probe_cosines, config.probe_quantile)
        return max(floor, relevance((cosine, 0.0, 0.0), config))

    def _subqueries(self, query: str, embed: QueryEmbed | None,
                    config: RetrievalConfig) -> list[str]:
        if embed is None or not config.decompose or config.fusion != "zscore":
            return []
        parts = decompose(query, config.max_subqueries)
        return parts if len(parts) > 1 else []

    def _score_whole(self, query: str, vector: Vector, config: RetrievalConfig) -> _Scored:
        if self.projection is not None:
            vector = vector @ self.projection
        cosine: Scores = self.matrix @ vector
        term_ids = self.lexicon.term_ids(query)
        bm25 = self.lexicon.scores(term_ids)
        if config.fusion != "zscore":
            return _Scored(None, cosine, fuse(cosine, bm25, config), term_ids)
        mean = float(vector @ self.mean_vector)
        deviation = math.sqrt(max(float(vector @ self.moment @ vector) - mean * mean, 1e-12))
        fused = _mix_moments(cosine, mean, deviation, bm25, config)
        return _Scored(None, cosine, fused, term_ids)

    def _score_parts(self, parts: list[str], embed: QueryEmbed, whole: _Scored,
                     ranking: list[int], allowed: BoolArray, config: RetrievalConfig
                     ) -> list[_Scored]:
        """Score all sub-queries at once, on candidate rows only: the whole query's fused top
        rows (``ranking``) and each sub-query's BM25 top rows. The z-scores use catalog-wide
        moments (the dense ones from the matrix moments), so they equal a full pass's."""
        vectors = np.asarray(embed(parts), dtype=np.float32)
        if self.projection is not None:
            vectors = vectors @ self.projection
        term_ids = [self.lexicon.term_ids(part) for part in parts]
        bm25 = self.lexicon.scores_many(term_ids)
        n, c = len(self.ids), config.candidates
        mark = np.zeros(n, dtype=bool)
        mark[ranking[:c]] = True
        for row in bm25:
            mark[_best_matching(row, allowed, c)] = True
        pool = np.flatnonzero(mark & allowed)
        cosine = vectors @ self.matrix[pool].T  # (parts, pool)
        means = vectors @ self.mean_vector
        spread = ((vectors @ self.moment) * vectors).sum(axis=1) - means**2
        dense_z = (cosine - means[:, None]) / np.sqrt(np.clip(spread, 1e-12, None))[:, None]
        lex_mean = bm25.sum(axis=1) / max(n, 1)
        lex_var = np.einsum("ij,ij->i", bm25, bm25) / max(n, 1) - lex_mean**2
        lex_sd = np.where(lex_var > 1e-18, np.sqrt(np.clip(lex_var, 1e-18, None)), np.inf)
        lexical_z = (bm25[:, pool] - lex_mean[:, None]) / lex_sd[:, None]
        fused = _mix(dense_z.astype(np.float32), lexical_z.astype(np.float32), config)
        return [_Scored(pool, cosine[i], fused[i], term_ids[i]) for i in range(len(parts))]

    def _exact(self, query: str, allowed: BoolArray) -> int | None:
        for key in _query_keys(query, self.name_starts):
            row = self.names.get(key)
            if row is not None and allowed[row]:
                return row
        return None

    def _entries(self, order: list[int], whole: _Scored, parts: list[_Scored],
                 config: RetrievalConfig) -> tuple[RankedCapability, ...]:
        """Entries for ``order``; each row's relevance comes from the query text (whole or
        sub-query) it scored best on."""
        sources: list[tuple[_Scored, int]] = []
        for row in order:
            best = (whole, row)
            for part in parts:
                at = part.at(row)
                if at is not None and part.fused[at] > best[0].fused[best[1]]:
                    best = (part, at)
            sources.append(best)
        coverage = np.zeros(len(order), dtype=np.float32)
        texts = {id(s): s for s, _ in sources}.values() if self._wants_coverage(config) else ()
        for scored in texts:
            mine = [i for i, (s, _) in enumerate(sources) if s is scored]
            coverage[mine] = self.lexicon.coverage(scored.term_ids, [order[i] for i in mine])
        scores = _non_increasing([float(whole.fused[row]) for row in order])
        entries = []
        for row, (scored, at), cov, score in zip(order, sources, coverage, scores, strict=True):
            evidence = (float(scored.cosine[at]), float(cov), float(scored.fused[at]))
            entries.append(RankedCapability(self.ids[row], score, relevance(evidence, config),
                                            evidence))
        return tuple(entries)

    @staticmethod
    def _wants_coverage(config: RetrievalConfig) -> bool:
        """BM25 term coverage is evidence for calibration; skipped when the model ignores it."""
        return config.relevance_coverage != 0.0 or config.collect_evidence

    def _allowed(self, kind: str | None, category: str | None, tags: Collection[str],
                 only_available: bool, exclude: Collection[str]) -> BoolArray:
        allowed = np.ones(len(self.ids), dtype=bool)
        chosen = ([self.kinds.get(kind)] if kind is not None else []) + (
            [self.categories.get(category)] if category is not None else []) + [
            self.tags.get(tag) for tag in tags]
        for rows in chosen:
            mask = np.zeros(len(self.ids), dtype=bool)
            if rows is not None:
                mask[rows] = True
            allowed &= mask
        if only_available:
            allowed &= self.available
        for cap_id in exclude:
            row = self.rows.get(cap_id)
            if row is not None:
                allowed[row] = False
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


def _quantile(ordered: tuple[float, ...], q: float) -> float:
    """``numpy.quantile`` (linear) of already sorted values, without numpy's overhead."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _probe_cosines(matrix: Matrix, probe_vectors: Matrix | None,
                   projection: Matrix | None) -> tuple[float, ...]:
    """Each probe's best cosine over the catalog, in the space queries are scored in, sorted."""
    if probe_vectors is None or len(probe_vectors) == 0 or len(matrix) == 0:
        return ()
    probes = np.asarray(probe_vectors, dtype=np.float32)
    if projection is not None:
        probes = probes @ projection
    best = (probes @ matrix.T).max(axis=1)
    return tuple(sorted(float(b) for b in best))


def _projection(matrix: Matrix, config: RetrievalConfig) -> Matrix | None:
    """Top right singular vectors of ``matrix`` (uncentered, so the mean direction stays)."""
    rows, dim = matrix.shape
    if not config.reduce_dims or rows <= config.reduce_above or config.reduce_dims >= dim:
        return None
    gram = matrix.T.astype(np.float64) @ matrix
    _, vectors = np.linalg.eigh(gram)  # ascending eigenvalues
    basis: Matrix = np.ascontiguousarray(vectors[:, ::-1][:, :config.reduce_dims],
                                         dtype=np.float32)
    return basis


def _dense_matrix(vectors: Matrix, summary_vectors: Matrix | None, count: int,
                  full_text_weight: float) -> Matrix:
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != count:
        raise ValueError(f"vectors must have one row per capability: got {matrix.shape} "
                         f"for {count} capabilities")
    if summary_vectors is not None:
        summary = np.asarray(summary_vectors, dtype=np.float32)
        if summary.shape != matrix.shape:
            raise ValueError(f"summary_vectors shape {summary.shape} != {matrix.shape}")
        matrix = full_text_weight * matrix + (1.0 - full_text_weight) * summary
    return np.ascontiguousarray(matrix, dtype=np.float32)


def _facets(caps: Sequence[Capability]) -> tuple[dict[str, RowArray], ...]:
    """Rows by kind, category, tag, visibility role and visibility user, in one pass."""
    found: tuple[dict[str, list[int]], ...] = ({}, {}, {}, {}, {})
    kinds, categories, tags, roles, users = found
    for row, cap in enumerate(caps):
        kinds.setdefault(cap.kind, []).append(row)
        categories.setdefault(cap.category, []).append(row)
        for tag in cap.tags:
            tags.setdefault(tag, []).append(row)
        for role in cap.visibility.roles:
            roles.setdefault(role, []).append(row)
        for user in cap.visibility.users:
            users.setdefault(user, []).append(row)
    return tuple({key: np.asarray(rows, dtype=np.int32) for key, rows in f.items()}
                 for f in found)


# -- pure scoring functions ------------------------------------------------------------------------


def zscore(scores: Scores) -> Scores:
    """``(x - mean) / std`` over the catalog; all zeros when the scores are flat."""
    if scores.size == 0:
        return scores
    std = float(scores.std())
    if std < 1e-9:
        return np.zeros_like(scores)
    result: Scores = ((scores - scores.mean()) / std).astype(np.float32)
    return result


def _zscore_at(scores: Scores, rows: IntArray) -> Scores:
    """:func:`zscore` of ``scores`` taken at ``rows`` only (moments from sums, one pass)."""
    n = scores.size
    mean = float(scores.sum()) / n
    variance = float(np.dot(scores, scores)) / n - mean * mean
    if variance < 1e-18:
        return np.zeros(rows.size, dtype=np.float32)
    result: Scores = ((scores[rows] - mean) / math.sqrt(variance)).astype(np.float32)
    return result


def reciprocal_ranks(scores: Scores, k: int = 60) -> Scores:
    """RRF contribution ``1 / (k + rank)`` of each document (rank 1 is the best)."""
    ranks = np.empty(scores.size, dtype=np.float32)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, scores.size + 1, dtype=np.float32)
    result: Scores = (1.0 / (k + ranks)).astype(np.float32)
    return result


def fuse(cosine: Scores, bm25: Scores, config: RetrievalConfig) -> Scores:
    """One query's fused scores: z-score convex mix (default), RRF, or one side alone."""
    if config.fusion == "dense":
        return zscore(cosine)
    if config.fusion == "lexical":
        return zscore(bm25)
    if config.fusion == "rrf":
        return reciprocal_ranks(cosine, config.rrf_k) + reciprocal_ranks(bm25, config.rrf_k)
    return _mix(zscore(cosine), zscore(bm25), config)


def _mix_moments(cosine: Scores, mean: float, deviation: float, bm25: Scores,
                 config: RetrievalConfig) -> Scores:
    """``_mix(zscore(cosine), zscore(bm25))`` with the dense moments given: two passes."""
    w = config.dense_weight
    n = max(bm25.size, 1)
    lex_mean = float(bm25.sum()) / n
    lex_var = float(np.dot(bm25, bm25)) / n - lex_mean * lex_mean
    lex_scale = (1.0 - w) / math.sqrt(lex_var) if lex_var > 1e-18 else 0.0
    fused: Scores = cosine * np.float32(w / deviation)
    fused += bm25 * np.float32(lex_scale)
    fused -= np.float32(w * mean / deviation + lex_scale * lex_mean)
    return fused


def _mix(dense_z: Scores, lexical_z: Scores, config: RetrievalConfig) -> Scores:
    w = config.dense_weight
    fused: Scores = (w * dense_z + (1.0 - w) * lexical_z).astype(np.float32)
    return fused


def relevance(evidence: tuple[float, float, float], config: RetrievalConfig) -> float:
    """The calibrated relevance of (cosine, coverage, fused z): a logistic model."""
    cosine, coverage, fused = evidence
    logit = (config.relevance_bias + config.relevance_cosine * cosine
             + config.relevance_coverage * coverage + config.relevance_z * fused)
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, logit))))


def top_rows(scores: Scores, allowed: BoolArray, k: int) -> list[int]:
    """Rows of the ``k`` best allowed scores, best first (ties keep catalog order).

    Exact, and fast on large catalogs: a strided sample gives a threshold that at least ``k``
    scores pass, so only those are sorted; many equal scores (BM25's zeros) are skipped."""
    if k <= 0 or scores.size == 0:
        return []
    candidates = _above_threshold(scores, allowed, k)
    values = scores[candidates]
    if candidates.size > k:
        kth = np.partition(values, values.size - k)[values.size - k]
        above = np.flatnonzero(values > kth)
        keep = np.concatenate([above, np.flatnonzero(values == kth)[: k - above.size]])
        candidates, values = candidates[keep], values[keep]
    order = np.lexsort((candidates, -values))
    return [int(r) for r in candidates[order]]


def _best_matching(scores: Scores, allowed: BoolArray, k: int) -> IntArray:
    """Rows of the ``k`` best positive scores among the allowed (fewer when fewer match; in no
    particular order): BM25 scores are zero for most rows, so only the matching ones are sorted."""
    rows: IntArray = np.flatnonzero((scores > 0) & allowed)
    if rows.size > k:
        rows = rows[np.argpartition(-scores[rows], k - 1)[:k]]
    return rows


def _above_threshold(scores: Scores, allowed: BoolArray, k: int) -> IntArray:
    """Allowed rows among which the ``k`` best surely are: those above a threshold taken from
    a strided sample, plus the first rows tied with it when too few are above (BM25's zeros);
    every allowed row when in doubt."""
    everyone = bool(allowed.all())
    n = scores.size
    rows: IntArray = np.arange(n) if everyone else np.flatnonzero(allowed)
    if n <= 8 * _SAMPLE or k * 8 >= n:
        return rows
    sample = scores[:: n // _SAMPLE]
    need = min(sample.size, 2 * (k * sample.size) // n + 2)
    threshold = np.partition(sample, sample.size - need)[sample.size - need]
    above = scores > threshold if everyone else (scores > threshold) & allowed
    count = int(np.count_nonzero(above))
    if count > n // 4:
        return rows
    if count >= k:
        return np.flatnonzero(above)
    tied = scores == threshold if everyone else (scores == threshold) & allowed
    ties = np.flatnonzero(tied)[: k - count]
    if count + ties.size < k:
        return rows
    return np.concatenate([np.flatnonzero(above), ties])


def _non_increasing(scores: list[float]) -> list[float]:
    """Scores that agree with the merged order: an entry placed above better-scored ones (an
    exact match, a sub-query's best) takes the best score below it, so a stable re-sort
    (graph re-ranking) keeps the order unless something changes a score."""
    out = list(scores)
    for i in range(len(out) - 2, -1, -1):
        out[i] = max(out[i], out[i + 1])
    return out


def _merge(ranking: list[int], parts: list[_Scored], k: int, exact: int | None,
           config: RetrievalConfig) -> list[int]:
    """Exact match first, then the whole query's best, then each confident sub-query's best
    (most confident first), then the whole query's ranking."""
    order: list[int] = [exact] if exact is not None else []
    reserved = ranking[:1]
    tops = []
    for part in parts:
        if part.fused.size and part.rows is not None:
            at = int(np.argmax(part.fused))
            if float(part.fused[at]) >= config.subquery_min_z:
                tops.append((float(part.fused[at]), int(part.rows[at])))
    reserved += [row for _, row in sorted(tops, key=lambda t: -t[0])]
    for row in [*reserved, *ranking]:
        if row not in order:
            order.append(row)
    return order[:k]
