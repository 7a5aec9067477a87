"""Print the shape of the import graph: modules and packages per top-level package, import
cycles, layers (the longest chain of imports between strongly connected groups) and the
imports inside a cycle (each of them goes back up). Whether imports follow the declared
layers is checked by the import-linter contracts in ``.importlinter``.

    .venv/bin/python scripts/architecture.py          # the figures
    .venv/bin/lint-imports                           # the contracts themselves
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("capdisc", "capdisc_workers", "capdisc_producers")


def _graph() -> nx.DiGraph:
    for folder in ("shared", "workers", "producers"):
        sys.path.insert(0, str(ROOT / folder))
    imports = grimp.build_graph(*PACKAGES, cache_dir=None)
    graph = nx.DiGraph()
    for module in imports.modules:
        if module.split(".")[0] in PACKAGES:
            graph.add_node(module)
            for imported in imports.find_modules_directly_imported_by(module):
                if imported.split(".")[0] in PACKAGES:
                    graph.add_edge(module, imported)
    return graph


def _is_package(module: str) -> bool:
    parts = module.split(".")
    top = {"capdisc": "shared", "capdisc_workers": "workers", "capdisc_producers": "producers"}[
        parts[0]
    ]
    return (ROOT / top / Path(*parts) / "__init__.py").is_file()


def main() -> None:
    graph = _graph()
    for top in PACKAGES:
        modules = [m for m in graph if m.split(".")[0] == top]
        packages = [m for m in modules if _is_package(m)]
        print(f"{top}: {len(modules) - len(packages)} modules in {len(packages)} packages")
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    print(f"import cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))
    condensed = nx.condensation(graph)
    print(f"layers (longest import chain): {nx.dag_longest_path_length(condensed) + 1}")
    within = sum(
        1 for a, b in graph.edges if condensed.graph["mapping"][a] == condensed.graph["mapping"][b]
    )
    print(f"imports inside a cycle (going back up): {within}")


if __name__ == "__main__":
    main()
