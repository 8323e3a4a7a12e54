"""The target EP's verdict decided on its first samples, where the rest cannot change it: a slow EP
(QNN's HTP simulator: seconds a sample) then runs only those (docs/decisions/speed-ep-verdict.md).

The CPU EP has judged the same quantized file on every sample before the EP runs it, so what the
EP's run can still change is only how far the EP computes that file otherwise than the CPU EP.

- **A clear miss** (exact): an output judged by its lowest cosine, below the bar by MISS_FACTOR
  times the bar's distance from 1 on one of the first samples, fails on all of them (the lowest
  cosine only falls as samples are added). Only where the caller asks (the confirmation, FP16's
  probe): a search compares its trials' figures, which a stop would take from fewer samples.
- **A clear pass** (bounded; against the caller's ``pass_bar``, the search's margin for quantize's
  gate): after at least PASS_MIN_SAMPLES samples, where the CPU EP passed
  every sample and the EP's first samples pass (load's rule against the CPU EP's run included),
  the largest the EP's run of the first samples departs from the CPU EP's run of the same file,
  by angle, by norm and by relative L2 error, each times SAFETY, is taken as the bound on each
  sample left; the pass is declared only where those bounds cannot move any sample left below the
  cosine bar (angles add: the EP's angle to the float model is at most the CPU EP's plus the EP's
  angle to the CPU EP's run), out of the norm's tolerance, past a top-1 decision's gap on the CPU
  EP's run, or past load's elementwise tolerance; and a top-1 decision is judged as the gate
  judges it (its agreement and the agreement to expect on unseen inputs) with the samples left at
  their worst within the bound (every row's lead over its runner-up shrunk by SAFETY times the
  largest change of a lead seen, against the output's largest value). Outputs judged otherwise (flat ones, a
  decision other than top-1/argmax over the last axis, a confidence threshold) run every sample.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ortprep.fidelity.decisions import judge_decision
from ortprep.fidelity.tolerances import NORM_TOLERANCE

PASS_MIN_SAMPLES = 4  # the EP's first samples before a pass may be declared
SAFETY = 4.0  # the bound on a sample left: this many times the largest relative error seen
MISS_FACTOR = 2.0  # a clear miss: lowest cosine below 1 - MISS_FACTOR * (1 - bar)
ARGMAX_KINDS = ("top1", "argmax")
# a miss at the bar (miss_line) stands this far below it: this module's cosine and the gate's are
# computed apart, and may differ in their last digits
MISS_ROUNDING = 1e-6


def _as64(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


def _cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if not (math.isfinite(na) and math.isfinite(nb)) or na == 0.0 or nb == 0.0:
        return None
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def _top_gap(value: np.ndarray) -> float:
    """The smallest gap between the largest and second-largest entry over the last axis's rows."""
    rows = value.reshape(-1, value.shape[-1]) if value.ndim else value.reshape(1, 1)
    if rows.shape[-1] < 2:
        return math.inf
    top = np.sort(rows, axis=-1)[:, -2:]
    return float(np.min(top[:, 1] - top[:, 0]))


def _leads(value: np.ndarray, by: np.ndarray) -> np.ndarray:
    """Each row's (last axis) entry at ``by``'s top class less its largest other entry."""
    rows = np.asarray(value, dtype=np.float64).reshape(-1, value.shape[-1])
    top = np.argmax(np.asarray(by).reshape(-1, value.shape[-1]), axis=-1)
    index = np.arange(rows.shape[0])
    rest = rows.copy()
    rest[index, top] = -np.inf
    return rows[index, top] - np.max(rest, axis=-1)


def _shrunk(value: np.ndarray, change: float) -> np.ndarray:
    """``value`` with every row's lead over the last axis shrunk by ``2 * change``: its top entry
    lowered and every other raised by ``change`` (the worst a change of at most ``change`` an
    element does to a top-1 decision)."""
    rows = np.array(value, dtype=np.float64).reshape(-1, value.shape[-1])
    lead = np.argmax(rows, axis=-1)
    rows += change
    rows[np.arange(rows.shape[0]), lead] -= 2.0 * change
    return rows.reshape(value.shape)


def early_rule(reference: list[dict], on_cpu: list[dict], min_cosine: float, flat: dict, decisions: dict,
               cpu_passed: bool, apart: Callable[[list[dict]], Any] | None = None,
               more: list[dict] | None = None, misses: bool = True, pass_bar: float | None = None,
               tolerances: Callable[[list[dict]], dict[str, float]] | None = None, miss_line: float | None = None
               ) -> Callable[[list[dict]], str | None]:
    """The rule for one candidate: ``reference`` the float model's outputs on every sample (CPU EP),
    ``on_cpu`` the candidate's on the CPU EP, ``cpu_passed`` the CPU EP's verdict on them all;
    ``apart(ep_samples)`` load's rule against the CPU EP's run on the first samples (None: within
    it); ``tolerances(ep_samples)``: load's elementwise tolerance per output. The returned function takes the
    EP's outputs on the first samples and says "pass", "miss" or None (run on). ``more``: the float
    model's outputs on other samples, whose margins join a decision's expected agreement.
    ``misses`` False: no stop on a clear miss (where the figures of every sample feed a search's
    comparisons); ``pass_bar``: the cosine a clear pass must hold (default ``min_cosine``);
    ``miss_line``: the cosine below which one sample is a miss (default: a clear miss,
    1 - MISS_FACTOR * (1 - min_cosine); ``min_cosine`` itself is exact for the verdict too)."""
    offered = len(reference)
    pass_bar = min_cosine if pass_bar is None else pass_bar
    bar_angle = math.acos(max(-1.0, min(1.0, pass_bar)))
    miss_line = 1.0 - MISS_FACTOR * (1.0 - min_cosine) if miss_line is None else miss_line - MISS_ROUNDING
    cosine_judged = [name for name in (reference[0] if reference else {})
                     if name not in flat and not (decisions.get(name) is not None and decisions[name].gated
                                                  and decisions[name].replaces_cosine)]

    def passable() -> bool:
        if not cpu_passed or offered <= PASS_MIN_SAMPLES:
            return False
        for name in reference[0]:
            if name in flat or _as64(reference[0][name]).dtype.kind != "f":
                return False
            decision = decisions.get(name)
            if decision is not None and decision.gated and (decision.kind not in ARGMAX_KINDS
                                                             or getattr(decision, "confident", False)):
                return False
        return True

    can_pass = passable()

    def decide(ep: list[dict]) -> str | None:
        seen = len(ep)
        if seen == 0 or seen >= offered:
            return None
        for sample, ref in zip(ep if misses else [], reference):
            for name in cosine_judged:
                if name not in sample:
                    return None  # an output missing: the judgement says so on every sample
                cosine = _cosine(_as64(ref[name]), _as64(sample[name]))
                if cosine is not None and cosine < miss_line:
                    return "miss"
        if not can_pass or seen < PASS_MIN_SAMPLES:
            return None
        for sample, ref, cpu in zip(ep, reference, on_cpu):  # the first samples pass, deciding as the CPU EP
            for name in reference[0]:
                cosine = _cosine(_as64(ref[name]), _as64(sample[name])) if name in sample else None
                if cosine is None or cosine < pass_bar:
                    return None
                decision = decisions.get(name)
                if decision is not None and decision.gated and not np.array_equal(
                        np.argmax(_as64(sample[name]), axis=-1), np.argmax(_as64(cpu[name]), axis=-1)):
                    return None
        # the largest of each measure of the EP against the CPU EP's run seen so far: the angle, the
        # norm's ratio, the largest elementwise difference against the largest value
        angle = norm = error = lead = 0.0
        for sample, cpu in zip(ep, on_cpu):
            for name, value in cpu.items():
                if name not in sample:
                    return None
                a, b = _as64(value), _as64(sample[name])
                if a.shape != b.shape or not np.all(np.isfinite(b)):
                    return None
                size, peak = float(np.linalg.norm(a)), float(np.max(np.abs(a)))
                cosine = _cosine(a, b)
                if size == 0.0 or peak == 0.0 or cosine is None:
                    return None
                angle = max(angle, math.acos(max(-1.0, min(1.0, cosine))))
                norm = max(norm, abs(float(np.linalg.norm(b)) / size - 1.0))
                error = max(error, float(np.max(np.abs(b - a))) / peak)
                if decisions.get(name) is not None and decisions[name].gated:
                    lead = max(lead, float(np.max(np.abs(_leads(b, a) - _leads(a, a)))) / peak)
        spread, bound = SAFETY * angle, SAFETY * error
        limits = tolerances(ep) if tolerances is not None else {}
        for name in reference[0]:
            ref_energy = sum(float(np.sum(_as64(r[name]) ** 2)) for r in reference)
            cpu_energy = sum(float(np.sum(_as64(c[name]) ** 2)) for c in on_cpu)
            if ref_energy == 0.0:
                return None
            ratio = math.sqrt(cpu_energy / ref_energy)
            if abs(ratio * (1.0 + SAFETY * norm) - 1.0) >= NORM_TOLERANCE or abs(
                    ratio * (1.0 - SAFETY * norm) - 1.0) >= NORM_TOLERANCE:
                return None
            decision = decisions.get(name)
            tolerance = limits.get(name)
            projected = [_as64(sample[name]) for sample in ep]  # the EP's decision at its worst within the bound
            for index in range(seen, offered):
                ref, cpu = _as64(reference[index][name]), _as64(on_cpu[index][name])
                cosine = _cosine(ref, cpu)
                if cosine is None or math.acos(max(-1.0, min(1.0, cosine))) + spread >= bar_angle:
                    return None
                peak = float(np.max(np.abs(cpu)))
                if tolerance is not None and bound * peak >= tolerance:  # the bound on any element's change
                    return None
                shrink = SAFETY * lead * peak  # the bound on how far the EP moves a row's lead
                if decision is not None and decision.gated and shrink >= _top_gap(cpu):
                    return None
                projected.append(_shrunk(cpu, shrink / 2.0))
            if decision is not None and decision.gated and not judge_decision(
                    decision, [_as64(r[name]) for r in reference], projected,
                    [_as64(m[name]) for m in more or [] if name in m] if decision.reads_margins else None
            ).get("passed"):
                return None  # the agreement to expect on unseen inputs could fall below its share
        if apart is not None and apart(ep) is not None:
            return None
        return "pass"

    return decide


def worst_first(feeds: list[dict]) -> list[int]:
    """The order to run ``feeds`` on the EP in: the samples it did worst on in this step first (the
    lowest cosine any file had on them there, budget.StepTimes.ep_worst), then the rest as given.
    A sample an earlier file missed the bar on is the likeliest to show a later file's miss at once."""
    from ortprep.runtime.budget import feed_key, step_times

    times = step_times()
    if times is None or not times.ep_worst:
        return list(range(len(feeds)))
    seen = [times.ep_worst.get(feed_key(feed)) for feed in feeds]
    return sorted(range(len(feeds)), key=lambda i: (seen[i] is None, seen[i] if seen[i] is not None else 0.0, i))


def note_ep_cosines(feeds: list[dict], cosines: list[float]) -> None:
    """Each sample's lowest output cosine on the EP (``cosines``, in the order of ``feeds``), kept in
    the step's ledger for worst_first."""
    from ortprep.runtime.budget import feed_key, step_times

    times = step_times()
    if times is None:
        return
    for feed, cosine in zip(feeds, cosines):
        key = feed_key(feed)
        times.ep_worst[key] = min(cosine, times.ep_worst.get(key, cosine))
