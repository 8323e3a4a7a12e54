"""The accuracy search of `quantize --auto-exclude`: which nodes to keep in float.

Each trial quantizes (in the quantizer's child) with a set of nodes kept in float and evaluates
the result on the held-back samples. Once the baseline fails the gate:
0. a calibration method other than min/max (percentile) is tried, kept only when it helps;
1. op-type rules known to matter (Softmax, LayerNormalization, the MatMuls of attention,
   the heads that write the outputs) are tried, each kept only when it measurably helps;
2. every node still quantized is ranked by the error it adds (its output compared with the float
   model's against what its inputs already carried, the per-tensor comparison ORT's
   qdq_loss_debug makes) and the ranked list is bisected for the fewest nodes that pass the gate;
   once no tensor's noise is above NOISE_FLOOR and the gate still fails, the tensors below it are
   ranked and bisected the same way (a decision near its boundary can need less error than the
   floor deems worth keeping float), then the nodes where the error starts;
3. the search stops when the gate passes with a margin (half-way from the gate to 1: a result
   chosen on a few held-back samples must hold on others), or when passing would keep more than
   ``max_float_share`` of the quantizable weights in float, and says which;
4. where it stopped short of the gate with time left (nothing it ranks helps, or its trials were
   spent): for static QDQ with 8-bit activations on the CPU EP, the 16-bit rung (Search.widen:
   the worst-ranked tensors get 16-bit activations, weights as asked); then every node still
   quantized is ordered by the noise it adds and the order is bisected between the best trial and
   the float model, or the most ``max_float_share`` allows (Search.converge): the search ends at a
   pass, at the float model or the cap (and says which), or at the time bound. Neither runs where
   only the target EP fails (ep_only).

Where the gate is judged on the target EP too (ep_gate.py), every trial is, and the search
accepts, rejects and compares trials on the worse of the two sides (lowest cosine, norm ratio).
Only the EP's final outputs are visible, so the ranking stays the CPU side's per-tensor
quantization noise (it still finds the tensors whose precision matters, which an EP's coarser
arithmetic hurts first); and where the EP alone fails (the CPU EP passes), the nodes that write
the outputs the EP gets wrong are tried first, since an EP's own encoding or precision at an
output is the usual cause. Before those rules, where the EP alone fails, keep_off_ep_move keeps
off the EP the node where its run first parts from the CPU EP's, then the nodes alike to it
(off_target.py): kept float, the EP would still compute them, in its own kernels.

:class:`Search` holds the selection logic alone (trials and ranking are passed in);
:class:`Trials` runs trials; :func:`run_search` wires them to a model.
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.model import iter_graphs
from ortprep.options import QuantizeOptions
from ortprep.runtime.budget import EpClock
from ortprep.steps.base import ProgressCallback
from ortprep.steps.quantize.calibrate import DataPlan, run_quantizer
from ortprep.transforms.qdq.encodings import floor_weight_scales, fp16_activation_matmuls, widen_activation_encodings
from ortprep.transforms.qdq.facts import output_writers, quantization_stats
from ortprep.steps.quantize.ep_gate import GateTarget, first_divergence
from ortprep.steps.quantize.evaluate import (LATENCY_RUNS, Evaluation, Judgement, confirm_on_target, evaluate, fmt_cosine,
                                             outputs_margin_gap, tensor_noise, timed_medians,
                                             worst_nodes)
from ortprep.steps.quantize.off_target import candidate_sets, move_off_ep, movable
from ortprep.steps.quantize.presets import quantizer_op_types
from ortprep.transforms.off_ep import OFF_EP_PREFIX, QDQ_OPS
from ortprep.transforms.verify import model_bytes

IMPROVES = 1e-4  # a rule (or a calibration method) must raise the lowest cosine by at least this much to stay
NOISE_FLOOR = 0.02  # quantization noise (RMS over median magnitude) below which a tensor is not worth keeping float
NORM_IMPROVES = 5e-3  # or bring the norm ratio this much closer to 1 (a scaled output: cosine cannot show it)
# or bring the decisions this much closer to the gate (share points of agreement, measured or
# expected: decision_shortfall), where the gate fails on a decision and the cosine is already near 1
DECISION_IMPROVES = 2e-3


# a trial's error where the nodes it kept float leave nothing quantized (Trials.attempt)
FLOAT_MODEL = "nothing is quantized with these nodes kept float: this is the float model"


def margin_aim(min_cosine: float) -> float:
    """The lowest cosine the search aims for: half-way from the gate to 1."""
    return min_cosine + (1 - min_cosine) / 2


@dataclass
class Trial:
    """One quantize-and-evaluate run: the nodes it kept float and how it did (``path``: its model)."""

    label: str
    kept: list[str]
    cosine: float | None  # the lowest cosine judged (the worse of the CPU EP's and the target EP's)
    passed: bool
    size: int
    path: Path | None = None
    error: str | None = None
    norm_ratio: float | None = None  # of both sides' norm ratios, the one farthest from 1
    sides: dict | None = None  # {"judged_on", "cpu": summary, "ep": summary or None} (Judgement.summary)
    shortfall: float | None = None  # how far its held-back decisions fall short of the gate (Evaluation.shortfall); 0: none does
    off: list[str] = field(default_factory=list)  # nodes kept off the target EP (off_ep.keep_off_ep): the CPU EP runs them
    wide: list[str] = field(default_factory=list)  # activations given 16 bits (the search's 16-bit rung; weights as asked)
    # how far its decisions fall short of the decision margin (Evaluation.margin_gap); 0: they hold it
    margin_gap: float | None = None

    def to_record(self, size_before: int) -> dict:
        sides = self.sides or {}
        return {"label": self.label, "kept_in_float": len(self.kept), "kept_off_ep": len(self.off),
                "activations_16bit": len(self.wide),
                "cosine": self.cosine, "passed": self.passed,
                "size_ratio": round(self.size / size_before, 4) if size_before and self.size else None,
                "error": self.error, "norm_ratio": self.norm_ratio, "decision_shortfall": None if self.shortfall is None else round(self.shortfall, 6),
                "decision_margin_gap": None if self.margin_gap is None else round(self.margin_gap, 6),
                "judged_on": sides.get("judged_on"),
                "cpu": sides.get("cpu"), "ep": sides.get("ep")}


def reaches_margin(trial: Trial, aim: float | None) -> bool:
    """Whether ``trial`` passes the gate with the margin a chosen result must have: its lowest
    cosine at ``aim`` (margin_aim; None: no cosine aim) and its decisions' shares half-way from the
    gate to 1 (decisions.with_margin; evaluate.hold_to_margin refuses a chosen result short of it)."""
    return (trial.passed and (aim is None or trial.cosine is None or trial.cosine >= aim)
            and not (trial.margin_gap or 0.0) > 0.0)


def ep_only(trial: Trial) -> bool:
    """Whether ``trial`` passes on the CPU EP and fails on the target EP only: the EP's own error,
    which the CPU side's ranking does not see and which the float model need not escape either."""
    sides = trial.sides or {}
    return bool((sides.get("cpu") or {}).get("passed")) and (sides.get("ep") or {}).get("passed") is False


def norm_error(trial: Trial) -> float:
    return abs(trial.norm_ratio - 1.0) if trial.norm_ratio is not None else 0.0


def cpu_side(trial: Trial) -> Trial:
    """``trial`` as the CPU EP alone judged it (its cosine and norm ratio on that side)."""
    cpu = (trial.sides or {}).get("cpu") or {}
    return Trial(trial.label, trial.kept, cpu.get("cosine"), trial.passed, trial.size, trial.path, trial.error,
                 norm_ratio=cpu.get("norm_ratio"), sides=trial.sides, off=trial.off, margin_gap=cpu.get("margin_gap"))


def improved(new: Trial, old: Trial) -> bool:
    """Whether ``new`` measured better than ``old``: it passes where ``old`` fails, or its lowest
    cosine rose by IMPROVES, or (its cosine no worse) its norm ratio came NORM_IMPROVES closer to 1
    or its decisions DECISION_IMPROVES closer to the gate (a classifier whose cosine is 0.9999 and
    whose expected agreement is short of 99%: the cosine cannot show the progress). The cosine
    still comes first: on 8 held-back samples one flipped class moves the shortfall by 12.5
    points, too coarse to veto a trial whose cosine rose (tried: on ConvNeXt-tiny the veto ended
    the search earlier, 11.5 points short, where the cosine-first order reached 0.6 points).
    Where one of them was not run on the target EP (a trial the CPU EP already failed), both are
    compared on the CPU EP's figures: a cosine over both sides against one over the CPU alone
    would count the EP's error as progress."""
    if (new.path is None and new.cosine is None) or new.error == FLOAT_MODEL:
        return False
    if new.passed and not old.passed:
        return True
    if (new.passed and old.passed and new.margin_gap is not None and old.margin_gap is not None
            and new.margin_gap <= 0.0 < old.margin_gap):
        # it reaches the decision margin where the other does not, however near that one came
        # (measured: magika's A16W8, 0.18 points short, below DECISION_IMPROVES; keeping 4 nodes
        # float reached it and was not taken)
        return True
    one_sided = [trial.sides is not None and trial.sides.get("ep") is None for trial in (new, old)]
    mixed = new.sides is not None and old.sides is not None and one_sided[0] != one_sided[1]
    if mixed:
        new, old = cpu_side(new), cpu_side(old)
    if new.cosine is None:
        return False
    # (the shortfall spans the sides judged on the held-back samples: it compares only trials
    # judged on the same sides)
    shortfalls = not mixed and new.shortfall is not None and old.shortfall is not None
    if old.cosine is None or new.cosine > old.cosine + IMPROVES:
        return True
    if new.cosine < old.cosine - IMPROVES:
        return False
    decided = shortfalls and new.shortfall < old.shortfall - DECISION_IMPROVES
    if shortfalls and not decided and new.passed and old.passed and new.margin_gap is not None \
            and old.margin_gap is not None:
        # both pass the gate: the decisions' progress is toward the margin (reaches_margin)
        decided = new.margin_gap < old.margin_gap - DECISION_IMPROVES
    return decided or norm_error(new) < norm_error(old) - NORM_IMPROVES


def change(before: Trial, after: Trial) -> str:
    """'cosine a -> b' (and the norm ratio where one was measured), for reasons and messages."""
    text = f"cosine {fmt_cosine(before.cosine)} -> {fmt_cosine(after.cosine)}"
    if before.norm_ratio is not None and after.norm_ratio is not None:
        text += f", norm ratio {before.norm_ratio:.3f} -> {after.norm_ratio:.3f}"
    if before.shortfall and after.shortfall is not None and after.shortfall != before.shortfall:
        text += f", decisions short of the gate by {before.shortfall:.1%} -> {after.shortfall:.1%}"
    return text


@dataclass
class SearchResult:
    """What a search ended with, and how it got there (for the report)."""

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
    """The last Conv/ConvTranspose/MatMul/Gemm on each path back from a graph output."""
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
                 max_float_share: float, max_trials: int, fixed: list[str], aim: float | None = None,
                 first_rules: list[tuple[str, list[str]]] | None = None,
                 blame: Callable[[Trial, list[str]], list[tuple[str, str, float]]] | None = None,
                 seconds: float | None = None, started: float | None = None,
                 fine_rank: Callable[[Trial, list[str]], list[tuple[str, list[str], float]]] | None = None,
                 clock: EpClock | None = None,
                 attempt_wide: Callable[[list[str], list[str], str], Trial] | None = None) -> None:
        # attempt_wide(kept, tensors, label): a trial whose ``tensors`` get 16-bit activations (the
        # 16-bit rung, where the activations are 8-bit and the EP runs mixed widths); None: no such rung
        self.attempt_wide = attempt_wide
        # the step's time on the target EP (--ep-total-seconds): once spent, no trial can pass there
        self.clock = clock
        # no trial starts ``seconds`` after ``started`` (time.monotonic(), the quantize step's
        # start by default now); None: no time bound
        self.deadline = (time.monotonic() if started is None else started) + seconds if seconds is not None else None
        self.seconds = seconds
        self.names = {n.name for _, g in iter_graphs(float_proto.graph) for n in g.node}
        # blame(trial, kept) -> [(node, op, cosine)]: the nodes where the trial's error starts (its
        # output worse than its inputs), worst first; what the ranking by activation noise cannot
        # see (8-bit weights under 16-bit activations) shows there
        self.blame = blame
        # fine_rank(trial, kept): as rank, but every quantized tensor with any noise, the ones
        # under NOISE_FLOOR included: once nothing is above the floor and the gate still fails
        # (a decision near its boundary needs a smaller error than the floor deems worth it), the
        # search goes on through them rather than stop short of the float model
        self.fine_rank = fine_rank
        # rules tried before the op-type rules, their nodes kept float as named (the EP's outputs)
        self.first_rules = list(first_rules or [])
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
        # the nodes the quantizer would quantize, in graph order (the float end's bisection orders them)
        self.quantizable = [node.name for node in graph.node if node.name in quantizable_nodes]
        self.quantizable_set = set(self.quantizable)

    def run(self, baseline: Trial) -> SearchResult:
        """The search; where it ends short of the gate with time left, the bisection from the float
        end (converge) follows, so that it stops only at a pass, the float model, or a bound."""
        result = self._run(baseline)
        if self.ok(result.best) or self.out_of_time():
            return result
        before = result.best
        result = self.widen(result)
        if self.ok(result.best) or self.out_of_time():
            return result
        # the rung's best short of the margin (if any) waits: the float end bisects from the trial
        # before the rung (its trials quantize every tensor at the width asked)
        wide, result.best = result.best, before
        result = self.converge(result)
        if wide is not before and not self.ok(result.best) and improved(wide, result.best):
            result.best = wide
            result.stopped += (f"; the best kept is the rung's: 16-bit activations on {len(wide.wide)} tensor(s), passing "
                               "the gate short of the margin")
        return result

    def widen(self, result: SearchResult) -> SearchResult:
        """The 16-bit rung, before the float end: the tensors still quantized, ranked by their noise
        in the best trial (fine_rank), the worst 1, 2, 4, ... given 16-bit activations (weights stay
        as asked) until a trial passes, then bisected between the last that failed and it for the
        fewest that pass. Doubling rather than bisecting from "all 16-bit": that end need not pass
        (measured: ORT 1.32's CPU EP fuses a MatMul whose input is 16-bit and whose weight is an 8-bit
        DequantizeLinear into MatMulNBits at accuracy level 4, int8 activations per block of 32, and a
        block with one large value loses the rest; cosine 0.70 where optimizations off give 0.9999).
        A tensor costs no weight this way, so this comes before keeping nodes float. Not run where
        only the target EP fails (its own error, as for the float end) or without attempt_wide."""
        best = result.best
        if self.attempt_wide is None or best.path is None or ep_only(best):
            return result
        kept = list(best.kept)
        tensors = list(dict.fromkeys(label for label, _, _ in self._units(best, kept, self.fine_rank or self.rank)))
        if not tensors:
            return result
        before = result.stopped
        steps = int(np.ceil(np.log2(len(tensors)))) + 1
        allowed = len(result.trials) + 2 * steps

        def judge(count: int) -> Trial | None:
            if self.out_of_time() or len(result.trials) >= allowed:
                return None
            outcome = self.attempt_wide(kept, tensors[:count], f"16-bit activations: the worst {count} of "
                                                                 f"{len(tensors)} ranked tensor(s)")
            result.trials.append(outcome)
            return outcome

        low, count, chosen, closest = 0, 1, None, None
        while True:
            count = min(count, len(tensors))
            outcome = judge(count)
            if outcome is None:
                break
            if self.ok(outcome):
                chosen = outcome
                break
            if outcome.passed and (closest is None or improved(outcome, closest)):
                closest = outcome
            low = count
            if count == len(tensors):
                break
            count *= 2
        if chosen is not None:
            _, chosen = self._fewest(low, count, chosen, judge)
            earlier = [n for n in kept if n not in self.fixed]
            if earlier and not self.out_of_time():
                # the nodes the earlier phases kept float may be needless now: one trial without them
                outcome = self.attempt_wide(list(self.fixed), list(chosen.wide),
                                            f"16-bit activations: the worst {len(chosen.wide)}, without the "
                                            f"{len(earlier)} node(s) kept float before")
                result.trials.append(outcome)
                if self.ok(outcome):
                    chosen = outcome
                    for name in earlier:
                        result.reasons.pop(name, None)
            result.best = chosen
            result.stopped = (f"{before}; then 16-bit activations on the {len(chosen.wide)} worst-ranked tensor(s) passed "
                              "the gate with the margin (the weights stay as asked"
                              + (f"; {len(chosen.kept) - len(self.fixed)} node(s) kept float" if len(chosen.kept) > len(self.fixed)
                                 else "") + ")")
        elif closest is not None and improved(closest, best):
            result.best = closest
            result.stopped = (f"{before}; 16-bit activations on the {len(closest.wide)} worst-ranked tensor(s) passed the "
                              "gate short of the margin at best")
        else:
            ran_out = self.out_of_time() or len(result.trials) >= allowed
            result.stopped = (f"{before}; 16-bit activations on the worst 1 to {low} of {len(tensors)} ranked tensors did "
                              "not pass" + (f" (then: {self._converge_limit(allowed)})" if ran_out and low < len(tensors)
                                            else ""))
        return result

    def _run(self, baseline: Trial) -> SearchResult:
        result = SearchResult(best=baseline, trials=[baseline])
        current = baseline
        kept = list(self.fixed)
        reasons: dict[str, str] = {}

        def trial(nodes: list[str], label: str) -> Trial | None:
            if len(result.trials) >= self.max_trials or self.out_of_time():
                return None
            outcome = self.attempt(nodes, label)
            result.trials.append(outcome)
            return outcome

        rules = [(label, names, False) for label, names in self.first_rules]
        rules += [(label, names, True) for label, names in rule_sets(self.float_proto)]
        for label, names, closed in rules:
            if self.ok(current):
                break
            # an EP rule names nodes of the quantized model: map them back (dynamic quantization renames some)
            wanted = (m for name in names for m in (self.closure.get(name, [name]) if closed
                                                    else [self._float_name(name) or name]))
            extra = [n for n in dict.fromkeys(wanted) if n not in kept]
            if not extra or not self.fits(kept + extra):
                continue
            outcome = trial(kept + extra, f"rule: {label}")
            if outcome is None:
                break
            helped = improved(outcome, current)
            record = {"rule": label, "nodes": len(extra), "cosine_before": current.cosine, "cosine_after": outcome.cosine,
                      "kept": helped}
            if current.norm_ratio is not None or outcome.norm_ratio is not None:
                record.update(norm_ratio_before=current.norm_ratio, norm_ratio_after=outcome.norm_ratio)
            result.rules.append(record)
            if helped:
                kept += extra
                for name in extra:
                    reasons[name] = f"rule: {label} ({change(current, outcome)})"
                current = outcome
        if self.ok(current):
            result.best, result.stopped, result.reasons = current, "the gate passed with the margin", reasons
            return result
        passes, fine = 0, False
        while True:
            if self.out_of_time() or len(result.trials) >= self.max_trials:
                result.best, result.stopped = current, self.limit_reached()  # before ranking costs its runs
                break
            passes += 1
            units = self._units(current, kept)
            fine_pass = False
            if not units and self.fine_rank is not None:
                units = self._units(current, kept, self.fine_rank)
                fine_pass = bool(units)
                fine = fine or fine_pass
            result.ranked += [{"pass": passes, "tensor": label, "nodes": members, "noise": round(score, 4)}
                              for label, members, score in units]
            below = " below the noise floor" if fine else ""

            def prefix(count: int, units=units) -> list[str]:
                return list(dict.fromkeys(n for _, members, _ in units[:count] for n in members))

            if not units:
                current, result.stopped = self._where_error_starts(current, kept, reasons, result, trial)
                result.best = current
                break
            high = len(units)
            while high > 0 and not self.fits(kept + prefix(high)):
                high -= 1
            if high <= 0 and fine_pass:
                # none of the tensors below the floor fits the budget: the nodes where the error starts next
                current, result.stopped = self._where_error_starts(current, kept, reasons, result, trial)
                result.best = current
                break
            if high <= 0:
                result.best = current
                result.stopped = (f"keeping more in float would leave less than {1 - self.share:.0%} of the weights "
                                  "quantized")
                break
            top = trial(kept + prefix(high), f"ranked{below} (pass {passes}): worst {high} tensor(s), {len(prefix(high))} node(s)")
            if top is None:
                result.best, result.stopped = current, self.limit_reached()
                break
            if self.ok(top):
                high, best = self._fewest(0, high, top, lambda middle: trial(
                    kept + prefix(middle), f"ranked{below} (pass {passes}): worst {middle} tensor(s), "
                                           f"{len(prefix(middle))} node(s)"))
                self._explain(units[:high], reasons)
                result.best, result.stopped = best, "the gate passed with the margin"
                break
            if not improved(top, current):
                current, result.stopped = self._where_error_starts(
                    current, kept, reasons, result, trial,
                    f"keeping the {len(prefix(high))} nodes around the {high} worst-ranked tensors in float did not improve "
                    "the result")
                result.best = current
                break
            # better but not there: keep them, and rank again on the new result (the next error source shows)
            self._explain(units[:high], reasons)
            kept += prefix(high)
            current = top
        result.reasons = reasons
        return result

    def converge(self, result: SearchResult) -> SearchResult:
        """The bisection from the float end, where the search ended short of the gate: the nodes the
        quantizer would quantize that are still quantized, ordered by the noise they add in the
        best trial (fine_rank, every tensor with any noise; the unranked ones after them, those
        nearest the outputs first), bisected on how many of the first ones to keep float (with
        what writes their inputs), between the best trial (fails) and the float model (passes,
        and is not run); within --max-float-share, from the most it allows (that trial is run).
        It ends at the fewest that pass, or says that only the float model (or the cap) is left.
        Its trials are its own, about log2(nodes) + 1, past --max-exclude-rounds (which bounds the
        search before it); the time bound and the target EP's clock still hold. Not run where the
        CPU EP passes and only the target EP fails: there the float model need not pass either
        (the EP computes float in its own precision), and the moves off the EP come next."""
        best = result.best
        before = result.stopped
        if ep_only(best):
            return result
        kept = list(best.kept)
        ranked = self._units(best, kept, self.fine_rank or self.rank) if best.path is not None else []
        order: list[str] = []
        for _, members, _ in ranked:
            order += [n for n in members if n in self.quantizable_set and n not in order]
        measured = len(order)
        order += [n for n in reversed(self.quantizable) if n not in order and n not in kept]
        order = [n for n in order if n not in kept]
        groups = [[m for m in self.closure.get(n, [n]) if m not in kept] for n in order]

        def prefix(count: int) -> list[str]:
            return list(dict.fromkeys(m for group in groups[:count] for m in group))

        if not groups:
            result.stopped = f"{before}; no node is left to keep float"
            return result
        high = len(groups)
        everything = set(order)
        while high > 1 and everything <= set(prefix(high - 1)):
            high -= 1  # the inputs' producers go with each node: fewer groups may already reach the float model
        while high > 0 and not self.fits(kept + prefix(high)):
            high -= 1
        if high == 0:  # --max-float-share leaves no room
            if "of the weights quantized" not in before:
                result.stopped = (f"{before}; keeping any more in float would leave less than {1 - self.share:.0%} of "
                                  "the weights quantized")
            return result
        capped = not everything <= set(prefix(high))
        if high == 1 and not capped:
            result.stopped = (f"{before}; only the float model is past it: keeping the first of the {len(order)} node(s) "
                              "still quantized in float keeps them all (with what writes their inputs)")
            return result
        low, passing, closest = 0, None, None  # closest: the best trial that passed the gate short of the margin
        allowed = len(result.trials) + int(np.ceil(np.log2(high + 1))) + 1
        stopped_by = None
        tried: dict[frozenset, int] = {frozenset(prefix(0)): 0}

        def judge(count: int, label: str) -> Trial | None:
            nonlocal closest
            outcome = self._converge_trial(result, kept + prefix(count), label, allowed)
            if outcome is not None and outcome.passed and not self.ok(outcome) and (
                    closest is None or improved(outcome, closest)):
                closest = outcome
            return outcome

        if capped:  # the float end is beyond --max-float-share: its nearest point is run, not assumed
            outcome = judge(high, f"from the float end: {len(prefix(high))} node(s) kept float, the first {high} of "
                                  f"{len(order)} (the most --max-float-share allows)")
            tried[frozenset(prefix(high))] = high
            if outcome is None:
                stopped_by = self._converge_limit(allowed)
            elif self.ok(outcome):
                passing = (high, outcome)
            elif outcome.error != FLOAT_MODEL:
                low = high
        while stopped_by is None and high - low > 1:
            middle = (low + high) // 2
            same = tried.get(frozenset(prefix(middle)))
            if same is not None:  # what it keeps is an endpoint's: that endpoint's verdict stands
                if same == low:
                    low = middle
                else:
                    high = middle
                continue
            tried[frozenset(prefix(middle))] = middle
            outcome = judge(middle, f"from the float end: {len(prefix(middle))} node(s) kept float, the first {middle} "
                                    f"of {len(order)}")
            if outcome is None:
                stopped_by = self._converge_limit(allowed)
                break
            if self.ok(outcome):
                high, passing = middle, (middle, outcome)
            elif outcome.error == FLOAT_MODEL:
                high = middle  # the quantizer leaves nothing quantized already: the float end is nearer
            else:
                low = middle
        if passing is not None:
            count, outcome = passing
            self._explain_order(order[:count], groups, measured, result.reasons)
            result.best = outcome
            result.stopped = (f"{before}; then the bisection from the float end passed the gate with the margin, "
                              f"keeping {len(prefix(count))} more node(s) in float (the first {count} of the "
                              f"{len(order)} still quantized)")
            return result
        if closest is not None and improved(closest, result.best):
            # none reached the margin; one passed the gate: as the search's own phases keep such a trial
            count = len(closest.kept) - len(kept)
            self._explain_order([n for n in order if n in set(closest.kept)], groups, measured, result.reasons)
            result.best = closest
            result.stopped = (f"{before}; then the bisection from the float end passed the gate short of the margin at "
                              f"best, keeping {count} more node(s) in float")
            return result
        if stopped_by is not None:
            result.stopped = f"{before}; the bisection from the float end stopped: {stopped_by}"
        elif capped and low == high:
            result.stopped = (f"{before}; keeping the first {high} of the {len(order)} nodes still quantized in float "
                              f"(the most --max-float-share {self.share:g} allows) did not pass either")
        else:
            result.stopped = (f"{before}; the bisection from the float end found no pass short of the float model "
                              f"(keeping the first {low} of the {len(order)} nodes still quantized in float failed"
                              + (f"; keeping {high} leaves nothing quantized" if high < len(groups) and not capped else "")
                              + ")")
        return result

    def _explain_order(self, names: list[str], groups: list[list[str]], measured: int, reasons: dict[str, str]) -> None:
        for position, group in enumerate(groups, start=1):
            if not group or group[0] not in names:
                continue
            why = (f"from the float end: #{position} by the noise it adds" if position <= measured else
                   f"from the float end: #{position}, no noise measured on it (nearest the outputs first)")
            for member in group:
                reasons.setdefault(member, why + " (the fewest kept float that pass)")

    def _converge_limit(self, allowed: int) -> str:
        """Why a late phase (the rung, the float end) ran no further trial: a bound, or its own trials."""
        return self.limit_reached() if self.out_of_time() else f"its trials were spent ({allowed} in all)"

    def _converge_trial(self, result: SearchResult, nodes: list[str], label: str, allowed: int) -> Trial | None:
        if self.out_of_time() or len(result.trials) >= allowed:
            return None
        outcome = self.attempt(nodes, label)
        result.trials.append(outcome)
        return outcome

    def _fewest(self, low: int, high: int, best: Trial, judge: Callable[[int], Trial | None]) -> tuple[int, Trial]:
        """Bisects between ``low`` (fails) and ``high`` (``best`` passes) for the fewest that the
        search accepts; ``judge(count)`` runs a trial (None: no more may run). Returns the count and
        its trial."""
        while high - low > 1:
            middle = (low + high) // 2
            outcome = judge(middle)
            if outcome is None:
                break
            if self.ok(outcome):
                high, best = middle, outcome
            else:
                low = middle
        return high, best

    def ok(self, trial: Trial) -> bool:
        """A trial the search accepts: it passes the gate, and its lowest cosine reaches ``aim`` and
        its decisions the decision margin (above the gate: the held-back samples are few, and the
        result must hold on others; reaches_margin)."""
        return reaches_margin(trial, self.aim)

    # The error-start phase keeps this many of the blamed nodes float first, doubling while a trial
    # does not improve, up to the float budget.
    FIRST_BLAMED = 4

    def _where_error_starts(self, current: Trial, kept: list[str], reasons: dict[str, str], result: SearchResult,
                            trial: Callable[[list[str], str], Trial | None], why: str | None = None) -> tuple[Trial, str]:
        """After the ranking by activation noise has nothing left that helps: keep float the nodes
        where the error starts (blame), the worst FIRST_BLAMED first, twice as many while that does
        not improve the result, and rank again after each improvement; until the gate passes, the
        float budget or the trial limit is reached, or no node introduces measurable error. Returns
        the best trial and why the search stopped."""
        stopped = why or "no quantized tensor left adds measurable error"
        sides = current.sides or {}
        if why is None and ep_only(current):
            # the ranking measures activation noise on the CPU EP, where this model already passes
            stopped += (f" on the CPU EP, where it passes; what fails is {sides['ep'].get('ep') or 'the target EP'}'s own "
                        "error, which that ranking does not see")
        if self.blame is None:
            return current, stopped
        count, rounds = self.FIRST_BLAMED, 0
        blamed_for: Trial | None = None
        while not self.ok(current):
            if self.out_of_time() or len(result.trials) >= self.max_trials:
                return current, self.limit_reached()
            if blamed_for is not current:  # the same trial blames the same nodes: asked once
                blamed = [(self._float_name(name), op, cosine) for name, op, cosine in self.blame(current, kept)]
                blamed = [(name, op, cosine) for name, op, cosine in blamed if name and name not in kept]
                blamed_for = current
            if not blamed:
                return current, stopped + "; no node left where the error starts"
            take = blamed[:count]
            nodes = list(dict.fromkeys(n for name, _, _ in take for n in self.closure.get(name, [name])))
            nodes = [n for n in nodes if n not in kept]
            if not self.fits(kept + nodes):
                return current, stopped + (f"; keeping the nodes where the error starts in float would leave less than "
                                           f"{1 - self.share:.0%} of the weights quantized")
            rounds += 1
            outcome = trial(kept + nodes, f"where the error starts (round {rounds}): {len(take)} node(s)")
            if outcome is None:
                return current, self.limit_reached()
            record = {"rule": f"where the error starts: {', '.join(name for name, _, _ in take[:6])}"
                      + ("..." if len(take) > 6 else ""), "nodes": len(nodes), "cosine_before": current.cosine,
                      "cosine_after": outcome.cosine, "kept": improved(outcome, current)}
            result.rules.append(record)
            if not record["kept"]:
                if len(take) < len(blamed):
                    count *= 2
                    continue
                return current, stopped + "; keeping every node where the error starts in float did not improve it"
            for name, op, cosine in take:
                for node in self.closure.get(name, [name]):
                    reasons.setdefault(node, f"the error starts at {name} ({op}: cosine {cosine:.4f} there, worse than "
                                             "what it reads)")
            kept += nodes
            current, count = outcome, self.FIRST_BLAMED
        return current, "the gate passed with the margin"

    def out_of_time(self) -> bool:
        if self.clock is not None and self.clock.exhausted:
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def limit_reached(self) -> str:
        """Why no further trial ran: the time bound or the trial limit."""
        if self.clock is not None and self.clock.exhausted:
            return (f"the step's time on the target EP ({self.clock.total:g} s, --ep-total-seconds) was spent: no later "
                    "trial could be judged there")
        if self.out_of_time():
            if self.seconds is not None and self.seconds <= 0:
                # --auto: --search-seconds bounds the whole step, and the earlier precisions' searches used it
                return "no search time was left (--search-seconds bounds the whole step; --auto's earlier attempts used it)"
            return f"the time bound ({self.seconds:g} s, --search-seconds) was reached"
        return f"the trial limit ({self.max_trials}) was reached"

    def fits(self, nodes: list[str]) -> bool:
        """Whether keeping ``nodes`` float keeps within --max-float-share of the quantizable weights
        (only the quantizable nodes' weights count: the others stay float anyway)."""
        if self.share >= 1:
            return True
        unique = set(nodes) & self.quantizable_set
        return sum(self.cost.get(n, 0) for n in unique) <= self.budget

    def _units(self, current: Trial, kept: list[str], rank=None) -> list[tuple[str, list[str], float]]:
        units = []
        for label, nodes, score in (rank or self.rank)(current, kept):
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


def margin_samples(plan: DataPlan) -> list:
    """The calibration samples (real data only: seeded noise says nothing of where real decisions
    sit), for the float model's margins in the expected agreement; at most MARGIN_SAMPLES of them
    and about MARGIN_BYTES."""
    calibration = plan.calibration
    samples: list = []
    if calibration is not None and calibration.kind != "random" and plan.calib_indices:
        from ortprep.steps.quantize.evaluate import MARGIN_BYTES, MARGIN_SAMPLES

        held = 0
        for sample in calibration.samples(plan.calib_indices[:MARGIN_SAMPLES]):
            held += sum(v.nbytes for v in sample.values())
            if held > MARGIN_BYTES and samples:
                break
            samples.append(sample)
    return samples


class Trials:
    """Quantize with some nodes kept in float, into a folder of its own, and evaluate."""

    def __init__(self, workdir: Path, options: QuantizeOptions, settings: dict, plan: DataPlan, eval_feeds: list,
                 big: bool, bounds: dict, progress: ProgressCallback | None, target: GateTarget | None = None,
                 spare_failing_baseline: bool = False, earlier: tuple[int, int] = (0, 0)) -> None:
        """``earlier``: (failed, judged) trials of --auto's earlier attempts on the same held-back
        samples (a later precision kept is chosen after them: held_to_margin)."""
        self.workdir, self.options, self.settings, self.plan = workdir, options, settings, plan
        self.target = target  # where the gate is judged besides the CPU EP
        self.eval_feeds, self.big, self.bounds, self.progress = eval_feeds, big, bounds, progress
        self.count = 0
        # trials judged on the held-back samples, and of those the ones that failed the gate there (an
        # evaluation that errored is not a verdict on them); a result kept after one failed was
        # chosen by those samples (held_to_margin)
        self.failed, self.judged = earlier
        self.failed_before: dict[Path, int] = {}  # a trial's model -> the trials that failed before it was judged
        self.fixed: list[str] = list(options.exclude_nodes)  # kept float in every trial
        self.off: list[str] = []  # kept off the target EP in every trial (keep_off_ep_move)
        self.evaluations: dict[Path, Evaluation] = {}
        self.caches: dict[Path, dict] = {}
        self.failure: str | None = None
        self.widened: dict[Path, list[str]] = {}  # a trial's model -> the graph outputs whose 16-bit encoding was widened
        self.widened_count: dict[Path, int] = {}  # a trial's model -> how many activations' 16-bit encodings were
        self.floored: dict[Path, list[dict]] = {}  # a trial's model -> weights whose scales were raised for QNN's HTP
        self.fp16_matmuls: dict[Path, list[str]] = {}  # a trial's model -> MatMuls of two 16-bit activations, in FP16
        self._margin_feeds: list | None = None
        self.started = time.monotonic()  # the search's time bound counts from here (the step's first trial)
        # The target EP runs the baselines (both sides reported, where they part
        # named; not an --auto attempt's that the CPU EP fails while later precisions remain), then
        # a trial only once the CPU EP passes it, until a trial passes on the CPU EP
        # and fails on the EP: from then on every trial runs there too (the EP's own error is what
        # the search works on). A trial failing on the CPU EP fails the gate either way.
        self.ep_in_loop = False
        self.sources: dict = {}  # each result's float model (its trial's source)
        # An --auto attempt with later precisions to try: its baseline runs on the EP only where the
        # CPU EP passes it. A baseline that fails there cannot pass, and on a slow EP its run costs what
        # a later precision's trials need: on the journey's layout detector (QNN's simulator, about
        # 200 s a judgement) three precisions that failed on the CPU EP took the 900 s before any
        # search could use them.
        self.spare_failing_baseline = spare_failing_baseline

    def counts(self) -> dict:
        """The trials judged on the held-back samples and those that failed there (verify.trials)."""
        return {"judged": self.judged, "failed": self.failed}

    def held_to_margin(self, trial: Trial) -> bool:
        """Whether ``trial``, kept, was chosen by the held-back samples: judged after another trial
        failed there (this step's, or an earlier --auto attempt's). Such a result holds the decision
        margin (evaluate.hold_to_margin); one whose baseline passes was not chosen, and is not."""
        return trial.path is not None and self.failed_before.get(trial.path, 0) > 0

    def margin_feeds(self) -> list:
        """The calibration samples for the float model's margins (margin_samples), read once."""
        if self._margin_feeds is None:
            self._margin_feeds = margin_samples(self.plan)
        return self._margin_feeds

    def attempt(self, source: Path, kept: list[str], label: str, off: list[str] | None = None,
                wide: list[str] | None = None) -> Trial:
        """``wide``: activations given 16 bits (Search.widen)."""
        trial = self._attempt(source, kept, label, off, list(wide or []))
        trial.wide = list(wide or [])
        return trial

    def _attempt(self, source: Path, kept: list[str], label: str, off: list[str] | None, wide: list[str]) -> Trial:
        off = list(self.off if off is None else off)
        self.count += 1
        folder = self.workdir / f"trial{self.count}"
        folder.mkdir()
        output = folder / "quantized.onnx"
        settings = {**self.settings, "wide_tensors": wide} if wide else self.settings
        ok, error = run_quantizer(self.workdir, source, output, self.options.mode, settings, self.plan.calibration,
                                  self.plan.calib_indices, kept, self.options.exclude_ops, self.big, self.progress)
        if not ok:
            self.failure = self.failure or error
            return Trial(label, list(kept), None, False, 0, None, error, off=off)
        if self.options.mode == "static" and self.settings["activation_type"] in ("uint16", "int16"):
            # headroom for inputs past the calibration samples' range, inside the model as at its
            # outputs (edits.widen_activation_encodings)
            tensors, outputs = widen_activation_encodings(output, float_model=source)
            self.widened[output] = outputs
            self.widened_count[output] = len(tensors)
        if self.options.mode == "static" and self.settings.get("preset") == "qnn":
            # after the widening: it changes the output scales the multipliers divide by (edits.HTP_MIN_MULTIPLIER)
            self.floored[output] = floor_weight_scales(output)
            if self.settings["activation_type"] in ("uint16", "int16"):
                # the HTP's 16-bit MatMul of two activations is far less precise than FP16 (eps/htp.py)
                self.fp16_matmuls[output] = fp16_activation_matmuls(output)
        if off:
            error = move_off_ep(output, off)
            if error is not None:
                return Trial(label, list(kept), None, False, 0, None, error, off=off)
        if (not label.startswith("baseline") and set(kept) - set(self.fixed)
                and quantization_stats(onnx.load(str(output), load_external_data=False))["quantized_ops"] == 0):
            # a search trial whose kept nodes leave nothing quantized is the float model: it passes
            # trivially, and a search that took it would end at "nothing was quantized" instead of at
            # its verdict; not evaluated (no EP time), no figure: neither a pass nor progress
            return Trial(label, list(kept), None, False, model_bytes(output), output, FLOAT_MODEL, off=off)
        return self.judge(source, output, label, kept, off)

    def edited(self, base: Trial, edit: Callable[[onnx.ModelProto], None]) -> Path:
        """A copy of ``base``'s file with its graph edited (no weights read: the copy sits beside
        it, so its external data resolves); ``judge`` evaluates it as a trial."""
        output = base.path.with_name(base.path.stem + f".variant{self.count}.onnx")
        self.count += 1
        graph = onnx.load(str(base.path), load_external_data=False)
        edit(graph)
        onnx.save(graph, str(output))
        return output

    def judge(self, source: Path, output: Path, label: str, kept: list[str], off: list[str]) -> Trial:
        """Evaluate ``output`` (quantized from ``source``) on the held-back samples."""
        evaluation = None
        if self.eval_feeds:
            if self.progress is not None:
                self.progress("evaluating", 0, 1)
            evaluation = evaluate(source, output, self.eval_feeds, self.options.min_cosine,
                                  self.caches.setdefault(source, {}), self.bounds, self.target, self.options.metrics,
                                  self.margin_feeds, ep_after_cpu_fails=self.ep_in_loop or (
                                      label.startswith("baseline") and not self.spare_failing_baseline),
                                  latency_runs=LATENCY_RUNS if label.startswith("baseline") else 0,
                                  confirm_feeds=self.margin_feeds)
            self.ep_in_loop = self.ep_in_loop or evaluation.ep_only
            self.failed_before[output] = self.failed
            self.judged += 1
            on_ep = evaluation.on_ep
            if evaluation.error is None and (on_ep is None or on_ep.error is None) and not evaluation.passed:
                self.failed += 1
            if self.progress is not None:
                self.progress("evaluating", 1, 1)
            self.evaluations[output] = evaluation
            self.sources[output] = source  # the float model it was compared (and is timed) with
        if evaluation is None:
            return Trial(label, list(kept), None, True, model_bytes(output), output, off=off)
        on_ep = evaluation.on_ep
        error = evaluation.error or (f"on {on_ep.ep}: {on_ep.error}" if on_ep is not None and on_ep.error else None)
        cpu = {"ep": "cpu", "cosine": evaluation.cosine, "norm_ratio": evaluation.norm_ratio, "passed": evaluation.cpu_verdict,
               "margin_gap": None if evaluation.error is not None else outputs_margin_gap(evaluation.outputs),
               "outputs": [{"name": o["name"], "cosine": o["cosine"], "norm_ratio": o.get("norm_ratio")}
                           for o in evaluation.outputs[:16]], "error": evaluation.error}
        sides = {"judged_on": evaluation.judged_on, "cpu": cpu, "ep": on_ep.summary() if on_ep is not None else None}
        return Trial(label, list(kept), evaluation.gate_cosine, evaluation.passed, model_bytes(output), output, error,
                     norm_ratio=evaluation.gate_norm_ratio, sides=sides, shortfall=evaluation.shortfall, off=off,
                     margin_gap=evaluation.margin_gap)


def try_calibration_methods(trials: Trials, source: Path, best: Trial, aim: float) -> tuple[Trial, list[dict], list[Trial]]:
    """Calibration methods other than min/max, each kept only when it raises the lowest cosine:
    min/max ranges stretched by rare values cost every node precision (PaddleOCR's detector:
    0.975 with min/max, 0.994 with percentile). Leaves ``trials.settings`` on the method kept;
    returns the best trial, a record per method tried, and their trials."""
    settings = trials.settings
    records: list[dict] = []
    tried: list[Trial] = []
    # (entropy is not tried by itself: on a tensor whose range one spike stretched it took 520 s
    # for a one-MatMul model; ask for it with --method entropy)
    for method in ("percentile",):
        trials.settings = {**settings, "method": method}
        outcome = trials.attempt(source, list(trials.fixed), f"calibration: {method}")
        tried.append(outcome)
        helped = outcome.path is not None and improved(outcome, best)
        records.append({"method": method, "cosine": outcome.cosine, "passed": outcome.passed, "kept": helped})
        if helped:
            best = outcome
            settings = trials.settings
        if reaches_margin(best, aim) and best.cosine is not None:
            break
    trials.settings = settings
    return best, records, tried


def try_compensated_rounding(trials: Trials, source: Path, best: Trial) -> tuple[Trial, dict]:
    """--weight-only --rounding auto, where nearest rounding failed the gate: the same weights
    rounded for each MatMul's output on the calibration samples (runtime/rounding.py), kept when it
    measures better (``improved``). Leaves ``trials.settings`` on the rounding kept; returns the
    best trial and a record of the attempt."""
    settings = trials.settings
    trials.settings = {**settings, "rounding": "gptq"}
    outcome = trials.attempt(source, list(trials.fixed), "rounding: gptq")
    kept = outcome.path is not None and improved(outcome, best)
    record = {"rounding": "gptq", "cosine": outcome.cosine, "passed": outcome.passed, "kept": kept,
              "nearest": {"cosine": best.cosine, "passed": best.passed}, **rounding_done(outcome)}
    if kept:
        return outcome, record
    trials.settings = settings
    return best, record


def set_accuracy_level(level: int) -> Callable[[onnx.ModelProto], None]:
    """An edit giving every MatMulNBits node ``level`` (0: the attribute left out, as ORT's
    quantizer leaves it)."""
    def edit(model: onnx.ModelProto) -> None:
        for node in (n for _, graph in iter_graphs(model.graph) for n in graph.node):  # If/Loop bodies too
            if node.op_type == "MatMulNBits":
                kept = [a for a in node.attribute if a.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend(kept)
                if level:
                    node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    return edit


def try_float_compute(trials: Trials, source: Path, best: Trial) -> tuple[Trial, dict]:
    """--weight-only --accuracy-level auto with the CPU EP's int8 compute (accuracy_level 4:
    activations quantized per block at run time): the same file computed in float32 (0), the more
    precise, where 4 fails the gate (kept when it measures better), or where 4 passes but does not
    run clearly faster on the samples' own shapes (at most FASTER of 0's time and FASTER_MS less a
    run) and 0 passes too; not where 0 runs slower than the float model and 4 does not
    (_int8_compute_pays: the float model, 4 and 0 are timed one run each in turn).
    Measured: one token by 4096x4096, 4 at 0.24x float's time and 0 at 1.56x; 128 tokens by
    384x1536, 4 at 1.23x and 0 at 1.06x; and the journey's recommender, int8, 4 at 0.91x of 0's
    time kept 47 of 50 top items on fresh inputs where 0 kept 49. Leaves ``trials.settings`` on the
    level kept."""
    settings = trials.settings
    if best.passed and not trials.eval_feeds:
        return best, {}
    twin = trials.edited(best, set_accuracy_level(0))  # timed, then judged, as one file
    timed = None
    if best.passed:
        # the float model, level 4 and level 0, one run of each in turn
        medians = timed_medians([source, best.path, twin], trials.eval_feeds[0])
        timed = None if medians is None else {"float": medians[0], "4": medians[1], "0": medians[2]}
        why = None if timed is None else _int8_compute_pays(timed)
        if why is not None:
            return best, {"accuracy_level": 0, "kept": False, "ms": _ms(timed), "why": why}
    outcome = trials.judge(source, twin, "accuracy level 0", best.kept, best.off)
    kept = outcome.path is not None and (improved(outcome, best) if not best.passed else outcome.passed)
    record = {"accuracy_level": 0, "cosine": outcome.cosine, "passed": outcome.passed, "kept": kept,
              "int8_compute": {"cosine": best.cosine, "passed": best.passed},
              "ms": _ms(timed) if timed else None,
              "why": "int8 compute is not clearly faster on the samples' shapes" if best.passed
              else "int8 compute failed the gate"}
    if kept:
        trials.settings = {**settings, "accuracy_level": 0}
        return outcome, record
    return best, record


# int8 compute is kept over float32 compute (both passing) only at most this share of its time, and
# at least this much less a run: on a model of tens of microseconds a run, the timing's noise (the
# journey's recommender: 0.87x in one run, 1.19x in the next) chose between them otherwise
FASTER, FASTER_MS = 0.9, 0.1


def _int8_compute_pays(ms: dict[str, float]) -> str | None:
    """Why level 4 is kept without judging level 0 (both passing is then not asked), from the
    three medians; None where 0, the more precise, is to be judged. 4 is kept where it runs clearly
    faster than 0 (FASTER, FASTER_MS), or where 0 runs slower than the float model and 4 does not:
    speed is part of the verdict, and a file slower than float where a passing one is not leaves
    the user worse off. Measured: gpt2_medium_slice's int4 on 32 tokens, level 4 at 0.86x float's
    time and 0 at 1.2x; 4 ran at 0.898x of 0's time, and beside another job at 0.96x, so the 10%
    rule alone kept 0 there (bench/RESULTS.md, session 28)."""
    if ms["4"] <= FASTER * ms["0"] and ms["0"] - ms["4"] >= FASTER_MS:
        return "int8 compute runs clearly faster on the samples' shapes"
    if ms["0"] > ms["float"] >= ms["4"]:
        return "float32 compute runs slower than the float model on the samples' shapes, and int8 compute does not"
    return None


def _ms(timed: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 4) for key, value in timed.items()}


def rounding_done(trial: Trial) -> dict:
    """What the worker's compensated rounding did for ``trial`` (its sidecar file), or nothing."""
    if trial.path is None:
        return {}
    sidecar = Path(str(trial.path) + ".rounding.json")
    if not sidecar.exists():
        return {}
    import json

    done = json.loads(sidecar.read_text(encoding="utf-8"))
    return {"matmuls": done.get("matmuls"), "error_vs_nearest": done.get("error_vs_nearest")}


# A node kept off the EP takes its activations' QuantizeLinear and DequantizeLinear nodes along:
# a move of N nodes may take up to this many times N off the EP's share, no more.
MOVE_NODE_SLACK = 8


def placement_lost(trials: Trials, before: Trial, after: Trial, moved: int) -> str | None:
    """Why the EP's run of ``after`` (``before`` with ``moved`` more nodes kept off the EP) no longer
    shows what the EP computes: its session took fewer nodes than the move accounts for. Measured
    (onnxruntime 1.32 + onnxruntime-qnn 2.7.0): rapidocr's PP-OCRv6 recogniser with its four
    attention MatMuls in If nodes put 0 of 1,002 nodes on QNN, where 962 of 977 ran there before
    (ORT logged that the EP's capability fused nodes with an unsupported one between them, and
    dropped it); the gate's "QNN" outputs were the CPU EP's. None where both placements keep the
    share, or either is unknown."""
    old = trials.evaluations.get(before.path) if before.path is not None else None
    new = trials.evaluations.get(after.path) if after.path is not None else None
    was = old.on_ep.placement if old is not None and old.on_ep is not None else None
    now = new.on_ep.placement if new is not None and new.on_ep is not None else None
    if not was or not now or was["nodes_on_ep"] - now["nodes_on_ep"] <= MOVE_NODE_SLACK * moved:
        return None
    return (f"the EP's session took {now['nodes_on_ep']} of {now['nodes_total']} nodes after the move, "
            f"{was['nodes_on_ep']} of {was['nodes_total']} before: its outputs are no longer the EP's")


def keep_off_ep_move(trials: Trials, source: Path, baseline: Trial, parted: list[dict], aim: float,
                     deadline: float | None, accept: Callable[[Trial], tuple[bool, str | None]] | None = None,
                     starts: int = 1) -> tuple[Trial, list[dict], dict[str, str]]:
    """The trials of the move from ``baseline`` (whose EP side alone fails; ``parted``: where the
    EP first parts, ep_gate.first_divergence, or parting_points): the best trial (``baseline``
    where none improved on it), a record per trial, and why each node of the best was kept off.
    The candidate sets (off_target.candidate_sets) of the first ``starts`` entries of ``parted``
    are tried in turn, each on top of the best so far. ``accept``: a trial is taken only when it
    says so (confirmation_move: its calibration samples pass on the EP; with why not, where that is
    not the samples' verdict), and the first taken ends the move; otherwise a trial is taken where
    it improved on the best."""
    if not parted or baseline.path is None or trials.target is None:
        return baseline, [], {}
    ep = trials.target.ep
    total = sum(1 for node in onnx.load(str(baseline.path), load_external_data=False).graph.node
                if node.op_type not in QDQ_OPS)
    limit = max(1, int(trials.options.max_float_share * total))
    best, records, reasons = baseline, [], {}
    tried: list[set[str]] = []
    taken: list[tuple[str, list[str]]] = []  # the sets kept, in order

    def done() -> bool:
        return best is not baseline and (accept is not None or reaches_margin(best, aim))

    usable = [entry for entry in parted if entry["node"] and not entry["node"].startswith(OFF_EP_PREFIX)]
    for first in usable[:starts]:
        for label, names in candidate_sets(baseline.path, first["node"], limit, where=first.get("where")):
            off = list(dict.fromkeys([*best.off, *names]))
            if set(off) in tried or set(off) == set(best.off) or len(off) - len(baseline.off) > limit:
                continue  # tried, nothing new, or more than the float share allows
            tried.append(set(off))
            clock = trials.target.clock
            if (deadline is not None and time.monotonic() >= deadline) or (clock is not None and clock.exhausted):
                why = "the time bound (--search-seconds)" if clock is None or not clock.exhausted else "--ep-total-seconds"
                records.append({"nodes": len(names), "label": label, "skipped": why})
                return best, records, reasons
            outcome = trials.attempt(source, list(baseline.kept), f"off {ep}: {label}", off=off)
            lost = placement_lost(trials, baseline, outcome, len(off) - len(baseline.off))
            unconfirmed = None
            if lost:
                helped = False
            elif accept is not None:
                helped, unconfirmed = accept(outcome)
            else:
                helped = improved(outcome, best)
            records.append({"label": label, "nodes": len(off) - len(best.off), "cosine_before": best.cosine,
                            "cosine_after": outcome.cosine, "passed": outcome.passed, "error": outcome.error, "kept": helped,
                            **({"confirmed": helped} if accept is not None else {}),
                            **({"not_confirmed": unconfirmed} if unconfirmed else {}),
                            **({"placement_lost": lost} if lost else {})})
            if helped:
                at = (f"first parting at {first['node']} ({first['op_type']}, cosine {first['cosine']:.4f} there)"
                      if "where" not in first else
                      f"seen at '{first['tensor']}' ({first['op_type']} {first['node']}, cosine {first['cosine']:.6f} there)")
                why = f"computed otherwise on {ep} than on the CPU EP: {label}; {at}; judged {change(best, outcome)}"
                reasons = {**reasons, **{name: why for name in names}}
                best = outcome
                taken.append((label, names))
            if done():
                if accept is None and len(taken) > 1:
                    best, reasons = _without_needless(trials, source, baseline, best, taken, reasons, aim, records)
                return best, records, reasons
    return best, records, reasons


def _without_needless(trials: Trials, source: Path, baseline: Trial, best: Trial, taken: list[tuple[str, list[str]]],
                      reasons: dict[str, str], aim: float, records: list[dict]) -> tuple[Trial, dict[str, str]]:
    """The passing ``best`` of a move that took several sets (``taken``, in order), without each
    earlier set the result passes without: measured on a mel front end, a Conv 2 steps off on QNN
    was kept off it first (cosine 0.8619 -> 0.8637), then its float Log (-> 0.9999993), which alone
    mends it. One trial per earlier set."""
    last = set(taken[-1][1])
    for label, names in taken[:-1]:
        dropped = (set(names) - last) & set(best.off)
        if not dropped:
            continue
        off = [name for name in best.off if name not in dropped]
        outcome = trials.attempt(source, list(baseline.kept), f"off {trials.target.ep}: without {label}", off=off)
        fine = (reaches_margin(outcome, aim)
                and not placement_lost(trials, baseline, outcome, len(off) - len(baseline.off)))
        records.append({"label": f"without {label}", "nodes": -len(dropped), "cosine_before": best.cosine,
                        "cosine_after": outcome.cosine, "passed": outcome.passed, "error": outcome.error, "kept": fine})
        if fine:
            best = outcome
            reasons = {name: why for name, why in reasons.items() if name not in dropped}
    return best, reasons


def parting_points(target: GateTarget, model: Path, feeds: list[dict], workdir: Path, side: Judgement) -> list[dict]:
    """Where the EP's run of ``model`` parts from the CPU EP's (ep_gate.first_divergence); else,
    each marked ``where``: the tensor farthest from it (ep_gate.APART_STEPS), then, for each output
    ``side`` (the EP's judgement of the model as it is) gets wrong, the float nodes on the way to it
    and the quantized node that writes it. Exposing tensors as outputs can change what the EP
    computes: measured on the HTP simulator (onnxruntime-qnn 2.7.0), two Conv+SiLU blocks on
    10x10 maps (cosine 0.80 at the output as written) agreed with the CPU EP at the output in each
    of 6 runs with their tensors exposed, and at every tensor in 1 of those 6, on one input; the
    move then had nothing to start from (2 searches of 8 failed so)."""
    parted = first_divergence(target, model, feeds, workdir, nearest=True)
    if (parted and "where" not in parted[0]) or side is None:
        return parted
    # then the nodes on the way to each output it gets wrong: the float ones the EP computes (in its
    # own precision: no tensor of theirs is exposed), then the quantized one that writes it
    proto = onnx.load(str(model), load_external_data=False)
    ops = {node.name: node.op_type for node in proto.graph.node}
    outputs = {o["name"]: o for o in side.outputs}
    for name in side.wrong_outputs():
        if name not in outputs:
            continue
        figures = outputs[name]
        quantized, computed = output_writers(proto, [name])
        for node, where in ([(n, "computed in float on the way to the output it gets wrong") for n in computed]
                            + [(n, "where the output it gets wrong is written") for n in quantized]):
            if node not in [entry["node"] for entry in parted] and not node.startswith(OFF_EP_PREFIX):  # not a move's If
                parted.append({"tensor": name, "node": node, "op_type": ops.get(node, "?"), "where": where,
                               "cosine": figures.get("cosine") if figures.get("cosine") is not None else -1.0,
                               "norm_ratio": figures.get("norm_ratio")})
    return parted


# The move after the search starts from at most this many nodes (parting_points), each with its
# candidate sets, while the gate still fails.
LATE_STARTS = 3


def late_move(trials: Trials, source: Path, best: Trial, options: QuantizeOptions
              ) -> tuple[Trial, list[dict], dict[str, str]]:
    """The move (keep_off_ep_move) from the search's result ``best`` where it still fails on the
    EP alone and nothing parted below DIVERGED before the search (parting_points). Measured on a
    keyword model whose LSTM QNN computes at cosine 0.99994 against the CPU EP's run of the same
    A16W16 file, its logits at 0.998: 30 of 32 top-1 classes on QNN, 32 of 32 with the LSTM on the
    CPU EP. Bound by --search-seconds (as the search) and --ep-total-seconds."""
    evaluation = trials.evaluations.get(best.path) if best.path is not None else None
    if (evaluation is None or trials.target is None or not evaluation.ep_only or evaluation.on_ep is None
            or evaluation.on_ep.error is not None
            or not movable(onnx.load(str(best.path), load_external_data=False))):
        return best, [], {}
    deadline = trials.started + options.search_seconds if options.search_seconds is not None else None
    clock = trials.target.clock
    if (deadline is not None and time.monotonic() >= deadline) or (clock is not None and clock.exhausted):
        return best, [], {}
    parted = parting_points(trials.target, best.path, trials.eval_feeds[:2], trials.workdir, evaluation.on_ep)
    return keep_off_ep_move(trials, source, best, parted, margin_aim(options.min_cosine), deadline, starts=LATE_STARTS)


def confirmation_move(trials: Trials, source: Path, best: Trial, options: QuantizeOptions
                      ) -> tuple[Trial, list[dict], dict[str, str]]:
    """The move (keep_off_ep_move) for a result that passed its held-back samples on both EPs and
    its calibration samples on the CPU EP, but whose calibration samples fail on the target EP
    (evaluate.confirm_on_target, which runs them only for the result chosen): where the EP first
    parts on the sample it did worst on, and each trial taken only when its own calibration
    samples pass there too. Measured on rapidocr's PP-OCRv6 recogniser (A16W16, HTP simulator):
    the 8 held-back lines passed, one calibration line of 24 was read otherwise on QNN, and the
    search never ran, since nothing had failed before that. It runs after the search, so
    --search-seconds (spent there, or by --auto's earlier attempts) does not bound it: its few
    trials (off_target.candidate_sets: at most four a start; one start where a tensor parts, up to
    LATE_STARTS where none does and parting_points starts from the output's side) are bound by
    --ep-total-seconds."""
    evaluation = trials.evaluations.get(best.path) if best.path is not None else None
    confirmation = evaluation.confirmation if evaluation is not None else None
    side = confirmation.on_ep if confirmation is not None else None
    if (trials.target is None or side is None or side.passed or side.error is not None or not side.sample_cosines
            or not confirmation.cpu.passed or not evaluation.cpu_verdict):
        return best, [], {}
    # the held-back samples come first in the EP's judgement, then the calibration ones
    samples = trials.eval_feeds[:confirmation.held_back] + trials.margin_feeds()
    worst = side.sample_cosines.index(min(side.sample_cosines))
    if worst >= len(samples) or not movable(onnx.load(str(best.path), load_external_data=False)):
        return best, [], {}
    parted = parting_points(trials.target, best.path, [samples[worst]], trials.workdir, side)
    cache = trials.caches.setdefault(source, {})
    needed = len(side.sample_cosines)  # the EP runs the samples in one order: as many reach the one that failed

    def confirmed(outcome: Trial) -> tuple[bool, str | None]:
        judged = trials.evaluations.get(outcome.path) if outcome.path is not None else None
        if not outcome.passed or judged is None:
            return False, None
        confirm_on_target(judged, outcome.path, trials.margin_feeds, trials.target, cache)
        on_ep = judged.confirmation.on_ep if judged.confirmation is not None else None
        reached = len(on_ep.sample_cosines) if on_ep is not None else 0
        if reached < needed:
            # the EP's time left judged fewer samples than showed the error: not a confirmation
            judged.passed = False
            return False, (f"the EP judged {reached} of the {needed} samples that showed the error "
                           "(--ep-seconds, --ep-total-seconds)")
        # (a set that passes short of the decision margin would be refused: the next set may reach it)
        return bool(judged.passed) and reaches_margin(outcome, None), None

    return keep_off_ep_move(trials, source, best, parted, margin_aim(options.min_cosine), None, accept=confirmed,
                            starts=1 if parted and "where" not in parted[0] else LATE_STARTS)


# EPs for which the search's 16-bit rung is tried: ORT's CPU EP, which runs QDQ models whose
# activations mix 8 and 16 bits (its Q/DQ kernels take 16-bit types; measured with onnxruntime
# 1.32.0: the sample CNN with two 16-bit tensors, cosine 0.99998 against float). QNN's HTP runs 8-bit
# activations only where asked for (its preset is 16-bit) and mixed widths were not measured there.
MIXED_WIDTH_EPS = (None, "cpu")


def wide_rung(options: QuantizeOptions, settings: dict) -> bool:
    """Whether the search has a 16-bit rung: static QDQ with 8-bit activations, for an EP that runs
    mixed widths."""
    return (options.mode == "static" and settings.get("format") == "qdq"
            and settings.get("activation_type") in ("uint8", "int8") and options.ep in MIXED_WIDTH_EPS)


def run_search(trials: Trials, source: Path, baseline: Trial, options: QuantizeOptions, proto: ModelProto
               ) -> tuple[Trial, dict, dict[str, str]]:
    """The search from ``baseline`` on the float model ``source`` (``proto``: its graph): the best
    trial, the search's record for the report, and why each node it kept float was kept."""
    float_graph = proto.graph
    producers = {out: node.name for node in float_graph.node for out in node.output}
    consumers: dict[str, list[str]] = {}
    for node in float_graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.name)

    def worst_sample(trial: Trial) -> int:
        """The evaluation sample the trial did worst on (its lowest cosine over both sides)."""
        cosines = trials.evaluations[trial.path].worst_sample_cosines if trial.path in trials.evaluations else []
        return cosines.index(min(cosines)) if cosines else 0

    def focus(trial: Trial) -> tuple[list, int, str]:
        """The samples the search looks at for ``trial``, the index of its worst there, and their
        name: the held-back samples, or, where only the calibration samples fail it (the held-back
        ones pass: evaluate.confirm), those, since the error the search must remove shows there."""
        evaluation = trials.evaluations.get(trial.path)
        side = evaluation.confirmation.failing if evaluation is not None and evaluation.confirmation is not None else None
        if side is not None and side.sample_cosines and evaluation.cpu_verdict and (
                evaluation.on_ep is None or evaluation.on_ep.passed):
            # the confirmation judged the held-back samples first, then the calibration samples
            worst = side.sample_cosines.index(min(side.sample_cosines))
            held = evaluation.confirmation.held_back
            if worst >= held:
                return trials.margin_feeds(), worst - held, "calibration"
            return trials.eval_feeds, worst, "held-back"
        return trials.eval_feeds, worst_sample(trial), "held-back"

    def rank(trial: Trial, kept: list[str], floor: float = NOISE_FLOOR) -> list[tuple[str, list[str], float]]:
        if trial.path is None:
            return []
        # the sample the trial did worst on (where calibration's ranges clip, say) and one more
        feeds, worst, _ = focus(trial)
        picked = [feeds[worst]] + [f for i, f in enumerate(feeds[:2]) if i != worst][:1]
        noise = tensor_noise(source, trial.path, picked, cache=trials.caches.setdefault(source, {}))
        # a tensor stays float only when the node writing it and every node reading it are float
        return [(tensor, ([producers[tensor]] if tensor in producers else []) + consumers.get(tensor, []), score)
                for tensor, score in noise if score > floor]

    ops = set(trials.settings["op_types"] or quantizer_op_types(options.mode, trials.settings["format"]))
    # the share is of the nodes the quantizer would quantize
    quantizable = {node.name for node in proto.graph.node if node.op_type in ops}
    first_rules = []
    off_records: list[dict] = []
    off_reasons: dict[str, str] = {}
    evaluation = trials.evaluations.get(baseline.path) if baseline.path is not None else None
    if evaluation is not None and evaluation.ep_only and evaluation.on_ep.error is None and trials.target is not None:
        # the EP alone gets some outputs wrong: the nodes where its run first parts from the CPU EP's,
        # kept off the EP first (off_target.py: kept float, the EP would still compute them), then kept float
        parted = first_divergence(trials.target, baseline.path, trials.eval_feeds[:2], trials.workdir)
        deadline = trials.started + options.search_seconds if options.search_seconds is not None else None
        moved, off_records, off_reasons = keep_off_ep_move(trials, source, baseline, parted,
                                                            margin_aim(options.min_cosine), deadline)
        if moved is not baseline:
            trials.off = list(moved.off)  # every later trial keeps them off too
            baseline = moved
        names = list(dict.fromkeys(entry["node"] for entry in parted[:3]))
        if names:
            first_rules.append((f"the nodes where {evaluation.on_ep.ep} first parts from the CPU EP ({', '.join(names)})",
                                names))
    if evaluation is not None and evaluation.ep_only and evaluation.on_ep.error is None:
        # then the nodes writing the outputs it gets wrong (their encoding, their precision)
        wrong = evaluation.on_ep.wrong_outputs()
        names, _ = output_writers(onnx.load(str(baseline.path), load_external_data=False), wrong)
        if names:
            first_rules.append((f"the nodes that write the outputs {evaluation.on_ep.ep} gets wrong ({', '.join(wrong[:4])})",
                                names))
    def blame(trial: Trial, kept: list[str]) -> list[tuple[str, str, float]]:
        if trial.path is None or not trials.eval_feeds:
            return []
        feeds, worst, which = focus(trial)
        return worst_nodes(source, trial.path, feeds[worst], set(kept), limit=None,
                           cache=trials.caches.setdefault(("blame", which, str(source), worst), {}))

    search = Search(proto, lambda kept, label: trials.attempt(source, kept, label), rank, quantizable_nodes=quantizable,
                    max_float_share=options.max_float_share, max_trials=options.max_exclude_rounds + 1,
                    fixed=list(trials.fixed), aim=margin_aim(options.min_cosine), first_rules=first_rules, blame=blame,
                    seconds=options.search_seconds, started=trials.started,
                    fine_rank=lambda trial, kept: rank(trial, kept, floor=0.0),
                    clock=trials.target.clock if trials.target is not None else None,
                    attempt_wide=(lambda kept, wide, label: trials.attempt(source, kept, label, wide=wide))
                    if wide_rung(options, trials.settings) else None)
    result = search.run(baseline)
    if not off_records and not search.ok(result.best):
        # nothing parted below DIVERGED before the search, and the search did not pass: the move
        # again from its result, where the EP's run is farthest from the CPU EP's or, where no
        # exposed tensor is apart, from the node that writes what it gets wrong
        late, off_records, off_reasons = late_move(trials, source, result.best, options)
        if late is not result.best:
            result.best = late
            result.stopped += ("; then nodes kept off the EP " + ("passed the gate" if search.ok(late) else "improved it")
                               + " (search.off_ep)")
    size_before = max(model_bytes(source), 1)
    record = {"aim": search.aim, "trials": [t.to_record(size_before) for t in result.trials], "rules": result.rules,
              "ranked": result.ranked[:50], "stopped": result.stopped, "off_ep": off_records,
              "off_ep_reasons": {name: off_reasons.get(name, "kept off the EP") for name in result.best.off}}
    return result.best, record, result.reasons
