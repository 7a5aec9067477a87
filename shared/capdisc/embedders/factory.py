"""Embedders by name: ``minilm`` or ``hashing`` (the OpenAI adapter needs its settings:
:func:`capdisc.resources.embedder_for`)."""

from __future__ import annotations

from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.minilm import MINILM_DIM, MiniLMEmbedder
from capdisc.embedders.port import Embedder
from capdisc.errors import EmbeddingError


def make_embedder(
    name: str, hashing_dim: int = MINILM_DIM, *, spin: bool = False, streams: int = 2
) -> Embedder:
    """The embedder a setting names: ``minilm`` (``spin`` and ``streams``:
    :class:`MiniLMEmbedder`'s) or ``hashing``."""
    if name == "hashing":
        return HashingEmbedder(hashing_dim)
    if name == "minilm":
        return MiniLMEmbedder(spin=spin, streams=streams)
    raise EmbeddingError(f"unknown embedder {name!r}; use 'minilm' or 'hashing'")
