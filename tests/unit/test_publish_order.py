"""The events a sync publishes (upserts shortest embedding text first, then deletes and
reindexes), and the chunks an indexing task is cut into."""

from __future__ import annotations

from capdisc.models import Capability
from capdisc.registry.policy import SyncPlan
from capdisc.retrieval.text import full_text
from capdisc_producers.sync import events_for


def tool(name: str, description: str) -> Capability:
    return Capability(id=f"tool:{name}", kind="tool", name=name, description=description)


def test_upserts_go_shortest_embedding_text_first_then_deletes_and_reindexes() -> None:
    long = tool("long", "Reads every record of a large table and writes a report. " * 6)
    short = tool("short", "Adds.")
    middle = tool("middle", "Sends an email to a customer with an attached invoice.")
    plan = SyncPlan(upserts=[long, short, middle], deletes=["tool:gone"], reindexes=["tool:x"])

    events = events_for(plan, "acme", "src", "batch-1", 7)

    assert [(e.type, e.capability_id) for e in events] == [
        ("upsert", "tool:short"),
        ("upsert", "tool:middle"),
        ("upsert", "tool:long"),
        ("delete", "tool:gone"),
        ("reindex", "tool:x"),
    ]
    assert len(full_text(short)) < len(full_text(middle)) < len(full_text(long))
    assert {e.seq for e in events} == {7}  # one sequence: the order decides nothing
    assert {e.batch_id for e in events} == {"batch-1"}


def test_upserts_of_equal_length_keep_the_plan_order() -> None:
    first, second = tool("aa", "Same length."), tool("bb", "Same length.")

    events = events_for(SyncPlan(upserts=[second, first]), "acme", "src", "batch-2", 7)

    assert [e.capability_id for e in events] == ["tool:bb", "tool:aa"]


def test_a_task_is_cut_into_chunks_its_last_one_short() -> None:
    from capdisc_workers.embedding import APPLY_CHUNK, LAST_CHUNK, chunk_bounds

    assert chunk_bounds(0) == []
    assert chunk_bounds(APPLY_CHUNK) == [(0, APPLY_CHUNK)]  # one chunk: nothing to overlap
    assert chunk_bounds(APPLY_CHUNK + 1) == [(0, APPLY_CHUNK), (APPLY_CHUNK, APPLY_CHUNK + 1)]
    count = 4 * APPLY_CHUNK
    bounds = chunk_bounds(count)
    assert bounds[-1] == (count - LAST_CHUNK, count)
    assert bounds[-2] == (3 * APPLY_CHUNK, count - LAST_CHUNK)
    assert [s for s, _e in bounds[1:]] == [e for _s, e in bounds[:-1]]  # contiguous
