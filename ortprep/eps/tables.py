"""Support tables: which (domain, op, opset, dtypes) an execution provider takes.

Tables are generated data (``eps/data/*.json``, see ``tools/gen_ep_tables.py``). For the CPU
EP, ``ortprep.runtime.kernels`` builds the table from the installed ONNX Runtime's own kernel
registry when there is one, since it is exact for that build.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from enum import Enum
from importlib import resources
from typing import Any

from ortprep.model import normalize_domain

log = logging.getLogger(__name__)

OPEN_ENDED = 2**31 - 1


class SupportLevel(str, Enum):
    SUPPORTED = "supported"
    UNSUPPORTED_OP = "unsupported_op"
    UNSUPPORTED_OPSET = "unsupported_opset"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    CONDITIONAL = "conditional"  # supported only when a rule's condition holds
    UNKNOWN = "unknown"  # no data

    @property
    def runs_on_ep(self) -> bool:
        """Whether the node is counted on the EP when partitioning (conditional ones are)."""
        return self in (SupportLevel.SUPPORTED, SupportLevel.CONDITIONAL)


@dataclass(frozen=True)
class TableEntry:
    domain: str
    op: str
    since: int | None  # None: the table has no opset data for this op
    until: int | None  # None: open-ended
    types: dict[str, tuple[str, ...]] | None  # constraint name ("*" = any data input) -> dtypes
    condition: str | None = None
    src: str = ""
    dml: dict[str, Any] | None = None
    only_in_model: bool = False  # OpenVINO: rejected when the graph has <= 3 nodes and starts with it

    def covers(self, since_version: int) -> bool:
        if self.since is None:
            return True
        return self.since <= since_version <= (self.until if self.until is not None else OPEN_ENDED)


@dataclass
class SupportTable:
    ep: str
    granularity: str  # "kernel" (opset ranges and type constraints) or "op" (op names only)
    sources: dict[str, dict[str, str]]
    entries: dict[tuple[str, str], list[TableEntry]]
    constraints: list[dict[str, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def lookup(self, domain: str, op: str) -> list[TableEntry]:
        return self.entries.get((normalize_domain(domain), op), [])

    def source_text(self, src: str) -> str:
        info = self.sources.get(src)
        return f"{info['what']} ({info['version']})" if info else src

    def version(self) -> str:
        return "; ".join(info["version"] for key, info in self.sources.items() if key != "constraints")

    def summary(self) -> str:
        return "; ".join(
            f"{info['what']} [{info['version']}]" for key, info in self.sources.items() if key != "constraints"
        )


def _entry(raw: dict[str, Any]) -> TableEntry:
    types = {name: tuple(values) for name, values in raw["types"].items()} if raw.get("types") else None
    return TableEntry(
        domain=normalize_domain(raw["domain"]),
        op=raw["op"],
        since=raw.get("since"),
        until=raw.get("until"),
        types=types,
        condition=raw.get("condition"),
        src=raw.get("src", ""),
        dml=raw.get("dml"),
        only_in_model=bool(raw.get("only_in_model")),
    )


def _index(entries: list[TableEntry]) -> dict[tuple[str, str], list[TableEntry]]:
    index: dict[tuple[str, str], list[TableEntry]] = defaultdict(list)
    for entry in entries:
        index[(entry.domain, entry.op)].append(entry)
    return dict(index)


def _read_json(name: str) -> dict[str, Any]:
    path = resources.files("ortprep.eps").joinpath("data", f"{name}.json")
    return json.loads(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def load_table(ep: str) -> SupportTable:
    """The generated support table of an EP (by canonical name): the measured table over the
    documented one where a measurement exists (qnn, openvino-cpu), the documented table otherwise.
    ``ortprep.runtime.kernels.support_table`` prefers the installed ORT's own kernel registry for
    the CPU; this module never asks the installed runtime."""
    table = load_documented_table(ep)
    measured = _read_measured(ep)
    return _with_measurement(table, measured) if measured else table


def _read_measured(ep: str) -> dict[str, Any] | None:
    path = resources.files("ortprep.eps").joinpath(f"data/measured/{ep}.json")
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


_ONNX_DTYPE = {"float32": "float", "float64": "double", "bool": "bool", "str": "string", "object": "string"}
ALL_DTYPES = frozenset({"float", "double", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                        "uint32", "uint64", "bool", "string"})


def _without(types: dict[str, tuple[str, ...]] | None, failed: set[str]) -> dict[str, tuple[str, ...]]:
    """An entry's dtype constraints less the dtypes measured to fail on its data input ("*" when
    the entry had none: every dtype but those)."""
    if not types:
        return {"*": tuple(sorted(ALL_DTYPES - failed))}
    return {name: tuple(t for t in allowed if t not in failed) for name, allowed in types.items()}


def _with_measurement(table: SupportTable, measured: dict[str, Any]) -> SupportTable:
    """Ops the EP took in a probe are supported (added where the documents miss them, restricted to
    the input dtypes that ran where others were refused); documented ops it took in none of its
    probes become conditional on the measured reason; undocumented ones it never took stay out."""
    source = measured["source"]
    sources = {
        **table.sources,
        "measured": {
            "what": source["what"],
            "version": f"{source['package']}, {source['backend']}, {source['date']}".strip(", "),
        },
    }
    entries = {key: list(value) for key, value in table.entries.items()}
    rejected: dict[tuple[str, str], str] = {}
    for name, facts in measured["ops"].items():
        domain, op = name.split(":", 1)
        key = (normalize_domain(domain), op)
        if facts["ran"] or facts["qdq_ran"]:
            # Only the input-0 dtypes measured to fail are taken away (float also covers Q/DQ models,
            # whose DQ outputs are float). A dtype onnx's single-op cases never probe is not refused:
            # int32 and int64 Mul/Add were never probed, and real OpenVINO CPU and QNN sessions take them
            # (check --prove on whole models, bench/RESULTS.md, issue 20); keeping only the dtypes that
            # ran had sent them to the CPU.
            ran = {_ONNX_DTYPE.get(t, t) for t in facts["dtypes_ran"]} | ({"float"} if facts["qdq_ran"] else set())
            failed = {_ONNX_DTYPE.get(t, t) for t in facts["dtypes_failed"]} - ran
            if key not in entries:
                types = {"*": tuple(sorted(ALL_DTYPES - failed))} if failed else None
                entries[key] = [TableEntry(domain=key[0], op=op, since=None, until=None, types=types, src="measured")]
            elif failed:
                entries[key] = [
                    replace(entry, types=_without(entry.types, failed), src="measured") for entry in entries[key]
                ]
        elif op in ("QuantizeLinear", "DequantizeLinear"):
            continue  # where a Q/DQ runs depends on its position (graph I/O or inside): the rules decide
        else:
            reason = facts["reasons"][0] if facts["reasons"] else "the EP did not claim the node"
            measured_note = (f"the EP took none of {facts['probes'] + facts['qdq_probes']} single-op probes "
                             f"({reason[:160]}); prove it with ortprep load MODEL --ep {table.ep}")
            if key in entries:
                # onnx's single-op cases are not every model's form (LayerNormalization's ask for all three
                # outputs, for one), so a documented op is kept, under the measured condition.
                entries[key] = [replace(entry, condition=measured_note, src="measured") for entry in entries[key]]
            else:
                rejected[key] = measured_note
    return SupportTable(ep=table.ep, granularity=table.granularity, sources=sources, entries=entries,
                        constraints=table.constraints, extra={**table.extra, "measured_rejected": rejected})


@functools.lru_cache(maxsize=None)
def load_documented_table(ep: str) -> SupportTable:
    """The table generated from the EP's documents and source (tools/gen_ep_tables.py)."""
    raw = _read_json(ep)
    entries_raw = _read_json(raw["entries_from"])["entries"] if raw.get("entries_from") else raw["entries"]
    extra = {k: v for k, v in raw.items() if k not in ("ep", "granularity", "sources", "entries", "constraints")}
    sources = dict(raw["sources"])
    if raw.get("entries_from"):
        sources = {**_read_json(raw["entries_from"])["sources"], **sources}
    return SupportTable(
        ep=ep,
        granularity=raw["granularity"],
        sources=sources,
        entries=_index([_entry(e) for e in entries_raw]),
        constraints=raw.get("constraints", []),
        extra=extra,
    )


@dataclass(frozen=True)
class Match:
    """What a table says about one node."""

    level: SupportLevel
    reason: str
    entry: TableEntry | None = None
    src: str | None = None
    note: str | None = None  # a cost or caveat of a supported node (e.g. casts ORT inserts)


def _ranges(entries: list[TableEntry]) -> str:
    spans = sorted((e.since or 0, e.until) for e in entries)
    return ", ".join(f"{lo}+" if hi is None else (f"{lo}" if lo == hi else f"{lo}-{hi}") for lo, hi in spans)


def _dtype_problem(table: SupportTable, entry: TableEntry, node) -> str | None:
    """First input/output whose dtype the entry does not accept, described; None if all fit."""
    from ortprep.analysis import formal_types

    if not entry.types:
        return None
    if "*" in entry.types:
        allowed = entry.types["*"]
        facts = node.inputs[0] if node.inputs else None
        if facts is not None and facts.dtype and facts.dtype not in allowed:
            return f"input 0 is {facts.dtype}; {table.ep} takes {', '.join(allowed)}"
        return None
    for constraint, kind, facts in formal_types(node):
        allowed = entry.types.get(constraint)
        if allowed is None or facts is None or not facts.dtype:
            continue
        if facts.dtype not in allowed:
            return f"{kind} type {constraint}={facts.dtype}; registered: {', '.join(allowed)}"
    return None


def _float16_castable(table: SupportTable, covering: list[TableEntry], node) -> bool:
    """ORT's CPU EP casts float16 nodes to float32 when only a float kernel exists."""
    from dataclasses import replace

    from ortprep.analysis import ValueFacts

    def widened(values):
        return [
            ValueFacts("float", v.shape, v.is_initializer) if v is not None and v.dtype == "float16" else v
            for v in values
        ]

    if not any(v is not None and v.dtype == "float16" for v in node.inputs + node.outputs):
        return False
    as_float = replace(node, inputs=widened(node.inputs), outputs=widened(node.outputs))
    return any(_dtype_problem(table, entry, as_float) is None for entry in covering)


def _io_type_problem(table: SupportTable, node) -> str | None:
    allowed = table.extra.get("io_types")
    if not allowed:
        return None
    for kind, values in (("input", node.inputs), ("output", node.outputs)):
        for position, facts in enumerate(values):
            if facts is None or facts.is_initializer or not facts.dtype or facts.dtype.endswith(")"):
                continue
            if facts.dtype not in allowed:
                return f"{kind} {position} is {facts.dtype}, which {table.ep} does not take"
    return None


def _expands_to_function(node) -> bool:
    schema = node.schema
    return schema is not None and (schema.has_function or schema.has_context_dependent_function)


def match(table: SupportTable, node) -> Match:
    """Look a node (an ``analysis.NodeInfo``) up in a table: op, opset range, dtypes, conditions."""
    entries = table.lookup(node.domain, node.op_type)
    if not entries:
        # ORT inlines a function body only when no EP, the CPU included, has a kernel; on other
        # EPs the CPU kernel takes the node first.
        if table.ep == "cpu" and _expands_to_function(node):
            return Match(
                SupportLevel.CONDITIONAL,
                f"{table.ep} registers no {node.op_type} kernel; ORT expands the ONNX function body into "
                "primitive ops, which are placed one by one",
            )
        if node.domain not in ("ai.onnx", "ai.onnx.ml") and not node.domain.startswith("com.microsoft"):
            return Match(SupportLevel.UNKNOWN, f"custom domain '{node.domain}': no table knows {node.op_type}")
        measured = table.extra.get("measured_rejected", {}).get((normalize_domain(node.domain), node.op_type))
        if measured:
            return Match(SupportLevel.UNSUPPORTED_OP, f"{table.ep} has no {node.domain}:{node.op_type}; {measured}",
                         src=table.source_text("measured"))
        return Match(SupportLevel.UNSUPPORTED_OP, f"{table.ep} has no {node.domain}:{node.op_type}")
    if table.granularity == "kernel" and node.since is not None:
        covering = [e for e in entries if e.covers(node.since)]
        if not covering:
            if table.ep == "cpu" and _expands_to_function(node):
                return Match(
                    SupportLevel.CONDITIONAL,
                    f"no {node.op_type} kernel for opset {node.since}; ORT expands the ONNX function body",
                )
            return Match(
                SupportLevel.UNSUPPORTED_OPSET,
                f"{node.op_type} version {node.since} (opset {node.opset}) is outside the registered "
                f"versions {_ranges(entries)}",
                src=table.source_text(entries[0].src),
            )
    else:
        covering = entries
    problems = []
    for entry in covering:
        problem = _dtype_problem(table, entry, node)
        if problem is None:
            break
        problems.append(problem)
    else:
        if table.ep == "cpu" and _float16_castable(table, covering, node):
            entry = covering[0]
            return Match(
                SupportLevel.SUPPORTED,
                "",
                entry,
                table.source_text(entry.src),
                note="no float16 kernel on the CPU: ORT inserts Casts to float32 around it (slower, more memory)",
            )
        return Match(SupportLevel.UNSUPPORTED_DTYPE, problems[0], covering[0], table.source_text(covering[0].src))
    if entry.only_in_model and node.graph_size <= 3 and node.index == 0:
        return Match(
            SupportLevel.UNSUPPORTED_OP,
            f"{table.ep} rejects {node.op_type} as the first node of a graph of 3 nodes or fewer",
            entry,
            table.source_text(entry.src),
        )
    io_problem = _io_type_problem(table, node)
    if io_problem:
        return Match(SupportLevel.UNSUPPORTED_DTYPE, io_problem, entry, table.source_text(entry.src))
    if entry.condition:
        return Match(SupportLevel.CONDITIONAL, entry.condition, entry, table.source_text(entry.src))
    return Match(SupportLevel.SUPPORTED, "", entry, table.source_text(entry.src))
