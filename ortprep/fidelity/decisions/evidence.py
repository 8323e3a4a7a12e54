"""The evidence rule for a decision the user did not name (inferred from an output's form, or a
level assumed for it): a share measured on a few samples refuses only where the samples are
evidence that the bar is missed, not on one flip. The share's one-sided upper bound (exact
binomial, Clopper-Pearson, at CONFIDENCE) must reach the bar; the agreement expected from the
margins is held as before. A decision named with --metric keeps the exact rule (the share itself
reaches the bar). Rule and figures: docs/decisions/gate-evidence.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# One-sided: a candidate whose true agreement sits exactly at the bar is refused by the samples'
# noise at most 5% of the time per share (docs/decisions/gate-evidence.md).
CONFIDENCE = 0.95
# Up to this many units the binomial tail is summed exactly; above, Wilson's bound (then as exact
# as it needs to be: its error shrinks as 1 / units).
EXACT_UNITS = 20_000
RULE = "evidence"  # an assumed decision's rule (the record's "rule")
EXACT = "exact"  # a named decision's rule


def by_evidence(decision) -> bool:
    """Whether ``decision`` is judged by the evidence rule: it was not named with --metric."""
    return decision.chosen_by != "--metric"


def _log_binomial(n: int, j: np.ndarray) -> np.ndarray:
    """log C(n, j) for the consecutive ``j``: the first by lgamma, the rest by their ratios."""
    first = math.lgamma(n + 1) - math.lgamma(j[0] + 1) - math.lgamma(n - j[0] + 1)
    steps = np.log((n - j[:-1]) / (j[:-1] + 1.0))
    return first + np.concatenate([[0.0], np.cumsum(steps)])


def tail(failures: int, units: int, share: float) -> float:
    """P(at least ``failures`` disagreements among ``units``) where each agrees with probability
    ``share``: how surprising the samples' failures are if the true agreement were ``share``."""
    if failures <= 0:
        return 1.0
    if failures > units:
        return 0.0
    q = 1.0 - share
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    if units > EXACT_UNITS:  # normal approximation with continuity correction
        mean, spread = units * q, math.sqrt(units * q * share)
        return 0.5 * math.erfc((failures - 0.5 - mean) / (spread * math.sqrt(2.0)))
    j = np.arange(failures, units + 1)
    logs = _log_binomial(units, j) + j * math.log(q) + (units - j) * math.log1p(-q)
    top = float(np.max(logs))
    return float(min(1.0, math.exp(top) * float(np.sum(np.exp(logs - top)))))


def counts(share: float, units: float) -> tuple[int, int]:
    """(failures, units) as whole numbers from a share of ``units`` (a share of F1's half-counts
    rounds to the nearest unit)."""
    whole = max(1, int(round(units)))
    return min(whole, max(0, int(round(whole * (1.0 - share))))), whole


def missed(share: float, units: float, required: float, confidence: float = CONFIDENCE) -> bool:
    """Whether ``share`` of ``units`` is evidence, at ``confidence``, that the true agreement lies
    below ``required``: so few agreements would be seen at most 1 - confidence of the time."""
    failures, whole = counts(share, units)
    return tail(failures, whole, required) <= 1.0 - confidence + 1e-12


def upper_bound(share: float, units: float, confidence: float = CONFIDENCE) -> float:
    """The one-sided upper confidence bound of the true agreement (Clopper-Pearson; Wilson above
    EXACT_UNITS): the largest agreement the samples do not rule out at ``confidence``."""
    failures, whole = counts(share, units)
    if failures == 0:
        return 1.0
    alpha = 1.0 - confidence
    if whole > EXACT_UNITS:
        z = math.sqrt(2.0) * _erfinv(2.0 * confidence - 1.0)
        p = 1.0 - failures / whole
        centre = (p + z * z / (2 * whole)) / (1 + z * z / whole)
        half = z * math.sqrt(p * (1 - p) / whole + z * z / (4 * whole * whole)) / (1 + z * z / whole)
        return min(1.0, centre + half)
    low, high = 0.0, 1.0
    for _ in range(50):  # the agreement at which seeing this many failures has probability alpha
        middle = (low + high) / 2
        if tail(failures, whole, middle) > alpha:
            low = middle
        else:
            high = middle
    return low


def _erfinv(y: float) -> float:
    """The inverse error function by Newton's method (math has erf, not its inverse)."""
    x = 0.0
    for _ in range(60):
        step = (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-14:
            break
    return x


def hold(record: dict[str, Any], key: str, share: float | None, units: float | None, expected: float | None,
         required: float, evidence: bool, expected_units: float | None = None) -> bool:
    """One share held to ``required``: by the exact rule (the share and the expected agreement
    reach it) or, ``evidence``, by the evidence rule (the share's upper bound on ``units`` reaches
    it; the expected agreement as before, or, where ``expected_units`` is given (a level assumed
    among several), its own upper bound over the margins it was read from). Adds ``KEY_upper`` and
    ``KEY_units`` (and ``expected_agreement_upper``/``_units``) to ``record`` where the evidence
    rule judged."""
    if share is None:
        return False
    expected_holds = expected is None or expected >= required
    if not evidence or not units:
        return share >= required and expected_holds
    record[f"{key}_units"] = int(round(units))
    record[f"{key}_upper"] = round(upper_bound(share, units), 6)
    if expected is not None and expected_units:
        record["expected_agreement_units"] = int(round(expected_units))
        record["expected_agreement_upper"] = round(upper_bound(expected, expected_units), 6)
        expected_holds = not missed(expected, expected_units, required)
    return not missed(share, units, required) and expected_holds
