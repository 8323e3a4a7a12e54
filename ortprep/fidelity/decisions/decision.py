"""A decision (what an application reads from one output) and the interface each kind of decision
implements. Kinds register themselves in KINDS; registry.py dispatches to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortprep.fidelity.decisions.evidence import EXACT, RULE, by_evidence, hold
from ortprep.fidelity.decisions.margins import usable


@dataclass(frozen=True)
class Decision:
    kind: str  # a name in KINDS
    threshold: float | None = None  # map, detect: the probability threshold
    chosen_by: str = "inferred"  # "inferred" from the output's form, or "--metric"
    gated: bool = True  # False: reported beside cosine, not part of the gate
    # map: True when --metric named the threshold (map:T): its regions are judged there alone
    threshold_given: bool = field(default=False, compare=False)
    # map: rows of independent scores ([N, C] from a Sigmoid): each row's best class is held too
    ranked: bool = field(default=False, compare=False)
    # top1: probability rows (inferred): the top class's probability is held at each level too
    confident: bool = field(default=False, compare=False)
    blank: int = 0  # ctc: the blank's class index (negative: from the end)
    bins: int | None = None  # dfl: the bins per side (None: the axis of 4 x BINS values, divided by 4)
    # inferred: what in the output's form chose the kind ("a [1, 4] output made by Softmax")
    because: str = field(default="", compare=False)
    # argmax: logits over a vocabulary at each position, judged per position (no whole-sequence rule)
    per_position: bool = field(default=False, compare=False)
    # map: --metric map:T:exact: regions kept only where their bounding box stays identical
    exact_boxes: bool = field(default=False, compare=False)

    @property
    def reads_margins(self) -> bool:
        """Whether the agreement to expect on unseen inputs is estimated from the float model's
        margins (how near each decision sits to its boundary)."""
        return KINDS[self.kind].reads_margins

    @property
    def replaces_cosine(self) -> bool:
        """Whether this decision, gated, judges its output in place of the cosine floor."""
        return KINDS[self.kind].replaces_cosine(self)

    def label(self) -> str:
        return KINDS[self.kind].label(self)

    def record(self) -> dict[str, Any]:
        kind = KINDS[self.kind]
        record = {"kind": self.kind, "threshold": self.threshold, "chosen_by": self.chosen_by, "gated": self.gated,
                  "required": kind.required if self.gated else None}
        if self.ranked:
            record["ranked"] = True
        if self.confident:
            record["confident"] = True
        if self.per_position:
            record["per_position"] = True
        if self.exact_boxes:
            record["exact_boxes"] = True
        # an assumed decision (not named with --metric) refuses on evidence (evidence.py)
        record["rule"] = RULE if by_evidence(self) else EXACT
        if self.because:
            record["inferred_from"] = self.because
        record.update(kind.extra_record(self))
        return record


@dataclass(frozen=True)
class Output:
    """What inference reads of one float output: its name, its values over the samples, their
    shape, the op that makes it, whether every value lies in [0, 1], and the model."""

    name: str
    values: list[np.ndarray]
    shape: tuple[int, ...]
    maker: str | None
    probability: bool
    proto: Any


class Kind:
    """One kind of decision: how it is written after --metric, inferred from an output, measured
    (its agreement, and the agreement to expect on unseen inputs) and what share it requires."""

    name = ""
    forms: tuple[str, ...] = ()  # how --metric writes it, for the error message
    required: float | None = None  # the share of agreement the gate asks
    reads_margins = True
    margins_any_shape = False  # other samples' outputs join the margins whatever their shape (a map)
    takes_value = False  # --metric NAME=KIND:VALUE

    def parse(self, value: str, text: str) -> Decision:
        return Decision(self.name, None, "--metric", threshold_given=bool(value))

    def infer(self, output: Output) -> Decision | None:
        return None  # never inferred: only --metric names it

    def label(self, decision: Decision) -> str:
        return self.name

    def extra_record(self, decision: Decision) -> dict[str, Any]:
        return {}

    def replaces_cosine(self, decision: Decision) -> bool:
        return False

    def usable(self, reference: list[np.ndarray], more: list[np.ndarray] | None) -> list[np.ndarray]:
        return usable(reference, more, self.margins_any_shape)

    def agreement(self, decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
        raise NotImplementedError

    def units(self, decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
        """How many decisions (rows, positions, F1's elements) the agreement is a share of: what
        the evidence rule's interval rests on. None: not counted (the exact rule then)."""
        return None

    def expected(self, decision: Decision, reference: list[np.ndarray], candidate: list,
                 more: list[np.ndarray] | None = None) -> float | None:
        raise NotImplementedError

    def also(self, decision: Decision, record: dict[str, Any], reference: list[np.ndarray], candidate: list,
             more: list[np.ndarray] | None, passed: bool) -> bool:
        """What this kind holds beyond its agreement (whole sequences, regions, ...): adds to
        ``record``, returns the verdict."""
        return passed

    def judge(self, decision: Decision, reference: list[np.ndarray], candidate: list,
              more: list[np.ndarray] | None = None) -> dict[str, Any]:
        """The agreement on the samples and the agreement to expect on unseen ones reach
        ``required``, and whatever ``also`` holds. ``passed`` is None when not gated."""
        agreed = self.agreement(decision, reference, candidate)
        expected = self.expected(decision, reference, candidate, more)
        record: dict[str, Any] = {**decision.record(), "agreement": agreed, "expected_agreement": expected}
        kept = self.usable(reference, more)
        if kept:
            record["margin_samples"] = len(reference) + len(kept)
        units = self.units(decision, reference, candidate) if by_evidence(decision) else None
        passed = hold(record, "agreement", agreed, units, expected, self.required, by_evidence(decision))
        passed = self.also(decision, record, reference, candidate, more, passed)
        record["passed"] = passed if decision.gated else None
        return record


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    return kind
