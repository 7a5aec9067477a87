"""The in-process vector index: an immutable snapshot of one tenant's capabilities and vectors.

Exact cosine search over a float32 matrix (vectors are L2-normalized, so a dot product). A
snapshot never changes; :meth:`IndexSnapshot.with_changes` returns a new one, so a discovery
worker swaps a reference and a request never sees a half-applied update.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from capdisc.embedding import Matrix, Vector
from capdisc.models import Capability


@dataclass(frozen=True)
class IndexSnapshot:
    """One tenant's searchable state at one index version."""

    tenant: str
    version: int
    dim: int
    ids: tuple[str, ...] = ()
    capabilities: Mapping[str, Capability] = field(default_factory=dict)
    matrix: Matrix = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))

    @classmethod
    def build(cls, tenant: str, version: int, dim: int,
              entries: Iterable[tuple[Capability, bytes]]) -> IndexSnapshot:
        caps: dict[str, Capability] = {}
        rows: dict[str, Vector] = {}
        for capability, vector in entries:
            if len(vector) != dim * 4:
                continue  # a vector of another model or size: left for a reindex
            caps[capability.id] = capability  # a repeated id: the later entry wins
            rows[capability.id] = np.frombuffer(vector, dtype=np.float32)
        matrix = (np.vstack(list(rows.values())) if rows
                  else np.zeros((0, dim), dtype=np.float32))
        return cls(tenant, version, dim, tuple(caps), caps, matrix)

    def __len__(self) -> int:
        return len(self.ids)

    def with_changes(self, version: int, upserts: Iterable[tuple[Capability, bytes]],
                     deletes: Iterable[str]) -> IndexSnapshot:
        """A new snapshot at ``version`` with ``upserts`` replaced or added and ``deletes`` gone."""
        entries = {cid: (cap, self.matrix[i].tobytes())
                   for i, (cid, cap) in enumerate(self._ordered())}
        for cap_id in deletes:
            entries.pop(cap_id, None)
        for capability, vector in upserts:
            entries[capability.id] = (capability, vector)
        return IndexSnapshot.build(self.tenant, version, self.dim, entries.values())

    def search(self, query: Vector, k: int, kind: str | None = None
               ) -> list[tuple[Capability, float]]:
        """The ``k`` most similar capabilities (optionally of one ``kind``), best first."""
        if not self.ids or k <= 0:
            return []
        scores = self.matrix @ query.astype(np.float32)
        if kind is not None:
            mask = np.array([self.capabilities[i].kind == kind for i in self.ids])
            scores = np.where(mask, scores, -np.inf)
        k = min(k, len(self.ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(self.capabilities[self.ids[i]], float(scores[i]))
                for i in top if np.isfinite(scores[i])]

    def _ordered(self) -> Iterable[tuple[str, Capability]]:
        return ((cid, self.capabilities[cid]) for cid in self.ids)
