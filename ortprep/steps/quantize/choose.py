"""--engine auto's choice among the engines (docs/decisions/choose-engine-order.md): after ORT's
baseline, each later engine of AUTO_ORDER quantizes the same source under the same gate, until one
passes; where speed counts (the CPU EP as the target, or an EP timed here) and the candidate that
passed runs slower than the float model, the remaining engines are tried too, within
--search-seconds, and the fastest that passes is kept. Each engine's record carries its latency
ratio; :func:`best_record` names the candidate kept (what ``--keep-failed`` writes on a refusal)
with its measured figures.
"""

from __future__ import annotations

import time
from pathlib import Path

from ortprep.options import QuantizeOptions
from ortprep.runtime.budget import step_spent
from ortprep.steps.quantize.engines import AUTO_ORDER, SPEED_ORDER, Exclusion, engine
from ortprep.steps.quantize.evaluate import measure_on_target
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.trials import FLOAT_MODEL, Trial, improved, reaches_margin

# A later engine that passed replaces an earlier one that passed only when it measured this much
# faster (as --auto's precisions: a few timed runs differ by some percent from one process to the next)
FASTER_BY = 0.9


def speed_counts(trials: Trials, options: QuantizeOptions) -> bool:
    """Whether latency judges the candidates: the CPU EP is the target (the gate's latency is this
    CPU's), or the target EP is timed here (its time is the device's: GateTarget.timed)."""
    target = trials.target
    return options.ep in (None, "cpu") or (target is not None and target.timed)


def latency(trials: Trials, trial: Trial) -> tuple[float | None, str | None]:
    """(the candidate's latency over the float model's, where it was timed): the target EP's where
    it was timed there, else this CPU's where the CPU EP is the target; (None, None) otherwise."""
    evaluation = trials.evaluations.get(trial.path) if trial.path is not None else None
    if evaluation is None:
        return None, None
    timed = evaluation.ep_latency or {}
    if timed.get("ratio") is not None:
        return timed["ratio"], timed["ep"]
    if trials.options.ep in (None, "cpu") and evaluation.latency_ratio is not None:
        return evaluation.latency_ratio, "cpu"
    return None, None


def slow(ratio: float | None) -> bool:
    """Slower than the float model where it was timed."""
    return ratio is not None and ratio > 1.0


def faster(ratio: float | None, than: float | None) -> bool:
    return ratio is not None and (than is None or ratio < FASTER_BY * than)


def holds(trials: Trials, trial: Trial) -> bool:
    """Whether ``trial`` passes as it will be judged once kept: the gate, and where it is chosen
    after other trials failed on the same held-back samples (an --auto precision after the first,
    or a later engine), the decision margin too (outcome's hold_to_margin refuses it short of that).
    A candidate that passes the gate but not the margin is refused in the end: it neither ends the
    engines' turn nor wins over one that holds (docs/decisions/acc-engine-settings.md)."""
    return trial.passed and not (trials.held_to_margin(trial) and not reaches_margin(trial, None))


def judged_where_it_runs(trials: Trials, trial: Trial) -> bool:
    """Whether ``trial`` was judged on the target EP where that EP judges here: a candidate the CPU
    EP alone judged cannot be written for it (ocr_det's AIMET-ONNX candidate, kept over ORT's without
    a QNN run, failed load on QNN: docs/decisions/choose-engine-order.md)."""
    target = getattr(trials, "target", None)
    return target is None or not target.judged or bool((trial.sides or {}).get("ep"))


def replaces(trials: Trials, trial: Trial, ratio: float | None, best: Trial, best_ratio: float | None) -> bool:
    """Whether a later engine's ``trial`` is kept over ``best``: where ``best`` holds, only a trial
    that holds and runs FASTER_BY faster; else one that holds, or (neither holding) one that
    measured better (trials.improved), never a failing one over one that passed the gate, and
    never one the target EP did not judge (judged_where_it_runs)."""
    if not judged_where_it_runs(trials, trial):
        return False
    if holds(trials, best):
        return holds(trials, trial) and faster(ratio, best_ratio)
    return holds(trials, trial) or ((trial.passed or not best.passed) and improved(trial, best))


def decision_agreements(trials: Trials, trial: Trial) -> list[dict]:
    """Each gated output's decision figures on the held-back samples (CPU EP): its kind, the share
    of samples (or positions) that keep the float model's decision, whole sequences where judged."""
    evaluation = trials.evaluations.get(trial.path) if trial.path is not None else None
    found = []
    for output in (evaluation.outputs if evaluation is not None else []):
        decision = output.get("decision") or {}
        if decision.get("agreement") is None:
            continue
        found.append({"output": output["name"], "kind": decision.get("kind"), "agreement": decision["agreement"],
                      "sequence_agreement": decision.get("sequence_agreement"),
                      "required": decision.get("required")})
    return found


def engine_record(trials: Trials, trial: Trial) -> dict:
    """One engine's baseline for the report: failed (its error) or judged (the gate's figures, and
    its latency over the float model's where it was timed)."""
    run = trials.engine_runs.get(trial.path) if trial.path is not None else trials.last_run
    detail = {k: v for k, v in (run.detail if run else {}).items() if k != "traceback"}
    if trial.path is None and trial.error != FLOAT_MODEL:
        return {"engine": trials.engine.name, "status": "failed", "error": trial.error,
                "seconds": run.seconds if run else None, "detail": detail}
    ratio, timed_on = latency(trials, trial)
    return {"engine": trials.engine.name, "status": "judged", "passed": trial.passed, "cosine": trial.cosine,
            "decision_shortfall": trial.shortfall, "judged_on": (trial.sides or {}).get("judged_on"),
            "latency_ratio": ratio, "timed_on": timed_on,
            "seconds": run.seconds if run else None, "detail": detail}


def choose_engine(trials: Trials, source: Path, label: str, first: Trial, options: QuantizeOptions
                  ) -> tuple[Trial, list[dict]]:
    """--engine auto: after ORT's baseline, each later engine of AUTO_ORDER that is available and
    supports the settings quantizes the same source, judged by the same gate, until one passes (with
    the decision margin where it will be held to it: holds) and, where speed counts (speed_counts),
    runs no slower than the float model. Of those that hold the fastest is kept (a later one only
    when FASTER_BY faster); where none holds, the best
    (trials.improved), and the search goes on with its engine. Once one passed, a later engine is
    tried only within --search-seconds. The record says what became of each engine, with its
    latency ratio. The engines are tried in AUTO_ORDER, and once one passed slowly in SPEED_ORDER
    (docs/decisions/choose-engine-order.md). Another --engine: its baseline alone."""
    records = [engine_record(trials, first)]
    if options.engine_name() != "auto":
        return first, records
    timed = speed_counts(trials, options)
    best, best_engine = first, trials.engine
    best_ratio = _timed(trials, first, timed)
    first_name = best_engine.name
    exclusion = Exclusion(tuple(trials.fixed), tuple(options.exclude_ops))
    spare = trials.spare_failing_baseline
    left = [name for name in AUTO_ORDER if name != first_name]
    while left:
        # the next engine: AUTO_ORDER's while none passed; once one passed slowly, SPEED_ORDER's
        slow_pass = holds(trials, best) and timed and slow(best_ratio)
        name = next(n for n in (SPEED_ORDER if slow_pass else AUTO_ORDER) if n in left)
        left.remove(name)
        candidate = engine(name)
        why = candidate.available()
        if why is not None:
            records.append({"engine": name, "status": "not available", "reason": why})
            continue
        why = candidate.supports(options.mode, trials.settings, exclusion)
        if why is not None:
            records.append({"engine": name, "status": "not supported", "reason": why})
            continue
        if holds(trials, best) and not (timed and slow(best_ratio)):
            records.append({"engine": name, "status": "not tried", "reason": f"{best_engine.name} passed the gate"
                            + (f" at {best_ratio:.2f}x the float model's latency" if best_ratio is not None else "")})
            continue
        if step_spent(f"--engine auto's {name}", trial=True):
            records.append({"engine": name, "status": "not tried",
                            "reason": "the step's own time (--step-seconds) was spent"})
            continue
        if holds(trials, best) and time.monotonic() - trials.started > options.search_seconds:
            records.append({"engine": name, "status": "not tried",
                            "reason": f"{best_engine.name} passed the gate at {best_ratio:.2f}x the float model's "
                                      f"latency, and --search-seconds ({options.search_seconds:g} s) was spent"})
            continue
        trials.engine = candidate
        # an engine whose candidate fails on the CPU EP is not judged on the target EP; one that passes
        # there is, whatever the first baseline measured (it may be kept over it: replaces)
        trials.spare_failing_baseline, trials.spare_later_sources = True, False
        try:
            trial = trials.attempt(source, list(trials.fixed), f"baseline ({label}, {name})", baseline=True)
        finally:
            trials.spare_failing_baseline, trials.spare_later_sources = spare, True
        ratio = _timed(trials, trial, timed)
        records.append(engine_record(trials, trial))
        if trial.path is None:
            continue
        if replaces(trials, trial, ratio, best, best_ratio):
            best, best_engine, best_ratio = trial, candidate, ratio
    trials.engine = best_engine
    for record in records:
        record["kept"] = record["engine"] == best_engine.name
    return best, records


def _timed(trials: Trials, trial: Trial, timed: bool) -> float | None:
    """A candidate's latency ratio where speed counts: a target EP timed here times a candidate
    that passed on it (evaluate.measure_on_target), the CPU EP's was measured with its baseline."""
    if not timed or trial.path is None:
        return None
    evaluation = trials.evaluations.get(trial.path)
    target = trials.target
    if (evaluation is not None and trial.passed and target is not None and target.timed
            and evaluation.ep_latency is None):
        measure_on_target(evaluation, target, trials.sources[trial.path], trial.path, trials.eval_feeds)
    return latency(trials, trial)[0]


def best_record(trials: Trials, best: Trial | None, engines: list[dict]) -> dict | None:
    """The candidate kept, by engine, with its measured figures: the gate's verdict, its lowest
    cosine, its decisions' agreement, its latency ratio, and the options that write it (where it
    was refused, --keep-failed keeps it as NAME.failed.onnx)."""
    if best is None or best.path is None:
        return None
    name = trials.engine.name
    ratio, timed_on = latency(trials, best)
    judged = [r["engine"] for r in engines if r.get("status") == "judged"]
    return {"engine": name, "passed": best.passed, "cosine": best.cosine,
            "decision_shortfall": best.shortfall, "decisions": decision_agreements(trials, best),
            "latency_ratio": ratio, "timed_on": timed_on, "judged": judged,
            "writes_it": f"--engine {name} --keep-failed"}


# a decision's agreement in words, by kind (the share the gate holds for it)
KIND_WORDS = {"ctc": "whole strings kept", "top1": "top-1 kept", "argmax": "argmax kept per position"}


def best_words(best: dict) -> str:
    """The kept engine's candidate in words, for the refusal's fix: the engines judged, its
    figures, and the options that write it."""
    figures = [f"lowest cosine {best['cosine']:.4f}" if best.get("cosine") is not None else "no cosine"]
    for decision in best.get("decisions") or []:
        share = decision["agreement"]
        what = KIND_WORDS.get(decision["kind"], f"{decision['kind']} agreement")
        figures.append(f"'{decision['output']}' {what} {share:.1%}"
                       + (f", whole sequences {decision['sequence_agreement']:.1%}"
                          if decision.get("sequence_agreement") is not None and decision["kind"] != "argmax" else ""))
    if best.get("latency_ratio") is not None:
        figures.append(f"{best['latency_ratio']:.2f}x the float model's latency")
    engines = ", ".join(best.get("judged") or [best["engine"]])
    return (f"of the engines judged ({engines}), {best['engine']}'s candidate measured best ("
            + "; ".join(figures) + f"): {best['writes_it']} writes it as NAME.failed.onnx")


def with_engines(fix: str | None, best: dict | None, asked: str) -> str | None:
    """A refusal's fix with the engines' part: under --engine auto, the best engine's candidate and
    what writes it (best_words); under one engine, that --engine auto tries the others too."""
    if best is None:
        return fix
    if asked == "auto":
        words = best_words(best)
    else:
        others = [name for name in AUTO_ORDER if name != asked]
        words = f"--engine auto tries {', '.join(others)} too and names the engine whose candidate measured best"
    return f"{fix}; {words}" if fix else words


def speed_words(engines: list[dict]) -> str:
    """The engines' latency ratios, for the finding on a result slower than the float model: which
    passed, at what ratio, and which was kept; empty where no other engine was judged."""
    judged = [r for r in engines if r.get("status") == "judged"]
    if len(judged) < 2:
        return ""
    shown = ", ".join(f"{r['engine']} ({'passed' if r.get('passed') else 'failed'}"
                      + (f", {r['latency_ratio']:.2f}x" if r.get("latency_ratio") is not None else "")
                      + (", kept" if r.get("kept") else "") + ")" for r in judged)
    return f"the engines judged: {shown}"
