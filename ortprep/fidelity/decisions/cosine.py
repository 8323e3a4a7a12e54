"""``cosine``: no decision; the output is judged by its cosine and norm ratio alone (``--metric
OUTPUT=cosine`` turns an inferred decision off)."""

from __future__ import annotations

from typing import Any

from ortprep.fidelity.decisions.decision import Kind, register


class Cosine(Kind):
    name = "cosine"
    forms = ("cosine",)
    reads_margins = False

    def agreement(self, decision, reference, candidate):
        return None

    def expected(self, decision, reference, candidate, more=None):
        return None

    def judge(self, decision, reference, candidate, more=None) -> dict[str, Any]:
        record: dict[str, Any] = {**decision.record(), "agreement": None, "expected_agreement": None}
        kept = self.usable(reference, more)
        if kept:
            record["margin_samples"] = len(reference) + len(kept)
        record["passed"] = None
        return record


COSINE = register(Cosine())
