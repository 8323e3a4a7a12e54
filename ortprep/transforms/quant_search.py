"""The accuracy-aware search of `quantize --auto-exclude`: which nodes to keep in float.

Each trial quantizes (in a child) with a set of nodes kept in float and evaluates the result on
the held-back samples. The search:
1. tries op-type rules known to matter (Softmax, LayerNormalization, the MatMuls of attention,
   the heads that write the outputs), each kept only when it measurably helps;
2. ranks every node still quantized by the error it adds (its output compared with the float
   model's against what its inputs already carried, the per-tensor comparison ORT's
   qdq_loss_debug makes) and bisects the ranked list for the fewest nodes that pass the gate;
3. stops when the gate passes with a margin (half-way from the gate to 1: a result chosen on a
   few held-back samples must hold on others), or when passing would keep more than ``max_float_share`` of the
   quantized nodes in float, and says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from ortprep.model import iter_graphs

IMPROVES = 1e-4  # a rule must raise the lowest cosine by at least this much to stay


@dataclass
class Trial:
    label: str
    kept: list[str]
    cosine: float | None
    passed: bool
    size: int
    path: Path | None = None
    error: str | None = None

    def to_record(self, size_before: int) -> dict:
        return {"label": self.label, "kept_in_float": len(self.kept), "cosine": self.cosine, "passed": self.passed,
                "size_ratio": round(self.size / size_before, 4) if size_before and self.size else None,
                "error": self.error}


@dataclass
class SearchResult:
    best: Trial
    trials: list[Trial] = field(default_factory=list)
    rules: list[dict] = field(default_factory=list)  # {"rule", "nodes", "cosine_before", "cosine_after", "kept"}
    ranked: list[dict] = field(default_factory=list)  # {"tensor", "nodes", "noise"} in rank order
    stopped: str = ""
    reasons: dict[str, str] = field(default_factory=dict)  # kept node -> why


def rule_sets(proto: onnx.ModelProto) -> list[tuple[str, list[str]]]:
    """(rule, node names) for the op-type rules that apply to this model."""
    graph = proto.graph
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    rules = [
        ("Softmax", [n.name for n in graph.node if n.op_type == "Softmax"]),
        ("LayerNormalization", [n.name for n in graph.node if n.op_type in ("LayerNormalization", "SimplifiedLayerNormalization")]),
        ("attention MatMuls (both inputs computed)",
         [n.name for n in graph.node if n.op_type == "MatMul" and not any(i in constants for i in n.input)]),
        ("heads (the last Conv/MatMul/Gemm before each output)", heads(proto)),
    ]
    return [(label, names) for label, names in rules if names]


COMPUTE = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def heads(proto: onnx.ModelProto) -> list[str]:
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    found: list[str] = []
    for value in graph.output:
        queue, seen = [value.name], set()
        while queue:
            node = producers.get(queue.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            if node.op_type in COMPUTE:
                if node.name not in found:
                    found.append(node.name)
                continue
            queue.extend(node.input)
    return found


class Search:
    """Runs trials through ``attempt(kept, label) -> Trial`` (quantize + evaluate) and ``rank(trial,
    kept) -> [(tensor, nodes, noise)]``: the quantized tensors of a trial's model, worst first, each
    with the nodes to keep in float so that it stays float (its producer and its consumers)."""

    def __init__(self, float_proto: onnx.ModelProto, attempt: Callable[[list[str], str], Trial],
                 rank: Callable[[Trial, list[str]], list[tuple[str, list[str], float]]], *, quantizable_nodes: set[str],
                 max_float_share: float, max_trials: int, fixed: list[str], aim: float | None = None) -> None:
        self.names = {n.name for _, g in iter_graphs(float_proto.graph) for n in g.node}
        self.aim = aim
        self.float_proto = float_proto
        self.attempt = attempt
        self.rank = rank
        graph = float_proto.graph
        constants = {t.name for t in graph.initializer}
        inits = {t.name: tuple(t.dims) for t in graph.initializer if int(np.prod(t.dims)) >= 16}
        producers = {out: node for node in graph.node for out in node.output}
        # A node kept in float still reads quantized values when the node that writes its input
        # is quantized (the quantizer puts Q/DQ on a tensor when either side is quantized): to
        # keep a node's computation float, its inputs' producers go with it.
        self.closure = {
            node.name: [node.name] + [producers[i].name for i in node.input
                                      if i in producers and i not in constants and producers[i].op_type != "Constant"]
            for node in graph.node
        }
        self.share = max_float_share
        # "worth it" is about the weights: at most this share of the quantizable weight elements
        # may stay float (nodes without weights cost nothing here; QNT002 says when nothing at all
        # ends up quantized)
        self.cost = {node.name: sum(int(np.prod(inits[i])) for i in node.input if i in inits) for node in graph.node}
        total = sum(self.cost[n.name] for n in graph.node if n.name in quantizable_nodes)
        self.budget = max_float_share * total if total else float("inf")
        self.max_trials = max_trials
        self.fixed = list(fixed)

    def run(self, baseline: Trial) -> SearchResult:
        result = SearchResult(best=baseline, trials=[baseline])
        current = baseline
        kept = list(self.fixed)
        reasons: dict[str, str] = {}

        def trial(nodes: list[str], label: str) -> Trial | None:
            if len(result.trials) >= self.max_trials:
                return None
            outcome = self.attempt(nodes, label)
            result.trials.append(outcome)
            return outcome

        for label, names in rule_sets(self.float_proto):
            if self.ok(current):
                break
            extra = [n for n in dict.fromkeys(m for name in names for m in self.closure.get(name, [name])) if n not in kept]
            if not extra or not self.fits(kept + extra):
                continue
            outcome = trial(kept + extra, f"rule: {label}")
            if outcome is None:
                break
            helped = (outcome.cosine is not None and (current.cosine is None or outcome.cosine > current.cosine + IMPROVES))
            result.rules.append({"rule": label, "nodes": len(extra), "cosine_before": current.cosine,
                                 "cosine_after": outcome.cosine, "kept": helped})
            if helped:
                kept += extra
                for name in extra:
                    reasons[name] = f"rule: {label} (cosine {_fmt(current.cosine)} -> {_fmt(outcome.cosine)})"
                current = outcome
        if self.ok(current):
            result.best, result.stopped, result.reasons = current, "the gate passed with the margin", reasons
            return result
        passes = 0
        while True:
            passes += 1
            units = self._units(current, kept)
            result.ranked += [{"pass": passes, "tensor": label, "nodes": members, "noise": round(score, 4)}
                              for label, members, score in units]

            def prefix(count: int, units=units) -> list[str]:
                return list(dict.fromkeys(n for _, members, _ in units[:count] for n in members))

            if not units:
                result.best, result.stopped = current, "no quantized tensor left adds measurable error"
                break
            high = len(units)
            while high > 0 and not self.fits(kept + prefix(high)):
                high -= 1
            if high <= 0:
                result.best = current
                result.stopped = (f"keeping more in float would leave less than {1 - self.share:.0%} of the weights "
                                  "quantized")
                break
            top = trial(kept + prefix(high), f"ranked (pass {passes}): worst {high} tensor(s), {len(prefix(high))} node(s)")
            if top is None:
                result.best, result.stopped = current, f"the trial limit ({self.max_trials}) was reached"
                break
            if self.ok(top):
                low, best = 0, top
                while high - low > 1:
                    middle = (low + high) // 2
                    outcome = trial(kept + prefix(middle),
                                    f"ranked (pass {passes}): worst {middle} tensor(s), {len(prefix(middle))} node(s)")
                    if outcome is None:
                        break
                    if self.ok(outcome):
                        high, best = middle, outcome
                    else:
                        low = middle
                self._explain(units[:high], reasons)
                result.best, result.stopped = best, "the gate passed with the margin"
                break
            if top.cosine is None or (current.cosine is not None and top.cosine <= current.cosine + IMPROVES):
                result.best = current
                result.stopped = (f"keeping the {len(prefix(high))} nodes around the {high} worst-ranked tensors in float "
                                  "did not improve the result")
                break
            # better but not there: keep them, and rank again on the new result (the next error source shows)
            self._explain(units[:high], reasons)
            kept += prefix(high)
            current = top
        result.reasons = reasons
        return result

    def ok(self, trial: Trial) -> bool:
        """A trial the search accepts: it passes the gate, and its lowest cosine reaches ``aim``
        (above the gate: the held-back samples are few, and the result must hold on others)."""
        return trial.passed and (self.aim is None or trial.cosine is None or trial.cosine >= self.aim)

    def fits(self, nodes: list[str]) -> bool:
        unique = set(nodes)
        return sum(self.cost.get(n, 0) for n in unique) <= self.budget

    def _units(self, current: Trial, kept: list[str]) -> list[tuple[str, list[str], float]]:
        units = []
        for label, nodes, score in self.rank(current, kept):
            members = [self._float_name(n) for n in nodes]
            members = [n for n in dict.fromkeys(members) if n and n not in kept]
            if members:
                units.append((label, members, score))
        return units

    @staticmethod
    def _explain(units, reasons: dict[str, str]) -> None:
        for position, (label, members, score) in enumerate(units, start=1):
            for name in members:
                reasons.setdefault(name, f"ranked #{position}: keeps tensor '{label}' float (quantization noise {score:.3g} "
                                         "of its median magnitude)")

    def _float_name(self, name: str) -> str | None:
        """The float model's node for a node of the quantized model (dynamic quantization renames
        the nodes it replaces: NAME_quant)."""
        if name in self.names:
            return name
        for suffix in ("_quant", "_Quant"):
            if name.endswith(suffix) and name[: -len(suffix)] in self.names:
                return name[: -len(suffix)]
        return None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
