"""The decision kinds, in the order --metric lists them and inference tries them, and the functions
that dispatch to them: parse a --metric, infer each output's decision, measure and judge one."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.assumptions import annotate
from ortprep.fidelity.decisions.classes import FEATURE_MAKERS, TOP1, named_as_classes
from ortprep.fidelity.decisions.cosine import COSINE
from ortprep.fidelity.decisions.ctc import CTC
from ortprep.fidelity.decisions.decision import KINDS as REGISTERED
from ortprep.fidelity.decisions.decision import Decision, Output
from ortprep.fidelity.decisions.detections import DETECT
from ortprep.fidelity.decisions.dfl import DFL
from ortprep.fidelity.decisions.maps import MAP
from ortprep.fidelity.decisions.sequences import ARGMAX
from ortprep.fidelity.graph import maker

ORDER = (TOP1, ARGMAX, MAP, DETECT, CTC, DFL, COSINE)
KINDS = tuple(kind.name for kind in ORDER)
assert set(KINDS) == set(REGISTERED), "every registered kind is listed"
# What the gate asks of each kind: the share of rows, positions, elements (F1), strings or sides.
REQUIRED = {kind.name: kind.required for kind in ORDER if kind.required is not None}
# Inference tries these in turn (the first that claims an output decides): rows that are one
# input's positions before rows of a batch, class scores before maps.
INFERENCE = (ARGMAX, TOP1, MAP)


def parse_metric(text: str) -> Decision:
    """``top1``, ``top1:0.8``, ``argmax``, ``argmax:positions``, ``map``, ``map:0.3``,
    ``map:0.3:exact``, ``detect``, ``detect:0.25``, ``ctc``, ``ctc:-1``, ``dfl``, ``dfl:8`` or
    ``cosine`` (ValueError otherwise). A decision named so keeps the exact rule; an inferred one
    refuses on evidence (evidence.py)."""
    name, _, value = text.strip().lower().partition(":")
    kind = REGISTERED.get(name)
    if kind is None or (value and not kind.takes_value):
        raise ValueError(f"{text!r} is not a metric: use one of "
                         + ", ".join(form for known in ORDER for form in known.forms))
    return kind.parse(value, text)


def infer_decisions(proto, reference: list[dict[str, np.ndarray]], overrides: dict[str, str] | None = None
                    ) -> dict[str, Decision]:
    """Each float output's decision, from its shape over the samples, its values and the op that
    makes it (``proto``: the float model); ``overrides``: output -> metric text (--metric)."""
    decisions: dict[str, Decision] = {}
    overrides = overrides or {}
    for name in (reference[0] if reference else {}):
        if name in overrides:
            decisions[name] = parse_metric(overrides[name])
            continue
        values = [np.asarray(sample[name]) for sample in reference if name in sample]
        if not values or values[0].dtype.kind != "f":
            continue
        made_by = maker(proto, name)
        if made_by in FEATURE_MAKERS and not named_as_classes(name):
            continue  # hidden states: no class is read from them (the cosine and the norm hold them)
        low = min(float(np.nanmin(v)) for v in values if v.size)
        high = max(float(np.nanmax(v)) for v in values if v.size)
        output = Output(name, values, values[0].shape, made_by, 0.0 <= low and high <= 1.0, proto)
        for kind in INFERENCE:
            decision = kind.infer(output)
            if decision is not None:
                decisions[name] = decision
                break
    return decisions


def agreement(decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
    """How far ``candidate``'s decisions agree with ``reference``'s, pooled over the samples
    (1.0: the same everywhere); None for ``cosine`` or when nothing can be compared."""
    return REGISTERED[decision.kind].agreement(decision, reference, candidate)


def expected_agreement(decision: Decision, reference: list[np.ndarray], candidate: list,
                       more: list[np.ndarray] | None = None) -> float | None:
    """The agreement to expect on unseen inputs of the same kind, from the float model's margins
    and the candidate's errors on them, taken as independent. ``more``: the float model's outputs
    on other samples, whose margins join the estimate. None for ``cosine`` or when nothing can be
    compared."""
    return REGISTERED[decision.kind].expected(decision, reference, candidate, more)


def judge_decision(decision: Decision, reference: list[np.ndarray], candidate: list,
                   more: list[np.ndarray] | None = None) -> dict[str, Any]:
    """One output's decision held to the gate by its kind (see each kind's module): the agreement
    on the samples and the agreement to expect on unseen ones reach its required share, and what
    else the kind holds; an assumed decision by the evidence rule (evidence.py). ``passed`` is None
    when the decision is not gated; the record says what was assumed and what refused
    (assumptions.py)."""
    return annotate(REGISTERED[decision.kind].judge(decision, reference, candidate, more))


def label_of(record: dict[str, Any]) -> str:
    """A judged decision's label (``map:0.5``, ``ctc:-1``, ...) from its record."""
    decision = Decision(record["kind"], record.get("threshold"), blank=record.get("blank") or 0,
                        bins=record.get("bins"), per_position=bool(record.get("per_position")),
                        exact_boxes=bool(record.get("exact_boxes")))
    return REGISTERED[record["kind"]].label(decision)
