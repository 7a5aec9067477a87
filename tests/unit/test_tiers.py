"""Tiered context under hard token budgets (the three tiers of docs/design.md)."""

from __future__ import annotations

import random
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capdisc.discovery.tiers import (
    NOTHING_FITS,
    TIER0_FOOTER,
    TIER0_HEADER,
    TIER1_HEADER,
    detail_block,
    first_sentence,
    schema_lines,
    summary_line,
    tier0_text,
    tier1_text,
    tier2_text,
)
from capdisc.models import Capability, Kind
from capdisc.tokens import TokenCounter, heuristic_tokens, make_counter

H = heuristic_tokens
CL100K = make_counter("cl100k")
COUNTERS = [pytest.param(heuristic_tokens, id="heuristic"), pytest.param(CL100K, id="cl100k")]
BIG = 100_000


def cap(
    name: str, kind: str = "tool", category: str = "general", description: str = "", **changes: Any
) -> Capability:
    return Capability(
        id=f"{kind}:{name}",
        kind=cast(Kind, kind),
        name=name,
        description=description or f"About {name}.",
        category=category,
        **changes,
    )


def lines(*parts: str) -> str:
    return "\n".join(parts)


WEB_SEARCH_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "The search query"},
        "max_results": {"type": "number", "description": "Maximum results to return", "default": 5},
        "search_type": {
            "type": "string",
            "description": "Type of search",
            "enum": ["search", "news", "images"],
            "default": "search",
        },
    },
    "required": ["query"],
}
WEB_SEARCH = cap(
    "web-search",
    category="information",
    display_name="Web Search",
    description="Search the web for current information using the Serper API. "
    "Results come back ranked.",
    full_schema=WEB_SEARCH_SCHEMA,
    required_secrets=("SERPER_API_KEY",),
)
GITHUB = cap(
    "github",
    kind="skill",
    category="developer-tools",
    description="Use the GitHub CLI for issues, PRs, repos.",
    full_content="\n# GitHub\n\nRun `gh issue list` first.\n\n",
    required_tools=("gh",),
)

CATALOG = [
    *(
        cap(name, category="communication")
        for name in ("telegram", "discord", "slack", "whatsapp", "email")
    ),
    cap("web-search", category="information"),
    cap("news-search", category="information"),
    cap("git", category="developer-tools"),
    cap("github", kind="skill", category="developer-tools"),
]
COMMUNICATION_LINE = "- communication: discord, email, slack, telegram (+1 more) (5)"
DEVELOPER_LINE = "- developer-tools: git, github (2)"
INFORMATION_LINE = "- information: news-search, web-search (2)"

# -- Tier 0 --------------------------------------------------------------------------------------


def test_tier0_lists_categories_biggest_first_with_counts_and_more_names() -> None:
    assert tier0_text(CATALOG, BIG, H) == lines(
        TIER0_HEADER, COMMUNICATION_LINE, DEVELOPER_LINE, INFORMATION_LINE, TIER0_FOOTER
    )


def test_tier0_header_and_footer_wording() -> None:
    assert (TIER0_HEADER, TIER0_FOOTER) == (
        "Available capability categories:",
        "Use the discover_capabilities tool to get details on any capability.",
    )


def test_tier0_category_of_exactly_four_names_has_no_more_marker() -> None:
    caps = [cap(n, category="c") for n in ("d", "c", "b", "a")]
    assert tier0_text(caps, BIG, H) == lines(TIER0_HEADER, "- c: a, b, c, d (4)", TIER0_FOOTER)


def test_tier0_counts_capabilities_of_every_kind_in_a_category() -> None:
    caps = [
        cap("x", kind="tool", category="c"),
        cap("x", kind="skill", category="c"),
        cap("y", kind="channel", category="c"),
    ]
    assert tier0_text(caps, BIG, H) == lines(TIER0_HEADER, "- c: x, x, y (3)", TIER0_FOOTER)


@pytest.mark.parametrize("budget", [BIG, 40, 25])
@pytest.mark.parametrize("seed", range(5))
def test_tier0_is_byte_identical_for_any_input_order(seed: int, budget: int) -> None:
    shuffled = list(CATALOG)
    random.Random(seed).shuffle(shuffled)
    assert tier0_text(shuffled, budget, CL100K) == tier0_text(CATALOG, budget, CL100K)


def test_tier0_says_how_many_categories_the_budget_cut() -> None:
    expected = lines(TIER0_HEADER, COMMUNICATION_LINE, "(+2 more categories)", TIER0_FOOTER)
    assert tier0_text(CATALOG, H(expected), H) == expected


def test_tier0_says_one_more_category_when_only_the_last_is_cut() -> None:
    expected = lines(
        TIER0_HEADER, COMMUNICATION_LINE, DEVELOPER_LINE, "(+1 more categories)", TIER0_FOOTER
    )
    assert tier0_text(CATALOG, H(expected), H) == expected


def test_tier0_cuts_every_category_when_not_even_the_first_fits() -> None:
    expected = lines(TIER0_HEADER, "(+3 more categories)", TIER0_FOOTER)
    assert tier0_text(CATALOG, H(expected), H) == expected


def test_tier0_without_capabilities_says_so() -> None:
    assert tier0_text([], BIG, H) == "No capabilities are registered yet."


@pytest.mark.parametrize("counter", COUNTERS)
def test_tier0_budget_zero_is_empty(counter: TokenCounter) -> None:
    assert tier0_text(CATALOG, 0, counter) == ""


def test_tier0_too_small_for_header_and_footer_is_cut_with_an_ellipsis() -> None:
    assert tier0_text(CATALOG, 5, H) == "Available capabilit…"


# -- Tier 1 --------------------------------------------------------------------------------------

SUMMARY_CASES: dict[str, tuple[int, Capability, str]] = {
    "tool with params": (
        1,
        WEB_SEARCH,
        "1. web-search (tool). Search the web for current information using the Serper API. "
        "Params: query, max_results, search_type",
    ),
    "skill with required tools": (
        4,
        GITHUB,
        "4. github (skill). Use the GitHub CLI for issues, PRs, repos. Requires: gh",
    ),
    "no params": (
        5,
        cap("summarizer", kind="skill", description="Summarize long documents into key points"),
        "5. summarizer (skill). Summarize long documents into key points",
    ),
    "unavailable": (
        2,
        cap("giphy", kind="extension", description="GIF search. Needs a key.", available=False),
        "2. giphy (extension). GIF search. [installable, not installed]",
    ),
    "unavailable with params and requirements": (
        3,
        cap(
            "t",
            description="Do it.",
            available=False,
            required_tools=("a", "b"),
            full_schema={"properties": {"p": {}, "q": {}}},
        ),
        "3. t (tool). Do it. [installable, not installed] Params: p, q Requires: a, b",
    ),
}


@pytest.mark.parametrize(
    ("rank", "capability", "expected"), list(SUMMARY_CASES.values()), ids=list(SUMMARY_CASES)
)
def test_summary_line(rank: int, capability: Capability, expected: str) -> None:
    assert summary_line(rank, capability) == expected


def test_tier1_lists_ranked_summary_lines_under_a_header() -> None:
    text, ids = tier1_text([WEB_SEARCH, GITHUB], {}, BIG, H)
    assert text == lines(TIER1_HEADER, summary_line(1, WEB_SEARCH), summary_line(2, GITHUB))
    assert ids == ("tool:web-search", "skill:github")


def test_tier1_appends_the_hints_of_matched_categories_most_common_first() -> None:
    matches = [cap("x", category="b"), cap("y", category="a"), cap("z", category="a")]
    hints = {"a": "  Do a things.\n", "b": "Do b things.", "unmatched": "Never shown."}
    text, _ids = tier1_text(matches, hints, BIG, H)
    assert text == lines(
        TIER1_HEADER,
        *(summary_line(i, c) for i, c in enumerate(matches, 1)),
        "Workflow (a): Do a things.",
        "Workflow (b): Do b things.",
    )


def test_tier1_skips_empty_hints() -> None:
    matches = [cap("x", category="a")]
    text, _ids = tier1_text(matches, {"a": ""}, BIG, H)
    assert text == lines(TIER1_HEADER, summary_line(1, matches[0]))


def test_tier1_skips_whitespace_only_hints() -> None:
    matches = [cap("x", category="a")]
    text, _ids = tier1_text(matches, {"a": "  \n "}, BIG, H)
    assert text == lines(TIER1_HEADER, summary_line(1, matches[0]))


def test_tier1_appends_only_the_hints_that_fit() -> None:
    matches = [cap("x", category="a"), cap("y", category="a"), cap("z", category="b")]
    hints = {"a": "A long hint " * 20, "b": "Short."}
    expected = lines(
        TIER1_HEADER,
        *(summary_line(i, c) for i, c in enumerate(matches, 1)),
        "Workflow (b): Short.",
    )
    text, ids = tier1_text(matches, hints, H(expected), H)
    assert (text, ids) == (expected, ("tool:x", "tool:y", "tool:z"))


def test_tier1_without_matches_says_nothing_fits() -> None:
    assert tier1_text([], {"general": "A hint."}, BIG, H) == (NOTHING_FITS, ())


def test_tier1_nothing_fits_is_cut_to_the_budget() -> None:
    assert tier1_text([], {}, 5, H) == ("No registered capab…", ())


def test_tier1_cuts_the_line_that_does_not_fit_and_drops_the_rest() -> None:
    matches = [WEB_SEARCH, GITHUB, cap("third")]
    head = lines(TIER1_HEADER, summary_line(1, WEB_SEARCH))
    text, ids = tier1_text(matches, {}, H(head) + 6, H)
    assert text == lines(head, "2. github (skill).…")
    assert ids == ("tool:web-search", "skill:github")


def test_tier1_drops_a_line_when_no_budget_is_left_for_it() -> None:
    head = lines(TIER1_HEADER, summary_line(1, WEB_SEARCH))
    assert tier1_text([WEB_SEARCH, GITHUB], {}, H(head) + 1, H) == (head, ("tool:web-search",))


@pytest.mark.parametrize("counter", COUNTERS)
def test_tier1_budget_zero_is_empty(counter: TokenCounter) -> None:
    assert tier1_text([WEB_SEARCH], {"information": "Hint."}, 0, counter) == ("", ())


# -- Tier 2 --------------------------------------------------------------------------------------

SCHEMA_CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "seed example": (
        WEB_SEARCH_SCHEMA,
        [
            "  query (string, required): The search query",
            "  max_results (number): Maximum results to return (default: 5)",
            '  search_type (string): Type of search [search|news|images] (default: "search")',
        ],
    ),
    "no type is any": ({"properties": {"x": {}}}, ["  x (any)"]),
    "union type": ({"properties": {"x": {"type": ["string", "null"]}}}, ["  x (string|null)"]),
    "required without description": (
        {"properties": {"x": {"type": "integer"}}, "required": ["x"]},
        ["  x (integer, required)"],
    ),
    "enum without description": (
        {"properties": {"x": {"type": "integer", "enum": [1, 2, 3]}}},
        ["  x (integer) [1|2|3]"],
    ),
    "falsy defaults are shown": (
        {"properties": {"a": {"default": None}, "b": {"default": False}, "c": {"default": ""}}},
        ["  a (any) (default: null)", "  b (any) (default: false)", '  c (any) (default: "")'],
    ),
    "structured default as JSON": (
        {"properties": {"x": {"type": "object", "default": {"k": [1]}}}},
        ['  x (object) (default: {"k": [1]})'],
    ),
    "non-dict spec": ({"properties": {"x": True}}, ["  x (any)"]),
    "no properties": ({"type": "object"}, []),
    "required of null": ({"properties": {"x": {}}, "required": None}, ["  x (any)"]),
}


@pytest.mark.parametrize(
    ("schema", "expected"), list(SCHEMA_CASES.values()), ids=list(SCHEMA_CASES)
)
def test_schema_lines(schema: dict[str, Any], expected: list[str]) -> None:
    assert schema_lines(schema) == expected


def test_detail_block_of_a_tool_is_its_schema() -> None:
    assert detail_block(WEB_SEARCH) == lines(
        "# Web Search",
        "Id: tool:web-search | Kind: tool | Category: information",
        "",
        "Search the web for current information using the Serper API. Results come back ranked.",
        "",
        "## Input Schema",
        "  query (string, required): The search query",
        "  max_results (number): Maximum results to return (default: 5)",
        '  search_type (string): Type of search [search|news|images] (default: "search")',
        "Required secrets: SERPER_API_KEY",
    )


def test_detail_block_of_a_skill_is_its_content() -> None:
    assert detail_block(GITHUB) == lines(
        "# github",
        "Id: skill:github | Kind: skill | Category: developer-tools",
        "",
        "Use the GitHub CLI for issues, PRs, repos.",
        "",
        "# GitHub\n\nRun `gh issue list` first.",
        "Requires: gh",
    )


def test_detail_block_warns_about_side_effects() -> None:
    block = detail_block(cap("send", description="Send it.", has_side_effects=True))
    assert block.splitlines()[-1] == (
        "Has side effects: confirm before calling when the user did not ask for it."
    )


def test_detail_block_without_schema_properties_has_no_schema_section() -> None:
    block = detail_block(cap("t", description="Do it.", full_schema={"type": "object"}))
    assert block == lines("# t", "Id: tool:t | Kind: tool | Category: general", "", "Do it.")


def test_tier2_joins_the_blocks_that_fit() -> None:
    text, ids = tier2_text([WEB_SEARCH, GITHUB], BIG, H)
    assert text == detail_block(WEB_SEARCH) + "\n\n" + detail_block(GITHUB)
    assert ids == ("tool:web-search", "skill:github")


def test_tier2_cuts_the_block_that_does_not_fit() -> None:
    first = detail_block(WEB_SEARCH)
    text, ids = tier2_text([WEB_SEARCH, GITHUB], H(first) + 1 + 10, H)
    assert text == first + "\n\n" + detail_block(GITHUB)[:39].rstrip() + "…"
    assert ids == ("tool:web-search", "skill:github")


def test_tier2_cuts_a_first_block_bigger_than_the_budget() -> None:
    assert tier2_text([WEB_SEARCH, GITHUB], 10, H) == (
        detail_block(WEB_SEARCH)[:39].rstrip() + "…",
        ("tool:web-search",),
    )


def test_tier2_drops_the_blocks_after_the_budget_is_spent() -> None:
    first, second = detail_block(WEB_SEARCH), detail_block(GITHUB)
    # each block after the first is charged one token for the blank line that separates it
    text, ids = tier2_text([WEB_SEARCH, GITHUB, cap("third")], H(first) + 1 + H(second), H)
    assert (text, ids) == (first + "\n\n" + second, ("tool:web-search", "skill:github"))


@pytest.mark.parametrize("counter", COUNTERS)
def test_tier2_budget_zero_is_empty(counter: TokenCounter) -> None:
    assert tier2_text([WEB_SEARCH], 0, counter) == ("", ())


def test_tier2_without_matches_is_empty() -> None:
    assert tier2_text([], BIG, H) == ("", ())


# -- first_sentence ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Search the web. Then summarize.", "Search the web."),
        ("Really? Yes.", "Really?"),
        ("Stop! Go.", "Stop!"),
        ("One sentence only.", "One sentence only."),
        ("no stop at all", "no stop at all"),
        ("", ""),
        ("  Multi\n  line\ttext.  Next one.", "Multi line text."),
        ("Version 1.2 is out. Try it.", "Version 1.2 is out."),
        ("a" * 160, "a" * 160),
        ("a" * 200, "a" * 159 + "…"),
        ("a" * 170 + ". Second.", "a" * 159 + "…"),
        ("word " * 40, ("word " * 32).rstrip() + "…"),
    ],
)
def test_first_sentence(text: str, expected: str) -> None:
    assert first_sentence(text) == expected


def test_first_sentence_with_a_smaller_limit() -> None:
    assert first_sentence("Short. Longer sentence here.", max_chars=5) == "Shor…"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Wow! This is great. More.", "Wow!"),
        ("Need a summary? This tool writes one. Fast.", "Need a summary?"),
    ],
)
def test_first_sentence_ends_at_the_earliest_stop(text: str, expected: str) -> None:
    assert first_sentence(text) == expected


# -- budget properties: no rendered tier ever exceeds its budget ---------------------------------
#
# Hypothesis draws the shape of each catalog (its size, a pool of text fragments, names, categories,
# a seed); the bulk (60 capabilities with descriptions up to 2,000 characters, schemas of up to 15
# parameters, skill content up to 5,000 characters) is expanded from the seed with random.Random.
# Drawing every character through Hypothesis makes 200 examples of such catalogs take ~30 s each.

FRAGMENTS = [
    "Search the web.",
    "Wow! ",
    "Why? ",
    "\n\n",
    "…",
    "   ",
    "<|endoftext|>",
    "日本語",
    "🎉",
    "x.y_z",
    "e.g. this",
    "'s",
    '```json\n{"a": 1}\n```',
]
pieces = st.lists(
    st.one_of(st.text(min_size=1, max_size=12), st.sampled_from(FRAGMENTS)), min_size=1, max_size=10
)
names = st.lists(
    st.one_of(
        st.sampled_from(["web-search", "github", "a", "x" * 60]), st.text(min_size=1, max_size=30)
    ),
    min_size=1,
    max_size=8,
)
categories = st.lists(
    st.one_of(st.sampled_from(["general", "communication", "information"]), st.text(max_size=20)),
    min_size=1,
    max_size=8,
)
TAGS = ["web", "search", "chat", "git", "files"]
TYPES: list[Any] = ["string", "number", "integer", "boolean", "object", ["string", "null"]]
KIND_NAMES = ["tool", "skill", "extension", "channel"]


class CatalogMaker:
    """Expands a seed into capabilities built from the drawn pools."""

    def __init__(
        self, seed: int, pieces: list[str], names: list[str], categories: list[str]
    ) -> None:
        self.rng = random.Random(seed)
        self.pieces, self.names, self.categories = pieces, names, categories

    def text(self, max_size: int) -> str:
        """Up to ``max_size`` characters; often empty, short, or exactly ``max_size``."""
        rng = self.rng
        size = rng.choice([0, rng.randint(0, 40), rng.randint(0, max_size), max_size])
        unit = "".join(rng.choice(self.pieces) for _ in range(rng.randint(1, 12)))
        return (unit * (size // len(unit) + 1))[:size]

    def schema(self) -> dict[str, Any] | None:
        rng = self.rng
        if rng.random() < 0.2:
            return None
        properties: dict[str, Any] = {}
        for _ in range(rng.randint(0, 15)):
            spec: dict[str, Any] = {}
            if rng.random() < 0.8:
                spec["type"] = rng.choice(TYPES)
            if rng.random() < 0.7:
                spec["description"] = self.text(300)
            if rng.random() < 0.3:
                spec["enum"] = [self.text(10) for _ in range(rng.randint(1, 5))]
            if rng.random() < 0.3:
                spec["default"] = rng.choice([None, True, 0, 5, self.text(20)])
            properties[self.text(20)] = spec
        required = [n for n in properties if rng.random() < 0.5]
        return {"type": "object", "properties": properties, "required": required}

    def capability(self, index: int) -> Capability:
        rng = self.rng
        kind = rng.choice(KIND_NAMES)
        name = rng.choice(self.names)
        return Capability(
            id=f"{kind}:{index}:{name}",
            kind=cast(Kind, kind),
            name=name,
            description=self.text(2000),
            display_name=rng.choice(["", self.text(30)]),
            category=rng.choice(self.categories),
            tags=tuple(rng.sample(TAGS, rng.randint(0, 3))),
            required_secrets=tuple(self.text(15) for _ in range(rng.randint(0, 2))),
            required_tools=tuple(rng.choice(self.names) for _ in range(rng.randint(0, 3))),
            available=rng.random() < 0.7,
            has_side_effects=rng.random() < 0.3,
            full_schema=self.schema() if kind == "tool" else None,
            full_content=(rng.choice([None, self.text(5000)]) if kind == "skill" else None),
        )


@st.composite
def catalogs(draw: st.DrawFn) -> list[Capability]:
    maker = CatalogMaker(
        draw(st.integers(0, 2**32 - 1)), draw(pieces), draw(names), draw(categories)
    )
    return [maker.capability(i) for i in range(draw(st.integers(1, 60)))]


budgets = st.integers(0, 3000)
hint_maps = st.dictionaries(
    st.one_of(st.sampled_from(["general", "communication"]), st.text()),
    st.text(max_size=200),
    max_size=4,
)


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=200, deadline=None)
@given(catalog=catalogs(), budget=budgets)
def test_tier0_never_exceeds_its_budget(
    counter: TokenCounter, catalog: list[Capability], budget: int
) -> None:
    assert counter(tier0_text(catalog, budget, counter)) <= budget


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=200, deadline=None)
@given(catalog=catalogs(), hints=hint_maps, budget=budgets, top=st.integers(0, 60))
def test_tier1_never_exceeds_its_budget(
    counter: TokenCounter, catalog: list[Capability], hints: dict[str, str], budget: int, top: int
) -> None:
    text, _ids = tier1_text(catalog[:top], hints, budget, counter)
    assert counter(text) <= budget


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=200, deadline=None)
@given(catalog=catalogs(), budget=budgets, top=st.integers(0, 60))
def test_tier2_never_exceeds_its_budget(
    counter: TokenCounter, catalog: list[Capability], budget: int, top: int
) -> None:
    text, _ids = tier2_text(catalog[:top], budget, counter)
    assert counter(text) <= budget


# Supplementary properties (fewer examples, to keep the file fast).


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=100, deadline=None)
@given(catalog=catalogs(), budget=budgets, data=st.data())
def test_tier0_is_byte_identical_for_any_order_of_a_random_catalog(
    counter: TokenCounter, catalog: list[Capability], budget: int, data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(catalog))
    assert tier0_text(shuffled, budget, counter) == tier0_text(catalog, budget, counter)


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=100, deadline=None)
@given(catalog=catalogs(), hints=hint_maps, budget=budgets, top=st.integers(0, 60))
def test_tier1_ids_are_the_leading_matches(
    counter: TokenCounter, catalog: list[Capability], hints: dict[str, str], budget: int, top: int
) -> None:
    _text, ids = tier1_text(catalog[:top], hints, budget, counter)
    assert ids == tuple(c.id for c in catalog[: len(ids)])


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=100, deadline=None)
@given(catalog=catalogs(), budget=budgets, top=st.integers(0, 60))
def test_tier2_ids_are_the_leading_matches(
    counter: TokenCounter, catalog: list[Capability], budget: int, top: int
) -> None:
    _text, ids = tier2_text(catalog[:top], budget, counter)
    assert ids == tuple(c.id for c in catalog[: len(ids)])
