"""The adapters a process runs with, built from its settings at the edge: the embedder, the
external vector store (if any) and their vendor settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capdisc.embedders.factory import make_embedder
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.minilm import MINILM_ID, MiniLMEmbedder
from capdisc.embedders.port import Embedder
from capdisc.errors import ConfigError, EmbeddingError, VectorStoreError
from capdisc.settings import Settings
from capdisc.vectorstores.port import VectorStore

if TYPE_CHECKING:
    from capdisc.vectorstores.weaviate import WeaviateStoreSettings


def embedder_for(settings: Settings) -> Embedder:
    """The embedder the settings name, the OpenAI provider configured from them included."""
    if settings.embedder != "openai":
        return make_embedder(
            settings.embedder,
            settings.hashing_dim,
            spin=settings.model_spin,
            streams=settings.model_streams,
        )
    from capdisc.embedders.openai import OpenAIEmbedder, OpenAIEmbedderSettings

    return OpenAIEmbedder(
        OpenAIEmbedderSettings(
            api_key=settings.openai_api_key,
            model=settings.openai_model,
            base_url=settings.openai_base_url,
            dimensions=settings.openai_dimensions,
            request_dimensions=settings.openai_request_dimensions,
            batch_size=settings.openai_batch_size,
            timeout_s=settings.openai_timeout_s,
            max_attempts=settings.openai_max_attempts,
        )
    )


def embedder_for_id(embedder_id: str, settings: Settings) -> Embedder:
    """The embedder whose :attr:`Embedder.id` is ``embedder_id`` (a tenant served from vectors
    of another model than the configured one, after a full reindex onto it)."""
    if embedder_id == MINILM_ID:
        return MiniLMEmbedder(spin=settings.model_spin, streams=settings.model_streams)
    kind, _, rest = embedder_id.partition("-")
    if kind == "hashing" and rest.isdigit():
        return HashingEmbedder(int(rest))
    if kind == "openai":
        model, _, dim = rest.rpartition("-")
        if model and dim.isdigit():
            return embedder_for(
                settings.with_changes(
                    embedder="openai", openai_model=model, openai_dimensions=int(dim)
                )
            )
    raise EmbeddingError(
        f"no embedder has id {embedder_id!r}; configure this worker with the "
        "embedder the tenant was last reindexed with (capdisc status shows it)"
    )


def store_for(settings: Settings) -> VectorStore | None:
    """The external vector store the settings name (None: discovery searches in-process)."""
    if settings.vector_store != "weaviate":
        return None
    from capdisc.vectorstores.weaviate import WeaviateVectorStore

    if not settings.weaviate_url:
        raise ConfigError(
            "vector_store is 'weaviate' but CAPDISC_WEAVIATE_URL is not set; set "
            "it to the Weaviate REST URL (and CAPDISC_WEAVIATE_GRPC_PORT)"
        )
    return WeaviateVectorStore(weaviate_settings(settings))


def weaviate_settings(settings: Settings) -> WeaviateStoreSettings:
    """The Weaviate adapter's settings from the process settings."""
    from capdisc.vectorstores.weaviate import WeaviateStoreSettings

    if not settings.weaviate_url:
        raise VectorStoreError(
            "the Weaviate vector store needs a server: set "
            "CAPDISC_WEAVIATE_URL (e.g. http://127.0.0.1:8080)"
        )
    return WeaviateStoreSettings(
        url=settings.weaviate_url,
        grpc_port=settings.weaviate_grpc_port,
        grpc_host=settings.weaviate_grpc_host or None,
        api_key=settings.weaviate_api_key,
        collection=settings.weaviate_collection,
        timeout_init_s=settings.weaviate_timeout_init_s,
        timeout_query_s=settings.weaviate_timeout_query_s,
        timeout_insert_s=settings.weaviate_timeout_insert_s,
    )
