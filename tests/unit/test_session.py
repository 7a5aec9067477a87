"""Session policy with a fake clock: the working set's cap, TTL then LRU,
always-include, the loop guard (counter, sliding window, A-B-A-B, exempt tools, re-discovery),
the redundant-search guard, profiles, exactly-once memory, export and import."""

from __future__ import annotations

from dataclasses import replace

import pytest

from capdisc.errors import ForbiddenError, UnknownProfileError
from capdisc.sessions.policy import (
    GENERIC_LOOP_GUIDANCE,
    REDUNDANT_SEARCH_NOTE,
    AgentProfile,
    SessionPolicy,
    SessionState,
    allowed_ids,
    argument_hash,
    bind,
    bound_ids,
    check_search,
    experts_first,
    export,
    held_by,
    holder_of,
    imported,
    new_session,
    record_call,
)
from capdisc.sessions.store import next_revision

S = 1000  # ms


def policy(**changes: object) -> SessionPolicy:
    return SessionPolicy.model_validate({"max_discovered_tools": 3, "tool_ttl_s": 60, **changes})


def fresh(profile: str | None = None) -> SessionState:
    return new_session("s1", profile, 0)


def bound_after(steps: list[tuple[int, list[str]]], rules: SessionPolicy) -> list[str]:
    state = fresh()
    for at_s, ids in steps:
        state, _events = bind(state, ids, at_s * S, rules)
    return sorted(state.bound)


# -- the working set -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([(0, ["a", "b"])], ["a", "b"], id="under-the-cap"),
        pytest.param([(0, ["a", "b", "c"]), (1, ["d"])], ["b", "c", "d"], id="lru-drops-oldest"),
        pytest.param(
            [(0, ["a"]), (10, ["b", "c"]), (20, ["a"]), (30, ["d"])],
            ["a", "c", "d"],
            id="refresh-protects",
        ),
        pytest.param([(0, ["a", "b", "c", "d", "e"])], ["a", "b", "c"], id="best-ranked-kept"),
        pytest.param([(0, ["a"]), (50, ["b", "c"]), (100, ["d"])], ["b", "c", "d"], id="ttl-first"),
    ],
)
def test_working_set_cap_ttl_then_lru(
    steps: list[tuple[int, list[str]]], expected: list[str]
) -> None:
    assert bound_after(steps, policy()) == expected


def test_ttl_eviction_comes_before_lru() -> None:
    rules = policy(max_discovered_tools=2, tool_ttl_s=30)
    state = fresh()
    state, _ = bind(state, ["old"], 0, rules)
    state, _ = bind(state, ["mid"], 40 * S, rules)
    state, _outcome, _ = record_call(state, "old", {}, 41 * S, rules)  # used: not stale
    state, events = bind(state, ["new"], 80 * S, rules)

    assert sorted(state.bound) == ["new", "old"]
    assert [(e.type, e.tool, e.reason) for e in events if e.type == "evicted"] == [
        ("evicted", "mid", "ttl")
    ]


def test_binding_a_bound_tool_refreshes_it_without_a_duplicate() -> None:
    state, _ = bind(fresh(), ["a"], 0, policy())
    state, events = bind(state, ["a"], 5 * S, policy())

    assert list(state.bound) == ["a"]
    assert state.bound["a"].first_seen_ms == 0 and state.bound["a"].last_used_ms == 5 * S
    assert [e.type for e in events] == ["refreshed"]


def test_always_include_tools_never_count_toward_the_cap_nor_get_evicted() -> None:
    rules = policy(always_include=["core"], max_discovered_tools=2)
    state, _ = bind(fresh(), ["core", "a", "b", "c"], 0, rules)

    assert sorted(state.bound) == ["a", "b"]
    assert bound_ids(state, rules)[0] == "core"


def test_profile_always_include_and_cap_override_the_platform_ones() -> None:
    rules = policy(
        always_include=["core"],
        profiles={"billing": AgentProfile(always_include=["invoice"], max_discovered_tools=1)},
    )
    state, _ = bind(fresh("billing"), ["invoice", "a", "b"], 0, rules)

    assert list(state.bound) == ["a"]
    assert bound_ids(state, rules) == ["core", "invoice", "a"]


# -- the loop guard --------------------------------------------------------------------------------


def calls(
    sequence: list[str], rules: SessionPolicy, gap_s: int = 1
) -> tuple[SessionState, list[bool]]:
    state, _ = bind(fresh(), sorted(set(sequence)), 0, rules)
    detected = []
    for step, tool in enumerate(sequence):
        state, outcome, _ = record_call(state, tool, {"q": "same"}, (step + 1) * gap_s * S, rules)
        detected.append(outcome.loop_detected)
    return state, detected


@pytest.mark.parametrize(
    ("sequence", "rules", "detected_at"),
    [
        pytest.param(["a", "a", "a"], {}, None, id="three-same-calls-ok"),
        pytest.param(
            ["a", "b", "a", "b", "a", "b", "a"],
            {"loop_window_s": 2},
            6,
            id="a-b-alternation-sliding-window",
        ),
        pytest.param(
            ["a", "b", "c", "a", "d", "e", "f", "a", "g", "h", "i", "a"],
            {"loop_recent_calls": 3},
            11,
            id="time-window-counter",
        ),
        pytest.param(["a"] * 6, {"loop_exempt_tools": ["a"]}, None, id="exempt-tool"),
        pytest.param(
            ["a", "x", "y", "z", "w", "v", "a", "u", "t", "s", "r", "q", "a", "p", "a"],
            {"loop_window_s": 5, "loop_recent_calls": 3},
            None,
            id="spread-out-calls-are-no-loop",
        ),
    ],
)
def test_loop_guard(sequence: list[str], rules: dict[str, object], detected_at: int | None) -> None:
    _state, detected = calls(sequence, policy(max_discovered_tools=20, **rules))

    expected = (
        [i == detected_at for i in range(len(sequence))]
        if detected_at is not None
        else [False] * len(sequence)
    )
    assert detected == expected


def test_a_loop_evicts_the_tool_and_guides_but_the_call_counts() -> None:
    rules = policy(max_discovered_tools=5)
    state, _ = bind(fresh(), ["a", "b"], 0, rules)
    for step in range(3):
        state, outcome, _ = record_call(state, "a", {"q": 1}, step * S, rules)
    state, outcome, events = record_call(state, "a", {"q": 1}, 4 * S, rules)

    assert outcome.loop_detected and outcome.evicted
    assert outcome.guidance == GENERIC_LOOP_GUIDANCE
    assert "a" not in state.bound and "a" in state.loop_evicted
    assert [e.type for e in events] == ["loop_detected", "evicted"]


def test_tool_specific_guidance_when_configured() -> None:
    rules = policy(loop_guidance={"a": "Try tool:b-search for fuzzy matches."})
    state, _ = bind(fresh(), ["a"], 0, rules)
    outcome = None
    for step in range(4):
        state, outcome, _ = record_call(state, "a", {}, step * S, rules)

    assert outcome is not None and outcome.guidance == "Try tool:b-search for fuzzy matches."


def test_rediscovery_restores_an_evicted_tool_and_resets_its_count() -> None:
    rules = policy()
    state, _ = bind(fresh(), ["a"], 0, rules)
    for step in range(4):
        state, _outcome, _ = record_call(state, "a", {}, step * S, rules)
    state, events = bind(state, ["a"], 10 * S, rules)
    state, outcome, _ = record_call(state, "a", {}, 11 * S, rules)

    assert "a" in state.bound and not state.loop_evicted
    assert [e.type for e in events] == ["restored"]
    assert not outcome.loop_detected


def test_an_always_include_tool_that_loops_is_flagged_but_kept() -> None:
    rules = policy(always_include=["core"])
    state, outcome = fresh(), None
    for step in range(4):
        state, outcome, _ = record_call(state, "core", {}, step * S, rules)

    assert outcome is not None and outcome.loop_detected and not outcome.evicted
    assert "core" in bound_ids(state, rules)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"url": "https://Example.com/a/"}, {"url": "https://example.com/a"}),
        ({"url": "https://x.io/p?b=2&a=1#top"}, {"url": "https://x.io/p?a=1&b=2"}),
        ({"q": " hello ", "n": 1}, {"n": 1, "q": "hello"}),
    ],
)
def test_argument_normalization_collapses_trivial_variations(a: object, b: object) -> None:
    assert argument_hash(a) == argument_hash(b)


def test_different_arguments_hash_apart() -> None:
    assert argument_hash({"url": "https://x.io/a"}) != argument_hash({"url": "https://x.io/b"})


# -- the redundant-search guard ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "gap_s", "noted"),
    [
        pytest.param(["a", "b", "c"], ["a", "b", "c"], 10, True, id="same-results"),
        pytest.param(
            ["a", "b", "c", "d", "e"], ["a", "b", "c", "d", "x"], 10, True, id="overlap-at-ratio"
        ),
        pytest.param(["a", "b", "c"], ["a", "x", "y"], 10, False, id="different-results"),
        pytest.param(["a", "b", "c"], ["a", "b", "c"], 400, False, id="outside-the-window"),
        pytest.param([], [], 10, False, id="nothing-found"),
    ],
)
def test_redundant_search_guard(
    first: list[str], second: list[str], gap_s: int, noted: bool
) -> None:
    state, note, _ = check_search(fresh(), first, 0, policy())
    state, note, events = check_search(state, second, gap_s * S, policy())

    assert (note == REDUNDANT_SEARCH_NOTE) is noted
    assert bool(events) is noted


# -- profiles, exactly-once, export/import -------------------------------------------------------


def test_profile_allowlist_and_experts_first() -> None:
    rules = policy(
        profiles={"billing": AgentProfile(allowlist=["inv", "pay"], expert_tools=["pay"])}
    )

    assert allowed_ids(rules, "billing") == frozenset({"inv", "pay"})
    assert allowed_ids(rules, None) is None
    assert experts_first(["x", "inv", "pay"], rules, "billing") == ["pay", "x", "inv"]


def test_export_then_import_reproduces_the_working_set() -> None:
    rules = policy()
    state, _ = bind(fresh(), ["a", "b"], 0, rules)
    state, _outcome, _ = record_call(state, "a", {}, S, rules)

    copy, events = imported(export(state), "child", 5 * S, rules)

    assert copy.session_id == "child" and copy.bound == state.bound
    assert events[0].type == "imported"


def test_state_round_trips_through_json_shape() -> None:
    rules = policy()
    state, _ = bind(fresh(), ["a"], 0, rules)
    state, _o, _ = record_call(state, "a", {"q": 1}, S, rules)
    state, _n, _ = check_search(state, ["a"], 2 * S, rules)

    assert SessionState.from_dict(state.to_dict()) == state


@pytest.mark.parametrize(
    ("platform", "profile_value", "expected"),
    [
        (0, None, 0),
        (1, None, 1),
        (0, 2, 2),
        (3, 0, 0),
    ],
)
def test_installable_offers_follow_the_profile_then_the_platform(
    platform: int, profile_value: int | None, expected: int
) -> None:
    rules = policy(
        installable_below=platform, profiles={"p": AgentProfile(installable_below=profile_value)}
    )

    assert rules.installable_for("p") == expected
    assert rules.installable_for(None) == platform


def test_revisions_count_on_within_a_session_and_start_apart_for_a_new_one() -> None:
    assert next_revision("7") == "8"  # a session stored before revisions had lineages
    started = next_revision("")
    assert next_revision(started) == started.replace(":1", ":2")
    assert next_revision("") != started


# -- whose session -------------------------------------------------------------------------------

FINANCE = holder_of(["finance"], None)


@pytest.mark.parametrize(
    ("roles", "user", "same_as_finance"),
    [
        (["finance"], None, True),
        (["finance", "finance"], "", True),
        ([], None, False),
        (["finance", "ops"], None, False),
        (["finance"], "ann", False),
    ],
)
def test_a_holder_is_the_roles_and_user_asked_with(
    roles: list[str], user: str | None, same_as_finance: bool
) -> None:
    assert (holder_of(roles, user) == FINANCE) is same_as_finance


def test_a_session_of_no_holder_becomes_its_next_callers() -> None:
    state = new_session("s1", None, 0)
    assert held_by(state, FINANCE).holder == FINANCE


def test_a_session_serves_its_holder_as_it_is() -> None:
    state = replace(new_session("s1", None, 0), holder=FINANCE)
    assert held_by(state, FINANCE) is state


def test_another_holders_session_is_refused_saying_to_use_one_s_own() -> None:
    state = replace(new_session("s1", None, 0), holder=FINANCE)
    with pytest.raises(ForbiddenError, match="use a session id of your own") as refused:
        held_by(state, holder_of([], None))
    assert refused.value.reason == "session"


def test_a_sessions_holder_survives_storage_and_stays_out_of_its_export() -> None:
    state = replace(new_session("s1", None, 0), holder=FINANCE)
    assert SessionState.from_dict(state.to_dict()).holder == FINANCE
    assert "holder" not in export(state)


# -- the profile a request names -----------------------------------------------------------------


@pytest.mark.parametrize("name", [None, ""])
def test_a_request_naming_no_profile_has_none(name: str | None) -> None:
    policy = SessionPolicy(profiles={"billing": AgentProfile(allowlist=["tool:a"])})
    assert policy.named_profile(name).allowlist is None


def test_a_request_naming_a_configured_profile_has_it() -> None:
    policy = SessionPolicy(profiles={"billing": AgentProfile(allowlist=["tool:a"])})
    assert policy.named_profile("billing").allowlist == ["tool:a"]


@pytest.mark.parametrize("configured", [{}, {"billing": AgentProfile(allowlist=["tool:a"])}])
def test_a_profile_not_configured_is_refused_naming_those_that_are(
    configured: dict[str, AgentProfile],
) -> None:
    policy = SessionPolicy(profiles=configured)
    with pytest.raises(UnknownProfileError, match="profile 'biling' is not configured") as exc:
        policy.named_profile("biling")
    assert ("'billing'" in str(exc.value)) is bool(configured)
