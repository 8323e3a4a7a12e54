"""The share of unseen inputs expected to keep an output's cosine at the gate's floor, read from the
spread of the samples' cosines: a file whose every sample passes may still sit so close to the floor
that some inputs of the same kind fall under it. The decisions have their margins for this; an
output judged by cosine alone has this. Measured, and why this form: docs/decisions/gate-cosine-tail.md."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# The share of unseen inputs at the floor the gate asks: the decisions' own bar (a top-1 class at 99%).
SHARE = 0.99
# Fewer samples say too little of a spread (the predictive interval of 4 samples reaches any floor).
MIN_SAMPLES = 8
# Samples whose distance from 1 is below this share of the floor's own distance count as unchanged:
# they keep the floor, and are left out of the fit, whose spread of logarithms they would stretch
# (an output a sample leaves all but identical is a cluster of its own, not the near end of a tail).
UNCHANGED = 1e-2
# Past this many degrees of freedom t_cdf reads the normal distribution (they differ by < 1e-5).
NORMAL_DF = 100_000


def _simpson(values: np.ndarray, step: float) -> float:
    return float(step / 3 * (values[0] + values[-1] + 4 * values[1:-1:2].sum() + 2 * values[2:-1:2].sum()))


def t_cdf(x: float, df: int) -> float:
    """Student's t distribution with ``df`` degrees of freedom, P(T <= x). With T = sqrt(df) tan(a)
    the density of a is proportional to cos(a) ** (df - 1) on (-pi/2, pi/2): a smooth, bounded
    integrand, integrated by Simpson's rule (the standard library has no incomplete beta). Past
    NORMAL_DF degrees of freedom, the normal distribution (the integrand grows too narrow)."""
    if df < 1:
        raise ValueError("t_cdf needs at least one degree of freedom")
    if df > NORMAL_DF:
        return 0.5 * math.erfc(-x / math.sqrt(2.0))
    angle = math.atan(abs(x) / math.sqrt(df))
    if angle == 0.0:
        return 0.5
    points = 2001
    part = _simpson(np.cos(np.linspace(0.0, angle, points)) ** (df - 1), angle / (points - 1))
    whole = _simpson(np.cos(np.linspace(0.0, math.pi / 2, points)) ** (df - 1), math.pi / 2 / (points - 1))
    half = min(0.5, 0.5 * part / whole)
    return 0.5 + half if x > 0 else 0.5 - half


def expected_share(cosines: Sequence[float], floor: float) -> float | None:
    """The share of unseen inputs expected at or above ``floor``. Samples left unchanged (UNCHANGED)
    keep it; over the others 1 - cosine is taken as log-normal, and the share is that of the
    predictive distribution of one more sample (Student's t with m - 1 degrees of freedom, widened
    by sqrt(1 + 1/m) for the estimated centre). None with fewer than MIN_SAMPLES samples, fewer
    than MIN_SAMPLES changed ones, or a floor of 1: a file left all but unchanged on most samples is
    judged by its lowest cosine alone, as before (so one more sample coming that near 1 can silence
    the rule; filling the fit with unchanged samples instead made two clusters read as one wide tail:
    docs/decisions/gate-cosine-tail.md)."""
    values = np.asarray([c for c in cosines if c is not None and math.isfinite(c)], np.float64)
    allowed = 1.0 - floor
    if values.size < MIN_SAMPLES or allowed <= 0.0:
        return None
    distances = 1.0 - values
    changed = distances[distances >= allowed * UNCHANGED]
    if changed.size == 0:
        return 1.0
    if changed.size < MIN_SAMPLES:
        return None
    logs = np.log(changed)
    centre, spread = float(logs.mean()), float(logs.std(ddof=1))
    limit = math.log(allowed)
    if spread == 0.0:
        kept = 1.0 if centre <= limit else 0.0
    else:
        kept = t_cdf((limit - centre) / (spread * math.sqrt(1.0 + 1.0 / changed.size)), changed.size - 1)
    return float((values.size - changed.size + changed.size * kept) / values.size)
