"""tools/contracts.py: the acyclic_modules import-linter contract sees what acyclic_siblings does
not, a package's __init__ and a child of it importing each other."""

from __future__ import annotations

import grimp
import pytest

from tools.contracts import AcyclicModulesContract, strongly_connected  # tools/: on the path by conftest.py


def _graph(imports: list[tuple[str, str]]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.sub", "pkg.sub.a", "pkg.sub.b", "pkg.c"):
        graph.add_module(module)
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported)
    return graph


def _check(imports: list[tuple[str, str]]):
    contract = AcyclicModulesContract(name="acyclic", session_options={"root_packages": ["pkg"]},
                                      contract_options={"packages": ["pkg"]})
    return contract.check(_graph(imports), verbose=False)


def test_a_package_init_and_its_child_importing_each_other_is_a_cycle():
    check = _check([("pkg.sub", "pkg.sub.a"), ("pkg.sub.a", "pkg.sub")])
    assert not check.kept
    assert check.metadata["cycles"] == [["pkg.sub", "pkg.sub.a", "pkg.sub"]]


def test_a_cycle_through_three_modules_is_named_in_order():
    check = _check([("pkg.sub.a", "pkg.sub.b"), ("pkg.sub.b", "pkg.c"), ("pkg.c", "pkg.sub.a")])
    assert not check.kept
    assert check.metadata["cycles"] == [["pkg.c", "pkg.sub.a", "pkg.sub.b", "pkg.c"]]


@pytest.mark.parametrize("imports", [[], [("pkg.sub", "pkg.sub.a"), ("pkg.sub.a", "pkg.sub.b"), ("pkg.c", "pkg.sub")]])
def test_imports_that_run_one_way_are_kept(imports):
    assert _check(imports).kept


def test_strongly_connected_leaves_out_single_modules():
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"c", "a"}}) == [["a", "b"]]
