"""Adjustments to the fused score: dense pseudo-relevance feedback (``feedback_rows``) and the
length prior (``length_prior``). Hand-made vectors; BM25 flat (every capability has the same
text) unless a test says otherwise, so only the dense side orders the rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capdisc.models import Capability
from capdisc.retrieval import DEFAULT_CONFIG, RetrievalConfig, RetrievalIndex


def _unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


#: The query is closest to "a"; "c" comes second on cosine but points away from "a"; "b" is
#: third on cosine and lies next to "a". Feedback from "a" lifts "b" above "c".
ROWS = {"a": _unit(1, 0, 0, 0), "b": _unit(0.8, 0.6, 0, 0), "c": _unit(0.5, 0, 0.866, 0),
        "d": _unit(0, 0, 0, 1), "e": _unit(0, 1, 0, 0), "f": _unit(0, 0, 1, 1)}
QUERY = _unit(0.9, 0, 0.436, 0)
OFF = replace(DEFAULT_CONFIG, feedback_rows=0, abstain_threshold=0.0, length_prior=0.0)
ON = replace(OFF, feedback_rows=1, feedback_weight=1.0)


def _index(names: list[str]) -> RetrievalIndex:
    caps = [Capability(id=f"tool:{n}", kind="tool", name=n, description="same words")
            for n in names]
    return RetrievalIndex.build(caps, np.stack([ROWS[n] for n in names]),
                                texts=["same words"] * len(names))


def _ranked(index: RetrievalIndex, query: str, config: RetrievalConfig,
            **options: object) -> list[str]:
    found = index.search(query, QUERY, 3, config=config, **options)  # type: ignore[arg-type]
    return [i.removeprefix("tool:") for i in found.ids]


@pytest.mark.parametrize(("config", "expected"), [
    (OFF, ["a", "c", "b"]),
    (ON, ["a", "b", "c"]),
    (replace(ON, feedback_weight=0.0), ["a", "c", "b"]),
])
def test_feedback_lifts_the_neighbours_of_the_best_match(config: RetrievalConfig,
                                                          expected: list[str]) -> None:
    assert _ranked(_index(list(ROWS)), "find the thing", config) == expected


def test_feedback_is_drawn_only_from_rows_the_filters_allow() -> None:
    whole = _index(list(ROWS))
    without_a = _index([n for n in ROWS if n != "a"])
    assert (_ranked(whole, "find the thing", ON, exclude=["tool:a"])
            == _ranked(without_a, "find the thing", ON))


def test_feedback_is_not_applied_to_chained_requests() -> None:
    chained = "Find the first thing for me. Then find the second thing for me."
    assert _ranked(_index(list(ROWS)), chained, ON) == ["a", "c", "b"]


def test_feedback_keeps_the_original_cosine_as_relevance_evidence() -> None:
    found = _index(list(ROWS)).search("find the thing", QUERY, 3, config=ON)
    cosines = {e.capability_id: e.evidence[0] for e in found.entries}
    for name in ("a", "b", "c"):
        assert cosines[f"tool:{name}"] == pytest.approx(float(QUERY @ ROWS[name]), abs=1e-5)


# -- the length prior ------------------------------------------------------------------------------

FILLER = " ".join(f"word{i}" for i in range(40))


@pytest.mark.parametrize(("prior", "expected"), [
    (0.0, ["long", "short"]),  # equal scores: catalog order
    (0.3, ["short", "long"]),  # equal scores: the shorter text first
])
def test_length_prior_prefers_the_shorter_of_equal_matches(prior: float,
                                                            expected: list[str]) -> None:
    names = ["long", "short", "other", "more"]
    caps = [Capability(id=f"tool:{n}", kind="tool", name=n, description=n) for n in names]
    same = _unit(1, 0, 0, 0)
    matrix = np.stack([same, same, _unit(0, 1, 0, 0), _unit(0, 0, 1, 0)])
    texts = [f"invoice {FILLER}", "invoice", "other", "more"]
    index = RetrievalIndex.build(caps, matrix, texts=texts)
    found = index.search("unrelated words", same, 2, config=replace(OFF, length_prior=prior))
    assert [i.removeprefix("tool:") for i in found.ids] == expected


def test_length_prior_does_not_overturn_a_clearly_better_match() -> None:
    names = ["long", "short", "other", "more"]
    caps = [Capability(id=f"tool:{n}", kind="tool", name=n, description=n) for n in names]
    matrix = np.stack([_unit(1, 0, 0, 0), _unit(0.3, 1, 0, 0), _unit(0, 0, 1, 0),
                       _unit(0, 0, 0, 1)])
    texts = [f"invoice {FILLER}", "invoice", "other", "more"]
    index = RetrievalIndex.build(caps, matrix, texts=texts)
    found = index.search("unrelated words", _unit(1, 0, 0, 0), 1, config=DEFAULT_CONFIG)
    assert found.ids == ("tool:long",)
