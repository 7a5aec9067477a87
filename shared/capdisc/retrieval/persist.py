"""A built :class:`~capdisc.retrieval.index.RetrievalIndex` on disk and back, without
building it again: every array as a ``.npy`` file (read back memory-mapped, never with pickle),
the tables that are not arrays as JSON, and the HNSW graph in faiss's own format (with, for a
graph carried over from an earlier index, each row's node in it).

What is written is exactly what :meth:`RetrievalIndex.build` made, so an index read back answers
every query as the one written did. Whether a directory may be read at all (its format, the
code that wrote it, its checksums) is for the caller to decide
(:mod:`capdisc.discovery.snapshotfile`); this module only maps arrays and tables to files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence, Sized
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from capdisc.captable import PackedStrings, table_arrays, table_from_arrays
from capdisc.retrieval.index import RetrievalIndex, RowArray
from capdisc.retrieval.lexical import LexicalIndex
from capdisc.retrieval.names import NameTable
from capdisc.retrieval.neighbors import CarriedGraph, Graph, NeighborIndex, NeighborSlot

#: The tables that are not arrays (names, vocabulary, facet keys, scalars).
TABLES = "retrieval.json"
#: The HNSW graph, when the index had one (faiss's own format).
GRAPH = "graph.faiss"
#: Prefix of every array file of the index.
ARRAYS = "r."
#: The row facets of the index, each written as its keys, one array of rows and offsets.
FACETS = ("kinds", "categories", "tags", "role_rows", "user_rows")
#: The capability table (:mod:`capdisc.captable`): its arrays (ids and names packed, the
#: id lookup's hashes and rows among them), and its categories as JSON.
TABLE_ARRAYS = (
    "blob",
    "offsets",
    "category_codes",
    "available",
    "open",
    "ids.blob",
    "ids.offsets",
    "names.blob",
    "names.offsets",
    "id_hashes",
    "id_rows",
)
TABLE = "table.json"
#: The lexicon's arrays (:class:`LexicalIndex` fields).
LEXICON = ("data", "indices", "indptr", "idf", "doc_indptr", "doc_terms", "doc_tf", "doc_len")
#: The lexicon's dense rows of its most frequent terms (made from the postings when a snapshot
#: written before them has none).
LEXICON_DENSE = ("dense_terms", "dense_rows", "dense_df")


def save_index(index: RetrievalIndex, directory: Path) -> list[str]:
    """Write ``index`` into ``directory`` (which exists), its capability table included;
    returns the file names written."""
    written: list[str] = []

    def array(name: str, value: npt.NDArray[Any]) -> None:
        file = f"{ARRAYS}{name}.npy"
        np.save(directory / file, np.ascontiguousarray(value), allow_pickle=False)
        written.append(file)

    array("matrix", index.matrix)
    array("names.hashes", index.names.hashes)
    array("names.rows", index.names.rows)
    array("row_keys.blob", index.row_keys.blob)
    array("row_keys.offsets", index.row_keys.offsets)
    array("mean_vector", index.mean_vector)
    array("moment", index.moment)
    table = table_arrays(index.table)
    for name in TABLE_ARRAYS:
        array(f"table.{name}", table[name])
    (directory / TABLE).write_text(json.dumps(table["json"], ensure_ascii=False))
    written.append(TABLE)
    if index.projection is not None:
        array("projection", index.projection)
    if index.probe_rows is not None:
        array("probe_rows", index.probe_rows)
    lexicon = index.lexicon
    for name in LEXICON + LEXICON_DENSE:
        array(f"lexicon.{name}", getattr(lexicon, name))
    facet_keys: dict[str, list[str]] = {}
    for facet in FACETS:
        rows: dict[str, RowArray] = getattr(index, facet)
        facet_keys[facet] = list(rows)
        parts = [rows[key] for key in facet_keys[facet]]
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        array(f"{facet}.offsets", np.concatenate(([0], np.cumsum(lengths))).astype(np.int64))
        array(
            f"{facet}.rows",
            np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32),
        )
    vocabulary = sorted(lexicon.vocabulary.items(), key=lambda item: item[1])
    tables = {
        "rows": len(index),
        "name_starts": sorted(index.names.starts),
        "vocabulary": [term for term, _id in vocabulary],
        "facets": facet_keys,
        "lexicon": {"num_docs": lexicon.num_docs, "stem": lexicon.stem, "k1": lexicon.k1},
        "lexicon_b": lexicon.b,
        "probe_cosines": list(index.probe_cosines),
    }
    if [term_id for _term, term_id in vocabulary] != list(range(len(vocabulary))):
        raise ValueError("the lexicon's term ids are not 0..n-1: it cannot be written")
    (directory / TABLES).write_text(json.dumps(tables, ensure_ascii=False, separators=(",", ":")))
    written.append(TABLES)
    graph = index.neighbors.graph
    if graph is not None:
        graph.write(directory / GRAPH)
        written.append(GRAPH)
        if isinstance(graph, CarriedGraph):
            array("graph_nodes", graph.labels())
    return written


def load_index(directory: Path, *, mmap: bool = True) -> RetrievalIndex:
    """The index :func:`save_index` wrote into ``directory``, its capability table included.
    Arrays (the table's compressed records too) are memory-mapped read-only when ``mmap``; the
    graph, if written, is in the index's slot already. ``ValueError`` (or ``OSError``) when
    anything is missing or does not fit."""
    tables = json.loads((directory / TABLES).read_text())

    def array(name: str, optional: bool = False) -> Any:
        path = directory / f"{ARRAYS}{name}.npy"
        if optional and not path.exists():
            return None
        loaded = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        return loaded.view(np.ndarray) if isinstance(loaded, np.memmap) else loaded

    table = table_from_arrays(
        {name: array(f"table.{name}") for name in TABLE_ARRAYS}
        | {"json": json.loads((directory / TABLE).read_text())}
    )
    if tables["rows"] != len(table):
        raise ValueError(f"the index has {tables['rows']} rows for {len(table)} capabilities")

    vocabulary = {term: term_id for term_id, term in enumerate(tables["vocabulary"])}
    lex = tables["lexicon"]
    lexicon = LexicalIndex(
        vocabulary,
        array("lexicon.data"),
        array("lexicon.indices"),
        array("lexicon.indptr"),
        int(lex["num_docs"]),
        bool(lex["stem"]),
        array("lexicon.idf"),
        array("lexicon.doc_indptr"),
        array("lexicon.doc_terms"),
        array("lexicon.doc_tf"),
        array("lexicon.doc_len"),
        float(lex["k1"]),
        float(tables["lexicon_b"]),
    )
    lexicon = _dense_rows(lexicon, *(array(f"lexicon.{name}", True) for name in LEXICON_DENSE))
    facets = {
        facet: _facet(tables["facets"][facet], array(f"{facet}.offsets"), array(f"{facet}.rows"))
        for facet in FACETS
    }
    names = NameTable(array("names.hashes"), array("names.rows"), frozenset(tables["name_starts"]))
    row_keys = PackedStrings(array("row_keys.blob"), array("row_keys.offsets"))
    if len(names.rows) != len(names.hashes) or (
        len(names.rows) and not 0 <= int(names.rows.min()) <= int(names.rows.max()) < len(table)
    ):
        raise ValueError("the name table's rows do not fit the capabilities")
    matrix = array("matrix")
    if matrix.shape[0] != len(table) or len(row_keys) != len(table):
        raise ValueError(f"the index arrays do not have {len(table)} rows")
    slot = NeighborSlot()
    if (directory / GRAPH).exists():
        graph = NeighborIndex.read(directory / GRAPH, mmap=mmap)
        slot.fill(_graph(graph, array("graph_nodes", True), table))
    return RetrievalIndex(
        table=table,
        ids=table.ids,
        matrix=matrix,
        lexicon=lexicon,
        names=names,
        kinds=facets["kinds"],
        categories=facets["categories"],
        tags=facets["tags"],
        available=table.available,
        open_rows=table.open,
        role_rows=facets["role_rows"],
        user_rows=facets["user_rows"],
        row_keys=row_keys,
        rows=table.rows,
        mean_vector=array("mean_vector"),
        moment=array("moment"),
        projection=array("projection", optional=True),
        probe_cosines=tuple(float(c) for c in tables["probe_cosines"]),
        probe_rows=array("probe_rows", optional=True),
        neighbors=slot,
    )


def _graph(base: NeighborIndex, nodes: RowArray | None, rows: Sized) -> Graph:
    """The graph as written: built for these rows, or carried over (``nodes``, per row)."""
    if nodes is None:
        if base.rows != len(rows):
            raise ValueError(f"the graph has {base.rows} rows for {len(rows)} capabilities")
        return base
    if len(nodes) != len(rows) or (len(nodes) and int(nodes.max()) >= base.rows):
        raise ValueError(f"the graph's nodes do not fit {len(rows)} capabilities")
    return CarriedGraph(base, np.asarray(nodes, dtype=np.int64))


def _dense_rows(lexicon: LexicalIndex, terms: Any, rows: Any, df: Any) -> LexicalIndex:
    """``lexicon`` with its dense rows as read; made from its postings when none were written
    (a snapshot written before they were: its postings are every term's)."""
    if terms is None or rows is None or df is None:
        return lexicon.with_dense_rows()
    if rows.ndim != 2 or rows.shape != (len(terms), lexicon.num_docs) or len(df) != len(terms):
        raise ValueError(f"the lexicon's dense rows of shape {rows.shape} do not fit it")
    if len(terms) and not (
        int(terms[0]) >= 0
        and int(terms[-1]) < len(lexicon.idf)
        and bool(np.all(terms[1:] > terms[:-1]))
    ):
        raise ValueError("the lexicon's dense rows name terms it does not have, or out of order")
    return replace(lexicon, dense_terms=terms, dense_rows=rows, dense_df=df)


def _facet(
    keys: Sequence[str], offsets: npt.NDArray[np.int64], rows: RowArray
) -> dict[str, RowArray]:
    if len(offsets) != len(keys) + 1:
        raise ValueError("a facet's offsets do not match its keys")
    return {key: rows[offsets[i] : offsets[i + 1]] for i, key in enumerate(keys)}
