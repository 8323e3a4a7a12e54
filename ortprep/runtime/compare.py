"""Output comparison: max abs / max rel difference and cosine similarity, per output."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# An output whose values are all within this of the reference counts as identical for cosine.
_TINY = 1e-12


@dataclass
class OutputDiff:
    name: str
    max_abs_diff: float | None
    max_rel_diff: float | None
    cosine: float | None
    nonfinite: bool  # the candidate has NaN/Inf where the reference has none
    shape_match: bool

    def to_record(self) -> dict:
        return asdict(self)


def compare_arrays(name: str, reference: np.ndarray, candidate: np.ndarray) -> OutputDiff:
    reference = np.asarray(reference)
    candidate = np.asarray(candidate)
    if reference.shape != candidate.shape:
        return OutputDiff(name, None, None, None, False, False)
    if reference.dtype.kind not in "fiub" or candidate.dtype.kind not in "fiub":
        equal = bool(np.array_equal(reference, candidate))
        return OutputDiff(name, 0.0 if equal else None, 0.0 if equal else None, 1.0 if equal else 0.0, False, True)
    ref = reference.astype(np.float64)
    cand = candidate.astype(np.float64)
    nonfinite = bool(np.any(~np.isfinite(cand) & np.isfinite(ref)))
    finite = np.isfinite(ref) & np.isfinite(cand)
    if ref.size == 0:
        return OutputDiff(name, 0.0, 0.0, 1.0, False, True)
    diff = np.abs(ref - cand)
    diff = np.where(finite, diff, np.inf)
    max_abs = float(diff.max())
    scale = np.maximum(np.abs(ref), 1e-6)
    max_rel = float((diff / scale).max())
    flat_ref, flat_cand = ref[finite].ravel(), cand[finite].ravel()
    norm = np.linalg.norm(flat_ref) * np.linalg.norm(flat_cand)
    if max_abs <= _TINY:
        cosine = 1.0
    elif norm == 0.0 or nonfinite:
        cosine = 0.0
    else:
        cosine = float(np.dot(flat_ref, flat_cand) / norm)
    return OutputDiff(name, max_abs, max_rel, cosine, nonfinite, True)


def compare_outputs(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> list[OutputDiff]:
    diffs = []
    for name, value in reference.items():
        if name not in candidate:
            diffs.append(OutputDiff(name, None, None, None, False, False))
        else:
            diffs.append(compare_arrays(name, value, candidate[name]))
    return diffs
