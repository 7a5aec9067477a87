"""One tenant's :class:`~capdisc.discovery.snapshot.IndexSnapshot` on disk, so a discovery
worker that starts (or reloads after a gap) maps it instead of reading every record from Redis
and building the index and the HNSW graph again.

A snapshot is a directory ``{snapshot_dir}/{tenant}/{vector space}/v{version}-{generation}``
(:func:`generation`: a hash of the Redis epoch, the build fingerprint and the poisoning policy):

================  =========================================================================
file              what it holds
================  =========================================================================
snapshot.json     the header (:class:`SnapshotHeader`): format, tenant, index version, vector
                  space, embedder, Redis epoch, the changes stream id it is current to, the
                  poisoning policy it was built under, the build fingerprint, and each file's
                  size and sha256; its own ``checksum`` over the rest
vectors.npy       their stored vectors (float32, one row each)
marks.json        the tool-poisoning marks of the marked ones
retrieval.json,   the built retrieval index (:mod:`capdisc.retrieval.persist`): arrays as
table.json,       ``.npy`` (read memory-mapped), tables as JSON, and the HNSW graph in faiss's
r.*.npy,          own format (large catalogs only); the served capabilities are its capability
graph.faiss       table (:mod:`capdisc.captable`): compressed records in one mapped array,
                  parsed when read
================  =========================================================================

Nothing is unpickled (a snapshot directory may be shared): ``.npy`` with ``allow_pickle=False``,
JSON, and faiss's format. A snapshot is written into a temporary directory and renamed into
place, so a reader never sees half of one; the newest few are kept, and those of a vector
space the tenant has moved from are removed.

A reader (:func:`open_newest`) takes the newest snapshot that fits what it wants
(:class:`Wanted`) and refuses every other one with a reason (:class:`SnapshotError`); it never
serves a snapshot whose checksums differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

import capdisc
from capdisc.discovery.snapshot import (
    HybridRetriever,
    IndexSnapshot,
    graph_builder,
    hybrid_retriever,
)
from capdisc.embedders.port import Matrix
from capdisc.errors import SnapshotError
from capdisc.registry.flags import Mark
from capdisc.retrieval.config import calibrated_for
from capdisc.retrieval.index import ExactRows
from capdisc.retrieval.lexical import stemming_available
from capdisc.retrieval.persist import load_index, save_index
from capdisc.retrieval.text import embedder_id_of
from capdisc.version import package_version

#: The layout this code writes and reads; a snapshot of another format is refused.
FORMAT_VERSION = 2
HEADER = "snapshot.json"
VECTORS = "vectors.npy"
MARKS = "marks.json"
#: Prefix of a snapshot being written (never read; removed when left over).
TEMPORARY = ".tmp-"
#: A leftover temporary directory older than this is a dead writer's: removed when pruning.
TEMPORARY_MAX_AGE_S = 3600.0
_NAME = re.compile(r"^v(\d{12})-([0-9a-f]{12})$")
#: Records parsed per ``json.loads`` (one call per chunk: keys shared, fewer calls).


@dataclass(frozen=True)
class SnapshotHeader:
    """What ``snapshot.json`` says about a snapshot."""

    format: int
    tenant: str
    version: int
    space: str
    embedder_id: str
    #: The Redis data generation (:data:`capdisc.keys.EPOCH`) the snapshot was read from.
    epoch: str
    #: The changes stream entry the snapshot is current to: every change of the tenant after
    #: ``version`` comes after it on the stream.
    changes_id: str
    #: The tool-poisoning policy it was built under (what was withheld and marked).
    policy: str
    #: :func:`build_fingerprint` of the code that built it.
    fingerprint: str
    capabilities: int
    dim: int
    graph: bool
    written_at_ms: int
    #: Each file's ``bytes`` and ``sha256``.
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        body = asdict(self)
        body["checksum"] = _checksum(body)
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SnapshotHeader:
        body = json.loads(text)
        if not isinstance(body, dict):
            raise ValueError("the header is not a JSON object")
        checksum = body.pop("checksum", None)
        if checksum != _checksum(body):
            raise ValueError("the header's checksum does not match its content")
        return cls(**body)


@dataclass(frozen=True)
class Wanted:
    """What a worker can serve for one tenant: a snapshot must match all of it."""

    tenant: str
    space: str
    epoch: str
    #: The tenant's index version in Redis now: a snapshot newer than that is refused.
    stored_version: int
    policy: str
    fingerprint: str


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@cache
def build_fingerprint(embedder_id: str) -> str:
    """What a snapshot's arrays depend on besides its capabilities and vectors: the format,
    capdisc's version, the code of the retrieval index and of the capability model, whether
    stemming is installed and the retrieval knobs of ``embedder_id``. Any difference and the
    snapshot is refused (rebuilt from Redis), so an upgrade never serves stale arrays."""
    digest = hashlib.sha256()
    digest.update(f"{FORMAT_VERSION}\0{package_version()}\0{stemming_available()}\0".encode())
    digest.update(repr(calibrated_for(embedder_id)).encode())
    package = Path(capdisc.__file__).parent
    sources = [*sorted((package / "retrieval").glob("*.py")), package / "models.py"]
    sources.append(Path(__file__))
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:32]


def snapshot_dir(root: Path, tenant: str, space: str) -> Path:
    """Where the snapshots of ``tenant`` served from ``space`` are kept."""
    return root / tenant / re.sub(r"[^A-Za-z0-9._-]", "_", space)


def generation(epoch: str, fingerprint: str, policy: str) -> str:
    """What a snapshot's name says besides its version: a hash of the Redis epoch, the build
    fingerprint and the poisoning policy it was made under. A snapshot that one of them made
    unusable is never mistaken for a fresh one of the same version, and is pruned."""
    return hashlib.sha256(f"{epoch}\0{fingerprint}\0{policy}".encode()).hexdigest()[:12]


def snapshot_name(version: int, generation_key: str) -> str:
    return f"v{version:012d}-{generation_key}"


def candidates(root: Path, tenant: str, space: str) -> list[Path]:
    """The complete snapshots of ``tenant`` in ``space``, newest version first; a folder that
    cannot be listed (a file in its place, no permission) is a :class:`SnapshotError`."""
    folder = snapshot_dir(root, tenant, space)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SnapshotError(f"cannot list the directory: {exc.strerror or exc}", folder) from exc
    found = [(int(m.group(1)), n) for n in names if (m := _NAME.match(n))]
    return [folder / name for _version, name in sorted(found, reverse=True)]


def newest_version(root: Path, tenant: str, space: str, generation_key: str) -> int | None:
    """The version of the newest snapshot of ``tenant`` in ``space`` of :func:`generation`
    ``generation_key`` (by its name: nothing is read), or None."""
    for path in candidates(root, tenant, space):
        found = _NAME.match(path.name)
        if found is not None and found.group(2) == generation_key:
            return int(found.group(1))
    return None


# -- writing -------------------------------------------------------------------------------------


def write_snapshot(
    root: Path,
    snapshot: IndexSnapshot,
    *,
    space: str,
    epoch: str,
    changes_id: str,
    policy: str,
    keep: int = 2,
) -> Path:
    """Write ``snapshot`` (served from ``space``, read in Redis generation ``epoch``, current to
    ``changes_id``, built under poisoning ``policy``) under ``root``, atomically; then keep the
    newest ``keep`` of its tenant and space (removing those of another :func:`generation`). A
    snapshot of that version and generation already there (another worker wrote it) is left as
    it is when it reads back whole (:func:`intact`), and replaced when it is damaged (else every
    start would refuse it until the next version). Returns its directory."""
    retriever = snapshot.retriever
    if not isinstance(retriever, HybridRetriever):
        raise ValueError("only a snapshot searched in process (the hybrid index) can be written")
    fingerprint = build_fingerprint(snapshot.embedder_id)
    key = generation(epoch, fingerprint, policy)
    folder = snapshot_dir(root, snapshot.tenant, space)
    final = folder / snapshot_name(snapshot.version, key)
    if final.exists():
        if intact(final):
            return final
        _discard(final)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{TEMPORARY}{final.name}-{uuid.uuid4().hex[:8]}"
    temporary.mkdir()
    try:
        np.save(temporary / VECTORS, np.ascontiguousarray(snapshot.matrix), allow_pickle=False)
        marks = {
            cap_id: {"places": [list(p) for p in m.places], "caution": m.caution}
            for cap_id, m in snapshot.marks.items()
        }
        (temporary / MARKS).write_text(json.dumps(marks, ensure_ascii=False))
        names = [VECTORS, MARKS, *save_index(retriever.index, temporary)]
        header = SnapshotHeader(
            format=FORMAT_VERSION,
            tenant=snapshot.tenant,
            version=snapshot.version,
            space=space,
            embedder_id=snapshot.embedder_id,
            epoch=epoch,
            changes_id=changes_id,
            policy=policy,
            fingerprint=fingerprint,
            capabilities=len(snapshot),
            dim=snapshot.dim,
            graph=retriever.index.neighbors.graph is not None,
            written_at_ms=int(time.time() * 1000),
            files={name: _file_sum(temporary / name) for name in names},
        )
        (temporary / HEADER).write_text(header.to_json())
        try:
            temporary.rename(final)
        except OSError:  # another writer renamed the same snapshot into place first
            if not final.exists():
                raise
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    prune(root, snapshot.tenant, space, keep, key)
    prune_other_spaces(root, snapshot.tenant, space, snapshot.version)
    return final


def intact(path: Path) -> bool:
    """Whether the snapshot at ``path`` has a readable header and every file it lists, with its
    checksum (what a reader checks before mapping it)."""
    try:
        _verify(path, read_header(path))
    except (SnapshotError, OSError):
        return False
    return True


def _discard(path: Path) -> None:
    """Remove the snapshot at ``path``: renamed aside first (atomically, so no reader takes it
    half removed; a worker mapping its files keeps them), then deleted. Another writer may
    have removed it already."""
    aside = path.with_name(f"{TEMPORARY}{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        path.rename(aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _file_sum(path: Path) -> dict[str, Any]:
    with path.open("rb") as data:
        digest = hashlib.file_digest(data, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": digest}


def prune(
    root: Path, tenant: str, space: str, keep: int, generation_key: str | None = None
) -> list[Path]:
    """Remove all but the newest ``keep`` snapshots of ``tenant`` in ``space``, those of another
    generation than ``generation_key`` (when given: they can no longer be served) and temporary
    directories left by a writer that died; returns what was removed."""
    kept: list[Path] = []
    removed: list[Path] = []
    for path in candidates(root, tenant, space):
        found = _NAME.match(path.name)
        usable = generation_key is None or (found is not None and found.group(2) == generation_key)
        (kept if usable and len(kept) < max(keep, 1) else removed).append(path)
    folder = snapshot_dir(root, tenant, space)
    now = time.time()
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(TEMPORARY) and now - entry.stat().st_mtime > (
                TEMPORARY_MAX_AGE_S
            ):
                removed.append(Path(entry.path))
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def prune_other_spaces(root: Path, tenant: str, space: str, below: int) -> list[Path]:
    """Remove the snapshots of ``tenant`` in vector spaces other than ``space`` of a version
    below ``below`` (one being written in ``space``), and returns them: the tenant is served
    from ``space`` since (moving back is a full reindex, after which they are refused), so they
    would only pile up, ``keep`` of them per model it was ever served from. A newer one is left:
    its writer serves the tenant from there now."""
    folder = snapshot_dir(root, tenant, space)
    try:
        others = [e.path for e in os.scandir(folder.parent) if e.is_dir() and e.name != folder.name]
    except OSError:
        return []
    removed: list[Path] = []
    for other in others:
        try:
            paths = candidates(root, tenant, Path(other).name)
        except SnapshotError:
            continue
        for path in paths:
            found = _NAME.match(path.name)
            if found is not None and int(found.group(1)) < below:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


# -- reading -------------------------------------------------------------------------------------


def read_header(path: Path) -> SnapshotHeader:
    """The header of the snapshot at ``path``; :class:`SnapshotError` when it is unreadable."""
    try:
        return SnapshotHeader.from_json((path / HEADER).read_text())
    except (OSError, ValueError, TypeError) as exc:
        raise SnapshotError(f"unreadable header: {exc}", path) from exc


def check(header: SnapshotHeader, wanted: Wanted, path: Path) -> None:
    """:class:`SnapshotError` naming the first way ``header`` does not fit ``wanted``."""
    problem = _mismatch(header, wanted)
    if problem is not None:
        raise SnapshotError(problem, path)


def _mismatch(header: SnapshotHeader, wanted: Wanted) -> str | None:
    if header.format != FORMAT_VERSION:
        return f"format {header.format}; this worker reads format {FORMAT_VERSION}"
    if header.tenant != wanted.tenant:
        return f"written for tenant {header.tenant!r}, not {wanted.tenant!r}"
    if header.epoch != wanted.epoch:
        return (
            f"written for Redis data generation {header.epoch[:12]}, Redis now holds "
            f"{wanted.epoch[:12]} (it lost or replaced its data since)"
        )
    if header.space != wanted.space or header.embedder_id != embedder_id_of(wanted.space):
        return (
            f"vector space {header.space} (embedder {header.embedder_id}); the tenant is "
            f"served from vector space {wanted.space} (embedder {embedder_id_of(wanted.space)})"
        )
    if header.fingerprint != wanted.fingerprint:
        return (
            f"built by other code (build fingerprint {header.fingerprint[:12]}, this worker's "
            f"{wanted.fingerprint[:12]}): the index would differ from a fresh build"
        )
    if header.policy != wanted.policy:
        return (
            f"built under poisoning policy {header.policy!r}; the tenant is served under "
            f"{wanted.policy!r}"
        )
    if header.version > wanted.stored_version:
        return (
            f"index version {header.version} is newer than the {wanted.stored_version} Redis "
            "holds (the tenant's data was reset)"
        )
    return None


def load_snapshot(
    path: Path,
    header: SnapshotHeader,
    probes: Matrix | None,
    *,
    mmap: bool = True,
    verify: bool = True,
) -> IndexSnapshot:
    """The :class:`IndexSnapshot` at ``path`` (whose header is ``header``), its arrays
    memory-mapped, its graph serving at once; ``probes``: the embedder's probe vectors (for the
    snapshots later deltas build). :class:`SnapshotError` when a file is missing, its checksum
    differs, or it does not fit the header. ``verify=False`` skips the checksums (most of a
    load's time: 0.31 of 0.33 s at 100,000 capabilities), for a snapshot this process's own
    child has just written; a file still has to be listed and to fit the header."""
    try:
        _verify(path, header, checksums=verify)
        return _load(path, header, probes, mmap)
    except SnapshotError:
        raise
    except Exception as exc:  # whatever a damaged file makes numpy, json or faiss raise
        raise SnapshotError(f"unreadable: {type(exc).__name__}: {exc}", path) from exc


def _verify(path: Path, header: SnapshotHeader, *, checksums: bool = True) -> None:
    for name, expected in header.files.items():
        if "/" in name or name.startswith("."):
            raise SnapshotError(f"the header names a file outside it: {name!r}", path)
        file = path / name
        if not file.exists():
            raise SnapshotError(f"{name} is missing", path)
        found = _file_sum(file) if checksums else expected
        if found != expected:
            raise SnapshotError(
                f"{name} is corrupt ({found['bytes']} bytes, sha256 {found['sha256'][:12]}; "
                f"the header says {expected.get('bytes')} bytes, sha256 "
                f"{str(expected.get('sha256'))[:12]})",
                path,
            )
    for name in (VECTORS, MARKS):
        if name not in header.files:
            raise SnapshotError(f"the header does not list {name}", path)
    unlisted = sorted({p.name for p in path.iterdir()} - set(header.files) - {HEADER})
    if unlisted:  # every file read must be one the checksums cover
        raise SnapshotError(f"files the header does not list: {', '.join(unlisted)}", path)


def _load(path: Path, header: SnapshotHeader, probes: Matrix | None, mmap: bool) -> IndexSnapshot:
    index = load_index(path, mmap=mmap)
    table = index.table
    if len(table) != header.capabilities:
        raise ValueError(f"{len(table)} records for {header.capabilities} capabilities")
    loaded = np.load(path / VECTORS, mmap_mode="r" if mmap else None, allow_pickle=False)
    vectors: Matrix = loaded.view(np.ndarray) if isinstance(loaded, np.memmap) else loaded
    if index.projection is not None and len(vectors) == len(table) > 0:
        index = replace(index, exact=ExactRows.of(vectors))  # its best rows rescored exactly
    reduced = index.projection is not None and index.exact is None  # the vectors: in the index
    rows = 0 if reduced else len(table)
    if vectors.dtype != np.float32 or vectors.shape != (rows, header.dim):
        raise ValueError(f"vectors of shape {vectors.shape} for {len(table)} records")
    marks = {
        cap_id: Mark(tuple((str(r), str(w)) for r, w in m["places"]), bool(m["caution"]))
        for cap_id, m in json.loads((path / MARKS).read_text()).items()
    }
    retriever = HybridRetriever(index, header.embedder_id)
    config = calibrated_for(header.embedder_id)
    graph = index.neighbors.graph
    stale = graph is None or graph.moved > config.ann_rebuild_moved
    if stale and config.ann_above and len(index) > config.ann_above:
        graph_builder().submit(retriever.lineage, index.matrix, index.neighbors)
    return IndexSnapshot(
        header.tenant,
        header.version,
        header.dim,
        table.ids,
        table,
        vectors,
        retriever,
        header.embedder_id,
        hybrid_retriever,
        probes,
        {i: m for i, m in marks.items() if i in table},
    )


def open_newest(
    root: Path,
    wanted: Wanted,
    probes: Matrix | None,
    refused: Callable[[SnapshotError], None],
    *,
    newer_than: int = -1,
) -> tuple[IndexSnapshot, SnapshotHeader, Path] | None:
    """The newest snapshot of ``wanted.tenant`` in ``wanted.space`` that fits ``wanted`` and
    reads back whole, with its header and directory; each one passed over is told to
    ``refused`` with why. None when there is none, or none of a version above ``newer_than``
    (what is served already: an older snapshot would not help)."""
    try:
        paths = candidates(root, wanted.tenant, wanted.space)
    except SnapshotError as exc:
        refused(exc)
        return None
    for path in paths:
        try:
            header = read_header(path)
            if header.version <= newer_than:
                return None
            check(header, wanted, path)
            return load_snapshot(path, header, probes), header, path
        except SnapshotError as exc:
            refused(exc)
    return None
