"""The kind of each file name, path, URL and email address written beside it in a request."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capdisc.bench.evaluation import QueryVectors
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.engine import embed_turn
from capdisc.embedders.hashing import HashingEmbedder
from capdisc.embedders.port import CachedQueryEmbedder
from capdisc.models import Capability
from capdisc.retrieval.config import DEFAULT_CONFIG
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.entities import annotate
from capdisc.retrieval.index import RetrievalIndex


@pytest.mark.parametrize(
    ("request_text", "annotated"),
    [
        ("read todo.txt and post it", "read todo.txt file and post it"),
        ("what is in /home/me/todo.txt?", "what is in /home/me/todo.txt file?"),
        ("list ./reports", "list ./reports folder"),
        (
            "open https://example.com/login, fill in the form",
            "open https://example.com/login web page, fill in the form",
        ),
        (
            'OCR the image at "https://a.io/scan.png"',
            'OCR the image at "https://a.io/scan.png" file',
        ),
        ("the report.pdf file please", "the report.pdf file please"),
        ("fetch the headlines of example.com", "fetch the headlines of example.com"),
        ("share it with bob@example.com.", "share it with bob@example.com email address."),
        ("price is 5@3.50, user@localhost", "price is 5@3.50, user@localhost"),
        ("version 1.2.3 of numpy, 24/7", "version 1.2.3 of numpy, 24/7"),
        ("open vercel/next.js on github", "open vercel/next.js on github"),
        ("", ""),
    ],
)
def test_annotate_writes_the_kind_beside_files_paths_urls_and_addresses(
    request_text: str, annotated: str
) -> None:
    assert annotate(request_text) == annotated


EMBEDDER = HashingEmbedder(256)
CATALOG = [
    Capability(
        id="tool:write_file", kind="tool", name="write_file", description="Write text to a file"
    ),
    Capability(
        id="tool:search_papers",
        kind="tool",
        name="search_papers",
        description="Search research papers",
    ),
]


@pytest.mark.parametrize(
    ("entity_types", "first"), [(True, "tool:write_file"), (False, "tool:search_papers")]
)
def test_a_file_name_in_the_request_finds_the_file_tool_when_its_kind_is_written(
    entity_types: bool, first: str
) -> None:
    index = RetrievalIndex.build(CATALOG, EMBEDDER.embed([lexical_text(c) for c in CATALOG]))
    config = replace(DEFAULT_CONFIG, fusion="lexical", entity_types=entity_types)
    query = "put the titles into papers.md"

    result = index.search(query, EMBEDDER.embed([query])[0], 2, config=config)

    assert result.ids[0] == first


def test_a_turn_embeds_the_request_with_the_kinds_written() -> None:
    vector, _ = embed_turn(CachedQueryEmbedder(EMBEDDER), "read todo.txt", DiscoveryConfig())

    np.testing.assert_allclose(vector, EMBEDDER.embed(["read todo.txt file"])[0])


@pytest.mark.parametrize(
    ("entity_types", "embedded"), [(True, "read todo.txt file"), (False, "read todo.txt")]
)
def test_benchmark_query_vectors_embed_each_request_as_a_turn_does(
    entity_types: bool, embedded: str
) -> None:
    vectors = QueryVectors.embed(EMBEDDER, ["read todo.txt"], None)

    np.testing.assert_allclose(
        vectors.of("read todo.txt", entity_types), EMBEDDER.embed([embedded])[0]
    )
