"""The in-process index snapshot, and the engine's policy over a plain cosine retriever."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from capdisc.discovery import snapshot as snapshot_module
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import Match, Query, discover
from capdisc.discovery.snapshot import IndexSnapshot, cosine_retriever, hybrid_retriever
from capdisc.discovery.tiers import NOTHING_FITS
from capdisc.embedders.port import Vector
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Kind
from capdisc.retrieval.config import calibrated_for

DIM = 3


def cap(name: str, kind: Kind = "tool", **changes: object) -> Capability:
    return Capability(
        id=f"{kind}:{name}", kind=kind, name=name, description=f"{name} does things.", **changes
    )  # type: ignore[arg-type]


def vec(*values: float) -> Vector:
    return np.array(values, dtype=np.float32)


def raw(*values: float) -> bytes:
    return vec(*values).tobytes()


SEARCH = cap("web-search")
FETCH = cap("web-fetch")
CAKE = cap("bake-cake", "skill")
ENTRIES = [(CAKE, raw(0, 0, 1)), (SEARCH, raw(1, 0, 0)), (FETCH, raw(0.8, 0.6, 0))]


@pytest.fixture
def snapshot() -> IndexSnapshot:
    return IndexSnapshot.build("acme", 3, DIM, ENTRIES, retriever=cosine_retriever)


def ranked(results: list[tuple[Capability, float]]) -> list[tuple[str, float]]:
    return [(c.id, round(s, 6)) for c, s in results]


# -- IndexSnapshot -------------------------------------------------------------------------------


def test_build_keeps_entry_order_and_vectors(snapshot: IndexSnapshot) -> None:
    assert snapshot.ids == ("skill:bake-cake", "tool:web-search", "tool:web-fetch")
    assert np.array_equal(
        snapshot.matrix, np.array([[0, 0, 1], [1, 0, 0], [0.8, 0.6, 0]], dtype=np.float32)
    )
    assert len(snapshot) == 3


def test_search_ranks_by_cosine_best_first(snapshot: IndexSnapshot) -> None:
    assert ranked(snapshot.search(vec(1, 0, 0), 3)) == [
        ("tool:web-search", 1.0),
        ("tool:web-fetch", 0.8),
        ("skill:bake-cake", 0.0),
    ]


def test_search_returns_at_most_k(snapshot: IndexSnapshot) -> None:
    assert ranked(snapshot.search(vec(0.6, 0.8, 0), 2)) == [
        ("tool:web-fetch", 0.96),
        ("tool:web-search", 0.6),
    ]


def test_search_with_k_larger_than_the_index_returns_everything(snapshot: IndexSnapshot) -> None:
    assert len(snapshot.search(vec(1, 0, 0), 50)) == 3


@pytest.mark.parametrize("k", [0, -1])
def test_search_with_k_not_positive_is_empty(snapshot: IndexSnapshot, k: int) -> None:
    assert snapshot.search(vec(1, 0, 0), k) == []


def test_search_of_an_empty_snapshot_is_empty() -> None:
    assert IndexSnapshot.build("acme", 0, DIM, []).search(vec(1, 0, 0), 5) == []


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("skill", [("skill:bake-cake", 0.0)]),
        ("tool", [("tool:web-search", 1.0), ("tool:web-fetch", 0.8)]),
        ("channel", []),
    ],
)
def test_search_kind_filter_returns_only_that_kind(
    snapshot: IndexSnapshot, kind: str, expected: list[tuple[str, float]]
) -> None:
    assert ranked(snapshot.search(vec(1, 0, 0), 3, kind=kind)) == expected


def test_build_skips_vectors_of_the_wrong_dimension() -> None:
    snapshot = IndexSnapshot.build("acme", 1, DIM, [(SEARCH, raw(1, 0, 0)), (FETCH, raw(1, 0))])

    assert snapshot.ids == ("tool:web-search",)
    assert snapshot.matrix.shape == (1, DIM)


def test_build_keeps_a_repeated_ids_first_place_and_its_last_vector() -> None:
    entries = [(SEARCH, raw(1, 0, 0)), (FETCH, raw(0, 1, 0)), (SEARCH, raw(0, 0, 1))]
    snapshot = IndexSnapshot.build("acme", 1, DIM, entries, retriever=cosine_retriever)

    assert snapshot.ids == ("tool:web-search", "tool:web-fetch")
    assert np.array_equal(snapshot.matrix, np.array([[0, 0, 1], [0, 1, 0]], dtype=np.float32))


def test_with_changes_upserts_and_deletes_into_a_new_snapshot(snapshot: IndexSnapshot) -> None:
    mail = cap("send-mail")

    changed = snapshot.with_changes(4, upserts=[(mail, raw(0, 1, 0))], deletes=["skill:bake-cake"])

    assert (changed.tenant, changed.version) == ("acme", 4)
    assert changed.ids == ("tool:web-search", "tool:web-fetch", "tool:send-mail")
    assert ranked(changed.search(vec(0, 1, 0), 1)) == [("tool:send-mail", 1.0)]


@pytest.mark.parametrize("retriever", [cosine_retriever, hybrid_retriever])
def test_with_changes_fills_an_empty_snapshot_as_a_build_would(retriever: object) -> None:
    empty = IndexSnapshot.build("acme", 0, DIM, [], retriever=retriever)  # type: ignore[arg-type]

    filled = empty.with_changes(3, upserts=ENTRIES, deletes=[])
    built = IndexSnapshot.build("acme", 3, DIM, ENTRIES, retriever=retriever)  # type: ignore[arg-type]

    assert filled.ids == built.ids and np.array_equal(filled.matrix, built.matrix)
    assert ranked(filled.search(vec(0.8, 0.6, 0), 2)) == ranked(built.search(vec(0.8, 0.6, 0), 2))


def test_a_build_after_an_empty_snapshot_serves_as_a_build_from_nothing() -> None:
    empty = IndexSnapshot.build("acme", 0, DIM, [], retriever=hybrid_retriever)

    after = IndexSnapshot.build("acme", 3, DIM, ENTRIES, retriever=hybrid_retriever, previous=empty)
    built = IndexSnapshot.build("acme", 3, DIM, ENTRIES, retriever=hybrid_retriever)

    assert ranked(after.search(vec(0.8, 0.6, 0), 2)) == ranked(built.search(vec(0.8, 0.6, 0), 2))


def test_with_changes_leaves_the_old_snapshot_unchanged(snapshot: IndexSnapshot) -> None:
    matrix_before = snapshot.matrix.copy()

    snapshot.with_changes(
        4, upserts=[(SEARCH, raw(0, 1, 0)), (cap("x"), raw(0, 1, 0))], deletes=["skill:bake-cake"]
    )

    assert (snapshot.version, snapshot.ids) == (
        3,
        ("skill:bake-cake", "tool:web-search", "tool:web-fetch"),
    )
    assert np.array_equal(snapshot.matrix, matrix_before)
    assert set(snapshot.capabilities) == {"skill:bake-cake", "tool:web-search", "tool:web-fetch"}


def test_with_changes_replaces_an_existing_capability_and_vector(snapshot: IndexSnapshot) -> None:
    renamed = SEARCH.with_changes(description="Finds pages.")

    changed = snapshot.with_changes(4, upserts=[(renamed, raw(0, 1, 0))], deletes=[])

    assert len(changed) == 3
    assert changed.capabilities["tool:web-search"].description == "Finds pages."
    assert ranked(changed.search(vec(0, 1, 0), 1)) == [("tool:web-search", 1.0)]


def test_with_changes_ignores_deleting_an_absent_id(snapshot: IndexSnapshot) -> None:
    changed = snapshot.with_changes(4, upserts=[], deletes=["tool:never-there"])

    assert changed.ids == snapshot.ids


def test_with_changes_skips_an_upsert_of_the_wrong_dimension(snapshot: IndexSnapshot) -> None:
    changed = snapshot.with_changes(4, upserts=[(cap("x"), raw(1, 0, 0, 0))], deletes=[])

    assert "tool:x" not in changed.ids


# -- engine.discover -----------------------------------------------------------------------------

NO_GRAPH = {"use_graph_reranking": False}


def test_discover_drops_matches_under_the_minimum_relevance(snapshot: IndexSnapshot) -> None:
    config = DiscoveryConfig(tier1_min_relevance=0.7, **NO_GRAPH)

    result = discover(snapshot, Query("q"), vec(1, 0, 0), config)

    assert [(m.capability.id, round(m.score, 6)) for m in result.matches] == [
        ("tool:web-search", 1.0),
        ("tool:web-fetch", 0.8),
    ]


def test_discover_keeps_a_match_exactly_at_the_minimum(snapshot: IndexSnapshot) -> None:
    config = DiscoveryConfig(tier1_min_relevance=1.0, **NO_GRAPH)

    result = discover(snapshot, Query("q"), vec(1, 0, 0), config)

    assert [(m.capability.id, m.score) for m in result.matches] == [("tool:web-search", 1.0)]


def test_discover_with_no_match_says_nothing_fits(snapshot: IndexSnapshot) -> None:
    result = discover(snapshot, Query("q"), vec(0, -1, 0), DiscoveryConfig())

    assert result.matches == ()
    assert result.tiers.tier1 == NOTHING_FITS
    assert result.tiers.tier2 == ""


def test_discover_uses_tier1_top_k_unless_a_limit_is_given(snapshot: IndexSnapshot) -> None:
    config = DiscoveryConfig(tier1_top_k=1, tier1_min_relevance=-1.0)

    assert len(discover(snapshot, Query("q"), vec(1, 0, 0), config).matches) == 1
    assert len(discover(snapshot, Query("q", limit=3), vec(1, 0, 0), config).matches) == 3


def test_discover_kind_filter(snapshot: IndexSnapshot) -> None:
    config = DiscoveryConfig(tier1_min_relevance=-1.0)

    result = discover(
        snapshot, Query("q", filters=SearchFilters(kind="skill")), vec(1, 0, 0), config
    )

    assert [m.capability.id for m in result.matches] == ["skill:bake-cake"]


def test_discover_result_names_tenant_version_and_index_size(snapshot: IndexSnapshot) -> None:
    result = discover(snapshot, Query("find news"), vec(1, 0, 0), DiscoveryConfig())

    assert (result.query, result.tenant, result.index_version, result.total_indexed) == (
        "find news",
        "acme",
        3,
        3,
    )


def test_discover_puts_the_best_tier2_top_k_matches_in_tier_2(snapshot: IndexSnapshot) -> None:
    config = DiscoveryConfig(tier1_min_relevance=-1.0, tier2_top_k=1, **NO_GRAPH)

    result = discover(snapshot, Query("q"), vec(1, 0, 0), config)

    assert [(m.capability.id, m.tier) for m in result.matches] == [
        ("tool:web-search", 2),
        ("tool:web-fetch", 1),
        ("skill:bake-cake", 1),
    ]
    assert result.tiers.tier2.startswith("# web-search") or "web-search" in result.tiers.tier2


def test_discover_context_renders_tier0_then_tier1_then_tier2(snapshot: IndexSnapshot) -> None:
    result = discover(snapshot, Query("q"), vec(1, 0, 0), DiscoveryConfig())

    assert result.context == "\n\n".join(
        [result.tiers.tier0, result.tiers.tier1, result.tiers.tier2]
    )
    assert result.tiers.tier0.startswith("Available capability categories:")


def test_match_to_dict_rounds_score_and_relevance_and_names_the_tier() -> None:
    assert Match(SEARCH, 0.123456, 0.654321).to_dict() == {
        "id": "tool:web-search",
        "kind": "tool",
        "name": "web-search",
        "display_name": "",
        "description": "web-search does things.",
        "category": "general",
        "available": True,
        "score": 0.1235,
        "relevance": 0.6543,
        "tier": 1,
    }


# -- a snapshot whose retriever keeps its vectors reduced ----------------------------------------


def reduced_snapshot(rows: int = 2100, rescore_below: int = 0) -> IndexSnapshot:
    """A hybrid snapshot above ``reduce_above`` (2,000 rows): its index keeps its vectors
    projected to ``reduce_dims`` dimensions, and no full ones unless ``rescore_below`` admits
    its size."""
    from capdisc.embedders.hashing import HashingEmbedder

    embedder = HashingEmbedder(384)
    caps = [cap(f"tool-{i}", category=f"topic-{i % 97}") for i in range(rows)]
    vectors = embedder.embed([f"{c.name} {c.category}" for c in caps])
    base = replace(calibrated_for(""), rescore_below=rescore_below)
    return IndexSnapshot.build(
        "acme",
        1,
        384,
        [(c, v.tobytes()) for c, v in zip(caps, vectors, strict=True)],
        retriever=partial(hybrid_retriever, base=base),
    )


@pytest.fixture(scope="module")
def reduced() -> IndexSnapshot:
    return reduced_snapshot()


def test_a_reduced_snapshot_holds_no_second_copy_of_its_vectors(reduced: IndexSnapshot) -> None:
    index = reduced.retriever.index  # type: ignore[attr-defined]

    assert index.projection is not None
    assert reduced.matrix.shape == (0, 384)


def test_its_vectors_project_back_to_the_rows_it_scores(reduced: IndexSnapshot) -> None:
    index = reduced.retriever.index  # type: ignore[attr-defined]

    again = reduced.vectors() @ index.projection

    np.testing.assert_allclose(again, index.matrix, atol=1e-5)


def test_a_delta_on_a_reduced_snapshot_copies_every_unchanged_row_as_it_is(
    reduced: IndexSnapshot,
) -> None:
    before = reduced.retriever.index  # type: ignore[attr-defined]
    new = cap("send-mail")
    vector = np.zeros(384, dtype=np.float32)
    vector[7] = 1.0

    changed = reduced.with_changes(2, upserts=[(new, vector.tobytes())], deletes=["tool:tool-0"])
    after = changed.retriever.index  # type: ignore[attr-defined]

    assert changed.matrix.shape == (0, 384)
    assert after.ids[-1] == "tool:send-mail"
    assert after.projection is before.projection
    assert np.array_equal(after.matrix[:-1], before.matrix[1:])
    np.testing.assert_allclose(after.matrix[-1], vector @ before.projection, atol=1e-6)


@pytest.fixture(scope="module")
def rescoring() -> IndexSnapshot:
    return reduced_snapshot(rescore_below=20_000)


def test_a_projected_snapshot_that_rescores_keeps_one_copy_of_its_full_vectors(
    rescoring: IndexSnapshot,
) -> None:
    index = rescoring.retriever.index  # type: ignore[attr-defined]

    assert index.projection is not None and index.exact is not None
    assert rescoring.matrix.shape == (2100, 384)
    assert index.exact.matrix is rescoring.matrix


def test_a_delta_on_it_keeps_the_full_vectors_of_every_row(rescoring: IndexSnapshot) -> None:
    new = cap("send-mail")
    vector = np.zeros(384, dtype=np.float32)
    vector[7] = 1.0

    changed = rescoring.with_changes(2, upserts=[(new, vector.tobytes())], deletes=["tool:tool-0"])
    after = changed.retriever.index  # type: ignore[attr-defined]

    assert after.exact is not None
    assert np.array_equal(after.exact.matrix[:-1], rescoring.matrix[1:])
    assert np.array_equal(after.exact.matrix[-1], vector)
    found = changed.retriever.search("send mail", vector, 3, SearchFilters(), DiscoveryConfig())
    assert found.hits[0].id == "tool:send-mail"


def test_a_delta_of_reduced_rows_is_refused_by_a_retriever_that_does_not_keep_them(
    reduced: IndexSnapshot,
) -> None:
    from capdisc.discovery.snapshot import cosine_retriever

    other = replace(reduced, factory=cosine_retriever)

    with pytest.raises(ValueError, match="reduced rows"):
        other.with_changes(2, upserts=[], deletes=["tool:tool-0"])


@pytest.mark.parametrize("slice_rows", [1, 7, 65_536])
def test_a_delta_copies_its_kept_rows_the_same_whatever_the_slice(
    reduced: IndexSnapshot, slice_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_module, "MOVED_SLICE", slice_rows)
    before = reduced.retriever.index  # type: ignore[attr-defined]

    changed = reduced.with_changes(2, upserts=[], deletes=["tool:tool-3", "tool:tool-9"])
    after = changed.retriever.index  # type: ignore[attr-defined]

    kept = [row for row, i in enumerate(before.ids) if i not in {"tool:tool-3", "tool:tool-9"}]
    assert np.array_equal(after.matrix, before.matrix[kept])
