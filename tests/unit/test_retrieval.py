"""The retrieval index (:mod:`capdisc.retrieval.index` and the modules it uses): fusion,
exact names, decomposition, abstention and filters.

Deterministic: the hashing embedder and a small hand-made catalog.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import Matrix, Vector
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Kind
from capdisc.retrieval.config import DEFAULT_CONFIG, RetrievalConfig, calibrated_for
from capdisc.retrieval.decompose import decompose
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.index import RetrievalIndex
from capdisc.retrieval.relevance import _quantile
from capdisc.retrieval.results import RetrievalResult, Scored, merge
from capdisc.retrieval.scoring import (
    fuse,
    fuse_pooled,
    lexical_moments,
    minmax,
    reciprocal_ranks,
    zscore,
)
from capdisc.retrieval.topk import best_matching, top_rows

EMBEDDER = HashingEmbedder(256)
#: Relevance calibrated for the hashing embedder's cosines: 0.5 at cosine 0.2.
HASHING = replace(DEFAULT_CONFIG, relevance_bias=-2.0, relevance_cosine=10.0, abstain_threshold=0.5)


def cap(
    cid: str,
    description: str,
    *,
    display: str = "",
    category: str = "general",
    tags: tuple[str, ...] = (),
    available: bool = True,
) -> Capability:
    kind, name = cid.split(":")
    return Capability(
        id=cid,
        kind=_kind(kind),
        name=name,
        description=description,
        display_name=display,
        category=category,
        tags=tags,
        available=available,
    )


def _kind(kind: str) -> Kind:
    assert kind in ("tool", "skill", "extension", "channel")
    return kind  # type: ignore[return-value]


CATALOG = [
    cap(
        "tool:weather-forecast",
        "Returns the weather forecast, temperature and rain for a city.",
        display="Weather Forecast",
        category="information",
        tags=("weather",),
    ),
    cap(
        "tool:currency-convert",
        "Converts an amount of money between currencies at the latest exchange rate.",
        display="Currency Convert",
        category="finance",
        tags=("money",),
    ),
    cap(
        "tool:send-email",
        "Sends an email message to a recipient with a subject and a body.",
        display="Send Email",
        category="communication",
        tags=("email",),
    ),
    cap(
        "tool:translate-text",
        "Translates text from one language into another language.",
        display="Translate Text",
        category="language",
    ),
    cap(
        "skill:trip-planner",
        "Plans a trip itinerary day by day with travel times.",
        display="Trip Planner",
        category="travel",
        tags=("travel", "itinerary"),
    ),
    cap(
        "extension:spotify",
        "Plays music, albums and playlists on Spotify.",
        display="Spotify",
        category="media",
        tags=("music",),
        available=False,
    ),
    cap(
        "tool:stock-quote",
        "Returns the latest stock price and market data for a ticker symbol.",
        display="Stock Quote",
        category="finance",
        tags=("money", "stocks"),
    ),
    cap(
        "channel:slack",
        "Connects the agent to a Slack workspace as a bot.",
        display="Slack",
        category="communication",
    ),
]


def vectors(texts: list[str]) -> Matrix:
    return EMBEDDER.embed(texts)


@pytest.fixture(scope="module")
def index() -> RetrievalIndex:
    return RetrievalIndex.build(CATALOG, vectors([lexical_text(c) for c in CATALOG]))


def search(
    index: RetrievalIndex,
    query: str,
    k: int = 5,
    *,
    config: RetrievalConfig = HASHING,
    **filters: Any,
) -> RetrievalResult:
    """``index.search`` with the hashing embedder and ``SearchFilters(**filters)``."""
    return index.search(
        query,
        vectors([query])[0],
        k,
        filters=SearchFilters(**filters),
        embed=vectors,
        config=config,
    )


# -- pure functions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "parts"),
    [
        ("What's the weather in Paris?", ["What's the weather in Paris?"]),
        (
            "Get the weather in Paris. Then convert 100 dollars to euros. "
            "Finally, email it to Bob.",
            ["Get the weather in Paris.", "convert 100 dollars to euros.", "email it to Bob."],
        ),
        (
            "Translate this letter into French and then send it to my lawyer",
            ["Translate this letter into French", "send it to my lawyer"],
        ),
        ("Check the stock price of ACME. Thanks!", ["Check the stock price of ACME."]),
        ("Additionally, plan a trip to Rome this weekend.", ["plan a trip to Rome this weekend."]),
        (
            "read todo.txt and post its contents to the #team channel",
            ["read todo.txt", "post its contents to the #team channel"],
        ),
        (
            "make a folder backups, and move old.csv into it",
            ["make a folder backups", "move old.csv into it"],
        ),
        ("search the web for cats and dogs", ["search the web for cats and dogs"]),
        ("compare flights and hotels in Rome", ["compare flights and hotels in Rome"]),
        (
            "open https://example.com/login, fill in the form and click sign in",
            ["open https://example.com/login", "fill in the form", "click sign in"],
        ),
        (
            "With the Stripe API, refund payment pi_3N",
            ["With the Stripe API, refund payment pi_3N"],
        ),
        (
            "check whether the CI is green on PR 31 and if so merge it",
            ["check whether the CI is green on PR 31", "merge it"],
        ),
        (
            "Find the droplet named db-old and destroy it",
            ["Find the droplet named db-old", "destroy it"],
        ),
        ("detect and track objects with the radar", ["detect and track objects with the radar"]),
        (
            'stage README.md and commit it as "docs: update readme"',
            ["stage README.md", 'commit it as "docs: update readme"'],
        ),
        (
            "post 'build done. and deploy it' to slack and then close the ticket",
            ["post 'build done. and deploy it' to slack", "close the ticket"],
        ),
        (
            "scrape the table on shop.example.com/list and insert the rows into my db",
            ["scrape the table on shop.example.com/list", "insert the rows into my db"],
        ),
        (
            "look up the algorithm named 'Depth-First Search' and send it to Ana",
            ["look up the algorithm named 'Depth-First Search'", "send it to Ana"],
        ),
        (
            '"This article is too long. Can you summarize this web page for me?"',
            ['"This article is too long.', 'Can you summarize this web page for me?"'],
        ),
        ("list the files and folders it holds", ["list the files and folders it holds"]),
        (
            "I need a playlist with a mix of genres. Can you assist me with that?",
            ["I need a playlist with a mix of genres."],
        ),
        ("", []),
    ],
)
def test_decompose_splits_chained_requests(query: str, parts: list[str]) -> None:
    assert decompose(query) == parts


# parts' best fused z, the reserved rows after the whole query's best (row 0)
@pytest.mark.parametrize(
    ("part_best", "reserved"),
    [
        ([7.0, 2.0], [10]),  # a part that does not stand out gets no slot
        ([7.0, 4.0], [10, 11]),  # in a short request a part that stands out less gets one
        ([7.0, 4.0, 4.5, 5.0], [10]),  # in a long one only the confident parts do
        ([7.0, 4.0, 4.5, 6.5], [10, 13]),
    ],
)
def test_merge_reserves_slots_for_the_parts_that_stand_out(
    part_best: list[float], reserved: list[int]
) -> None:
    parts = [
        Scored(
            np.array([10 + i, 50], dtype=np.int64), np.zeros(2), np.array([z, 0.0]), np.array([])
        )
        for i, z in enumerate(part_best)
    ]
    order = merge([0, 1, 2, 3, 4, 5, 6], parts, 10, None, DEFAULT_CONFIG)
    assert order[: 1 + len(reserved)] == [0, *reserved]
    assert order[1 + len(reserved)] == 1


def test_decompose_caps_the_number_of_parts() -> None:
    query = " ".join(f"Please do task number {i} now." for i in range(20))
    assert len(decompose(query, max_parts=4)) == 4


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),
        ([0.0, 1.0, 2.0], [-1.2247, 0.0, 1.2247]),
    ],
)
def test_zscore(scores: list[float], expected: list[float]) -> None:
    np.testing.assert_allclose(zscore(np.array(scores, dtype=np.float32)), expected, atol=1e-4)


def test_reciprocal_ranks_follow_the_order() -> None:
    ranks = reciprocal_ranks(np.array([0.1, 0.9, 0.5], dtype=np.float32), k=60)
    np.testing.assert_allclose(ranks, [1 / 63, 1 / 61, 1 / 62], rtol=1e-6)


# dense, bm25, dense_weight, expected best row
@pytest.mark.parametrize(
    ("dense", "bm25", "weight", "best"),
    [
        ([0.9, 0.5, 0.1, 0.0], [0.0, 0.0, 9.0, 0.0], 1.0, 0),  # dense alone
        ([0.9, 0.5, 0.1, 0.0], [0.0, 0.0, 9.0, 0.0], 0.0, 2),  # lexical alone
        ([0.9, 0.8, 0.1, 0.0], [0.0, 5.0, 0.0, 0.0], 0.7, 1),  # agreement beats one strong side
        ([0.9, 0.2, 0.1, 0.0], [0.0, 1.0, 0.0, 0.0], 0.7, 0),  # weak lexical cannot overturn dense
    ],
)
def test_fusion_order(dense: list[float], bm25: list[float], weight: float, best: int) -> None:
    config = replace(DEFAULT_CONFIG, dense_weight=weight)
    fused = fuse(np.array(dense, dtype=np.float32), np.array(bm25, dtype=np.float32), config)
    assert int(np.argmax(fused)) == best


@pytest.mark.parametrize("fusion", ["dense", "lexical", "rrf", "zscore"])
def test_every_fusion_prefers_a_row_both_sides_rank_first(fusion: str) -> None:
    config = replace(DEFAULT_CONFIG, fusion=fusion)  # type: ignore[arg-type]
    fused = fuse(
        np.array([0.2, 0.9, 0.1], dtype=np.float32),
        np.array([1.0, 7.0, 0.0], dtype=np.float32),
        config,
    )
    assert int(np.argmax(fused)) == 1


def test_pooled_fusion_with_given_moments_equals_the_full_pass() -> None:
    rng = np.random.default_rng(3)
    cosine = rng.random(500).astype(np.float32)
    bm25 = np.where(rng.random(500) < 0.2, rng.random(500) * 9, 0).astype(np.float32)
    flat = np.zeros(500, dtype=np.float32)
    pool = np.array([0, 7, 42, 499])
    config = DEFAULT_CONFIG
    moments = (np.array([cosine.mean()]), np.array([cosine.var()]))

    for lexical in (bm25, flat):
        given = lexical_moments(lexical[None, :])
        pooled = fuse_pooled(cosine[pool][None, :], *moments, lexical[pool][None, :], given, config)
        full = fuse(cosine, lexical, config)
        np.testing.assert_allclose(pooled[0], full[pool], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("n", "k", "zeros"),
    [(10, 3, 0.0), (6000, 10, 0.0), (6000, 64, 0.97), (6000, 5, 1.0), (20000, 200, 0.5)],
)
def test_top_rows_is_exact_with_ties_in_catalog_order(n: int, k: int, zeros: float) -> None:
    rng = np.random.default_rng(n + k)
    scores = np.round(rng.random(n) * 50).astype(np.float32)
    scores[rng.random(n) < zeros] = 0.0
    allowed = rng.random(n) < 0.8
    rows = np.flatnonzero(allowed)
    expected = rows[np.lexsort((rows, -scores[rows]))][:k].tolist()
    assert top_rows(scores, allowed, k) == expected


@pytest.mark.parametrize(
    ("n", "k", "matched", "admitted_share"),
    [
        (100, 5, 0.5, 0.8),
        (20_000, 64, 0.9, 0.8),
        (20_000, 128, 0.3, 0.8),
        (50_000, 3, 1.0, 0.8),
        (20_000, 64, 0.001, 0.8),
        (50_000, 10, 1.0, 1.0),  # every row allowed: the sampled threshold decides
        (50_000, 64, 1.0, 0.002),  # few allowed above the sampled threshold: every match
        (50_000, 64, 0.01, 1.0),  # the sampled threshold is 0: every positive score
    ],
)
def test_best_matching_holds_the_k_best_positive_scores_of_the_allowed_rows(
    n: int, k: int, matched: float, admitted_share: float
) -> None:
    rng = np.random.default_rng(n + k)
    scores = np.round(rng.random(n) * 30 + 1).astype(np.float32)  # many ties
    scores[rng.random(n) >= matched] = 0.0
    allowed = rng.random(n) < admitted_share
    admitted = scores[allowed & (scores > 0)]

    best = best_matching(scores, allowed, k)

    assert allowed[best].all() and len(set(best.tolist())) == best.size
    assert (
        sorted(scores[best].tolist(), reverse=True) == sorted(admitted.tolist(), reverse=True)[:k]
    )


# -- searching ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("what will the weather be tomorrow, any rain?", "tool:weather-forecast"),
        ("convert 100 dollars to euros at the exchange rate", "tool:currency-convert"),
        ("translate this text into another language", "tool:translate-text"),
        ("latest stock price for the ticker ACME", "tool:stock-quote"),
    ],
)
def test_relevant_capability_ranks_first(index: RetrievalIndex, query: str, best: str) -> None:
    result = search(index, query)
    assert result.ids[0] == best
    assert not result.abstained


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("call tool:send-email for me", "tool:send-email"),
        ("use currency-convert on these numbers", "tool:currency-convert"),
        ("Ask Trip Planner about music", "skill:trip-planner"),
        ("put something on Spotify about the weather forecast", "extension:spotify"),
    ],
)
def test_exact_name_ranks_first(index: RetrievalIndex, query: str, named: str) -> None:
    result = search(index, query)
    assert result.exact_match == named
    assert result.ids[0] == named


@pytest.mark.parametrize(
    "query",
    [
        "what is the weather forecast in lowercase prose",  # display name not capitalized
        "send an email to slack people",  # 'slack' as a word of the catalog's texts
    ],
)
def test_ordinary_words_are_not_names(query: str) -> None:
    index = RetrievalIndex.build(
        [*CATALOG, cap("tool:slack-post", "Posts a message to a Slack channel.")],
        vectors([lexical_text(c) for c in [*CATALOG, cap("tool:slack-post", "x")]]),
    )
    assert search(index, query).exact_match is None


def test_unrelated_query_abstains(index: RetrievalIndex) -> None:
    result = search(index, "bake sourdough bread with rye flour")
    assert result.abstained


def test_abstention_can_be_switched_off(index: RetrievalIndex) -> None:
    result = search(
        index, "bake sourdough bread with rye flour", config=replace(HASHING, abstain_threshold=0.0)
    )
    assert not result.abstained
    assert len(result.entries) == 5


def test_relevance_is_between_zero_and_one(index: RetrievalIndex) -> None:
    entries = search(index, "weather and money").entries
    assert all(0.0 <= e.relevance <= 1.0 for e in entries)


def test_decomposition_gives_each_request_a_slot(index: RetrievalIndex) -> None:
    query = (
        "Tell me the weather forecast for Rome. Then convert 300 dollars into euros. "
        "Finally, send an email message to my sister."
    )
    result = search(index, query, k=3)
    assert len(result.subqueries) == 3
    assert set(result.ids) == {"tool:weather-forecast", "tool:currency-convert", "tool:send-email"}


def test_without_an_embed_function_the_query_is_not_decomposed(index: RetrievalIndex) -> None:
    query = "Tell me the weather forecast. Then convert dollars into euros."
    result = index.search(query, vectors([query])[0], 3, config=HASHING)
    assert result.subqueries == ()


# filter options, allowed ids
@pytest.mark.parametrize(
    ("options", "allowed"),
    [
        ({"kind": "skill"}, {"skill:trip-planner"}),
        ({"category": "finance"}, {"tool:currency-convert", "tool:stock-quote"}),
        ({"tags": ("money", "stocks")}, {"tool:stock-quote"}),
        ({"only_available": True}, {c.id for c in CATALOG} - {"extension:spotify"}),
        ({"only_installable": True}, {"extension:spotify"}),
        (
            {"exclude_ids": frozenset({"tool:weather-forecast"})},
            {c.id for c in CATALOG} - {"tool:weather-forecast"},
        ),
        (
            {"include_ids": frozenset({"tool:send-email", "channel:slack", "tool:unknown"})},
            {"tool:send-email", "channel:slack"},
        ),
        ({"include_ids": frozenset()}, set()),
        ({"kind": "channel", "category": "finance"}, set()),
    ],
)
def test_filters_apply_before_top_k(
    index: RetrievalIndex, options: dict[str, Any], allowed: set[str]
) -> None:
    result = search(
        index,
        "weather forecast money music",
        k=8,
        config=replace(HASHING, abstain_threshold=0.0),
        **options,
    )
    assert set(result.ids) == allowed


def test_filtered_exact_name_is_ignored(index: RetrievalIndex) -> None:
    result = search(index, "use tool:send-email", kind="skill")
    assert result.exact_match is None


@pytest.mark.parametrize("k", [0, -1])
def test_no_room_means_no_entries(index: RetrievalIndex, k: int) -> None:
    assert search(index, "weather", k=k).entries == ()


def test_empty_catalog_abstains() -> None:
    empty = RetrievalIndex.build([], np.zeros((0, EMBEDDER.dim), dtype=np.float32))
    result = empty.search("weather", vectors(["weather"])[0], 5)
    assert result.entries == ()
    assert result.abstained


def test_vectors_must_align_with_capabilities() -> None:
    with pytest.raises(ValueError, match="one row per capability"):
        RetrievalIndex.build(CATALOG, np.zeros((2, 8), dtype=np.float32))


def test_summary_vectors_are_folded_into_one_matrix() -> None:
    full = vectors([lexical_text(c) for c in CATALOG])
    summary = vectors([c.description for c in CATALOG])
    built = RetrievalIndex.build(
        CATALOG,
        full,
        summary_vectors=summary,
        config=replace(DEFAULT_CONFIG, full_text_weight=0.25),
    )
    np.testing.assert_allclose(built.matrix, 0.25 * full + 0.75 * summary, atol=1e-6)


def test_projection_keeps_the_ranking_of_a_large_catalog() -> None:
    rng = np.random.default_rng(7)
    caps = [cap(f"tool:t{i}", f"tool number {i}") for i in range(300)]
    base = rng.normal(size=(300, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    exact = RetrievalIndex.build(caps, base, config=replace(DEFAULT_CONFIG, reduce_dims=0))
    reduced_config = replace(DEFAULT_CONFIG, reduce_dims=31, reduce_above=100)
    reduced = RetrievalIndex.build(caps, base, config=reduced_config)
    assert reduced.matrix.shape == (300, 31)
    query = base[42]
    assert (
        exact.search("x", query, 1).ids == reduced.search("x", query, 1, config=reduced_config).ids
    )


def _unit_rows(rows: int, dim: int, seed: int) -> Matrix:
    matrix = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


EXACT = replace(DEFAULT_CONFIG, reduce_dims=0)
PROJECTED = replace(DEFAULT_CONFIG, reduce_dims=12, reduce_above=100, rescore_below=0)
RESCORED = replace(PROJECTED, rescore_below=1_000, rescore_rows=300)  # every row


def _top(config: RetrievalConfig, query: Vector, base: Matrix) -> list[tuple[str, float]]:
    caps = [cap(f"tool:t{i}", f"tool number {i}") for i in range(len(base))]
    index = RetrievalIndex.build(caps, base, config=config)
    return [
        (e.capability_id, e.evidence[0]) for e in index.search("x", query, 5, config=config).entries
    ]


def test_a_small_projected_catalog_scores_its_best_rows_with_exact_cosines() -> None:
    base = _unit_rows(300, 32, 11)
    near = base[[3, 42, 77, 150, 199, 260]] + 0.6 * _unit_rows(6, 32, 12)
    queries = near / np.linalg.norm(near, axis=1, keepdims=True)

    exact = [_top(EXACT, q, base) for q in queries]
    rescored = [_top(RESCORED, q, base) for q in queries]
    projected = [_top(PROJECTED, q, base) for q in queries]

    assert [[i for i, _ in t] for t in rescored] == [[i for i, _ in t] for t in exact]
    np.testing.assert_allclose(
        [[c for _, c in t] for t in rescored], [[c for _, c in t] for t in exact], atol=1e-5
    )
    assert projected != exact  # 12 dimensions of 32 alone rank otherwise


def test_every_row_a_rescoring_catalog_ranks_carries_its_exact_cosine() -> None:
    base = _unit_rows(300, 32, 11)
    caps = [cap(f"tool:t{i}", f"tool number {i}") for i in range(300)]
    config = replace(RESCORED, rescore_rows=4)
    index = RetrievalIndex.build(caps, base, config=config)
    query = _unit_rows(1, 32, 13)[0]

    found = index.search("x", query, 5, config=config).entries

    rows = [int(e.capability_id.removeprefix("tool:t")) for e in found]
    np.testing.assert_allclose([e.evidence[0] for e in found], base[rows] @ query, atol=1e-5)


@pytest.mark.parametrize(
    ("rows", "config", "kept"),
    [
        (300, RESCORED, True),
        (300, PROJECTED, False),  # rescoring off
        (300, replace(RESCORED, rescore_below=200), False),  # too large to keep them
        (300, replace(RESCORED, ann_above=250), False),  # large enough for the graph
        (80, RESCORED, False),  # not projected at all
    ],
)
def test_only_a_projected_catalog_within_the_limits_keeps_its_full_vectors(
    rows: int, config: RetrievalConfig, kept: bool
) -> None:
    caps = [cap(f"tool:t{i}", f"tool number {i}") for i in range(rows)]
    base = _unit_rows(rows, 32, 5)

    index = RetrievalIndex.build(caps, base, config=config)

    assert (index.exact is not None) == kept
    if kept:
        assert index.exact is not None and index.exact.matrix is base  # not a copy


def test_config_is_a_frozen_value() -> None:
    config = RetrievalConfig()
    with pytest.raises(AttributeError):
        config.dense_weight = 0.1  # type: ignore[misc]


# -- per-catalog abstention ------------------------------------------------------------------------


def test_probes_raise_the_abstention_threshold_to_how_close_the_catalog_comes() -> None:
    probes = vectors(["weather forecast temperature rain", "send an email message"])
    index = RetrievalIndex.build(
        CATALOG, vectors([lexical_text(c) for c in CATALOG]), probe_vectors=probes
    )
    floor = replace(HASHING, abstain_threshold=0.01)

    raised = index.abstain_threshold(floor)

    assert len(index.probe_cosines) == 2
    assert raised > 0.01
    assert index.abstain_threshold(replace(floor, adaptive_abstain=False)) == 0.01


def test_a_zero_threshold_never_abstains_even_with_probes() -> None:
    index = RetrievalIndex.build(
        CATALOG,
        vectors([lexical_text(c) for c in CATALOG]),
        probe_vectors=vectors(["weather forecast"]),
    )

    assert index.abstain_threshold(replace(HASHING, abstain_threshold=0.0)) == 0.0


def test_an_index_without_probes_keeps_the_configured_threshold(index: RetrievalIndex) -> None:
    assert index.probe_cosines == ()
    assert index.abstain_threshold(HASHING) == HASHING.abstain_threshold


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ((1.0,), 0.6, 1.0),
        ((0.0, 1.0), 0.5, 0.5),
        ((0.1, 0.2, 0.3, 0.4, 0.5), 0.6, 0.34),
        ((0.1, 0.2, 0.3), 1.0, 0.3),
        ((0.1, 0.2, 0.3), 0.0, 0.1),
    ],
)
def test_quantile_of_sorted_values_matches_numpy(
    values: tuple[float, ...], q: float, expected: float
) -> None:
    assert _quantile(values, q) == pytest.approx(expected)
    assert _quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


# -- the query's own no-tool signal ----------------------------------------------------------------


def _probe_index() -> RetrievalIndex:
    return RetrievalIndex.build(
        CATALOG,
        vectors([lexical_text(c) for c in CATALOG]),
        probe_vectors=vectors(["tell me a funny joke about the weather"]),
    )


def _top_relevance(index: RetrievalIndex, query: str, penalty: float) -> float:
    config = replace(HASHING, probe_penalty=penalty, probe_baseline=0.0)
    result = index.search(query, vectors([query])[0], 3, config=config)
    return result.entries[0].relevance


def test_a_query_close_to_a_probe_loses_relevance_in_proportion_to_the_penalty() -> None:
    index = _probe_index()
    query = "tell me a funny joke about the weather"

    relevances = [_top_relevance(index, query, p) for p in (0.0, 0.25, 0.5)]

    assert relevances[0] > relevances[1] > relevances[2]


def test_the_probe_penalty_leaves_the_ranking_and_the_evidence_unchanged() -> None:
    index = _probe_index()
    query = "weather forecast for tomorrow"
    plain = index.search(query, vectors([query])[0], 3, config=HASHING)
    penalized = index.search(
        query, vectors([query])[0], 3, config=replace(HASHING, probe_penalty=0.5)
    )

    assert penalized.ids == plain.ids
    assert [e.evidence for e in penalized.entries] == [e.evidence for e in plain.entries]


def test_an_uncalibrated_embedder_takes_no_probe_penalty() -> None:
    assert calibrated_for("some-other-model").probe_penalty == 0.0
    assert (
        calibrated_for("minilm-l6-int8", replace(DEFAULT_CONFIG, probe_penalty=0.25)).probe_penalty
        == 0.25
    )


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([1.0, 3.0, 2.0], [0.0, 1.0, 0.5]),
        ([2.0, 2.0], [0.0, 0.0]),
        ([], []),
    ],
)
def test_minmax_scales_scores_to_the_unit_interval(
    scores: list[float], expected: list[float]
) -> None:
    out = minmax(np.asarray(scores, dtype=np.float32))

    assert out.tolist() == pytest.approx(expected)
