"""Reducing a session that an EP refuses to the nodes that cause it, and measuring what makes it
work (``check --prove``).

:func:`reduce_failure` searches the main graph's *units*: a node with the activation Q/DQ nodes
of its QDQ node unit, or an If/Loop/Scan node with its subgraphs whole (opaque: the outer-scope
values they read are provided like any input). Constant work (Constant nodes, nodes that read only
constants: weight DequantizeLinear, shape arithmetic on static shapes) is not searched; it comes
along with the units that read it. A probe is a model of its own holding a set of units: its inputs
are the values the set reads from outside (typed from shape inference), its outputs the values it
makes that something outside reads; several connected components are one valid model. Each probe
is built into a session by the caller's ``fails`` callback (on a worker, with its timeout).

The search: two binary searches over the node order narrow to the shortest window that fails
alone, then delta debugging over sets (ddmin, as Polygraphy's ``debug reduce``) reduces the window
to a 1-minimal set: it fails, and without any one of its units it does not. With ``find_all`` the
search goes on among the other units (same-signature units first, one probe each) until the rest
of the graph no longer fails alone: every culprit, not only the first. Bounded by a number of
probe sessions and a deadline (:class:`Bound`), reported through ``progress(done, bound)``.

:func:`find_fix` measures what makes the failing session work, within its own bound: provider
options first (QNN: other SoCs, then device-independent options), then a graph change that keeps
the culprit units off the EP (:func:`keep_off_ep`), verified by a session on the EP and by the
original's and the rewrite's outputs on the CPU EP.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError
from ortprep.model import ModelHandle
from ortprep.transforms.off_ep import QDQ_OPS, CutError, GraphCut, describe_node, has_subgraphs, keep_off_ep

log = logging.getLogger(__name__)

# A probe session costs 0.2-0.4 s when QNN's simulator refuses it and up to about 1 s when it
# finalizes a large probe (measured, onnxruntime-qnn 2.7.0: 60 probes took 17-29 s on real OCR and
# detector models of 300-600 nodes); the deadline bounds the search where sessions are slower.
MAX_PROBES = 100
MAX_SECONDS = 120.0
# The fix search: one session per candidate, four CPU sessions to verify a graph change, one per
# culprit set when pruning it.
MAX_FIX_SESSIONS = 40
MAX_FIX_SECONDS = 120.0
# Occurrences of a culprit's pattern tried alone before a new bisection (one probe each, small
# ones): a real model repeats its blocks, and so its culprits.
MAX_SIMILAR = 24


# QNN provider options tried in this order by find_fix (each: key, value, what it means). The
# first four move the session to another SoC; the others keep the device. Measured on the HTP
# simulator (onnxruntime 1.32 + onnxruntime-qnn 2.7.0, 2026-11-24): a strided depthwise Conv and a
# ReduceSum -> Mul that fail at finalize with soc_model unset or 30 finalize with 60/57/69/43; none
# of htp_arch 73, vtcm_mb 8, htp_graph_finalization_optimization_mode 3 or
# enable_htp_fp16_precision 0 changes that. enable_htp_graph_splitting 1 crashes the process
# (SIGSEGV), so it is not tried.
QNN_OPTION_CANDIDATES: tuple[tuple[str, str, str], ...] = (
    ("soc_model", "60", "Snapdragon X Elite (another SoC)"),
    ("soc_model", "57", "Snapdragon 8 Gen 3 (another SoC)"),
    ("soc_model", "69", "Snapdragon 8 Elite (another SoC)"),
    ("soc_model", "43", "Snapdragon 8 Gen 2 (another SoC)"),
    ("htp_arch", "73", "HTP architecture v73"),
    ("vtcm_mb", "8", "8 MB of VTCM"),
    ("htp_graph_finalization_optimization_mode", "3", "the most thorough graph finalization"),
    ("enable_htp_fp16_precision", "0", "float models in fp32 precision"),
)
DEVICE_KEYS = ("soc_model", "htp_arch")
FLOAT_ONLY_KEYS = ("enable_htp_fp16_precision",)

Fails = Callable[[str], tuple[bool, str]]
# (created?, EP message) or (created?, EP message, ORT's assignment {node name: EP} when created)
Session = Callable[[str, dict[str, str]], tuple]
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Bound:
    """At most ``probes`` sessions and ``seconds`` of wall time for one search; a session under
    way when the deadline passes finishes (each has the caller's own timeout)."""

    probes: int = MAX_PROBES
    seconds: float = MAX_SECONDS

    def to_record(self) -> dict[str, Any]:
        return {"probes": self.probes, "seconds": self.seconds}


class _Stopped(Exception):
    pass


class _Budget:
    def __init__(self, bound: Bound, progress: Progress | None) -> None:
        self.bound = bound
        self.progress = progress
        self.started = time.perf_counter()
        self.used = 0

    def spend(self) -> None:
        if self.used >= self.bound.probes:
            raise _Stopped(f"the bound of {self.bound.probes} sessions was reached")
        if time.perf_counter() - self.started > self.bound.seconds:
            raise _Stopped(f"the deadline of {self.bound.seconds:g} s passed")
        self.used += 1

    def report(self) -> None:
        if self.progress is not None:
            self.progress(self.used, self.bound.probes)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.used, self.used)  # a bar's total becomes what was spent

    @property
    def seconds(self) -> float:
        return round(time.perf_counter() - self.started, 2)


# --------------------------------------------------------------------------- the search


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
    def __init__(self, cut: GraphCut, fails: Fails, budget: _Budget, workdir: str, expected) -> None:
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

    def window(self, order: list[int], floor: int = 0) -> list[int]:
        """The shortest window of ``order`` (which fails as a whole) that fails alone: the first
        end whose prefix fails, then the last start whose window to that end still fails.
        Prefixes ending before unit ``floor`` are known not to fail (a search before found so)."""
        low, high = next((k for k, u in enumerate(order) if u >= floor), len(order) - 1), len(order) - 1
        while low < high:
            middle = (low + high) // 2
            if self.test(order[:middle + 1]):
                high = middle
            else:
                low = middle + 1
        end = high
        low, high = 0, end
        while low < high:
            middle = (low + high + 1) // 2
            if self.test(order[middle:end + 1]):
                low = middle
            else:
                high = middle - 1
        return order[low:end + 1]

    def ddmin(self, units: list[int]) -> list[int]:
        """A 1-minimal failing subset of ``units`` (which fails): Zeller's ddmin over chunks in
        node order; the complements are tried once there are more than two chunks."""
        current, chunks_wanted = list(units), 2
        while len(current) >= 2:
            chunks = _split(current, chunks_wanted)
            reduced = False
            for chunk in chunks:
                if self.test(chunk):
                    current, chunks_wanted, reduced = chunk, 2, True
                    break
            if not reduced and chunks_wanted > 2:
                for chunk in chunks:
                    rest = [u for u in current if u not in chunk]
                    if self.test(rest):
                        current, chunks_wanted, reduced = rest, max(chunks_wanted - 1, 2), True
                        break
            if not reduced:
                if chunks_wanted >= len(current):
                    break
                chunks_wanted = min(len(current), 2 * chunks_wanted)
        return current


def _split(items: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        if end > start:
            chunks.append(items[start:end])
        start = end
    return chunks


def reduce_failure(handle: ModelHandle, fails: Fails, *, message: str | None = None, bound: Bound | None = None,
                   progress: Progress | None = None, find_all: bool = True) -> dict[str, Any]:
    """The units of ``handle``'s main graph that make a session fail, as 1-minimal sets
    (bisection to a window, then ddmin; with ``find_all`` every culprit until the rest of the
    graph no longer fails alone).

    ``fails(model_path)`` builds the probe's session (on a worker) and answers (failed?, EP
    message); with ``message`` (the failing session's own) a probe counts only when it fails the
    same way (the same EP error identifiers). ``bound``: at most that many probe sessions and
    seconds (default :class:`Bound`); ``progress(done, bound)`` after each probe session, and
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

    bound = bound or Bound()
    budget = _Budget(bound, progress)
    cut = GraphCut(handle.proto, handle.folder)
    record: dict[str, Any] = {"nodes": [], "culprits": [], "probes": 0, "seconds": 0.0, "message": "",
                              "bound": bound.to_record(), "units": len(cut.units),
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
                window = search.window(remaining, floor)
                if not search.known_to_fail(window) and not search.test(window):
                    record["reason"] = _no_window_reason(search, len(found))
                    break
                culprit = search.ddmin(window)
                found.append(culprit)
                if not find_all:
                    break
                _alike(search, culprit, remaining, found, by_pattern)
                taken = {u for group in found for u in group}
                remaining = [u for u in remaining if u not in taken]
                floor = window[-1]  # no prefix of the rest ending before this fails (it did not before)
        except _Stopped as stop:
            record["stopped"] = f"{stop}: {len(found)} culprit set(s) found so far"
            if search.best is not None and not any(set(search.best) == set(group) for group in found):
                record["partial"] = [cut.label(i) for u in search.best for i in cut.main_nodes(u)]
    budget.finish()
    record["probes"], record["seconds"] = budget.used, budget.seconds
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
                    for candidate in sorted({cut.unit_of.get(user) for name in made for user in cut.consumers.get(name, [])}
                                            - {None}):
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


# --------------------------------------------------------------------------- the fix search


def _is_float_model(cut: GraphCut) -> bool:
    """No QDQ nodes outside constant work: the EP computes it in floating point."""
    return not any(node.op_type in QDQ_OPS for index, node in enumerate(cut.nodes) if index not in cut.free)


def option_candidates(provider: str, current: dict[str, str], *, float_model: bool, keep_device: bool
                      ) -> list[tuple[str, str, str]]:
    """The provider options find_fix tries for ``provider``, in order, without those the session
    already has."""
    if provider != "QNNExecutionProvider":
        return []
    candidates = []
    for key, value, meaning in QNN_OPTION_CANDIDATES:
        if keep_device and key in DEVICE_KEYS:
            continue
        if key in FLOAT_ONLY_KEYS and not float_model:
            continue
        if current.get(key) == value:
            continue
        candidates.append((key, value, meaning))
    return candidates


def find_fix(handle: ModelHandle, culprit: dict[str, Any], session: Session, *, provider: str,
             provider_options: dict[str, str], ep_label: str, workdir: str | Path | None = None,
             command_args: Sequence[str] = (), kinds: Sequence[str] = ("provider_option", "graph"),
             keep_device: bool = False, prune: bool = True, bound: Bound | None = None,
             progress: Progress | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """Measure what makes the session of ``handle`` on ``provider`` (created with
    ``provider_options``, which failed) work, within ``bound`` (default: MAX_FIX_SESSIONS
    sessions and MAX_FIX_SECONDS seconds; the four CPU sessions that verify a graph change count).

    ``session(model_path, provider_options)`` builds the session on a worker and answers
    (created?, EP message). ``kinds``, in order: "provider_option" (one session per candidate of
    :func:`option_candidates`; ``keep_device`` skips those that change the SoC), "graph" (the
    culprit units of ``culprit``, reduce_failure's record, kept off the EP by :func:`keep_off_ep`,
    written into ``workdir``; a fix only when its session is created and its outputs on the CPU
    EP match the original's). ``command_args``: what the user's ``ortprep check`` line had after
    the model besides ``--ep``/``--prove`` (e.g. ["--device", "888"]), for the command given back.

    The record: ``kind`` ("provider_option", "graph" or None), ``options`` or ``model`` (the
    rewritten file), ``moved_nodes`` and ``verified`` for a graph change, ``command``,
    ``sessions``, ``seconds``, ``tried`` (each candidate and its outcome), ``note``; ``reason``
    when nothing worked, ``stopped`` when the bound ended the search. With ``prune`` a graph change
    that works is pruned to the nodes the whole model needs off the EP (``kept_off``; ``pruned``
    the culprits it did not need: artifacts of the probes' cuts, one session each)."""
    bound = bound or Bound(MAX_FIX_SESSIONS, MAX_FIX_SECONDS)
    budget = _Budget(bound, progress)
    cut = GraphCut(handle.proto, handle.folder)
    model_path = str(handle.path)
    record: dict[str, Any] = {"kind": None, "sessions": 0, "seconds": 0.0, "tried": [], "bound": bound.to_record()}
    found = None
    try:
        for kind in kinds:
            if kind == "provider_option":
                found = _try_options(record, budget, session, model_path, provider, provider_options,
                                     float_model=_is_float_model(cut), keep_device=keep_device)
            elif kind == "graph":
                found = _try_graph(record, budget, session, handle, culprit, provider, provider_options, workdir, timeout,
                                   prune)
            else:
                raise ValueError(f"unknown fix kind {kind!r}")
            if found is not None:
                break
    except _Stopped as stop:
        record["stopped"] = str(stop)
    budget.finish()
    record["sessions"], record["seconds"] = budget.used, budget.seconds
    if found is None:
        record["reason"] = record.get("stopped") or "no candidate made the session work: " + "; ".join(
            f"{t['candidate']}: {t['message']}" for t in record["tried"][-3:])
        return record
    record.update(found)
    record["command"] = _command(record, ep_label, list(command_args), model_path)
    return record


def _try_options(record, budget, session, model_path, provider, current, *, float_model, keep_device):
    for key, value, meaning in option_candidates(provider, current, float_model=float_model, keep_device=keep_device):
        budget.spend()
        created, message = session(model_path, {**current, key: value})[:2]
        budget.report()
        record["tried"].append({"kind": "provider_option", "candidate": f"{key}={value}", "created": bool(created),
                                "message": "" if created else message})
        if created:
            note = (f"{key}={value} builds the session for {meaning}: the model runs there, not on the device "
                    "you targeted" if key in DEVICE_KEYS else f"{key}={value}: {meaning}")
            return {"kind": "provider_option", "options": {key: value}, "note": note}
    return None


def _graph_candidates(culprit: dict[str, Any]) -> list[list[str]]:
    """Which nodes to keep off the EP, in the order find_fix tries them. A 1-minimal set no longer
    fails without any one of its nodes, so one node per set may be enough: the one with the
    smallest outputs (the CPU's share costs least), the last, the first; then every culprit node
    (in the whole model the rest of a set may fail with other nodes). Several are tried because
    QNN 2.7.0's capability is sometimes invalid around the Ifs ("set nodes that cannot be fused
    together"; ORT then gives every node to the CPU), for one choice and not another (measured on
    magika's model: the smallest-output choice, 0 nodes on QNN; the last-node choice, 86)."""
    described = {node["name"]: node for node in culprit.get("nodes", [])}

    def size(name: str) -> int:
        total = 0
        for text in described.get(name, {}).get("outputs", []):
            count = 1
            for dim in filter(None, text.partition("[")[2].rstrip("]").split(",")):
                count *= int(dim) if dim.isdigit() else 1 << 20
            total += count
        return total

    sets = [group["nodes"] for group in culprit.get("culprits", []) if group.get("nodes")] or [[n] for n in described]
    choices = [[min(reversed(names), key=size) for names in sets], [names[-1] for names in sets],
               [names[0] for names in sets], [name for names in sets for name in names]]
    unique: list[list[str]] = []
    for choice in choices:
        choice = list(dict.fromkeys(choice))
        if choice and not any(set(choice) == set(known) for known in unique):
            unique.append(choice)
    return unique


def _try_graph(record, budget, session, handle, culprit, provider, provider_options, workdir, timeout, prune):
    """Keep culprit nodes off the EP (the choices of _graph_candidates, in order) until one
    rewrite's session is created with the EP taking the rest, and its CPU outputs match; then,
    with ``prune``, drop the nodes the whole model does not need off the EP (see _prune)."""
    candidates = _graph_candidates(culprit)
    if not candidates:
        record["tried"].append({"kind": "graph", "candidate": "keep the culprit off the EP", "created": False,
                                "message": "no culprit nodes were named"})
        return None
    if workdir is None:
        raise ValueError("find_fix needs a workdir to write a graph change into")
    stem = Path(handle.path).stem if handle.path else "model"
    target = Path(workdir) / f"{stem}.off-ep.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    for number, names in enumerate(candidates):
        entry = {"kind": "graph", "candidate": f"keep {', '.join(names)} off the EP", "created": False}
        record["tried"].append(entry)
        # a file of its own per trial: a worker's session cache knows a file by path, size and mtime
        trial = target.with_suffix(f".trial{number}.onnx")
        created = _off_session(entry, budget, session, handle, names, trial, provider, provider_options)
        if trial.exists():
            os.replace(trial, target) if created else trial.unlink()
        entry["model"] = str(target) if created else None
        if not created:
            continue
        for _ in range(4):  # four CPU sessions: the original and the rewrite, optimized and not
            budget.spend()
        verified = verify_on_cpu(str(handle.path), str(target), timeout=timeout)
        budget.report()
        entry["verified"] = verified
        if not verified["cpu_outputs_match"]:
            entry["message"] = verified.get("message", "the rewrite's outputs differ from the original's on the CPU EP")
            continue
        found = {"kind": "graph", "model": str(target), "kept_off": names, "moved_nodes": entry["moved"],
                 "placement": entry.get("placement"), "verified": {"session": True, **verified}}
        if prune and len(names) > 1:
            found = _prune(found, record, budget, session, handle, provider, provider_options, timeout)
        found["note"] = (f"{len(found['moved_nodes'])} node(s) run on the CPU EP inside If nodes (both branches the "
                         "same), the rest on the EP")
        return found
    return None


def _off_session(entry, budget, session, handle, names, path: Path, provider, provider_options) -> bool:
    """Write ``handle`` with ``names`` kept off the EP to ``path`` and build its session (one):
    True when it is created and the EP takes something, but none of the moved nodes."""
    try:
        proto, moved = keep_off_ep(handle, names)
    except CutError as exc:
        entry["message"] = exc.message
        return False
    written = ModelHandle(proto=proto, path=None).save(path, force=True)
    entry["model"], entry["moved"] = str(written), moved
    budget.spend()
    outcome = session(str(written), dict(provider_options))
    budget.report()
    created, message = outcome[:2]
    entry.update(created=bool(created), message="" if created else message)
    if not created:
        return False
    assignment = outcome[2] if len(outcome) > 2 else None
    if assignment:
        # ORT's record names the nodes inside the Ifs' branches: the EP must have taken none of them,
        # and something else (else "the session works" only means "it all runs on the CPU")
        # (QNN's layout pass renames the nodes it takes: "dw" becomes "dw_token_5")
        on_ep = sorted({name for name in moved for node, ep in assignment.items()
                        if ep == provider and (node == name or node.startswith(f"{name}_token_"))})
        taken = sum(1 for ep in assignment.values() if ep == provider)
        entry["placement"] = {"moved_on_ep": on_ep, "nodes_on_ep": taken, "nodes_total": len(assignment)}
        if on_ep or not taken:
            entry["message"] = (f"the EP took moved node(s) {', '.join(on_ep)}" if on_ep else
                                "the EP took no node at all: the session works only because it all runs on the CPU")
            return False
    return True


def _prune(found, record, budget, session, handle, provider, provider_options, timeout):
    """Drop, one at a time, each node kept off the EP whose absence the whole model's session
    still survives (one session each); the rest are the culprits the model needs off the EP (a
    probe's culprit can be an artifact of the cut: a value the probe reads as its input, or
    exposes as its output, that the whole model keeps inside the EP's graph). The pruned rewrite
    is verified on the CPU EP again; where the bound ends the pruning first, the fix found stays."""
    kept, dropped = list(found["kept_off"]), []
    trial_path = Path(found["model"]).with_suffix(".pruned.onnx")
    last: dict[str, Any] = {}
    try:
        for number, name in enumerate(list(kept)):
            if len(kept) == 1:
                break
            trial = [n for n in kept if n != name]
            entry = {"kind": "graph", "candidate": f"without {name}", "created": False}
            record["tried"].append(entry)
            path = Path(found["model"]).with_suffix(f".without{number}.onnx")  # a file of its own, as above
            try:
                if _off_session(entry, budget, session, handle, trial, path, provider, provider_options):
                    kept, last = trial, entry
                    dropped.append(name)
            finally:
                path.unlink(missing_ok=True)
                entry.pop("model", None)
        if dropped:
            pruned, moved = _rewrite(handle, kept, trial_path)
            for _ in range(4):
                budget.spend()
            verified = verify_on_cpu(str(handle.path), pruned, timeout=timeout)
            budget.report()
            if verified["cpu_outputs_match"]:
                final = _rewrite(handle, kept, Path(found["model"]))[0]
                found = {**found, "model": final, "kept_off": kept, "moved_nodes": moved,
                         "placement": last.get("placement", found["placement"]), "verified": {"session": True, **verified}}
            else:
                dropped = []
    except _Stopped as stop:
        record["stopped"] = f"{stop} while pruning; the fix is the unpruned rewrite"
        dropped = []
    finally:
        for leftover in (trial_path, Path(f"{trial_path}.data")):
            leftover.unlink(missing_ok=True)
    found["pruned"] = dropped
    return found


def _rewrite(handle: ModelHandle, names: list[str], path: Path) -> tuple[str, list[str]]:
    proto, moved = keep_off_ep(handle, names)
    return str(ModelHandle(proto=proto, path=None).save(path, force=True)), moved


# Outputs of the rewrite on the CPU EP against the original's, with ORT's graph optimizations off
# (the same ops run, so the same values: this proves the rewrite computes the same function) and at
# the default level (reported: ORT's fusions may differ once nodes sit in an If; in a QDQ model
# ORT quantizes a float Conv's weights that follow a DequantizeLinear, and inside the If it no
# longer does, measured: the rewrite is then the closer one to the float model).
VERIFY_RTOL, VERIFY_ATOL = 1e-5, 1e-5


def verify_on_cpu(original: str, rewritten: str, *, timeout: float = 300.0, seed: int = 0) -> dict[str, Any]:
    """Both models on the CPU EP (a worker) on the same seeded random inputs, with graph
    optimizations off and at the default level. ``cpu_outputs_match``: with optimizations off,
    |a - b| <= atol + rtol * |a| everywhere; ``max_abs_diff`` (optimizations off) and
    ``max_abs_diff_default`` (default level); ``message`` where they could not run."""
    import onnx

    from ortprep.runtime.feeds import input_specs, random_feeds
    from ortprep.runtime.requests import RunModel
    from ortprep.runtime.worker import call

    try:
        feeds = random_feeds(input_specs(onnx.load(original, load_external_data=False)), seed=seed)
    except OrtprepError as exc:
        return {"cpu_outputs_match": False, "message": f"no inputs could be made: {exc.one_line()}"}
    result: dict[str, Any] = {"tolerance": {"rtol": VERIFY_RTOL, "atol": VERIFY_ATOL}}
    for level, key in (("disable", "max_abs_diff"), ("default", "max_abs_diff_default")):
        replies = [call(RunModel(model=path, feeds=[feeds], optimization=level), timeout=timeout)
                   for path in (original, rewritten)]
        for path, reply in zip((original, rewritten), replies):
            if not reply.ok:
                return {"cpu_outputs_match": False,
                        "message": f"{Path(path).name} did not run on the CPU EP: {reply.message}"}
        match, worst = _compare(replies[0].samples[0], replies[1].samples[0])
        result[key] = worst
        if level == "disable":
            result["cpu_outputs_match"] = match
            result["outputs"] = sorted(replies[0].samples[0])
    return result


def _compare(reference: dict[str, Any], candidate: dict[str, Any]) -> tuple[bool, float]:
    import numpy as np

    worst, match = 0.0, set(reference) == set(candidate)
    for name, value in reference.items():
        other = candidate.get(name)
        if other is None or np.shape(other) != np.shape(value):
            match = False
            continue
        a, b = np.asarray(value, dtype=np.float64), np.asarray(other, dtype=np.float64)
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b))))
            match = match and bool(np.allclose(b, a, rtol=VERIFY_RTOL, atol=VERIFY_ATOL, equal_nan=True))
    return match, worst


def _command(record: dict[str, Any], ep_label: str, command_args: list[str], model_path: str) -> str:
    """The `ortprep check` line that shows the fix working."""
    import shlex

    args = list(command_args)
    if record["kind"] == "provider_option":
        if any(key in DEVICE_KEYS for key in record["options"]):
            args = _without_device(args)
        args += [f"--provider-option={ep_label}:{key}={value}" for key, value in record["options"].items()]
        model = model_path
    else:
        model = record["model"]
    return shlex.join(["ortprep", "check", model, "--ep", ep_label, "--prove", *args])


def _without_device(args: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--device":
            skip = True
            continue
        if arg.startswith("--device="):
            continue
        kept.append(arg)
    return kept
