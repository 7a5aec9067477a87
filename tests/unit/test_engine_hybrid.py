"""The engine over the hybrid retriever (:class:`capdisc.discovery.snapshot.HybridRetriever`
over :class:`capdisc.retrieval.index.RetrievalIndex`): what the discovery worker serves per
turn.

Deterministic: the hashing embedder, stored vectors made the way the indexing worker makes them
(:func:`capdisc.retrieval.text.combine` of the full text and the summary).
"""

from __future__ import annotations

import numpy as np
import pytest

from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import Match, Query, discover, hints_for, rank
from capdisc.discovery.snapshot import HybridRetriever, IndexSnapshot
from capdisc.discovery.tiers import NOTHING_FITS
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import Matrix
from capdisc.filters import SearchFilters
from capdisc.models import Capability
from capdisc.retrieval.results import _non_increasing
from capdisc.retrieval.text import combine, embedding_texts

EMBEDDER = HashingEmbedder(256)
CONFIG = DiscoveryConfig(tier1_min_relevance=0.0)


def cap(cid: str, description: str, display: str, category: str = "general") -> Capability:
    kind, name = cid.split(":")
    return Capability(
        id=cid,
        kind=kind,
        name=name,
        description=description,  # type: ignore[arg-type]
        display_name=display,
        category=category,
    )


CATALOG = [
    cap(
        "tool:weather-forecast",
        "Returns the weather forecast, temperature and rain for a city.",
        "Weather Forecast",
        "information",
    ),
    cap(
        "tool:currency-convert",
        "Converts an amount of money between currencies at the latest exchange rate.",
        "Currency Convert",
        "finance",
    ),
    cap(
        "tool:send-email",
        "Sends an email message to a recipient with a subject and a body.",
        "Send Email",
        "communication",
    ),
    cap(
        "tool:translate-text",
        "Translates text from one language into another language.",
        "Translate Text",
        "language",
    ),
    cap(
        "skill:trip-planner",
        "Plans a trip itinerary day by day with travel times.",
        "Trip Planner",
        "travel",
    ),
    cap(
        "tool:stock-quote",
        "Returns the latest stock price and market data for a ticker.",
        "Stock Quote",
        "finance",
    ),
]


def stored_vector(capability: Capability) -> bytes:
    full, summary = EMBEDDER.embed(list(embedding_texts(capability)))
    return combine(full, summary).tobytes()


@pytest.fixture(scope="module")
def snapshot() -> IndexSnapshot:
    entries = [(c, stored_vector(c)) for c in CATALOG]
    return IndexSnapshot.build("acme", 7, EMBEDDER.dim, entries, EMBEDDER.id)


def embed(texts: list[str]) -> Matrix:
    return EMBEDDER.embed(texts)


def ask(
    snapshot: IndexSnapshot,
    text: str,
    config: DiscoveryConfig = CONFIG,
    filters: SearchFilters | None = None,
    limit: int = 3,
) -> list[str]:
    query = Query(text, limit, filters or SearchFilters())
    return list(rank(snapshot, query, embed([text])[0], config, limit, embed).ids)


def test_the_snapshot_is_served_by_the_hybrid_retriever(snapshot: IndexSnapshot) -> None:
    assert isinstance(snapshot.retriever, HybridRetriever)


def test_a_query_naming_a_capability_ranks_it_first(snapshot: IndexSnapshot) -> None:
    assert ask(snapshot, "use stock-quote to check the weather in Paris")[0] == "tool:stock-quote"


def test_a_named_capability_stays_first_under_a_high_minimum_relevance(
    snapshot: IndexSnapshot,
) -> None:
    config = CONFIG.merged({"tier1_min_relevance": 0.99})

    assert ask(snapshot, "stock-quote", config) == ["tool:stock-quote"]


def test_a_chained_query_finds_a_tool_for_each_request(snapshot: IndexSnapshot) -> None:
    ids = ask(
        snapshot,
        "Convert 100 dollars into euros at the exchange rate. "
        "Then send an email message with the amount to my accountant.",
    )

    assert {"tool:currency-convert", "tool:send-email"} <= set(ids)


def test_excluded_ids_are_never_returned(snapshot: IndexSnapshot) -> None:
    filters = SearchFilters(exclude_ids=frozenset({"tool:weather-forecast"}))

    assert "tool:weather-forecast" not in ask(
        snapshot, "weather forecast for a city", filters=filters
    )


def test_an_unrelated_query_abstains_with_the_nothing_fits_tier(snapshot: IndexSnapshot) -> None:
    config = CONFIG.merged({"abstain_threshold": 0.99})

    result = discover(
        snapshot,
        Query("zebra xylophone quartz"),
        embed(["zebra xylophone quartz"])[0],
        config,
        embed,
    )

    assert result.abstained and result.matches == ()
    assert result.tiers.tier1 == NOTHING_FITS


def test_an_embedder_without_calibration_never_abstains(snapshot: IndexSnapshot) -> None:
    result = discover(
        snapshot,
        Query("zebra xylophone quartz"),
        embed(["zebra xylophone quartz"])[0],
        CONFIG,
        embed,
    )

    assert not result.abstained


@pytest.mark.parametrize(
    ("options", "field", "expected"),
    [
        ({"fusion": "rrf"}, "fusion", "rrf"),
        ({"dense_weight": 0.25}, "dense_weight", 0.25),
        ({"exact_name_match": False}, "exact_name", False),
        ({"decompose_queries": False}, "decompose", False),
        ({"abstain_threshold": 0.42}, "abstain_threshold", 0.42),
        ({}, "abstain_threshold", 0.0),  # the hashing embedder has no calibration
    ],
)
def test_per_call_options_reach_the_retrieval_config(
    snapshot: IndexSnapshot, options: dict[str, object], field: str, expected: object
) -> None:
    retriever = snapshot.retriever
    assert isinstance(retriever, HybridRetriever)

    config = retriever.retrieval_config(CONFIG.merged(options))

    assert getattr(config, field) == expected


def test_lexical_fusion_per_call_changes_the_ranking_source(snapshot: IndexSnapshot) -> None:
    # The two sides disagree on this query: the hashing vectors put currency-convert first
    # ("money"), BM25 translate-text ("translate" in its name, title and description). So the
    # answer changes only if the per-call fusion reaches the retriever.
    query = "translate money"
    default = CONFIG.merged({"exact_name_match": False})
    lexical = CONFIG.merged({"fusion": "lexical", "exact_name_match": False})

    assert ask(snapshot, query, default)[0] == "tool:currency-convert"
    assert ask(snapshot, query, lexical)[0] == "tool:translate-text"


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([], []),
        ([3.0], [3.0]),
        ([3.0, 2.0, 1.0], [3.0, 2.0, 1.0]),
        ([3.0, 0.5, 2.0, 1.0], [3.0, 2.0, 2.0, 1.0]),
        ([0.1, 0.2, 5.0], [5.0, 5.0, 5.0]),
    ],
)
def test_entry_scores_never_increase_down_the_merged_order(
    scores: list[float], expected: list[float]
) -> None:
    assert _non_increasing(scores) == expected


def test_the_stored_vector_scores_the_mean_of_both_views() -> None:
    full, summary, query = EMBEDDER.embed(["send an email", "email", "write an email"])

    mixed = combine(full, summary)

    assert float(query @ mixed) == pytest.approx(
        0.5 * float(query @ full) + 0.5 * float(query @ summary), abs=1e-6
    )
    assert mixed.dtype == np.float32


# -- workflow hints (docs/design.md, "Workflow hints") ---------------------------------------------


def test_an_answer_carries_the_workflow_hints_of_its_categories(snapshot: IndexSnapshot) -> None:
    config = CONFIG.merged(
        {
            "workflow_hints": {
                "finance": " Confirm the amount before converting. ",
                "travel": "Check visas.",
                "language": "",
            }
        }
    )
    text = "convert 100 dollars to euros at the exchange rate"

    result = discover(snapshot, Query(text, 2), embed([text])[0], config, embed)

    assert result.workflow_hints == {"finance": "Confirm the amount before converting."}
    assert result.to_dict()["workflow_hints"] == {
        "finance": "Confirm the amount before converting."
    }


@pytest.mark.parametrize(
    ("categories", "hints", "expected"),
    [
        ([], {"a": "x"}, {}),
        (["a", "b", "a"], {"a": "x", "b": "y"}, {"a": "x", "b": "y"}),
        (["b", "a"], {"a": "x", "b": "y"}, {"b": "y", "a": "x"}),
        (["a"], {"a": "   "}, {}),
        (["c"], {"a": "x"}, {}),
    ],
)
def test_hints_follow_the_order_categories_first_appear(
    categories: list[str], hints: dict[str, str], expected: dict[str, str]
) -> None:
    matches = tuple(
        Match(cap(f"tool:t{i}", "d", "T", category), 1.0, 1.0)
        for i, category in enumerate(categories)
    )

    found = hints_for(matches, hints)

    assert found == expected and list(found) == list(expected)
