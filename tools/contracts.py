"""import-linter contracts of this repository's own (named in pyproject's ``contract_types``).

``acyclic_modules``: no import cycle between any two modules of a package, the package's own
``__init__`` included. The stock ``acyclic_siblings`` compares the children of each package, so it
misses a package's ``__init__`` that imports a child which imports the package back (a package is
not its children's sibling). Every import counts, those inside functions too.
"""

from __future__ import annotations

from importlinter.application import contract_utils, output
from importlinter.application.contract_utils import AlertLevel
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules

MAX_CYCLES_TO_RENDER = 20


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of a directed graph, without recursion; only those of
    more than one node (a module importing itself is no cycle here)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def cycle_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle through the component's first module, for the message (a shortest way back)."""
    start = component[0]
    members = set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(edges.get(node, ())):
                if successor not in members:
                    continue
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if successor not in came_from:
                    came_from[successor] = node
                    following.append(successor)
        frontier = following
    return component


class AcyclicModulesContract(Contract):
    """No cycle in the import graph of the modules under ``packages`` (their ``__init__`` included)."""

    type_name = "acyclic_modules"

    packages = fields.SetField(subfield=fields.ModuleExpressionField())
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(AlertLevel, default=AlertLevel.ERROR)

    def check(self, graph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph, ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=self.unmatched_ignore_imports_alerting,  # type: ignore[arg-type]
        )
        packages = module_expressions_to_modules(graph, sorted(self.packages), raise_if_unmatched=True)  # type: ignore
        modules: set[str] = set()
        for package in packages:
            modules.add(package.name)
            modules |= graph.find_descendants(package.name)
        edges = {module: graph.find_modules_directly_imported_by(module) & modules for module in modules}
        cycles = [cycle_in(component, edges) for component in strongly_connected(edges)]
        return ContractCheck(kept=not cycles, warnings=list(removal.warnings),
                             ignored_import_count=removal.ignored_import_count, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        cycles = check.metadata["cycles"]
        output.print_error(f"{len(cycles)} import cycle(s) between modules:")
        output.new_line()
        for cycle in cycles[:MAX_CYCLES_TO_RENDER]:
            output.print_error("- " + " -> ".join(cycle))
        if len(cycles) > MAX_CYCLES_TO_RENDER:
            output.print_error(f"(and {len(cycles) - MAX_CYCLES_TO_RENDER} more)")
        output.new_line()
