"""``dfl[:BINS]``: a box regression head that gives each side of a box as a distribution over BINS
distances (distribution focal loss: GFL, NanoDet, PP-PicoDet, YOLOv8 before its decoding), read as
its application decodes it: each side's expected distance, compared in bins (at least the required
share within DFL_SLACK, none beyond DFL_LIMIT). Never inferred (a 32-channel feature map has the
same form): ``--metric OUTPUT=dfl``. Measurements: docs/decisions/fidelity-decisions.md ("DFL")."""

from __future__ import annotations

from typing import Any

import numpy as np

from ortprep.fidelity.decisions.decision import Decision, register
from ortprep.fidelity.decisions.maps import Map

# A quarter bin is 2 px at the finest level of stride 8; a whole bin is another box at any level.
DFL_SLACK = 0.25
DFL_LIMIT = 1.0


def dfl_distances(value: np.ndarray, bins: int | None = None) -> np.ndarray | None:
    """A DFL box head's output decoded as its application decodes it: [positions, 4] expected
    distances in bins (the softmax over each side's bins times 0..bins-1). The 4 x bins values lie
    on the last axis ([..., N, 4 x bins]) or on the one before it ([..., 4 x bins, N]): the one
    that holds 4 x bins, or, bins not given, the smaller of those holding a multiple of 4 (at least
    8); None where neither does."""
    array = np.asarray(value, np.float64)
    if array.ndim < 1:
        return None

    def fits(size: int) -> bool:
        return size == 4 * bins if bins else size >= 8 and size % 4 == 0

    axes = [axis for axis in (-1, -2) if array.ndim >= -axis and fits(array.shape[axis])]
    if not axes:
        return None
    axis = min(axes, key=lambda a: array.shape[a])  # (positions outnumber a side's bins)
    sides = np.moveaxis(array, axis, -1).reshape(-1, array.shape[axis])
    per_side = sides.shape[-1] // 4
    scores = sides.reshape(-1, 4, per_side)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ np.arange(per_side, dtype=np.float64)


def dfl_hint(name: str, shape: tuple[int, ...], metrics: dict[str, str] | None = None) -> str:
    """A refusal's hint where an output has the form of a DFL box head (an axis of 4 x bins
    values, 4 to 32 bins, smaller than the axis of positions beside it) and no --metric was given
    for it: its logits are not what an application reads."""
    if (metrics or {}).get(name) or len(shape) < 2:
        return ""
    for axis, other in ((-1, -2), (-2, -1)):
        size = shape[axis]
        if size % 4 == 0 and 4 <= size // 4 <= 32 and shape[other] > size:
            return (f"; if '{name}' is a DFL box head (4 sides x {size // 4} bins, decoded by a softmax), "
                    f"--metric {name}=dfl judges the distances its application decodes")
    return ""


class Dfl(Map):
    name = "dfl"
    forms = ("dfl", "dfl:BINS")
    required = 0.99
    reads_margins = False  # distances, judged as they move
    margins_any_shape = False

    def parse(self, value, text):
        try:
            bins = int(value) if value else None
        except ValueError:
            bins = 0
        if bins is not None and bins < 2:
            raise ValueError(f"{text!r}: the number after 'dfl:' is the bins per box side (reg_max + 1, at least 2)")
        return Decision("dfl", None, "--metric", bins=bins)

    def infer(self, output):
        return None

    def label(self, decision):
        return "dfl" if decision.bins is None else f"dfl:{decision.bins}"

    def extra_record(self, decision):
        return {"bins": decision.bins, "slack_bins": DFL_SLACK, "limit_bins": DFL_LIMIT}

    def judge(self, decision, reference, candidate, more=None) -> dict[str, Any]:
        """Each box side's decoded distance, pooled over the samples: the share within DFL_SLACK
        bins of the float model's reaches the required share, and no side moves beyond DFL_LIMIT."""
        record: dict[str, Any] = {**decision.record(), "agreement": None, "expected_agreement": None}
        moved = []
        for r, c in zip(reference, candidate):
            ours = dfl_distances(r, decision.bins)
            if ours is None:
                record.update(passed=False if decision.gated else None,
                              error=f"not a DFL box output (an axis of 4 x bins values): shape {list(np.shape(r))}")
                return record
            theirs = dfl_distances(c, decision.bins) if c is not None and np.shape(c) == np.shape(r) else None
            if theirs is not None:
                moved.append(np.abs(theirs - ours).ravel())
        if not moved:
            record["passed"] = False if decision.gated else None
            return record
        every = np.concatenate(moved)
        finite = np.isfinite(every)  # a NaN side is a side moved
        agreed = float(np.mean(finite & (every <= DFL_SLACK))) if every.size else 1.0
        largest = float(every[finite].max()) if finite.any() else None
        record.update(agreement=agreed, sides=int(every.size), largest_move_bins=largest)
        passed = agreed >= self.required and bool(finite.all()) and (largest is None or largest <= DFL_LIMIT)
        record["passed"] = passed if decision.gated else None
        return record


DFL = register(Dfl())
