"""Snapshots on disk (:mod:`capdisc.discovery.snapshotfile`, :mod:`capdisc.retrieval.persist`):
one read back answers every query as the snapshot written did, with its graph serving at once;
a snapshot that is corrupt, for another Redis generation, space, build or policy, or newer than
Redis is refused with its reason; the writer thread writes the newest snapshot of a tenant."""

from __future__ import annotations

import functools
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from capdisc.access import Caller
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.snapshot import HybridRetriever, IndexSnapshot, hybrid_retriever
from capdisc.discovery.snapshotfile import (
    HEADER,
    SnapshotHeader,
    Wanted,
    _file_sum,
    build_fingerprint,
    candidates,
    check,
    load_snapshot,
    open_newest,
    read_header,
    write_snapshot,
)
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.errors import SnapshotError
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Visibility
from capdisc.registry.flags import Mark
from capdisc.retrieval.config import RetrievalConfig, calibrated_for
from capdisc.retrieval.neighbors import BackgroundBuilder, CarriedGraph
from capdisc.retrieval.persist import load_index, save_index
from capdisc.retrieval.probes import PROBES
from capdisc.retrieval.text import full_text
from capdisc_workers.discovery import DiscoveryWorker
from capdisc_workers.follower import Indexes, SnapshotWarmer
from capdisc_workers.snapshots import SnapshotWriter, Written

pytest.importorskip("faiss")

EMBEDDER = HashingEmbedder(64)
SPACE = "hashing-64.fs1"
EPOCH = "0f" * 16
ROWS = 400
#: Small thresholds, so 400 rows are searched in a projection and through an HNSW graph.
SMALL = replace(calibrated_for(EMBEDDER.id), reduce_above=100, reduce_dims=16, ann_above=200)
WORDS = ["weather", "invoice", "calendar", "email", "stock", "translate", "image", "map", "sql"]
QUERIES = [
    "send an email to the team",
    "what is the weather in paris",
    "refund an invoice then translate the receipt",
    "sql stock report",
    "image of a map",
]
PROBE_VECTORS = EMBEDDER.embed(list(PROBES))


def catalog() -> list[Capability]:
    rng = np.random.default_rng(7)
    caps = []
    for i in range(ROWS):
        words = [str(w) for w in rng.choice(WORDS, size=3)]
        caps.append(
            Capability(
                id=f"tool:{words[0]}-{i}",
                kind="tool" if i % 5 else "skill",
                name=f"{words[0]}-{words[1]}-{i}",
                display_name=f"{words[0].title()} {words[1].title()} {i}",
                description=f"Does {' '.join(words)} things, number {i}.",
                category=words[2],
                tags=(words[1],) if i % 3 else (),
                available=i % 9 != 0,
                full_schema={"type": "object", "properties": {words[1]: {"type": "string"}}},
                visibility=Visibility(roles=("ops",) if i % 4 == 0 else (), users=()),
            )
        )
    return caps


def build(builder: BackgroundBuilder, base: RetrievalConfig = SMALL) -> IndexSnapshot:
    caps = catalog()
    vectors = EMBEDDER.embed([full_text(c) for c in caps])
    snapshot = IndexSnapshot.build(
        "acme",
        42,
        EMBEDDER.dim,
        ((c, vectors[i].tobytes()) for i, c in enumerate(caps)),
        EMBEDDER.id,
        functools.partial(hybrid_retriever, base=base, builder=builder),
        probes=PROBE_VECTORS,
        marks={caps[3].id: Mark((("R1", "description"),), caution=True)},
    )
    assert builder.idle(60)
    return snapshot


@pytest.fixture(scope="module")
def built() -> IndexSnapshot:
    snapshot = build(BackgroundBuilder())
    assert snapshot.search_mode == "graph"
    return snapshot


def wanted(**changes: object) -> Wanted:
    base = Wanted("acme", SPACE, EPOCH, 42, "warn", build_fingerprint(EMBEDDER.id))
    return replace(base, **changes)  # type: ignore[arg-type]


def write(root: Path, snapshot: IndexSnapshot, **changes: object) -> Path:
    options: dict[str, object] = {
        "space": SPACE,
        "epoch": EPOCH,
        "changes_id": "5-0",
        "policy": "warn",
    }
    options.update(changes)
    return write_snapshot(root, snapshot, **options)  # type: ignore[arg-type]


def answers(snapshot: IndexSnapshot) -> list[object]:
    retriever = snapshot.retriever
    assert isinstance(retriever, HybridRetriever)
    found: list[object] = []
    for query in QUERIES:
        vector = EMBEDDER.embed([query])[0]
        for filters in (
            SearchFilters(),
            SearchFilters(kind="skill"),
            SearchFilters(caller=Caller.of(("ops",), None), only_available=True),
        ):
            found.append(
                retriever.index.search(
                    query, vector, 10, filters=filters, embed=EMBEDDER.embed, config=SMALL
                )
            )
    return found


def test_a_snapshot_read_back_answers_as_the_one_written(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    path = write(tmp_path, built)

    loaded = load_snapshot(path, read_header(path), PROBE_VECTORS)

    assert loaded.search_mode == "graph"  # the graph serves at once, not after a build
    assert (loaded.tenant, loaded.version, loaded.ids) == (built.tenant, built.version, built.ids)
    assert dict(loaded.capabilities) == dict(built.capabilities)
    assert dict(loaded.marks) == dict(built.marks)
    assert np.array_equal(loaded.matrix, built.matrix)
    assert answers(loaded) == answers(built)
    assert loaded.tier0(200, "heuristic") == built.tier0(200, "heuristic")


def test_a_snapshot_that_rescores_is_read_back_with_its_full_vectors(tmp_path: Path) -> None:
    rescoring = replace(calibrated_for(EMBEDDER.id), reduce_above=100, reduce_dims=16)
    built = build(BackgroundBuilder(), rescoring)
    path = write(tmp_path, built)

    loaded = load_snapshot(path, read_header(path), PROBE_VECTORS)

    index = loaded.retriever.index  # type: ignore[attr-defined]
    original = built.retriever.index  # type: ignore[attr-defined]
    assert index.projection is not None and index.exact is not None
    assert built.matrix.shape == (ROWS, EMBEDDER.dim)
    assert np.array_equal(index.exact.matrix, built.matrix)
    for query in QUERIES:
        vector = EMBEDDER.embed([query])[0]
        found = index.search(query, vector, 10, config=rescoring)
        assert found == original.search(query, vector, 10, config=rescoring)


def test_an_index_written_before_dense_rows_makes_them_and_answers_the_same(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    index = built.retriever.index  # type: ignore[attr-defined]
    data, indices, indptr = index.lexicon.postings()
    every_term = replace(
        index.lexicon,
        data=data,
        indices=indices,
        indptr=indptr,
        dense_terms=np.zeros(0, dtype=np.int32),
        dense_rows=np.zeros((0, len(index)), dtype=np.float32),
        dense_df=np.zeros(0, dtype=np.int64),
    )
    save_index(replace(index, lexicon=every_term), tmp_path)  # as an older release wrote it
    for name in ("dense_terms", "dense_rows", "dense_df"):
        (tmp_path / f"r.lexicon.{name}.npy").unlink()

    loaded = load_index(tmp_path)

    assert len(loaded.lexicon.dense_terms)
    for name in ("data", "indices", "indptr", "dense_terms", "dense_rows", "dense_df"):
        assert np.array_equal(getattr(loaded.lexicon, name), getattr(index.lexicon, name)), name
    for query in QUERIES:
        vector = EMBEDDER.embed([query])[0]
        got = loaded.search(query, vector, 10, embed=EMBEDDER.embed, config=SMALL)
        want = index.search(query, vector, 10, embed=EMBEDDER.embed, config=SMALL)
        assert [e.capability_id for e in got.entries] == [e.capability_id for e in want.entries]


@pytest.mark.parametrize("terms", [[10**6], [5, 3]])
def test_dense_rows_of_terms_the_lexicon_lacks_are_refused(
    built: IndexSnapshot, tmp_path: Path, terms: list[int]
) -> None:
    index = built.retriever.index  # type: ignore[attr-defined]
    save_index(index, tmp_path)
    rows = np.zeros((len(terms), len(index)), dtype=np.float32)
    np.save(tmp_path / "r.lexicon.dense_terms.npy", np.asarray(terms, dtype=np.int32))
    np.save(tmp_path / "r.lexicon.dense_rows.npy", rows)
    np.save(tmp_path / "r.lexicon.dense_df.npy", np.ones(len(terms), dtype=np.int64))

    with pytest.raises(ValueError, match="dense rows name terms"):
        load_index(tmp_path)


def test_a_delta_on_a_snapshot_read_back_equals_the_delta_on_the_built_one(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    path = write(tmp_path, built)
    loaded = load_snapshot(path, read_header(path), None)
    changed = replace(built.capabilities[built.ids[1]], description="Sends weather by email.")
    vector = EMBEDDER.embed([full_text(changed)])[0].tobytes()

    after_built = built.with_changes(43, [(changed, vector)], [built.ids[2]])
    after_loaded = loaded.with_changes(43, [(changed, vector)], [built.ids[2]])

    assert after_loaded.ids == after_built.ids
    assert np.array_equal(after_loaded.matrix, after_built.matrix)
    query = "weather by email"
    vec = EMBEDDER.embed([query])[0]
    from_loaded = after_loaded.retriever.search(query, vec, 5, SearchFilters(), DiscoveryConfig())
    from_built = after_built.retriever.search(query, vec, 5, SearchFilters(), DiscoveryConfig())
    assert [h.id for h in from_loaded.hits] == [h.id for h in from_built.hits]
    # float32 sums may round apart in the last place: a mapped array's alignment picks the
    # SIMD path
    assert [h.score for h in from_loaded.hits] == pytest.approx(
        [h.score for h in from_built.hits], rel=1e-5
    )


def test_a_delta_written_with_its_carried_graph_is_read_back_with_it(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    changed = replace(built.capabilities[built.ids[1]], description="Sends weather by email.")
    vector = EMBEDDER.embed([full_text(changed)])[0].tobytes()
    after = built.with_changes(43, [(changed, vector)], [built.ids[2]])
    path = write(tmp_path, after)

    loaded = load_snapshot(path, read_header(path), PROBE_VECTORS)

    graph = loaded.retriever.index.neighbors.graph  # type: ignore[attr-defined]
    carried = after.retriever.index.neighbors.graph  # type: ignore[attr-defined]
    assert isinstance(graph, CarriedGraph) and isinstance(carried, CarriedGraph)
    assert np.array_equal(graph.labels(), carried.labels())
    assert answers(loaded) == answers(after)


def test_a_snapshot_is_written_whole_or_not_at_all_and_once(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    path = write(tmp_path, built)
    again = write(tmp_path, built)

    assert again == path
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    assert read_header(path).files.keys() >= {
        "r.table.blob.npy",
        "table.json",
        "vectors.npy",
        "graph.faiss",
    }


def test_only_the_newest_snapshots_are_kept(built: IndexSnapshot, tmp_path: Path) -> None:
    for version in (40, 41, 42):
        write(tmp_path, replace(built, version=version), keep=2)

    assert [p.name[:13] for p in candidates(tmp_path, "acme", SPACE)] == [
        "v000000000042",
        "v000000000041",
    ]


def test_snapshots_of_a_space_the_tenant_moved_from_are_removed_when_it_is_written(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    moved_from = "hashing-64.fs0"
    for version in (40, 41):
        write(tmp_path, replace(built, version=version), space=moved_from)
    newer = write(tmp_path, replace(built, version=43), space="hashing-64.fs2")
    other_tenant = write(tmp_path, replace(built, tenant="beta", version=7), space=moved_from)

    fresh = write(tmp_path, built)

    assert candidates(tmp_path, "acme", moved_from) == []
    assert candidates(tmp_path, "acme", "hashing-64.fs2") == [newer]  # its writer serves it
    assert candidates(tmp_path, "acme", SPACE) == [fresh]
    assert candidates(tmp_path, "beta", moved_from) == [other_tenant]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"epoch": "1e" * 16}, "Redis data generation"),
        ({"space": "hashing-64.fs2"}, "vector space"),
        ({"space": "minilm-l6-int8.fs1"}, "served from .*embedder minilm-l6-int8"),
        ({"stored_version": 41}, "newer than the 41 Redis holds"),
        ({"fingerprint": "0" * 32}, "built by other code"),
        ({"policy": "quarantine"}, "poisoning policy"),
        ({"tenant": "other"}, "tenant"),
    ],
)
def test_a_snapshot_that_does_not_fit_is_refused_with_its_reason(
    built: IndexSnapshot, tmp_path: Path, changes: dict[str, object], reason: str
) -> None:
    path = write(tmp_path, built)

    with pytest.raises(SnapshotError, match=reason) as refused:
        check(read_header(path), wanted(**changes), path)

    assert refused.value.path == str(path)


def test_a_corrupt_file_is_refused_and_the_next_snapshot_is_taken(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    older = write(tmp_path, replace(built, version=41))
    newest = write(tmp_path, built)
    matrix = newest / "r.matrix.npy"
    data = bytearray(matrix.read_bytes())
    data[-5] ^= 0xFF
    matrix.write_bytes(bytes(data))
    refused: list[SnapshotError] = []

    found = open_newest(tmp_path, wanted(), PROBE_VECTORS, refused.append)

    assert found is not None and found[2] == older and found[0].version == 41
    assert [e.path for e in refused] == [str(newest)]
    assert "r.matrix.npy is corrupt" in refused[0].reason


def test_checksums_are_skipped_only_when_asked(built: IndexSnapshot, tmp_path: Path) -> None:
    path = write(tmp_path, built)
    marks = path / "marks.json"
    marks.write_text(marks.read_text() + " ")  # other bytes, the same marks
    header = read_header(path)

    with pytest.raises(SnapshotError, match=r"marks\.json is corrupt"):
        load_snapshot(path, header, PROBE_VECTORS)
    assert load_snapshot(path, header, PROBE_VECTORS, verify=False).ids == built.ids
    (path / "graph.faiss").unlink()
    with pytest.raises(SnapshotError, match=r"graph\.faiss is missing"):
        load_snapshot(path, header, PROBE_VECTORS, verify=False)


@pytest.mark.parametrize("damage", ["truncate", "delete", "header", "unlisted"])
def test_a_damaged_snapshot_is_refused(built: IndexSnapshot, tmp_path: Path, damage: str) -> None:
    path = write(tmp_path, built)
    if damage == "truncate":
        records = path / "r.table.blob.npy"
        records.write_bytes(records.read_bytes()[:100])
    elif damage == "delete":
        (path / "graph.faiss").unlink()
    elif damage == "unlisted":  # a file no checksum covers is never read
        np.save(path / "r.extra.npy", np.zeros(3), allow_pickle=False)
    else:
        header = json.loads((path / HEADER).read_text())
        header["version"] = 41  # edited without its checksum
        (path / HEADER).write_text(json.dumps(header))
    refused: list[SnapshotError] = []

    assert open_newest(tmp_path, wanted(), None, refused.append) is None
    assert len(refused) == 1 and refused[0].path == str(path)
    if damage == "unlisted":
        assert "r.extra.npy" in refused[0].reason


@pytest.mark.parametrize("blocked", ["root", "tenant"])
def test_a_file_where_the_snapshot_folder_should_be_is_refused_not_raised(
    tmp_path: Path, blocked: str
) -> None:
    root = tmp_path / "snapshots"
    if blocked == "root":
        root.write_text("not a directory")
    else:
        root.mkdir()
        (root / "acme").write_text("not a directory")
    refused: list[SnapshotError] = []

    assert open_newest(root, wanted(), None, refused.append) is None
    assert len(refused) == 1 and "cannot list the directory" in refused[0].reason
    assert refused[0].path == str(root / "acme" / SPACE)


@pytest.mark.parametrize("mmap", [True, False])
def test_an_array_of_objects_is_never_unpickled(
    built: IndexSnapshot, tmp_path: Path, mmap: bool
) -> None:
    path = write(tmp_path, built)
    np.save(path / "r.table.available.npy", np.array([object()] * ROWS), allow_pickle=True)
    body = json.loads((path / HEADER).read_text())
    body.pop("checksum")
    header = SnapshotHeader(**body)
    files = dict(
        header.files, **{"r.table.available.npy": _file_sum(path / "r.table.available.npy")}
    )
    (path / HEADER).write_text(replace(header, files=files).to_json())

    with pytest.raises(SnapshotError, match=r"allow_pickle=False|Python objects"):
        load_snapshot(path, read_header(path), None, mmap=mmap)


def test_an_older_snapshot_than_the_one_served_is_not_read(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    write(tmp_path, built)
    refused: list[SnapshotError] = []

    assert open_newest(tmp_path, wanted(), None, refused.append, newer_than=42) is None
    assert refused == []


def test_the_writer_writes_the_newest_offer_of_a_tenant(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    writer = SnapshotWriter(tmp_path, keep=2, interval_s=0)
    superseded = replace(built, version=41)

    writer.offer(superseded, space=SPACE, epoch=EPOCH, changes_id="4-0", policy="warn")
    writer.offer(built, space=SPACE, epoch=EPOCH, changes_id="5-0", policy="warn")

    assert writer.idle(60)
    newest = read_header(candidates(tmp_path, "acme", SPACE)[0])
    assert (newest.version, newest.changes_id) == (42, "5-0")


def test_the_writer_leaves_a_snapshot_already_on_disk(built: IndexSnapshot, tmp_path: Path) -> None:
    path = write(tmp_path, built)
    shutil.copy(path / HEADER, tmp_path / "header-before")
    writer = SnapshotWriter(tmp_path, keep=2, interval_s=0)

    writer.offer(built, space=SPACE, epoch=EPOCH, changes_id="9-0", policy="warn")

    assert writer.idle(60)
    assert writer.written == 0
    assert writer.last_written() == {}  # nothing written by this writer
    assert (path / HEADER).read_bytes() == (tmp_path / "header-before").read_bytes()


def damage(path: Path) -> None:
    """Flip a byte of the snapshot at ``path``'s matrix: its size stays, its checksum differs."""
    matrix = path / "r.matrix.npy"
    data = bytearray(matrix.read_bytes())
    data[-5] ^= 0xFF
    matrix.write_bytes(bytes(data))


@pytest.mark.parametrize("through", ["write_snapshot", "writer"])
def test_a_damaged_snapshot_of_the_same_version_is_written_again(
    built: IndexSnapshot, tmp_path: Path, through: str
) -> None:
    path = write(tmp_path, built)
    damage(path)
    refused: list[SnapshotError] = []
    assert open_newest(tmp_path, wanted(), PROBE_VECTORS, refused.append) is None

    if through == "writer":
        writer = SnapshotWriter(tmp_path, keep=2, interval_s=0)
        writer.offer(built, space=SPACE, epoch=EPOCH, changes_id="5-0", policy="warn")
        assert writer.idle(60)
        assert writer.written == 1
    else:
        assert write(tmp_path, built) == path

    found = open_newest(tmp_path, wanted(), PROBE_VECTORS, refused.append)
    assert found is not None and found[2] == path and found[0].ids == built.ids
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing left aside
    assert len(refused) == 1  # only the damaged one, before it was written again


def test_the_writer_records_the_last_snapshot_it_wrote_of_each_tenant(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    writer = SnapshotWriter(tmp_path, keep=2, interval_s=0)
    assert writer.last_written() == {}
    before = time.time()
    older = replace(built, version=41)  # held: an offer keeps its snapshot weakly

    writer.offer(older, space=SPACE, epoch=EPOCH, changes_id="4-0", policy="warn")
    assert writer.idle(60)
    writer.offer(built, space=SPACE, epoch=EPOCH, changes_id="5-0", policy="warn")
    assert writer.idle(60)

    recorded = writer.last_written()
    path = candidates(tmp_path, "acme", SPACE)[0]
    megabytes = round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 1)
    assert list(recorded) == ["acme"] and writer.written == 2
    assert (recorded["acme"].index_version, recorded["acme"].megabytes) == (42, megabytes)
    assert before - 0.001 <= recorded["acme"].written_at_unix_s <= time.time()
    assert recorded["acme"].took_s >= 0
    recorded.clear()  # a copy: the writer's own record is untouched
    assert list(writer.last_written()) == ["acme"]


def test_a_failed_write_is_kept_with_why_until_one_succeeds(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    blocked = tmp_path / "acme"
    blocked.write_text("a file where the tenant's folder goes")
    writer = SnapshotWriter(tmp_path, keep=2, interval_s=0)

    writer.offer(built, space=SPACE, epoch=EPOCH, changes_id="5-0", policy="warn")
    assert writer.idle(60)

    failed = writer.last_failed()
    assert list(failed) == ["acme"] and failed["acme"].index_version == 42
    assert "cannot list the directory" in failed["acme"].error
    assert time.time() - failed["acme"].failed_at_unix_s < 60
    assert writer.last_written() == {}
    blocked.unlink()
    writer.offer(built, space=SPACE, epoch=EPOCH, changes_id="5-0", policy="warn")
    assert writer.idle(60)
    assert writer.last_failed() == {} and list(writer.last_written()) == ["acme"]


@pytest.mark.parametrize(
    ("written", "beat"),
    [
        (None, {}),  # no snapshot_dir: the heartbeat says nothing of snapshots
        ({}, {"snapshots": {}, "snapshots_failed": {}}),  # a snapshot_dir, nothing written yet
        (
            {"acme": Written(42, 1_700_000_000.5, 12.5, 0.31)},
            {
                "snapshots": {
                    "acme": {
                        "index_version": 42,
                        "written_at_unix_s": 1_700_000_000.5,
                        "megabytes": 12.5,
                        "took_s": 0.31,
                    }
                },
                "snapshots_failed": {},
            },
        ),
    ],
)
def test_the_heartbeat_carries_the_snapshots_written_only_with_a_writer(
    written: dict[str, Written] | None, beat: dict[str, object]
) -> None:
    writer = (
        None
        if written is None
        else SimpleNamespace(last_written=lambda: written, last_failed=lambda: {})
    )
    worker = object.__new__(DiscoveryWorker)  # only what the heartbeat reads
    worker.follower = SimpleNamespace(writer=writer)  # type: ignore[assignment]

    assert worker._snapshots_written() == beat


def test_a_snapshot_of_the_same_version_made_unusable_is_replaced_not_kept(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    stale = write(tmp_path, built, epoch="1e" * 16)  # before Redis lost its data
    other_policy = write(tmp_path, built, policy="quarantine")

    fresh = write(tmp_path, built)

    assert len({stale, other_policy, fresh}) == 3  # same version, three names
    assert candidates(tmp_path, "acme", SPACE) == [fresh]  # the unusable ones are pruned


def test_snapshots_are_off_unless_a_directory_is_set() -> None:
    from capdisc.settings import Settings

    assert Settings.load({}).snapshot_dir is None
    assert Settings.load({"CAPDISC_SNAPSHOT_DIR": " "}).snapshot_dir is None
    assert Settings.load({"CAPDISC_SNAPSHOT_DIR": "/var/lib/capdisc"}).snapshot_dir == Path(
        "/var/lib/capdisc"
    )


def _remembered(snapshot: IndexSnapshot) -> int:
    retriever = snapshot.retriever
    assert isinstance(retriever, HybridRetriever)
    return len(retriever.index.texts)


def test_a_changed_snapshot_warmed_from_the_one_it_replaces_answers_as_a_cold_one(
    built: IndexSnapshot,
) -> None:
    answers(built)  # its memo now holds the queries' texts
    edited = replace(built.capabilities.row(0), description="Edited: a zebra crossing map.")
    vector = EMBEDDER.embed([full_text(edited)])[0].tobytes()
    cold, warm = (built.with_changes(43, [(edited, vector)], []) for _ in range(2))

    made = warm.warm(built.recent_texts(100))

    assert warm.search_mode == "graph" and made > 0 and _remembered(warm) == made
    assert answers(warm) == answers(cold)


def test_a_mapped_snapshot_is_warmed_through_terms_not_ids(
    built: IndexSnapshot, tmp_path: Path
) -> None:
    answers(built)
    path = write(tmp_path, built)
    cold, warm = (load_snapshot(path, read_header(path), PROBE_VECTORS) for _ in range(2))

    made = warm.warm(built.recent_texts(100))

    assert made == _remembered(warm) > 0
    assert answers(warm) == answers(cold)


def _changed(snapshot: IndexSnapshot, version: int) -> IndexSnapshot:
    edited = replace(snapshot.capabilities.row(1), description=f"Edited for version {version}.")
    vector = EMBEDDER.embed([full_text(edited)])[0].tobytes()
    return snapshot.with_changes(version, [(edited, vector)], [])


def test_a_worker_warms_the_snapshot_it_swaps_in_from_the_one_replaced(
    built: IndexSnapshot,
) -> None:
    answers(built)
    indexes = Indexes()
    warmer = SnapshotWarmer(indexes, limit=100)
    new = _changed(built, 44)
    indexes.put(new)

    warmer.submit(new, built)

    assert warmer.wait(60)
    assert _remembered(new) == len(built.recent_texts(100)) > 0


def test_a_snapshot_no_longer_served_is_not_warmed(built: IndexSnapshot) -> None:
    answers(built)
    indexes = Indexes()
    warmer = SnapshotWarmer(indexes, limit=100)
    replaced, newer = _changed(built, 45), _changed(built, 46)
    indexes.put(newer)

    warmer.submit(replaced, built)

    assert warmer.wait(60)
    assert _remembered(replaced) == 0
