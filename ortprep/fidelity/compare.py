"""Array comparison: max abs / max rel difference, cosine similarity and norm ratio per output, and
whether a reference output is too flat for cosine to mean anything."""

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
    judged_by: str = "cosine"  # or "absolute error: ..." when the reference is degenerate
    norm_ratio: float | None = None  # |candidate| / |reference|: a uniformly scaled output has cosine 1, not this

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
    reference_norm = float(np.linalg.norm(flat_ref))
    if max_abs <= _TINY:
        norm_ratio = 1.0
    else:
        norm_ratio = float(np.linalg.norm(flat_cand)) / reference_norm if reference_norm else None
    return OutputDiff(name, max_abs, max_rel, cosine, nonfinite, True, norm_ratio=norm_ratio)


def compare_outputs(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> list[OutputDiff]:
    diffs = []
    for name, value in reference.items():
        if name not in candidate:
            diffs.append(OutputDiff(name, None, None, None, False, False))
        else:
            diffs.append(compare_arrays(name, value, candidate[name]))
    return diffs


@dataclass(frozen=True)
class Degenerate:
    """A reference output on which cosine similarity means nothing."""

    what: str  # for people: "constant (0.5)", "near zero (peak 7.8e-04)", ...
    scale: float  # what an absolute error is measured against


def degenerate(reference: np.ndarray, bounds: tuple[float, float] | None = None) -> Degenerate | None:
    """Whether the inputs leave this output flat: constant, near zero, or barely moving within
    the range the graph bounds it to."""
    values = np.asarray(reference)
    if values.dtype.kind != "f" or values.size == 0:
        return None
    finite = values[np.isfinite(values)].astype(np.float64)
    if finite.size == 0:
        return None
    spread = float(finite.max() - finite.min())
    peak = float(np.abs(finite).max())
    if bounds is not None:
        width = bounds[1] - bounds[0]
        if spread < 0.01 * width:
            return Degenerate(f"flat within its range [{bounds[0]:g}, {bounds[1]:g}]: values {finite.min():.3g} to "
                              f"{finite.max():.3g}", width)
        return None
    if peak < 1e-6:
        return Degenerate(f"near zero (peak {peak:.2g})", 1e-6)
    if spread <= 1e-6 * peak:
        return Degenerate(f"constant ({finite.flat[0]:.4g})", peak)
    return None
