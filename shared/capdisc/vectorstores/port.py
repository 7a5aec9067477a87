"""The vector-store port: where capability vectors live when they leave the process.

A :class:`VectorStore` keeps, per tenant, one :class:`StoredObject` per capability (its vector,
the text the keyword side matches, and every property a query filters on) and answers hybrid
queries: a dense side (cosine with the caller's query vector) and a keyword side (BM25 over the
text), fused by relative scores with the caller's ``alpha`` (1: dense only, 0: keyword only).

**Visibility is a pre-filter.** A query's filters are a :class:`capdisc.filters.SearchFilters`,
caller included: a capability is visible to the caller iff it is open to every member of the
tenant, or shares a role with the caller, or names the caller's user
(:func:`capdisc.access.visible`). Stores apply it *inside* the query, with the other filters, so
the top-k is computed over visible capabilities only: an invisible capability can neither be
returned nor take a slot. :class:`InMemoryVectorStore` is the reference implementation the
contract suite (``tests/unit/test_vector_store_contract.py``) holds every adapter to (it applies
:meth:`~capdisc.filters.SearchFilters.admits` to each object);
:class:`capdisc.vectorstores.weaviate.WeaviateVectorStore` is the production one.

Tenants are explicit: :meth:`VectorStore.ensure_tenant` creates one; any other operation on a
tenant that was never ensured raises :class:`~capdisc.errors.UnknownTenantError` rather than
answering with an empty success.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from capdisc.access import Caller, visible
from capdisc.embedders.port import Matrix, Vector
from capdisc.errors import UnknownTenantError, VectorStoreError
from capdisc.filters import SearchFilters
from capdisc.models import Capability, Visibility
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.lexical import STOPWORDS
from capdisc.tenants import TENANT_RE

ArrayLike = Sequence[float] | npt.NDArray[np.floating]


@dataclass(frozen=True)
class StoredObject:
    """One capability as a vector store keeps it.

    ``vector`` is any dimension (float32, finite, not all zeros); every object of a tenant must
    have the same dimension. ``text`` is what the keyword side matches. ``vis_roles`` and
    ``vis_users`` are the capability's :attr:`visibility`: open to every member of the tenant
    when both are empty, else to callers holding one of the roles or named in the users.
    """

    id: str
    vector: Vector = field(compare=False, repr=False)
    text: str = ""
    kind: str = "tool"
    category: str = "general"
    tags: tuple[str, ...] = ()
    available: bool = True
    vis_roles: tuple[str, ...] = ()
    vis_users: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.id:
            raise VectorStoreError("a stored object needs a capability id")
        try:
            vector = np.asarray(self.vector, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise VectorStoreError(
                f"capability {self.id!r}: the vector is not a sequence of numbers: {exc}"
            ) from exc
        if vector.ndim != 1 or vector.size == 0:
            raise VectorStoreError(
                f"capability {self.id!r}: the vector must be one non-empty "
                f"row of numbers, got shape {vector.shape}"
            )
        if not np.isfinite(vector).all() or not vector.any():
            raise VectorStoreError(
                f"capability {self.id!r}: the vector must be finite and not all zeros"
            )
        object.__setattr__(self, "vector", vector)
        for name in ("tags", "vis_roles", "vis_users"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def from_capability(
        cls, capability: Capability, vector: ArrayLike, *, text: str | None = None
    ) -> StoredObject:
        """A capability's object: its filter fields, its visibility
        (:attr:`capdisc.models.Capability.visibility`: open when it names no roles and no users),
        and the text BM25 matches in-process
        (:func:`capdisc.retrieval.documents.lexical_text`) unless ``text`` is given."""
        visibility = capability.visibility
        return cls(
            capability.id,
            np.asarray(vector, dtype=np.float32),
            lexical_text(capability) if text is None else text,
            capability.kind,
            capability.category,
            tuple(capability.tags),
            capability.available,
            tuple(visibility.roles),
            tuple(visibility.users),
        )

    @property
    def visibility(self) -> Visibility:
        """Who in the tenant sees this capability (:class:`capdisc.models.Visibility`)."""
        return Visibility(self.vis_roles, self.vis_users)

    def visible_to(self, caller: Caller) -> bool:
        return visible(self.visibility, caller)


@dataclass(frozen=True)
class StoreHit:
    """One result: the capability id and its fused score (higher is better, 0..1)."""

    id: str
    score: float


@dataclass(frozen=True)
class UpsertFailure:
    """An object the store refused, after the retry, and the store's reason."""

    id: str
    reason: str


@dataclass(frozen=True)
class UpsertReport:
    """What an upsert did: ids written, objects refused (with reasons), and how many objects
    were sent a second time after a first refusal."""

    written: tuple[str, ...] = ()
    failed: tuple[UpsertFailure, ...] = ()
    retried: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


class VectorStore(Protocol):
    """Port: capability vectors of many tenants, searched with filters and visibility inside
    the query. Writes are upserts keyed by capability id, so repeating one is harmless."""

    def ensure_tenant(self, tenant: str) -> None:
        """Create ``tenant`` if it does not exist (idempotent)."""
        ...

    def upsert(self, tenant: str, objects: Sequence[StoredObject]) -> UpsertReport:
        """Write ``objects`` (replacing any with the same id); per-object refusals are retried
        once and the rest reported, never dropped. A later duplicate id in ``objects`` wins."""
        ...

    def delete(self, tenant: str, ids: Collection[str]) -> int:
        """Remove these capability ids (absent ones are ignored); returns how many went."""
        ...

    def search(
        self,
        tenant: str,
        query_text: str,
        query_vector: ArrayLike,
        k: int,
        *,
        alpha: float,
        filters: SearchFilters,
    ) -> list[StoreHit]:
        """The ``k`` best objects that pass ``filters`` (visibility included), best first."""
        ...

    def count(self, tenant: str) -> int:
        """How many objects ``tenant`` holds (all of them, whatever their visibility)."""
        ...

    def close(self) -> None:
        """Release connections; the store may be used again afterwards (it reconnects)."""
        ...


def check_tenant(tenant: str) -> None:
    if not TENANT_RE.fullmatch(tenant):
        raise VectorStoreError(
            f"{tenant!r} is not a valid tenant name (letters, digits, '_', "
            "'-'; at most 64 characters, starting with a letter or digit)"
        )


def check_query(k: int, alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0 or math.isnan(alpha):
        raise VectorStoreError(
            f"alpha must be within 0..1 (1: vectors only, 0: keywords only), got {alpha}"
        )
    if k < 0:
        raise VectorStoreError(f"k must not be negative, got {k}")


def last_per_id(objects: Sequence[StoredObject]) -> list[StoredObject]:
    """``objects`` with a repeated id kept once, at its last value, in first-seen order."""
    latest: dict[str, StoredObject] = {}
    for obj in objects:
        latest[obj.id] = obj
    return list(latest.values())


# -- the in-process reference store ----------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
#: Weaviate's BM25 defaults.
BM25_K1 = 1.2
BM25_B = 0.75


def keyword_terms(text: str) -> list[str]:
    """Lowercased words (letters and digits), English stop words dropped: Weaviate's ``word``
    tokenization with its ``en`` stop-word preset, approximately."""
    return [w for w in (m.lower() for m in _WORD.findall(text)) if w not in STOPWORDS]


def relative_score_fusion(sides: Sequence[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Weaviate's ``relativeScoreFusion``: each side's scores min-max scaled to 0..1 (all equal:
    1), times the side's weight, summed per id over the sides the id appears in."""
    fused: dict[str, float] = {}
    for weight, scores in sides:
        if not scores:
            continue
        low, high = min(scores.values()), max(scores.values())
        for key, value in scores.items():
            scaled = weight if high == low else weight * (value - low) / (high - low)
            fused[key] = fused.get(key, 0.0) + scaled
    return fused


@dataclass
class _Tenant:
    objects: dict[str, StoredObject] = field(default_factory=dict)
    dim: int | None = None
    #: Built on first search after a write: ids, unit-row matrix, term counts, lengths.
    cache: tuple[tuple[str, ...], Matrix, list[Counter[str]], list[int]] | None = None

    def view(self) -> tuple[tuple[str, ...], Matrix, list[Counter[str]], list[int]]:
        if self.cache is None:
            ids = tuple(self.objects)
            if ids:
                matrix = np.vstack([self.objects[i].vector for i in ids])
                matrix = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
            else:
                matrix = np.zeros((0, self.dim or 0), dtype=np.float32)
            counts = [Counter(keyword_terms(self.objects[i].text)) for i in ids]
            self.cache = (ids, matrix.astype(np.float32), counts, [sum(c.values()) for c in counts])
        return self.cache


class InMemoryVectorStore:
    """The reference :class:`VectorStore`: exact cosine (numpy) and BM25 over each tenant's
    objects, fused like Weaviate's hybrid (relative scores, ``alpha`` on the vector side).
    Thread-safe. Keyword statistics (document frequencies, average length) are over the whole
    tenant, as in a Weaviate shard; the filters restrict which objects are scored."""

    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()

    def ensure_tenant(self, tenant: str) -> None:
        check_tenant(tenant)
        with self._lock:
            self._tenants.setdefault(tenant, _Tenant())

    def upsert(self, tenant: str, objects: Sequence[StoredObject]) -> UpsertReport:
        with self._lock:
            state = self._tenant(tenant)
            written: list[str] = []
            failed: list[UpsertFailure] = []
            for obj in last_per_id(objects):
                dim = int(obj.vector.size)
                if state.dim is not None and dim != state.dim:
                    failed.append(
                        UpsertFailure(
                            obj.id,
                            f"vector has {dim} dimensions, the tenant's index has {state.dim}",
                        )
                    )
                    continue
                state.dim = dim
                state.objects[obj.id] = obj
                written.append(obj.id)
            if written:
                state.cache = None
            return UpsertReport(tuple(written), tuple(failed))

    def delete(self, tenant: str, ids: Collection[str]) -> int:
        with self._lock:
            state = self._tenant(tenant)
            gone = [i for i in set(ids) if state.objects.pop(i, None) is not None]
            if gone:
                state.cache = None
            return len(gone)

    def search(
        self,
        tenant: str,
        query_text: str,
        query_vector: ArrayLike,
        k: int,
        *,
        alpha: float,
        filters: SearchFilters,
    ) -> list[StoreHit]:
        check_query(k, alpha)
        query = np.asarray(query_vector, dtype=np.float32)
        with self._lock:
            state = self._tenant(tenant)
            if state.dim is not None and query.shape != (state.dim,):
                raise VectorStoreError(
                    f"the query vector has shape {query.shape}, tenant "
                    f"{tenant!r} holds {state.dim}-dimensional vectors"
                )
            ids, matrix, counts, lengths = state.view()
            admitted = [row for row, i in enumerate(ids) if filters.admits(state.objects[i])]
        if k == 0 or not admitted:
            return []
        sides: list[tuple[float, dict[str, float]]] = []
        if alpha > 0:
            norm = float(np.linalg.norm(query))
            cosines = matrix[admitted] @ (query / norm if norm > 0 else query)
            sides.append(
                (alpha, {ids[row]: float(c) for row, c in zip(admitted, cosines, strict=True)})
            )
        if alpha < 1:
            sides.append(
                (1.0 - alpha, _bm25(keyword_terms(query_text), ids, counts, lengths, admitted))
            )
        fused = relative_score_fusion(sides)
        best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [StoreHit(key, score) for key, score in best]

    def count(self, tenant: str) -> int:
        with self._lock:
            return len(self._tenant(tenant).objects)

    def close(self) -> None:
        """Nothing to release: the objects stay (they live as long as this store)."""

    def _tenant(self, tenant: str) -> _Tenant:
        check_tenant(tenant)
        state = self._tenants.get(tenant)
        if state is None:
            raise UnknownTenantError(
                f"the vector store has no tenant {tenant!r}: create it "
                "with ensure_tenant first (publish to that tenant)"
            )
        return state


def _bm25(
    terms: list[str],
    ids: tuple[str, ...],
    counts: list[Counter[str]],
    lengths: list[int],
    rows: list[int],
) -> dict[str, float]:
    """BM25 of the matching ``rows`` (statistics over every row); rows matching no term are
    left out, as a keyword search does."""
    if not terms or not ids:
        return {}
    n = len(ids)
    average = max(sum(lengths) / n, 1e-9)
    frequencies = {t: sum(1 for c in counts if t in c) for t in set(terms)}
    idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in frequencies.items()}
    scores: dict[str, float] = {}
    for row in rows:
        tf = counts[row]
        norm = BM25_K1 * (1.0 - BM25_B + BM25_B * lengths[row] / average)
        score = sum(idf[t] * tf[t] * (BM25_K1 + 1.0) / (tf[t] + norm) for t in terms if t in tf)
        if score > 0:
            scores[ids[row]] = score
    return scores
