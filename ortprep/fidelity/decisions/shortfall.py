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
    ranking, the confidence."""
    gaps: list[tuple[str, float, float]] = []

    def gap(required: float | None, *values: tuple[str, float | None]) -> None:
        if required is not None:
            gaps.extend((what, bar(required), value) for what, value in values if value is not None)

    gap(record.get("required"), ("agreement", record.get("agreement")),
        ("expected agreement", record.get("expected_agreement")))
    gap(record.get("required_sequences"), ("whole sequences", record.get("sequence_agreement")),
        ("expected whole sequences", record.get("expected_sequence_agreement")))
    gap(record.get("required_regions"), ("regions", record.get("region_agreement")),
        ("boxes", record.get("box_agreement")))
    gap(record.get("required_scenes"), ("whole scenes", record.get("scene_agreement")),
        ("expected whole scenes", record.get("expected_scene_agreement")))
    for part in ("ranking", "confidence"):
        nested = record.get(part) or {}
        gap(nested.get("required"), (part, nested.get("agreement")),
            (f"expected {part}", nested.get("expected_agreement")))
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
