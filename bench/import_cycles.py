"""Import cycles among the repository's packages (bench and ortprep by default), from the import graph.

    .venv/bin/python -m bench.import_cycles [PACKAGE ...]

The graph is grimp's (what import-linter reads): every ``import`` and ``from ... import`` in a
module, those inside functions included (the bench's old cycle ran through such imports), without
the implicit import of a package's ``__init__`` by its submodules. Prints each cycle found (one per
strongly connected component of more than one module, or a module importing itself) and exits 1
where there is one.
"""

from __future__ import annotations

import sys

import grimp


def components(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of the import graph with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1 or node in graph.find_modules_directly_imported_by(node):
                    found.append(sorted(members))
    return found


def main(argv: list[str]) -> int:
    packages = argv or ["bench", "ortprep"]
    graph = grimp.build_graph(*packages, include_external_packages=False)
    cycles = components(graph)
    for members in cycles:
        path = graph.find_shortest_chain(members[0], members[0]) if len(members) == 1 else None
        print(f"cycle among {len(members)} module(s): {', '.join(members)}" + (f" ({path})" if path else ""))
    print(f"{len(graph.modules)} modules in {', '.join(packages)}: {len(cycles)} import cycle(s)")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
