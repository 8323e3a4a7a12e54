"""``ctc[:BLANK]``: a CTC recogniser's per-position scores, read as its greedy decoder reads them:
the argmax per position, repeats merged, the blank (index BLANK, default 0; negative counts from
the end) dropped. The decoded strings must be equal, and, for probabilities, the lines' scores stay
on the same side of each level. Gated, it replaces its output's cosine floor (a repeat turning
blank at its run's edge changes nothing read but lowers the cosine). Never inferred:
``--metric OUTPUT=ctc``. Measurements: docs/decisions/fidelity-decisions.md ("CTC")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.classes import class_agreement, expected_class_agreement, probability_rows
from ortprep.fidelity.decisions.decision import Decision, Kind, register
from ortprep.fidelity.decisions.margins import held_at_levels
from ortprep.fidelity.decisions.sequences import expected_sequence_agreement

CTC_REPLACES_COSINE = True
CTC_BLANK = 0
REQUIRED_CTC = 0.95


def sequence_scores(value: np.ndarray) -> np.ndarray:
    """An [N, T, C] output (or a time-major [T, 1, C]) as [N, T, C]."""
    array = np.asarray(value, np.float64)
    if array.ndim == 3 and array.shape[1] == 1 and array.shape[0] > 1:
        array = np.transpose(array, (1, 0, 2))
    return array.reshape(-1, *array.shape[-2:]) if array.ndim >= 2 else array.reshape(1, 1, -1)


def ctc_strings(value: np.ndarray, blank: int = CTC_BLANK) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Greedy CTC decoding of each sequence of ``value``: (the class indices kept, the positions
    they were read at): the argmax per position, repeats merged, the blank dropped."""
    scores = sequence_scores(value)
    classes = scores.shape[-1]
    blank = blank % classes if classes else 0
    decoded = []
    for row in np.argmax(scores, axis=-1):
        keep = np.ones(row.size, bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank
        decoded.append((tuple(int(i) for i in row[keep]), np.nonzero(keep)[0]))
    return decoded


def line_scores(value: np.ndarray, blank: int) -> list[float | None]:
    """Each decoded line's score as PaddleOCR-style recognisers report it: the mean of the top
    probability over the positions it keeps; None for an empty line."""
    scores = sequence_scores(value)
    lines = []
    for (_, kept), row in zip(ctc_strings(value, blank), scores):
        lines.append(float(np.mean(np.max(row[kept], axis=-1))) if kept.size else None)
    return lines


def ctc_pairs(reference: list[np.ndarray], candidate: list) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.asarray(r), np.asarray(c)) for r, c in zip(reference, candidate)
            if c is not None and np.shape(r) == np.shape(c) and np.ndim(r) >= 2 and np.shape(r)[-1] >= 2]


def ctc_agreement(decision: Decision, reference: list[np.ndarray], candidate: list) -> float | None:
    """The share of decoded strings (over the samples' sequences) that are equal."""
    same = total = 0
    for r, c in ctc_pairs(reference, candidate):
        for (want, _), (got, _) in zip(ctc_strings(r, decision.blank), ctc_strings(c, decision.blank)):
            same += want == got
            total += 1
    return same / total if total else None


class Ctc(Kind):
    name = "ctc"
    forms = ("ctc", "ctc:BLANK")
    required = REQUIRED_CTC
    takes_value = True

    def parse(self, value, text):
        try:
            blank = int(value) if value else CTC_BLANK
        except ValueError:
            raise ValueError(f"{text!r}: the number after 'ctc:' is the blank's class index (0, or -1 for the last)"
                             ) from None
        return Decision("ctc", None, "--metric", blank=blank)

    def label(self, decision):
        return "ctc" if decision.blank == CTC_BLANK else f"ctc:{decision.blank}"

    def extra_record(self, decision):
        return {"blank": decision.blank, "replaces_cosine": self.replaces_cosine(decision)}

    def replaces_cosine(self, decision):
        return decision.gated and CTC_REPLACES_COSINE

    def agreement(self, decision, reference, candidate):
        return ctc_agreement(decision, reference, candidate)

    def expected_both(self, reference, candidate, more) -> tuple[float | None, float | None]:
        """(the agreement per position to expect on unseen inputs, the strings' from it): every
        position's argmax taken as able to change a string, so the strings' figure is cautious."""
        per_position = expected_class_agreement(reference, candidate, self.usable(reference, more))
        return per_position, expected_sequence_agreement(reference, per_position)

    def expected(self, decision, reference, candidate, more=None):
        return self.expected_both(reference, candidate, more)[1]

    def confidence(self, decision: Decision, reference: list[np.ndarray], candidate: list,
                   more: list[np.ndarray] | None) -> dict[str, Any] | None:
        """The lines' scores held at each of MAP_LEVELS (an application drops a line below a score
        of its own): the worst level, held to the required share. None where the output is not
        probabilities or no line is read."""
        compared = ctc_pairs(reference, candidate)
        if not compared or not probability_rows(sequence_scores(r).reshape(-1, r.shape[-1]) for r, _ in compared):
            return None
        ours, theirs = [], []
        for r, c in compared:
            for want, got in zip(line_scores(r, decision.blank), line_scores(c, decision.blank)):
                if want is not None:
                    ours.append(want)
                    theirs.append(got if got is not None else 0.0)  # an emptied line has no score to keep
        if not ours:
            return None
        ours_a, theirs_a = np.asarray(ours), np.asarray(theirs)
        pooled = [ours_a]
        for m in more or []:
            m = np.asarray(m)
            if np.ndim(m) >= 2 and np.shape(m)[-1] == np.shape(compared[0][0])[-1]:
                pooled.append(np.asarray([v for v in line_scores(m, decision.blank) if v is not None]))
        return {**held_at_levels(ours_a, theirs_a, np.concatenate(pooled), self.required), "lines": int(ours_a.size)}

    def judge(self, decision, reference, candidate, more=None) -> dict[str, Any]:
        """The decoded strings equal on the required share of the samples' sequences, as many to
        expect on unseen inputs, and the lines' scores on the same side of each level."""
        record: dict[str, Any] = {**decision.record()}
        agreed = ctc_agreement(decision, reference, candidate)
        kept = self.usable(reference, more)
        per_position, expected = self.expected_both(reference, candidate, kept)
        strings = sum(sequence_scores(r).shape[0] for r, _ in ctc_pairs(reference, candidate))
        record.update(agreement=agreed, expected_agreement=expected, strings=strings,
                      strings_changed=None if agreed is None else int(round(strings * (1.0 - agreed))),
                      position_agreement=class_agreement(reference, candidate),
                      expected_position_agreement=per_position)
        if kept:
            record["margin_samples"] = len(reference) + len(kept)
        passed = agreed is not None and agreed >= self.required and (expected is None or expected >= self.required)
        confidence = self.confidence(decision, reference, candidate, kept)
        if confidence is not None:
            record["confidence"] = confidence
            passed = passed and confidence["passed"]
        if agreed is None:
            record["error"] = "no [N, T, C] or [T, 1, C] scores with C >= 2 to decode"
        record["passed"] = passed if decision.gated else None
        return record


CTC = register(Ctc())
