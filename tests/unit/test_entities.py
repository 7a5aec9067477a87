"""The kind of each file name, path, URL and email address written beside it in a request, and
the step a file saved into implies."""

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
from capdisc.retrieval.decompose import decompose
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.entities import MOVE_FILE, WRITE_FILE, annotate, implied_steps
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


@pytest.mark.parametrize(
    ("request_text", "steps"),
    [
        ("save a summary to pixel.md", [WRITE_FILE]),
        ("write the titles into papers.md file", [WRITE_FILE]),
        ("get the transcript and save it as talk.txt", [WRITE_FILE]),
        ("store the rows in a new file called rows.csv", []),  # "in": not a destination
        ("export the report into a new file called q3.pdf", [WRITE_FILE]),
        ("add a 3x4 table to the report.docx", []),  # an edit in place, not a save
        ("rename report_v2.docx to report.docx", [MOVE_FILE]),
        ("move old_data.csv into it", [MOVE_FILE]),
        (
            "move the file notes.txt to ./archive and save a copy as notes.md",
            [MOVE_FILE, WRITE_FILE],
        ),
        ("move fast and read todo.txt", []),
        ("read the Q3 numbers from sales.xlsx", []),
        ("save the page to https://example.com/upload", []),  # a web page, not a file
        ("save the summary to notes", []),
        ("", []),
    ],
)
def test_a_request_that_saves_into_or_moves_a_file_implies_that_step(
    request_text: str, steps: list[str]
) -> None:
    assert implied_steps(request_text) == steps


@pytest.mark.parametrize(
    ("query", "parts"),
    [
        (
            "find papers about RAG and write the titles into papers.md",
            ["find papers about RAG", "write the titles into papers.md", WRITE_FILE],
        ),
        (
            "save the headlines of example.com into notes.md",
            ["save the headlines of example.com into notes.md", WRITE_FILE],
        ),
        ("read todo.txt and post it to slack", ["read todo.txt", "post it to slack"]),
    ],
)
def test_decompose_adds_the_implied_steps_after_the_requests(query: str, parts: list[str]) -> None:
    assert decompose(query, implied=True) == parts


def test_decompose_adds_no_implied_step_unless_asked() -> None:
    assert decompose("save the headlines of example.com into notes.md") == [
        "save the headlines of example.com into notes.md"
    ]


def test_a_saving_verb_far_before_the_file_implies_nothing() -> None:
    request = "save the list, " + "and the notes " * 20 + "to x.md"

    assert implied_steps(request) == []


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


def test_a_turn_embeds_an_implied_step_on_its_own() -> None:
    query = "save the headlines of example.com into notes.md"
    _, embed = embed_turn(CachedQueryEmbedder(EMBEDDER), query, DiscoveryConfig())

    np.testing.assert_allclose(embed([WRITE_FILE])[0], EMBEDDER.embed([WRITE_FILE])[0])


def test_benchmark_query_vectors_hold_the_implied_steps() -> None:
    vectors = QueryVectors.embed(EMBEDDER, ["save a summary to notes.md"], None)

    np.testing.assert_allclose(vectors([WRITE_FILE])[0], EMBEDDER.embed([WRITE_FILE])[0])


NEWS_CATALOG = [
    Capability(id="tool:write_file", kind="tool", name="write_file", description="Write a file"),
    *(
        Capability(
            id=f"tool:news{i}",
            kind="tool",
            name=f"news_{i}",
            description=f"Get the latest news headlines of a site and save them, variant {i}",
        )
        for i in range(6)
    ),
    *(
        Capability(
            id=f"tool:other{i}", kind="tool", name=f"other_{i}", description=f"Weather map {i}"
        )
        for i in range(30)
    ),
]


@pytest.mark.parametrize(("entity_types", "writes"), [(True, True), (False, False)])
def test_a_request_saving_into_a_file_gets_the_write_tool_among_its_answers(
    entity_types: bool, writes: bool
) -> None:
    index = RetrievalIndex.build(
        NEWS_CATALOG, EMBEDDER.embed([lexical_text(c) for c in NEWS_CATALOG])
    )
    config = replace(DEFAULT_CONFIG, entity_types=entity_types)
    query = "save the headlines of example.com into notes.md"

    result = index.search(query, EMBEDDER.embed([query])[0], 3, embed=EMBEDDER.embed, config=config)

    assert ("tool:write_file" in result.ids) is writes


class _SpanEmbedder(HashingEmbedder):
    """Pools spans the way MiniLM does, so a pooled part differs from the part embedded alone
    (here: the whole text's vector)."""

    def embed_spans(self, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
        return np.vstack([self.embed([text])] * (len(spans) + 1))


CHAINED = "read todo.txt and post it to slack"


@pytest.mark.parametrize(("pooled_above", "alone"), [(3, True), (1, False), (0, False)])
def test_a_short_request_embeds_each_part_on_its_own_and_a_longer_one_pools_them(
    pooled_above: int, alone: bool
) -> None:
    embedder = _SpanEmbedder(256)
    config = DiscoveryConfig(pooled_parts_above=pooled_above)
    _, embed = embed_turn(CachedQueryEmbedder(embedder), CHAINED, config)

    part = "post it to slack"
    same = np.allclose(embed([part])[0], embedder.embed([part])[0])
    assert same is alone
