"""The selection logic of quantize's search (``--auto-exclude``): which nodes to keep in float.

Once the baseline fails the gate: op-type rules known to matter, each kept only when it measurably
helps (:func:`rule_sets`); then every node still quantized ranked by the error it adds and the
ranked list bisected for the fewest that pass; then the nodes where the error starts (blame);
then, with time left, the late phases (:mod:`.float_end`): the 16-bit rung and the bisection from
the float end. It stops at a pass with the margin (:func:`~.trials.reaches_margin`), at
``max_float_share`` of the weights, or at its :class:`~ortprep.prove.reduction.Budget` (trials and
seconds). Trials and rankings are passed in: this module runs no model.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import onnx

from ortprep.model import iter_graphs
from ortprep.prove.reduction import Budget, first_true
from ortprep.runtime.budget import EpClock, step_spent
from ortprep.steps.quantize.float_end import FloatEnd
from ortprep.steps.quantize.trials import SearchResult, Trial, change, ep_only, improved, reaches_margin

NOISE_FLOOR = 0.02  # quantization noise (RMS over median magnitude) below which a tensor is not worth keeping float


def rule_sets(proto: onnx.ModelProto) -> list[tuple[str, list[str]]]:
    """(rule, node names) for the op-type rules that apply to this model."""
    graph = proto.graph
    constants = ({t.name for t in graph.initializer}
                 | {o for n in graph.node if n.op_type == "Constant" for o in n.output})
    rules = [
        ("Softmax", [n.name for n in graph.node if n.op_type == "Softmax"]),
        ("LayerNormalization",
         [n.name for n in graph.node if n.op_type in ("LayerNormalization", "SimplifiedLayerNormalization")]),
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


class Search(FloatEnd):
    """Runs trials through ``attempt(kept, label) -> Trial`` (quantize + evaluate) and ``rank(trial,
    kept) -> [(tensor, nodes, noise)]``: the quantized tensors of a trial's model, worst first, each
    with the nodes to keep in float so that it stays float (its producer and its consumers)."""

    def __init__(self, float_proto: onnx.ModelProto, attempt: Callable[[list[str], str], Trial],
                 rank: Callable[[Trial, list[str]], list[tuple[str, list[str], float]]], *, quantizable_nodes: set[str],
                 max_float_share: float, fixed: list[str], budget: Budget | None = None, aim: float | None = None,
                 first_rules: list[tuple[str, list[str]]] | None = None,
                 blame: Callable[[Trial, list[str]], list[tuple[str, str, float]]] | None = None,
                 fine_rank: Callable[[Trial, list[str]], list[tuple[str, list[str], float]]] | None = None,
                 clock: EpClock | None = None,
                 attempt_wide: Callable[[list[str], list[str], str], Trial] | None = None,
                 sensitivity: Callable[[Trial, list[str], list[str]], list[tuple[str, list[str], float]]] | None = None
                 ) -> None:
        # attempt_wide(kept, tensors, label): a trial whose ``tensors`` get 16-bit activations (the
        # 16-bit rung, where the activations are 8-bit and the EP runs mixed widths); None: no such rung
        self.attempt_wide = attempt_wide
        # sensitivity(trial, kept, first): as rank, ordered by how much each tensor's quantization
        # alone moves the outputs, the tensors ``first`` names measured first (the rung's order; the
        # noise orders the tensors it did not reach)
        self.sensitivity = sensitivity
        self.sensitive: list[tuple[str, float]] = []  # the rung's ranking by it, for the report
        # the step's time on the target EP (--ep-total-seconds): once spent, no trial can pass there
        self.clock = clock
        # the trials (the baseline counts as one: --max-exclude-rounds + 1) and the seconds from the
        # quantize step's first trial (--search-seconds) the search may spend; run() accounts in
        # ``budget``, a fresh copy of these limits
        self.limits = budget or Budget()
        self.budget = dataclasses.replace(self.limits)
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
        self.weight_cap = max_float_share * total if total else float("inf")
        self.fixed = list(fixed)
        # the nodes the quantizer would quantize, in graph order (the float end's bisection orders them)
        self.quantizable = [node.name for node in graph.node if node.name in quantizable_nodes]
        self.quantizable_set = set(self.quantizable)

    def run(self, baseline: Trial) -> SearchResult:
        """The search; where it ends short of the gate with time left, the bisection from the float
        end (converge) follows, so that it stops only at a pass, the float model, or a bound."""
        self.budget = dataclasses.replace(self.limits, used=1, parent=None)  # the baseline is a trial
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
            result.stopped += (f"; the best kept is the rung's: 16-bit activations on {len(wide.wide)} tensor(s), "
                               "passing the gate short of the margin")
        return result

    def _run(self, baseline: Trial) -> SearchResult:
        result = SearchResult(best=baseline, trials=[baseline])
        current = baseline
        kept = list(self.fixed)
        reasons: dict[str, str] = {}

        def trial(nodes: list[str], label: str) -> Trial | None:
            if self.budget.out_of_probes() or self.out_of_time():
                return None
            return self._probe(result, self.budget, lambda: self.attempt(nodes, label))

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
            record = {"rule": label, "nodes": len(extra), "cosine_before": current.cosine,
                      "cosine_after": outcome.cosine,
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
            if self.out_of_time() or self.budget.out_of_probes():
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
            top = trial(kept + prefix(high),
                        f"ranked{below} (pass {passes}): worst {high} tensor(s), {len(prefix(high))} node(s)")
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
                    f"keeping the {len(prefix(high))} nodes around the {high} worst-ranked tensors in float did not "
                    "improve the result")
                result.best = current
                break
            # better but not there: keep them, and rank again on the new result (the next error source shows)
            self._explain(units[:high], reasons)
            kept += prefix(high)
            current = top
        result.reasons = reasons
        return result

    def _fewest(self, low: int, high: int, best: Trial, judge: Callable[[int], Trial | None]) -> tuple[int, Trial]:
        """Bisects between ``low`` (fails) and ``high`` (``best`` passes) for the fewest that the
        search accepts; ``judge(count)`` runs a trial (None: no more may run). Returns the count and
        its trial. The reduction engine's bisection (prove.reduction.first_true)."""
        accepted = {high: best}

        def probe(count: int) -> bool | None:
            outcome = judge(count)
            if outcome is None:
                return None
            if self.ok(outcome):
                accepted[count] = outcome
                return True
            return False

        _, high, _ = first_true(low, high, probe)
        return high, accepted[high]

    @staticmethod
    def _probe(result: SearchResult, budget: Budget, attempt: Callable[[], Trial]) -> Trial:
        """One trial, counted in ``budget`` and kept in ``result``."""
        outcome = attempt()
        result.trials.append(outcome)
        budget.count()
        return outcome

    def ok(self, trial: Trial) -> bool:
        """A trial the search accepts: it passes the gate, and its lowest cosine reaches ``aim`` and
        its decisions the decision margin (above the gate: the held-back samples are few, and the
        result must hold on others; reaches_margin)."""
        return reaches_margin(trial, self.aim)

    # The error-start phase keeps this many of the blamed nodes float first, doubling while a trial
    # does not improve, up to the float budget.
    FIRST_BLAMED = 4

    def _where_error_starts(self, current: Trial, kept: list[str], reasons: dict[str, str], result: SearchResult,
                            trial: Callable[[list[str], str], Trial | None],
                            why: str | None = None) -> tuple[Trial, str]:
        """After the ranking by activation noise has nothing left that helps: keep float the nodes
        where the error starts (blame), the worst FIRST_BLAMED first, twice as many while that does
        not improve the result, and rank again after each improvement; until the gate passes, the
        float budget or the trial limit is reached, or no node introduces measurable error. Returns
        the best trial and why the search stopped."""
        stopped = why or "no quantized tensor left adds measurable error"
        sides = current.sides or {}
        if why is None and ep_only(current):
            # the ranking measures activation noise on the CPU EP, where this model already passes
            stopped += (f" on the CPU EP, where it passes; what fails is {sides['ep'].get('ep') or 'the target EP'}'s "
                        "own error, which that ranking does not see")
        if self.blame is None:
            return current, stopped
        count, rounds = self.FIRST_BLAMED, 0
        blamed_for: Trial | None = None
        while not self.ok(current):
            if self.out_of_time() or self.budget.out_of_probes():
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
        """The search's seconds are spent, or the step's time on the target EP (EpClock)."""
        if self.clock is not None and self.clock.exhausted:
            return True
        return self.budget.out_of_time() or step_spent("the search's later trials", trial=True)

    def limit_reached(self) -> str:
        """Why no further trial ran: the time bound or the trial limit."""
        if self.clock is not None and self.clock.exhausted:
            return (f"{self.clock.spent_words('on the target EP')} was spent: no "
                    "later trial could be judged there")
        if step_spent("the search's later trials", trial=True):
            return "the step's own time (--step-seconds) was spent: no later trial could run"
        if self.out_of_time():
            if self.budget.seconds is not None and self.budget.seconds <= 0:
                # --auto: --search-seconds bounds the whole step, and the earlier precisions' searches used it
                return ("no search time was left (--search-seconds bounds the whole step; --auto's earlier attempts "
                        "used it)")
            return f"the time bound ({self.budget.seconds:g} s, --search-seconds) was reached"
        return f"the trial limit ({self.budget.probes}) was reached"

    def fits(self, nodes: list[str]) -> bool:
        """Whether keeping ``nodes`` float keeps within --max-float-share of the quantizable weights
        (only the quantizable nodes' weights count: the others stay float anyway)."""
        if self.share >= 1:
            return True
        unique = set(nodes) & self.quantizable_set
        return sum(self.cost.get(n, 0) for n in unique) <= self.weight_cap

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
                reasons.setdefault(name,
                                   f"ranked #{position}: keeps tensor '{label}' float (quantization noise {score:.3g} "
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
