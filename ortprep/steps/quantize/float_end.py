"""The late phases of quantize's search, where its own phases stopped short of the gate: the
16-bit rung (:meth:`FloatEnd.widen`) and the bisection from the float end
(:meth:`FloatEnd.converge`). A mixin of :class:`~ortprep.steps.quantize.strategy.Search`, whose
attributes it reads (attempt, attempt_wide, rank, fine_rank, budget, fixed, quantizable, closure,
share); each phase spends a phase of the search's :class:`~ortprep.prove.reduction.Budget`.
"""

from __future__ import annotations

import numpy as np

from ortprep.prove.reduction import Budget, doubling, first_true
from ortprep.steps.quantize.trials import FLOAT_MODEL, SearchResult, Trial, ep_only, improved


class FloatEnd:
    """The rung and the float end of :class:`~ortprep.steps.quantize.strategy.Search`."""

    def widen(self, result: SearchResult) -> SearchResult:
        """The 16-bit rung, before the float end: the tensors still quantized, ranked by how much each
        alone moves the outputs (sensitivity; its own noise, fine_rank, orders those it did not reach:
        an error that grows downstream, as in a variance written E[x^2] - E[x]^2, is small where it
        starts), the worst 1, 2, 4, ... given 16-bit activations (weights stay
        as asked) until a trial passes, then bisected between the last that failed and it for the
        fewest that pass. Doubling rather than bisecting from "all 16-bit": that end need not pass
        (ORT's CPU EP fuses a MatMul of a 16-bit input and an 8-bit weight into int8 compute:
        docs/decisions/reduce-quantize-search.md).
        A tensor costs no weight this way, so this comes before keeping nodes float. Not run where
        only the target EP fails (its own error, as for the float end) or without attempt_wide.
        Its trials are its own phase of the search's budget (two per doubling)."""
        best = result.best
        if self.attempt_wide is None or best.path is None or ep_only(best):
            return result
        kept = list(best.kept)
        noisy = [label for label, _, _ in self._units(best, kept, self.fine_rank or self.rank)]
        # the noisiest are measured first: where its time runs out, they are the ones it reached
        moved = self._units(best, kept, lambda trial, nodes: self.sensitivity(trial, nodes, noisy)
                            ) if self.sensitivity else []
        self.sensitive = [(label, score) for label, _, score in moved]
        moving = [label for label, _, _ in moved]
        tensors = list(dict.fromkeys(moving + noisy))
        if not tensors:
            return result
        by = " by the outputs' change" if moving else ""
        before = result.stopped
        steps = int(np.ceil(np.log2(len(tensors)))) + 1
        phase = self.budget.phase(2 * steps)

        def judge(count: int) -> Trial | None:
            if self.out_of_time() or phase.out_of_probes():
                return None
            label = f"16-bit activations: the worst {count} of {len(tensors)} ranked tensor(s){by}"
            return self._probe(result, phase, lambda: self.attempt_wide(kept, tensors[:count], label))

        chosen = closest = None

        def probe(count: int) -> bool | None:
            nonlocal chosen, closest
            outcome = judge(count)
            if outcome is None:
                return None
            if self.ok(outcome):
                chosen = outcome
                return True
            if outcome.passed and (closest is None or improved(outcome, closest)):
                closest = outcome
            return False

        # the worst 1, 2, 4, ... tensors at 16 bits until a trial passes (the engine's galloping search)
        low, count, _ = doubling(len(tensors), probe)
        if chosen is not None:
            _, chosen = self._fewest(low, count, chosen, judge)
            earlier = [n for n in kept if n not in self.fixed]
            if earlier and not self.out_of_time():
                # the nodes the earlier phases kept float may be needless now: one trial without them
                label = (f"16-bit activations: the worst {len(chosen.wide)}, without the {len(earlier)} node(s) "
                         "kept float before")
                outcome = self._probe(result, phase,
                                      lambda: self.attempt_wide(list(self.fixed), list(chosen.wide), label))
                if self.ok(outcome):
                    chosen = outcome
                    for name in earlier:
                        result.reasons.pop(name, None)
            result.best = chosen
            result.stopped = (f"{before}; then 16-bit activations on the {len(chosen.wide)} worst-ranked tensor(s) "
                              "passed the gate with the margin (the weights stay as asked"
                              + (f"; {len(chosen.kept) - len(self.fixed)} node(s) kept float"
                                 if len(chosen.kept) > len(self.fixed)
                                 else "") + ")")
        elif closest is not None and improved(closest, best):
            result.best = closest
            result.stopped = (f"{before}; 16-bit activations on the {len(closest.wide)} worst-ranked tensor(s) passed "
                              "the gate short of the margin at best")
        else:
            ran_out = self.out_of_time() or phase.out_of_probes()
            then = f" (then: {self._converge_limit(phase)})" if ran_out and low < len(tensors) else ""
            result.stopped = (f"{before}; 16-bit activations on the worst 1 to {low} of {len(tensors)} ranked tensors "
                              "did not pass" + then)
        return result

    def converge(self, result: SearchResult) -> SearchResult:
        """The bisection from the float end, where the search ended short of the gate: the nodes the
        quantizer would quantize that are still quantized, ordered by the noise they add in the
        best trial (fine_rank, every tensor with any noise; the unranked ones after them, those
        nearest the outputs first), bisected on how many of the first ones to keep float (with
        what writes their inputs), between the best trial (fails) and the float model (passes,
        and is not run); within --max-float-share, from the most it allows (that trial is run).
        It ends at the fewest that pass, or says that only the float model (or the cap) is left.
        Its trials are its own phase of the budget, about log2(nodes) + 1, past --max-exclude-rounds
        (which bounds the search before it); the time bound and the target EP's clock still hold.
        The bisection is the reduction engine's (prove.reduction.first_true). Not run where the
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
            result.stopped = (f"{before}; only the float model is past it: keeping the first of the {len(order)} "
                              "node(s) still quantized in float keeps them all (with what writes their inputs)")
            return result
        low, passing, closest = 0, None, None  # closest: the best trial that passed the gate short of the margin
        phase = self.budget.phase(int(np.ceil(np.log2(high + 1))) + 1)
        stopped_by = None
        # what a set of kept nodes was found to be (True: it passes, or leaves nothing quantized)
        tried: dict[frozenset, bool] = {frozenset(prefix(0)): False}

        def judge(count: int, label: str) -> Trial | None:
            nonlocal closest
            outcome = self._converge_trial(result, kept + prefix(count), label, phase)
            if outcome is not None and outcome.passed and not self.ok(outcome) and (
                    closest is None or improved(outcome, closest)):
                closest = outcome
            return outcome

        if capped:  # the float end is beyond --max-float-share: its nearest point is run, not assumed
            outcome = judge(high, f"from the float end: {len(prefix(high))} node(s) kept float, the first {high} of "
                                  f"{len(order)} (the most --max-float-share allows)")
            if outcome is None:
                stopped_by = self._converge_limit(phase)
            else:
                tried[frozenset(prefix(high))] = self.ok(outcome) or outcome.error == FLOAT_MODEL
                if self.ok(outcome):
                    passing = (high, outcome)
                elif outcome.error != FLOAT_MODEL:
                    low = high

        def probe(middle: int) -> bool | None:
            nonlocal passing, stopped_by
            known = tried.get(frozenset(prefix(middle)))
            if known is not None:  # what it keeps was judged already: that verdict stands
                return known
            outcome = judge(middle, f"from the float end: {len(prefix(middle))} node(s) kept float, the first {middle} "
                                    f"of {len(order)}")
            if outcome is None:
                stopped_by = self._converge_limit(phase)
                return None
            if self.ok(outcome):
                passing = (middle, outcome)
            # a trial that leaves nothing quantized: the float end is nearer
            tried[frozenset(prefix(middle))] = self.ok(outcome) or outcome.error == FLOAT_MODEL
            return tried[frozenset(prefix(middle))]

        if stopped_by is None:
            low, high, _ = first_true(low, high, probe)
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
                              + (f"; keeping {high} leaves nothing quantized" if high < len(groups) and not capped
                                 else "")
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

    def _converge_limit(self, phase: Budget) -> str:
        """Why a late phase (the rung, the float end) ran no further trial: a bound, or its own trials."""
        return self.limit_reached() if self.out_of_time() else f"its trials were spent ({phase.probes} in all)"

    def _converge_trial(self, result: SearchResult, nodes: list[str], label: str, phase: Budget) -> Trial | None:
        if self.out_of_time() or phase.out_of_probes():
            return None
        return self._probe(result, phase, lambda: self.attempt(nodes, label))
