"""The texts a capability is embedded and matched by (docs/design.md, "Embedding texts").

:func:`full_text` (display name and description, parameters with their descriptions, tags,
dependencies, example queries) and :func:`summary_text` (display name and the description's
first paragraph) measured best on the benchmark data; a category line and the raw name in
parentheses cost recall. Never the full schema, the full content or secrets.

A capability's stored vector is :func:`combine` of the two texts' embeddings: cosine with a
query is then the weighted mean of the two views' cosines, in one row. :func:`vector_space`
names vectors made this way, so vectors of another embedder or scheme are never mixed in.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from capdisc.embedders.port import Vector
from capdisc.identifiers import humanize, split_identifiers
from capdisc.models import Capability

_PARAGRAPH = re.compile(r"\n\s*\n")


def full_text(capability: Capability) -> str:
    """The main embedding text of ``capability``."""
    name = capability.display_name or humanize(capability.name)
    lines = [f"{name}: {capability.description.strip()}"]
    params = _parameter_phrases(capability)
    if params:
        lines.append("Parameters: " + "; ".join(params))
    if capability.tags:
        lines.append("Use cases: " + ", ".join(capability.tags))
    if capability.required_tools:
        lines.append("Requires: " + ", ".join(capability.required_tools))
    if capability.example_queries:
        lines.append("Examples: " + "; ".join(capability.example_queries))
    return "\n".join(lines)


#: How the stored vector is made from the texts' embeddings; part of :func:`vector_space`.
VECTOR_SCHEME = "fs1"
#: Weight of the full-text view against the summary view in the stored vector.
FULL_TEXT_WEIGHT = 0.5


def embedding_texts(capability: Capability) -> tuple[str, str]:
    """What the indexing worker embeds for a capability: the full text and the summary."""
    return full_text(capability), summary_text(capability)


def combine(full: Vector, summary: Vector, full_weight: float = FULL_TEXT_WEIGHT) -> Vector:
    """The stored vector: ``w * full + (1 - w) * summary`` (both L2-normalized, the sum not)."""
    mixed: Vector = full_weight * np.asarray(full, dtype=np.float32) + (
        1.0 - full_weight
    ) * np.asarray(summary, dtype=np.float32)
    return mixed.astype(np.float32)


def vector_space(embedder_id: str) -> str:
    """The id stored vectors are kept under: the embedder and :data:`VECTOR_SCHEME`."""
    return f"{embedder_id}.{VECTOR_SCHEME}"


def embedder_id_of(space: str) -> str:
    """The embedder id of a vector space named by :func:`vector_space`."""
    return space.removesuffix(f".{VECTOR_SCHEME}")


def summary_text(capability: Capability) -> str:
    """The short second view: display name and the description's first paragraph."""
    name = capability.display_name or humanize(capability.name)
    first = _PARAGRAPH.split(capability.description.strip(), maxsplit=1)[0].strip()
    return f"{name}: {first}"


def _parameter_phrases(capability: Capability) -> list[str]:
    properties = (capability.full_schema or {}).get("properties")
    if not isinstance(properties, dict):
        return []
    phrases = []
    for key, spec in properties.items():
        words = split_identifiers(str(key)).lower()
        about = spec.get("description") if isinstance(spec, dict) else None
        phrases.append(
            f"{words} ({about.strip()})" if isinstance(about, str) and about.strip() else words
        )
    return phrases


def text_hash(text: str) -> str:
    """Key of the shared embedding cache."""
    return hashlib.sha256(text.encode()).hexdigest()
