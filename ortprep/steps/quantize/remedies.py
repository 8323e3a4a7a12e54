"""Remedies quantize tries on a failing result before (or instead of) keeping nodes float: another
calibration method, compensated rounding for weight-only MatMuls, and float32 compute where the
CPU EP's int8 compute fails or does not pay. Each is kept only where it measures better
(:func:`~.trials.improved`). Measurements: docs/decisions/reduce-quantize-search.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import onnx

from ortprep.model import iter_graphs
from ortprep.steps.quantize.evaluate import timed_medians
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.trials import Trial, improved, reaches_margin

def try_calibration_methods(trials: Trials, source: Path, best: Trial,
                            aim: float) -> tuple[Trial, list[dict], list[Trial]]:
    """Calibration methods other than min/max, each kept only when it raises the lowest cosine:
    min/max ranges stretched by rare values cost every node precision. Leaves ``trials.settings`` on the method kept;
    returns the best trial, a record per method tried, and their trials."""
    settings = trials.settings
    records: list[dict] = []
    tried: list[Trial] = []
    # (entropy is not tried by itself: it can take minutes on one tensor; ask for it with --method
    # entropy; docs/decisions/reduce-quantize-search.md)
    for method in ("percentile",):
        trials.settings = {**settings, "method": method}
        outcome = trials.attempt(source, list(trials.fixed), f"calibration: {method}")
        tried.append(outcome)
        helped = outcome.path is not None and improved(outcome, best)
        records.append({"method": method, "cosine": outcome.cosine, "passed": outcome.passed, "kept": helped})
        if helped:
            best = outcome
            settings = trials.settings
        if reaches_margin(best, aim) and best.cosine is not None:
            break
    trials.settings = settings
    return best, records, tried


def try_compensated_rounding(trials: Trials, source: Path, best: Trial) -> tuple[Trial, dict]:
    """--weight-only --rounding auto, where nearest rounding failed the gate: the same weights
    rounded for each MatMul's output on the calibration samples (runtime/rounding.py), kept when it
    measures better (``improved``). Leaves ``trials.settings`` on the rounding kept; returns the
    best trial and a record of the attempt."""
    settings = trials.settings
    trials.settings = {**settings, "rounding": "gptq"}
    outcome = trials.attempt(source, list(trials.fixed), "rounding: gptq")
    kept = outcome.path is not None and improved(outcome, best)
    record = {"rounding": "gptq", "cosine": outcome.cosine, "passed": outcome.passed, "kept": kept,
              "nearest": {"cosine": best.cosine, "passed": best.passed}, **rounding_done(outcome)}
    if kept:
        return outcome, record
    trials.settings = settings
    return best, record


def set_accuracy_level(level: int) -> Callable[[onnx.ModelProto], None]:
    """An edit giving every MatMulNBits node ``level`` (0: the attribute left out, as ORT's
    quantizer leaves it)."""
    def edit(model: onnx.ModelProto) -> None:
        for node in (n for _, graph in iter_graphs(model.graph) for n in graph.node):  # If/Loop bodies too
            if node.op_type == "MatMulNBits":
                kept = [a for a in node.attribute if a.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend(kept)
                if level:
                    node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    return edit


def try_float_compute(trials: Trials, source: Path, best: Trial) -> tuple[Trial, dict]:
    """--weight-only --accuracy-level auto with the CPU EP's int8 compute (accuracy_level 4:
    activations quantized per block at run time): the same file computed in float32 (0), the more
    precise, where 4 fails the gate (kept when it measures better), or where 4 passes but does not
    run clearly faster on the samples' own shapes (at most FASTER of 0's time and FASTER_MS less a
    run) and 0 passes too; not where 0 runs slower than the float model and 4 does not
    (_int8_compute_pays: the float model, 4 and 0 are timed one run each in turn). Leaves
    ``trials.settings`` on the level kept."""
    settings = trials.settings
    if best.passed and not trials.eval_feeds:
        return best, {}
    twin = trials.edited(best, set_accuracy_level(0))  # timed, then judged, as one file
    timed = None
    if best.passed:
        # the float model, level 4 and level 0, one run of each in turn
        medians = timed_medians([source, best.path, twin], trials.eval_feeds[0])
        timed = None if medians is None else {"float": medians[0], "4": medians[1], "0": medians[2]}
        why = None if timed is None else _int8_compute_pays(timed)
        if why is not None:
            return best, {"accuracy_level": 0, "kept": False, "ms": _ms(timed), "why": why}
    outcome = trials.judge(source, twin, "accuracy level 0", best.kept, best.off)
    kept = outcome.path is not None and (improved(outcome, best) if not best.passed else outcome.passed)
    record = {"accuracy_level": 0, "cosine": outcome.cosine, "passed": outcome.passed, "kept": kept,
              "int8_compute": {"cosine": best.cosine, "passed": best.passed},
              "ms": _ms(timed) if timed else None,
              "why": "int8 compute is not clearly faster on the samples' shapes" if best.passed
              else "int8 compute failed the gate"}
    if kept:
        trials.settings = {**settings, "accuracy_level": 0}
        return outcome, record
    return best, record


# int8 compute is kept over float32 compute (both passing) only at most this share of its time, and
# at least this much less a run: the timing's noise on a tiny model chose between them otherwise
# (docs/decisions/reduce-quantize-search.md)
FASTER, FASTER_MS = 0.9, 0.1


def _int8_compute_pays(ms: dict[str, float]) -> str | None:
    """Why level 4 is kept without judging level 0 (both passing is then not asked), from the
    three medians; None where 0, the more precise, is to be judged. 4 is kept where it runs clearly
    faster than 0 (FASTER, FASTER_MS), or where 0 runs slower than the float model and 4 does not:
    speed is part of the verdict, and a file slower than float where a passing one is not leaves
    the user worse off (docs/decisions/reduce-quantize-search.md)."""
    if ms["4"] <= FASTER * ms["0"] and ms["0"] - ms["4"] >= FASTER_MS:
        return "int8 compute runs clearly faster on the samples' shapes"
    if ms["0"] > ms["float"] >= ms["4"]:
        return "float32 compute runs slower than the float model on the samples' shapes, and int8 compute does not"
    return None


def _ms(timed: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 4) for key, value in timed.items()}


def rounding_done(trial: Trial) -> dict:
    """What the worker's compensated rounding did for ``trial`` (its sidecar file), or nothing."""
    if trial.path is None:
        return {}
    sidecar = Path(str(trial.path) + ".rounding.json")
    if not sidecar.exists():
        return {}
    done = json.loads(sidecar.read_text(encoding="utf-8"))
    return {"matmuls": done.get("matmuls"), "error_vs_nearest": done.get("error_vs_nearest")}
