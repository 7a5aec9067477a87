"""The token report: a static dump of every tool against capdisc's tiered answer per turn."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdisc.agents.formats import to_openai_chat
from capdisc.bench.tokenreport import static_dump_tokens, token_report
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import CachedQueryEmbedder
from capdisc.models import Capability
from capdisc.retrieval.text import combine, embedding_texts
from capdisc.tokens import heuristic_tokens

EMBEDDER = HashingEmbedder(64)
TOPICS = [
    "weather",
    "invoice",
    "calendar",
    "email",
    "database",
    "translation",
    "music",
    "shipping",
    "payroll",
    "ticket",
]


def tool(i: int) -> Capability:
    topic = TOPICS[i % len(TOPICS)]
    schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": f"What to look up about {topic}"},
            "limit": {"type": "integer", "description": "How many results at most"},
            "region": {"type": "string", "description": "Region code such as eu or us"},
        },
        "required": ["query"],
    }
    return Capability(
        id=f"tool:{topic}-{i}",
        kind="tool",
        name=f"{topic}-{i}",
        description=f"Works with {topic} records, variant {i}: finds, reads and "
        f"updates {topic} data for the user.",
        category=topic,
        full_schema=schema,
    )


def snapshot_of(caps: list[Capability]) -> IndexSnapshot:
    entries = []
    for capability in caps:
        full, summary = EMBEDDER.embed(list(embedding_texts(capability)))
        entries.append((capability, combine(full, summary).tobytes()))
    return IndexSnapshot.build("t", 1, EMBEDDER.dim, entries, EMBEDDER.id)


QUERIES = CachedQueryEmbedder(EMBEDDER)


@pytest.fixture(scope="module")
def sixty() -> IndexSnapshot:
    return snapshot_of([tool(i) for i in range(60)])


def test_the_static_dump_counts_every_tool_definition(sixty: IndexSnapshot) -> None:
    caps = [sixty.capabilities[i] for i in sixty.ids]
    expected = heuristic_tokens(json.dumps(to_openai_chat(caps, include_metatool=False)))

    assert static_dump_tokens(sixty, heuristic_tokens) == expected


def test_a_tiered_turn_costs_at_least_ninety_percent_less_at_sixty_tools(
    sixty: IndexSnapshot,
) -> None:
    report = token_report(
        sixty, ["find the weather data", "update an invoice"], QUERIES, DiscoveryConfig()
    )

    assert report["saving"] >= 0.9
    assert report["turn_tokens"]["max"] < report["static_dump_tokens"]


def test_the_report_names_its_counter_and_sizes(sixty: IndexSnapshot) -> None:
    report = token_report(sixty, ["music"], QUERIES, DiscoveryConfig())

    assert (report["capabilities"], report["queries"], report["counter"]) == (60, 1, "heuristic")


@settings(max_examples=25, deadline=None)
@given(
    size=st.integers(1, 30),
    tier0=st.integers(0, 300),
    tier1=st.integers(0, 400),
    tier2=st.integers(0, 800),
    query=st.sampled_from(TOPICS),
)
def test_no_turn_ever_exceeds_its_tier_budgets(
    size: int, tier0: int, tier1: int, tier2: int, query: str
) -> None:
    config = DiscoveryConfig(
        tier0_budget_tokens=tier0, tier1_budget_tokens=tier1, tier2_budget_tokens=tier2
    )

    report = token_report(snapshot_of([tool(i) for i in range(size)]), [query], QUERIES, config)

    assert report["over_budget_turns"] == 0
