"""Batches of events in one indexing task: one embedding pass, refused events alone, order kept."""

from __future__ import annotations

import redis

from capdisc import keys
from capdisc.registry.events import RegistryEvent
from capdisc.registry.normalize import capability_from_record
from capdisc.retrieval.text import embedding_texts
from capdisc.status import collect_status
from capdisc_producers.publisher import Publisher, wait_for_acks

from .conftest import Stack


def upsert(tenant: str, name: str, seq: int, description: str, batch: str) -> RegistryEvent:
    return RegistryEvent(
        type="upsert",
        tenant=tenant,
        capability_id=f"tool:{name}",
        seq=seq,
        capability={"kind": "tool", "name": name, "description": description},
        batch_id=batch,
    )


def test_a_batch_applies_good_events_and_refuses_a_poison_one_alone(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    batch = f"{tenant}-b1"
    events = [
        upsert(tenant, "alpha", 1, f"Alpha tool {tenant}.", batch),
        upsert(tenant, "beta", 1, f"Beta tool {tenant}.", batch),
    ]
    publisher = Publisher(stack.url)
    before = collect_status(connection)["embedding_calls"]

    publisher.app.send_task(
        keys.TASK_APPLY_EVENTS,
        queue=keys.INDEXING_QUEUE,
        args=[[events[0].encode(), '{"not": "an event"}', events[1].encode()]],
    )
    outcomes = wait_for_acks(connection, batch, 2, 30)

    assert sorted(o["decision"] for o in outcomes) == ["upsert", "upsert"]
    assert connection.hexists(keys.caps(tenant), "tool:alpha")
    assert connection.hexists(keys.caps(tenant), "tool:beta")
    # the two new capabilities' distinct texts, once each; the poison event embedded nothing
    texts = {
        t
        for e in events
        for t in embedding_texts(capability_from_record(e.capability or {}, "test"))
    }
    assert collect_status(connection)["embedding_calls"] - before == len(texts)


def test_stale_and_duplicate_events_in_a_batch_embed_nothing(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    Publisher(stack.url).send([upsert(tenant, "gamma", 5, f"Gamma {tenant}.", f"{tenant}-a")])
    wait_for_acks(connection, f"{tenant}-a", 1, 30)
    before = collect_status(connection)["embedding_calls"]
    batch = f"{tenant}-b2"

    Publisher(stack.url).send(
        [
            upsert(tenant, "gamma", 5, f"Gamma {tenant}.", batch),  # duplicate
            upsert(tenant, "gamma", 3, f"Gamma changed long ago {tenant}.", batch),  # stale
        ]
    )
    outcomes = wait_for_acks(connection, batch, 2, 30)

    assert sorted(o["decision"] for o in outcomes) == ["stale", "stale"]
    assert collect_status(connection)["embedding_calls"] == before


def test_a_batch_of_several_chunks_applies_every_event_once_in_order(
    stack: Stack, connection: redis.Redis, tenant: str
) -> None:
    """Past ``APPLY_CHUNK`` events a task embeds one chunk while it writes those before (the
    last one cut to ``LAST_CHUNK``): every event still applied once, in the order sent, a poison
    payload refused alone and a capability sent twice (in two chunks) stored once."""
    from capdisc_workers.embedding import APPLY_CHUNK, LAST_CHUNK, chunk_bounds

    batch = f"{tenant}-chunks"
    count = 2 * APPLY_CHUNK + LAST_CHUNK + 20
    assert len(chunk_bounds(count + 2)) == 4  # the last chunk is cut
    events = [
        upsert(tenant, f"tool{i:03d}", 1, f"Tool {i} of {tenant}.", batch) for i in range(count)
    ]
    repeat = upsert(tenant, "tool000", 1, f"Tool 0 of {tenant}.", batch)  # a duplicate
    payloads = [e.encode() for e in events]
    payloads.insert(APPLY_CHUNK + 3, '{"not": "an event"}')
    payloads.append(repeat.encode())
    before = collect_status(connection)["embedding_calls"]

    Publisher(stack.url).app.send_task(
        keys.TASK_APPLY_EVENTS, queue=keys.INDEXING_QUEUE, args=[payloads]
    )
    outcomes = wait_for_acks(connection, batch, count + 1, 60)

    assert len(outcomes) == count + 1
    applied = [o for o in outcomes if o["decision"] == "upsert"]
    assert [o["capability_id"] for o in applied] == [e.capability_id for e in events]
    versions = [int(o["version"]) for o in applied]
    assert versions == sorted(versions) and len(set(versions)) == count
    assert outcomes[-1]["decision"] == "stale"  # the duplicate, after its first copy
    assert connection.hlen(keys.caps(tenant)) == count
    texts = {
        t
        for e in events
        for t in embedding_texts(capability_from_record(e.capability or {}, "test"))
    }
    assert collect_status(connection)["embedding_calls"] - before == len(texts)


def test_a_chunks_missing_texts_reach_the_model_in_as_few_calls_as_allowed(
    connection: redis.Redis, tenant: str
) -> None:
    """Small model calls idle the cores at each call's end; a chunk's misses go in calls of
    :data:`~capdisc_workers.embedding.MODEL_CALL_TEXTS`."""
    from capdisc.embedders.hashing import HashingEmbedder
    from capdisc_workers.embedding import MODEL_CALL_TEXTS, vectors_for

    calls: list[int] = []

    class Counting(HashingEmbedder):
        @property
        def id(self) -> str:
            return f"counting-{tenant}"  # an embedding cache of its own: every text misses

        def embed(self, texts):  # type: ignore[no-untyped-def]
            calls.append(len(texts))
            return super().embed(texts)

    caps = [
        capability_from_record(
            {"kind": "tool", "name": f"t{i}", "description": f"Tool {i} of {tenant}."}, "test"
        )
        for i in range(MODEL_CALL_TEXTS + 10)
    ]
    texts = {text for cap in caps for text in embedding_texts(cap)}

    made = vectors_for(connection, Counting(8), caps)

    assert len(texts) > MODEL_CALL_TEXTS
    assert calls == [MODEL_CALL_TEXTS, len(texts) - MODEL_CALL_TEXTS]
    assert set(made) == {cap.id for cap in caps}
