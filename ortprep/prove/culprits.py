"""A failing session reduced to the nodes that cause it (``check --prove``).

:func:`reduce_failure` searches the main graph's *units* (:class:`~ortprep.transforms.off_ep.GraphCut`:
a node with the activation Q/DQ nodes of its QDQ node unit, or an If/Loop/Scan node with its
subgraphs whole). A probe is a model of its own holding a set of units, built into a session by
the caller's ``fails`` callback (on a worker, with its timeout). The search is the reduction
engine's (:mod:`ortprep.prove.reduction`): bisection to the shortest window that fails alone, then
ddmin to a 1-minimal set; with ``find_all`` it goes on among the other units (same-signature
units first) until the rest of the graph no longer fails alone. Bounded by one :class:`Budget`.
Figures behind the bounds: docs/decisions/reduce-prove-bounds.md.
"""

from __future__ import annotations

import dataclasses
import time
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from ortprep.model import ModelHandle
from ortprep.prove.reduction import Budget, Progress, Stopped, ddmin, shortest_window
from ortprep.transforms.off_ep import CutError, GraphCut, describe_node, has_subgraphs

log = logging.getLogger(__name__)

# Probe sessions and seconds for one reduction (docs/decisions/reduce-prove-bounds.md).
MAX_PROBES = 100
MAX_SECONDS = 120.0
# Occurrences of a culprit's pattern tried alone before a new bisection (one probe each, small
# ones): a real model repeats its blocks, and so its culprits.
MAX_SIMILAR = 24

Fails = Callable[[str], tuple[bool, str]]


def default_budget() -> Budget:
    return Budget(MAX_PROBES, MAX_SECONDS)


def started(bound: Budget | None, default: Budget, progress: Progress | None) -> Budget:
    """A fresh account of ``bound`` (or ``default``): its limits, no probe spent, its clock from now."""
    return dataclasses.replace(bound or default, started=time.monotonic(), used=0, progress=progress, parent=None)


def _failure_key(message: str) -> tuple[frozenset[str], str]:
    """What makes two failures the same: the EP's error identifiers (QNN_COMMON_ERROR_MEM_ALLOC)
    and codes, else the message's first words without names and numbers."""
    identifiers = frozenset(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", message or ""))
    words = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "", (message or "").split(".")[0]).strip().lower()
    return identifiers, words


def _same_failure(expected: tuple[frozenset[str], str] | None, message: str) -> bool:
    if expected is None:
        return True
    identifiers, words = expected
    found_identifiers, found_words = _failure_key(message)
    if identifiers:
        return identifiers <= found_identifiers
    return not words or words == found_words


class _Search:
    def __init__(self, cut: GraphCut, fails: Fails, budget: Budget, workdir: str, expected) -> None:
        self.cut, self.fails, self.budget, self.workdir, self.expected = cut, fails, budget, workdir, expected
        self.results: dict[frozenset[int], bool] = {}
        self.messages: dict[frozenset[int], str] = {}
        self.cut_errors: dict[frozenset[int], str] = {}
        self.best: list[int] | None = None  # the smallest set known to fail, for a stopped search
        self.count = 0

    def test(self, units: Sequence[int]) -> bool:
        import onnx

        key = frozenset(units)
        if key in self.results:
            return self.results[key]
        try:
            model = self.cut.probe(sorted(key))
        except CutError as exc:
            self.cut_errors[key] = exc.message
            self.results[key] = False
            return False
        self.budget.spend()
        self.count += 1
        path = os.path.join(self.workdir, f"probe{self.count}.onnx")
        large = sum(t.ByteSize() for t in model.graph.initializer) > 1_500_000_000
        onnx.save_model(model, path, save_as_external_data=large, location=f"probe{self.count}.onnx.data")
        try:
            failed, message = self.fails(path)
        finally:
            for leftover in (path, f"{path}.data"):
                if os.path.exists(leftover):
                    os.remove(leftover)
        matched = bool(failed) and _same_failure(self.expected, message)
        if failed and not matched:
            log.info("probe of %d unit(s) failed otherwise: %s", len(key), message)
        self.results[key] = matched
        if matched:
            self.messages[key] = message
            if self.best is None or len(key) <= len(self.best):
                self.best = sorted(key)
        self.budget.report()
        return matched

    def known_to_fail(self, units: Sequence[int]) -> bool:
        return self.results.get(frozenset(units), False)


def reduce_failure(handle: ModelHandle, fails: Fails, *, message: str | None = None, bound: Budget | None = None,
                   progress: Progress | None = None, find_all: bool = True) -> dict[str, Any]:
    """The units of ``handle``'s main graph that make a session fail, as 1-minimal sets
    (bisection to a window, then ddmin; with ``find_all`` every culprit until the rest of the
    graph no longer fails alone).

    ``fails(model_path)`` builds the probe's session (on a worker) and answers (failed?, EP
    message); with ``message`` (the failing session's own) a probe counts only when it fails the
    same way (the same EP error identifiers). ``bound``: at most that many probe sessions and
    seconds (default :func:`default_budget`); ``progress(done, bound)`` after each probe session, and
    ``progress(done, done)`` at the end.

    The record: ``nodes`` (every culprit node: name, op_type, attributes, input and output
    dtype[shape]), ``culprits`` (each set: its node names, the Q/DQ and constant nodes that came
    along, the EP's message for it, ``found_by`` "ddmin" or "pattern" (another occurrence of a
    set ddmin reduced, tried whole), ``minimal``), ``probes``, ``seconds``, ``message``, ``bound``,
    ``units``, ``control_flow`` (If/Loop/Scan nodes searched as opaque units); ``stopped`` when the
    bound ended the search (``nodes`` then holds what was found, ``partial`` the smallest set known
    to fail); ``cut_errors`` when some probes could not be built (why: a value of unknown type, at
    which node), and then a culprit set that contains such a subset says ``minimal: false``;
    ``reason`` when no culprit is named."""
    import tempfile

    budget = started(bound, default_budget(), progress)
    cut = GraphCut(handle.proto, handle.folder)
    record: dict[str, Any] = {"nodes": [], "culprits": [], "probes": 0, "seconds": 0.0, "message": "",
                              "bound": budget.to_record(), "units": len(cut.units),
                              "method": "bisection to a window, ddmin in it, then the set's pattern elsewhere",
                              "control_flow": [cut.label(u[0]) for u in cut.units
                                               if len(u) == 1 and has_subgraphs(cut.nodes[u[0]])]}
    if not cut.units:
        record["reason"] = "the main graph holds only constant work; no part of it can fail alone"
        return record
    expected = _failure_key(message) if message else None
    found: list[list[int]] = []
    with tempfile.TemporaryDirectory(prefix="ortprep-reduce-") as workdir:
        search = _Search(cut, fails, budget, workdir, expected)
        remaining = list(range(len(cut.units)))
        by_pattern: set[frozenset[int]] = set()
        floor = 0
        try:
            while remaining:
                if found and not search.test(remaining):
                    break  # the rest of the graph no longer fails alone
                window = shortest_window(remaining, search.test, floor)
                if not search.known_to_fail(window) and not search.test(window):
                    record["reason"] = _no_window_reason(search, len(found))
                    break
                culprit = ddmin(window, search.test)
                found.append(culprit)
                if not find_all:
                    break
                _alike(search, culprit, remaining, found, by_pattern)
                taken = {u for group in found for u in group}
                remaining = [u for u in remaining if u not in taken]
                floor = window[-1]  # no prefix of the rest ending before this fails (it did not before)
        except Stopped as stop:
            record["stopped"] = f"{stop}: {len(found)} culprit set(s) found so far"
            if search.best is not None and not any(set(search.best) == set(group) for group in found):
                record["partial"] = [cut.label(i) for u in search.best for i in cut.main_nodes(u)]
    budget.finish()
    record["probes"], record["seconds"] = budget.used, budget.elapsed
    for group in found:
        names = [cut.label(i) for u in group for i in cut.main_nodes(u)]
        carried = sorted(cut.with_constant_work({i for u in group for i in cut.units[u]})
                         - {i for u in group for i in cut.main_nodes(u)})
        # 1-minimal among the subsets that could be built: one that could not be is untested
        untested = any(key < frozenset(group) for key in search.cut_errors)
        alike = frozenset(group) in by_pattern
        record["culprits"].append({"nodes": names, "with": [cut.label(i) for i in carried],
                                   "message": search.messages.get(frozenset(group), ""),
                                   "found_by": "pattern" if alike else "ddmin",
                                   # a single unit that fails is minimal; a set found by its likeness to one
                                   # ddmin reduced fails, but its own subsets were not tried
                                   "minimal": not untested and (not alike or len(group) == 1)})
        record["nodes"].extend(describe_node(cut, i) for u in group for i in cut.main_nodes(u))
    if search.cut_errors:
        record["cut_errors"] = sorted(set(search.cut_errors.values()))[:5]
    if found:
        record["message"] = record["culprits"][0]["message"]
    elif "reason" not in record and "stopped" not in record:
        record["reason"] = _no_window_reason(search, 0)
    return record


def _alike(search: _Search, group: list[int], remaining: list[int], found: list[list[int]],
           by_pattern: set[frozenset[int]]) -> None:
    """Other occurrences of a culprit set that fail alone (one probe each), added to ``found`` as
    they are: units with the same signatures, wired to each other the same way (a real model
    repeats its blocks, and so its culprits: an SE block's HardSigmoid, a written-out GELU)."""
    taken = {u for known in found for u in known}
    pool = [u for u in remaining if u not in taken]
    for occurrence in _occurrences(search.cut, group, pool)[:MAX_SIMILAR]:
        if search.test(occurrence):
            found.append(occurrence)
            by_pattern.add(frozenset(occurrence))


def _occurrences(cut: GraphCut, group: list[int], pool: list[int]) -> list[list[int]]:
    members = sorted(group)
    signatures = [cut.signature(u) for u in members]
    # (i, j, rank, slot): member j's node at ``rank`` reads, at input ``slot``, a value member i makes
    edges = []
    for j, unit in enumerate(members):
        for rank, index in enumerate(cut.units[unit]):
            for slot, name in enumerate(cut.nodes[index].input):
                source = cut.producer.get(name)
                if source is not None and cut.unit_of.get(source) in members and cut.unit_of[source] != unit:
                    edges.append((members.index(cut.unit_of[source]), j, rank, slot))
    linked, frontier = {0}, [0]
    while frontier:
        at = frontier.pop()
        for i, j, _, _ in edges:
            for a, b in ((i, j), (j, i)):
                if a == at and b not in linked:
                    linked.add(b)
                    frontier.append(b)
    if len(linked) != len(members):
        return []  # a set in pieces: no wiring to follow from one anchor
    available = set(pool)
    results: list[list[int]] = []
    for anchor in pool:
        if anchor in members or cut.signature(anchor) != signatures[0]:
            continue
        mapping = {0: anchor}
        progress = True
        while progress and len(mapping) < len(members):
            progress = False
            for i, j, rank, slot in edges:
                if i in mapping and j not in mapping:
                    made = {out for index in cut.units[mapping[i]] for out in cut.nodes[index].output if out}
                    users = {cut.unit_of.get(user) for name in made for user in cut.consumers.get(name, [])}
                    for candidate in sorted(users - {None}):
                        if candidate in available and candidate not in mapping.values() and \
                                cut.signature(candidate) == signatures[j] and _reads(cut, candidate, rank, slot, made):
                            mapping[j] = candidate
                            progress = True
                            break
                elif j in mapping and i not in mapping:
                    unit = cut.units[mapping[j]]
                    if rank < len(unit) and slot < len(cut.nodes[unit[rank]].input):
                        source = cut.producer.get(cut.nodes[unit[rank]].input[slot])
                        candidate = cut.unit_of.get(source) if source is not None else None
                        if candidate in available and candidate not in mapping.values() and \
                                cut.signature(candidate) == signatures[i]:
                            mapping[i] = candidate
                            progress = True
        if len(mapping) == len(members):
            occurrence = sorted(mapping.values())
            if occurrence not in results:
                results.append(occurrence)
    return results


def _reads(cut: GraphCut, unit: int, rank: int, slot: int, made: set[str]) -> bool:
    nodes = cut.units[unit]
    return rank < len(nodes) and slot < len(cut.nodes[nodes[rank]].input) and cut.nodes[nodes[rank]].input[slot] in made


def _no_window_reason(search: _Search, found: int) -> str:
    if search.cut_errors:
        return "the graph cannot be cut there: " + next(iter(search.cut_errors.values()))
    if found:
        return "the rest of the graph does not fail alone"
    return ("no part of the graph fails alone the way the whole model does: the failure needs the whole graph "
            "(or the EP fails the probes otherwise)")


