"""How far a judged decision falls short of the gate, or of the margin asked of a result chosen
among several trials on the same samples (the winner's curse)."""

from __future__ import annotations

from typing import Any


def with_margin(required: float) -> float:
    """A share the gate asks, raised half-way to 1: what a result chosen among several trials on
    the same samples must hold."""
    return required + (1.0 - required) / 2


def share_gaps(record: dict[str, Any], bar=lambda required: required) -> list[tuple[str, float, float]]:
    """(what, asked, measured) for each share the gate asks of a judged decision (``bar(required)``)
    and the share measured or expected: agreement, whole sequences, regions, whole scenes, the
    ranking, the confidence. A share the evidence rule judged (an assumed decision's: evidence.py)
    is read by its upper bound, held to the gate's own bar: its interval already answers for the
    few samples it rests on (docs/decisions/gate-evidence.md)."""
    gaps: list[tuple[str, float, float]] = []

    def gap(required: float | None, source: dict[str, Any], *values: tuple[str, str]) -> None:
        if required is None:
            return
        for what, key in values:
            upper = source.get(f"{key}_upper")
            if upper is not None:
                gaps.append((what, required, upper))
            elif source.get(key) is not None:
                gaps.append((what, bar(required), source[key]))

    gap(record.get("required"), record, ("agreement", "agreement"), ("expected agreement", "expected_agreement"))
    gap(record.get("required_sequences"), record, ("whole sequences", "sequence_agreement"),
        ("expected whole sequences", "expected_sequence_agreement"))
    gap(record.get("required_regions"), record, ("regions", "region_agreement"), ("boxes", "box_agreement"))
    gap(record.get("required_scenes"), record, ("whole scenes", "scene_agreement"),
        ("expected whole scenes", "expected_scene_agreement"))
    for part in ("ranking", "confidence"):
        nested = record.get(part) or {}
        gap(nested.get("required"), nested, (part, "agreement"), (f"expected {part}", "expected_agreement"))
    return gaps


def decision_shortfall(record: dict[str, Any] | None) -> float:
    """How far a judged decision falls short of the gate: the largest gap between a share asked and
    the share measured or expected, in share points; 0.0 when it passes, is not gated, or has
    nothing measured. The accuracy search reads it as progress where cosine cannot show it."""
    if not record or record.get("passed") is not False:
        return 0.0
    return max([0.0, *(asked - value for _, asked, value in share_gaps(record))])


def margin_shortfall(record: dict[str, Any] | None) -> float:
    """How far a gated decision falls short of every share asked raised half-way to 1
    (with_margin), in share points; 0.0 when it holds them all, is not gated, or has nothing
    measured (docs/decisions/fidelity-decisions.md, "The margin of a chosen result")."""
    if not record or record.get("passed") is None:  # not gated
        return 0.0
    return max([0.0, *(asked - value for _, asked, value in share_gaps(record, with_margin))])
