"""The agreement to expect on unseen inputs, from margins and errors: how near the float model's
decisions sit to their boundary, and how far the candidate moves them toward it. Shared by every
kind of decision. Measurements behind the rules: docs/decisions/fidelity-decisions.md."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.evidence import hold, upper_bound

# At most this many margins (and errors) enter an estimate (an even stride keeps its shape).
_ESTIMATE_CAP = 200_000
# The margin the near-boundary line of flip_rate reaches: the second smallest.
NEAREST_MARGINS = 2
# The levels a score is held at where the application's own threshold is not known.
MAP_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def pairs(reference: list[np.ndarray], candidate: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (float, candidate) outputs of each sample that can be compared (the candidate ran and
    has the float output's shape), as given: read in float64 one pair at a time (as64), so that
    large outputs are not all converted at once."""
    return [(r, c) for r, c in zip(reference, candidate) if c is not None and np.shape(r) == np.shape(c)]


def as64(compared: list[tuple[np.ndarray, np.ndarray]]):
    """Each pair in float64, one at a time."""
    for r, c in compared:
        yield np.asarray(r, np.float64), np.asarray(c, np.float64)


def usable(reference: list[np.ndarray], more: list[np.ndarray] | None, any_shape: bool) -> list[np.ndarray]:
    """The float outputs of ``more`` whose margins can join ``reference``'s: the class axis must
    match (sequences of other lengths count), or, ``any_shape``, any shape. As given."""
    if not reference:
        return []
    classes = np.shape(reference[0])[-1:]
    return [np.asarray(m) for m in (more or []) if m is not None and np.ndim(m) >= 1
            and (any_shape or np.shape(m)[-1:] == classes)]


def thin(values: np.ndarray) -> np.ndarray:
    values = values[np.isfinite(values)]
    if values.size > _ESTIMATE_CAP:
        values = values[:: int(np.ceil(values.size / _ESTIMATE_CAP))]
    return values


def flip_rate(margins: np.ndarray, errors: np.ndarray) -> float:
    """How often a decision changes on an input nobody measured: the chance that an error drawn
    from ``errors`` (how far the candidate moved a decision toward its boundary) exceeds a margin
    drawn from ``margins`` (how far the float model's decision sits from it). The margins' CDF is
    interpolated through the origin at plotting positions k / (n + 1), so that a few samples with
    no near tie still give a near-tie rate in proportion to the error."""
    margins, errors = thin(np.asarray(margins, np.float64)), thin(np.asarray(errors, np.float64))
    if margins.size == 0 or errors.size == 0:
        return 0.0
    count = margins.size + 1
    tied = int(np.sum(margins <= 0.0))  # a margin of 0 (an exact tie) is below any positive error
    ordered = np.sort(margins[margins > 0.0])
    floor = tied / count
    if ordered.size == 0:
        cdf = np.full(errors.shape, floor)
    else:
        # the CDF through (0, floor) and each margin's plotting position k / (n + 1); a repeated margin
        # rises from its first position to its last where it stands
        values = np.unique(ordered)
        first = (tied + np.searchsorted(ordered, values, side="left") + 1) / count
        last = (tied + np.searchsorted(ordered, values, side="right")) / count
        index = np.searchsorted(values, errors, side="left")  # the margins' values below each error
        inside = np.minimum(index, values.size - 1)
        left_x = np.where(index == 0, 0.0, values[np.maximum(index - 1, 0)])
        left_y = np.where(index == 0, floor, last[np.maximum(index - 1, 0)])
        right_x, right_y = values[inside], first[inside]
        width = np.where(right_x > left_x, right_x - left_x, 1.0)
        # beyond the largest margin every decision is within reach
        cdf = np.where(index >= values.size, 1.0, left_y + (errors - left_x) / width * (right_y - left_y))
        # Near the boundary the CDF is a straight line through the origin up to the second smallest
        # margin, not the smallest: the smallest of a few samples is the most variable of them
        # (docs/decisions/fidelity-decisions.md, "Near ties").
        k = min(ordered.size, NEAREST_MARGINS)
        reach = ordered[k - 1]
        at_reach = (tied + k) / count  # the k-th margin's position, whether or not it repeats the one before
        cdf = np.where(errors <= reach, floor + errors / reach * (at_reach - floor), cdf)
    # an error that does not move a decision toward its boundary flips none
    return float(np.mean(np.where(errors > 0.0, cdf, 0.0)))


def held_at_levels(ours: np.ndarray, theirs: np.ndarray, everything: np.ndarray, required: float,
                   evidence: bool = False, levels: tuple[float, ...] | None = None) -> dict[str, Any]:
    """Scores in 0..1 (``ours`` the float model's, ``theirs`` the candidate's for the same rows)
    held at each of ``levels`` (MAP_LEVELS where the application's own threshold is not known):
    per level, the share on the same side of it, and the share to expect from the float scores'
    distances to it (``everything``: ours and those of other samples) and the candidate's moves
    toward it; the worst level, with ``passed`` against ``required``. ``evidence``: the levels are
    assumed (the worst of several guesses at the application's threshold), and a level refuses only
    on evidence (evidence.py): its share's upper bound on the samples, or the expected share's over
    the margins it was read from, misses ``required``; the worst level is the one whose bound is
    lowest."""
    worst: dict[str, Any] | None = None
    units, margin_units = int(np.size(ours)), int(np.size(everything))
    given = levels is not None
    for level in levels or MAP_LEVELS:
        above = ours > level
        agreed = float(np.mean(above == (theirs > level)))
        # each error as a move toward the level, each margin the float value's distance from it
        errors = np.where(above, ours - theirs, theirs - ours)
        expected = 1.0 - flip_rate(np.abs(everything - level), errors)
        entry = {"level": level, "agreement": agreed, "expected_agreement": expected}
        seen = (min(upper_bound(agreed, units), upper_bound(expected, margin_units)) if evidence
                else min(agreed, expected))
        if worst is None or seen < worst[0]:
            worst = (seen, entry)
    chosen = worst[1]
    chosen["required"] = required
    chosen["level_assumed"] = not given
    chosen["passed"] = hold(chosen, "agreement", chosen["agreement"], units, chosen["expected_agreement"], required,
                            evidence, margin_units)
    return chosen
