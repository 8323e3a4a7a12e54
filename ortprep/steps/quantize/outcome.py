"""The trials of one quantize attempt: the baseline on each source (pre-processed, as given),
the remedies (calibration method, rounding, compute), the search (``--auto-exclude``), the target
EP's confirmation and the selection's margin. :func:`quantize_and_search` returns an
:class:`Outcome`; the step's report is written from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from ortprep.findings import Finding
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.steps.base import ProgressCallback
from ortprep.steps.quantize.calibrate import DataPlan
from ortprep.steps.quantize.ep_gate import GateTarget
from ortprep.fidelity.evaluation import Evaluation, hold_to_margin
from ortprep.steps.quantize.evaluate import confirm_on_target, measure_latency
from ortprep.fidelity.words import fmt_cosine
from ortprep.steps.quantize.moves import confirmation_move
from ortprep.steps.quantize.remedies import (
    rounding_done,
    try_calibration_methods,
    try_compensated_rounding,
    try_float_compute,
)
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.search import run_search
from ortprep.steps.quantize.choose import best_record, choose_engine, engine_record
from ortprep.steps.quantize.trials import PREPROCESS_MARGIN, Trial, improved, margin_aim, reaches_margin
from ortprep.transforms.verify import model_bytes


@dataclass
class Outcome:
    """What the trials ended with."""

    trial: Trial | None
    evaluation: Evaluation | None
    excluded: list[dict]
    search: dict | None = None
    failure: str | None = None  # ORT's quantizer raised or died: its whole message
    source: str = "preprocessed"
    method: str = "minmax"  # the calibration method of the result
    # outputs given 16-bit headroom (qdq.encodings.widen_activation_encodings)
    widened: list[str] = field(default_factory=list)
    widened_activations: int = 0  # activations (outputs included) given 16-bit headroom
    # weights whose scales were raised for QNN (qdq.encodings.floor_weight_scales)
    floored: list[dict] = field(default_factory=list)
    fp16_matmuls: list[str] = field(default_factory=list)  # MatMuls of two 16-bit activations computed in FP16 (QNN)
    # activation encodings cut to their readers' knees (qdq.saturation.cut_to_readers)
    cut: list[str] = field(default_factory=list)
    # nodes kept off the target EP (off_target.py): name, op_type, reason
    off_ep: list[dict] = field(default_factory=list)
    wide: list[str] = field(default_factory=list)  # activations the search gave 16 bits (Search.widen)
    # --weight-only: the compensated rounding asked for or tried (remedies.try_compensated_rounding)
    rounding: dict | None = None
    # --weight-only: float32 compute judged beside int8 compute (remedies.try_float_compute)
    compute: dict | None = None
    # trials judged on the held-back samples, and those that failed the gate there (--auto's earlier
    # attempts' included: runner.Trials)
    judged: dict = field(default_factory=lambda: {"judged": 0, "failed": 0})
    engine: str = "ort"  # the engine of the result (and of the search)
    # each engine --engine auto considered: tried, not available, not supported, failed or judged
    engines: list[dict] = field(default_factory=list)
    engine_seconds: float = 0.0  # every engine call of the step, together
    # the candidate kept, by engine, with its measured figures (choose.best_record): JSON engine.best
    engine_best: dict | None = None


def quantize_and_search(workdir: Path, sources: list[tuple[str, Path]], options: QuantizeOptions, settings: dict,
                        plan: DataPlan, eval_feeds: list, big: bool, bounds: dict, progress: ProgressCallback | None,
                        report: StepResult, sentinels: list[str], target: GateTarget | None = None,
                        spare_failing_baseline: bool = False, earlier: tuple[int, int] = (0, 0)) -> Outcome:
    """The baseline on each source (pre-processed, as given), the better kept; then the search.
    ``spare_failing_baseline`` and ``earlier``: see Trials."""
    trials = Trials(workdir, options, settings, plan, eval_feeds, big, bounds, progress, target, spare_failing_baseline,
                    earlier)
    trials.fixed += [n for n in sentinels if n not in trials.fixed]
    baselines = [(label, path, trials.attempt(path, list(trials.fixed), f"baseline ({label})", baseline=True))
                 for label, path in sources]
    usable = [(label, path, t) for label, path, t in baselines if t.path is not None]
    engines: list[dict] | None = None
    if not usable and options.engine_name() == "auto":
        # ORT's quantizer failed on every source: the other engines on the first
        label, path, failed = baselines[0]
        rescued, engines = choose_engine(trials, path, label, failed, options)
        usable = [(label, path, rescued)] if rescued.path is not None else []
    if not usable:
        return Outcome(None, None, [], failure=trials.failure, judged=trials.counts(), engine=trials.engine.name,
                       engines=engines or [engine_record(trials, t) for _, _, t in baselines],
                       engine_seconds=trials.engine_seconds)
    chosen = usable[0]
    if len(usable) > 1:
        with_pre, without = usable[0], usable[1]
        first, second = with_pre[2], without[2]
        # without pre-processing wins when it passes where it fails, or is clearly more accurate
        if (second.passed and not first.passed) or (second.passed == first.passed and second.cosine is not None
                                                    and (first.cosine is None or second.cosine > first.cosine
                                                         + PREPROCESS_MARGIN)):
            chosen = without
            report.add(Finding.of(
                "QNT013",
                                  "quantization pre-processing made the result worse (cosine "
                                  f"{fmt_cosine(with_pre[2].cosine)} with it, "
                f"{fmt_cosine(without[2].cosine)} without): the model is quantized as given",
                fix="nothing to do; --no-preprocess skips the comparison"))
    label, source, best = chosen
    if engines is None:
        best, engines = choose_engine(trials, source, label, best, options)
    if trials.engine.name == "nncf" and not best.passed and eval_feeds:
        best = try_smooth_quant_alphas(trials, source, label, best, engines)
    search_record = None
    reasons: dict[str, str] = {}
    calibration: list[dict] = []
    aim = margin_aim(options.min_cosine)

    def short(trial: Trial) -> bool:
        """Fails the gate, or was chosen by the held-back samples and holds short of the decision margin."""
        return not trial.passed or (trials.held_to_margin(trial) and not reaches_margin(trial, None))

    searching = short(best) and options.auto_exclude and bool(eval_feeds)
    if (not best.passed and options.auto_exclude and eval_feeds and options.mode == "static"
            and settings["method"] == "minmax"):
        # the calibration method first, then the nodes
        baseline_cosine, first = best.cosine, best
        best, calibration, tried = try_calibration_methods(trials, source, best, aim)
        settings = trials.settings
        if settings["method"] != "minmax":
            report.add(Finding.of("QNT016",
                                  f"{settings['method']} calibration kept: lowest cosine {fmt_cosine(baseline_cosine)} "
                                  f"with min/max ranges, {fmt_cosine(best.cosine)} with {settings['method']}",
                                  fix=f"nothing to do; --method {settings['method']} asks for it directly"))
    rounding = compute = None
    if options.mode == "weight-only":
        best, rounding, compute = weight_only_trials(trials, source, best, options, plan, eval_feeds, report)
        settings = trials.settings
        searching = searching and short(best)
    graph_only = onnx.load(str(source), load_external_data=False)
    if searching:  # once the search started it aims for the margin, whatever fixed the gate
        best, search_record, reasons = run_search(trials, source, best, options, graph_only)
    if calibration:
        size = max(model_bytes(source), 1)
        search_record = search_record or {"aim": None, "trials": [best.to_record(size)], "rules": [],
                                          "ranked": [], "sensitivity": [], "stopped": "the gate passed"}
        search_record["calibration"] = calibration
        # the baseline and each calibration trial, then the search's own (its first is the best of those)
        search_record["trials"] = [t.to_record(size) for t in [first, *tried]] + search_record["trials"][1:]
    excluded = [{"name": n, "reason": "--exclude-node"} for n in options.exclude_nodes]
    excluded += [{"name": n, "reason": "reads a non-finite or sentinel constant (no 8-bit range holds it)"}
                 for n in trials.fixed if n not in options.exclude_nodes]
    ops = {n.name: n.op_type for n in graph_only.graph.node}
    excluded += [{"name": n, "op_type": ops.get(n, "?"), "reason": reasons.get(n, "auto-exclude")}
                 for n in best.kept if n not in trials.fixed]
    chosen = trials.evaluations.get(best.path)
    if chosen is not None and best.path is not None and target is not None:
        # the calibration samples on the target EP, once, for the result chosen (evaluate.confirm_on_target)
        confirm_on_target(chosen, best.path, trials.margin_feeds, target, trials.caches.setdefault(source, {}))
        if not chosen.passed and options.auto_exclude and options.mode == "static":
            # only the EP's runs of the calibration samples fail: what it computes otherwise is kept off it
            moved, moves, why_moved = confirmation_move(trials, source, best, options)
            if moves:
                size = max(model_bytes(source), 1)
                search_record = search_record or {"aim": None, "trials": [best.to_record(size)], "rules": [],
                                                  "ranked": [], "sensitivity": [],
                                                  "stopped": "the gate passed on the held-back samples"}
                search_record["off_ep"] = [*search_record.get("off_ep", []), *moves]
                search_record["off_ep_reasons"] = {**search_record.get("off_ep_reasons", {}), **why_moved}
                if moved is best:
                    search_record["stopped"] = (f"{search_record['stopped']}; then {len(moves)} set(s) of nodes kept "
                                                "off "
                                                f"{target.ep} did not mend its calibration samples there "
                                                "(search.off_ep)")
            if moved is not best:
                best, chosen = moved, trials.evaluations[moved.path]
        best = replace(best, passed=best.passed and chosen.passed)
    if chosen is not None and best.path is not None and trials.held_to_margin(best) and chosen.passed:
        # kept after another trial failed on the same held-back samples: chosen by them, so held to
        # the decision margin (evaluate.hold_to_margin)
        selection = hold_to_margin(chosen, trials.judged)
        if selection is not None and not selection["passed"]:
            best = replace(best, passed=False)
        if search_record is not None and selection is not None:
            search_record["selection"] = selection
    if chosen is not None and best.path is not None:
        if best.path in trials.sources:  # search trials are not timed
            measure_latency(chosen, trials.sources[best.path], best.path, trials.eval_feeds)
    why_off = (search_record or {}).get("off_ep_reasons") or {}
    off_ep = [{"name": n, "op_type": ops.get(n, "?"), "reason": why_off.get(n, "kept off the EP")} for n in best.off]
    return Outcome(best, chosen, excluded, search_record, source=label, judged=trials.counts(),
                   method=trials.settings["method"], widened=trials.widened.get(best.path, []),
                   floored=trials.floored.get(best.path, []),
                   widened_activations=trials.widened_count.get(best.path, 0),
                   cut=trials.cut.get(best.path, []),
                   off_ep=off_ep, fp16_matmuls=trials.fp16_matmuls.get(best.path, []), wide=list(best.wide),
                   rounding=rounding, compute=compute, engine=trials.engine.name, engines=engines,
                   engine_seconds=trials.engine_seconds, engine_best=best_record(trials, best, engines))


def try_smooth_quant_alphas(trials: Trials, source: Path, label: str, best: Trial, engines: list[dict]) -> Trial:
    """NNCF's baseline failed on a graph it runs SmoothQuant on: each of SMOOTH_QUANT_ALPHAS (how much
    of an activation's outlier range moves into the weights) quantizes again, judged by the gate;
    the first that passes is kept, else the best (trials.improved), and the search goes on with
    it. NNCF's own 0.95 suits LLM activations; on small dense models a lower one kept the weights'
    per-channel grid (docs/decisions/engines-integration.md)."""
    from ortprep.steps.quantize.engines.nncf import SMOOTH_QUANT_ALPHA, SMOOTH_QUANT_ALPHAS, model_type

    if model_type(source) != "transformer":
        return best
    settings = trials.settings
    kept = settings.get("smooth_quant_alpha", SMOOTH_QUANT_ALPHA)
    tried = [{"alpha": kept, "cosine": best.cosine, "passed": best.passed}]
    for alpha in SMOOTH_QUANT_ALPHAS:
        if alpha == kept or best.passed:
            continue
        trials.settings = {**settings, "smooth_quant_alpha": alpha}
        trial = trials.attempt(source, list(trials.fixed), f"baseline ({label}, nncf, SmoothQuant alpha {alpha})")
        tried.append({"alpha": alpha, "cosine": trial.cosine, "passed": trial.passed, "error": trial.error})
        if trial.path is not None and improved(trial, best):
            best, settings = trial, trials.settings
    trials.settings = settings
    for record in engines:
        if record["engine"] == "nncf":
            record["smooth_quant_alphas"] = tried
            record["smooth_quant_alpha"] = settings.get("smooth_quant_alpha", SMOOTH_QUANT_ALPHA)
    return best


def weight_only_trials(trials: Trials, source: Path, best: Trial, options: QuantizeOptions, plan: DataPlan,
                       eval_feeds: list, report: StepResult) -> tuple[Trial, dict | None, dict | None]:
    """--weight-only after its baseline: the compensated rounding where nearest rounding failed
    (--rounding auto, real calibration samples), then float32 compute against the CPU EP's int8
    kernel (--accuracy-level auto). Returns the trial kept and a record of each (or None)."""
    settings = trials.settings
    rounding = compute = None
    if settings.get("rounding") == "gptq" and best.path is not None:
        rounding = {"rounding": "gptq", "asked": True, **rounding_done(best)}
    elif options.rounding == "auto" and not best.passed and eval_feeds and plan.calib_indices:
        before = best
        best, rounding = try_compensated_rounding(trials, source, best)
        if rounding["kept"]:
            share = rounding.get("error_vs_nearest")
            report.add(Finding.of(
                "QNT030", f"gptq rounding kept: nearest rounding (ORT's own) failed the gate at lowest cosine "
                f"{fmt_cosine(before.cosine)}; with each weight's rounding error moved onto the weights not yet "
                "rounded, "
                f"{fmt_cosine(best.cosine)}"
                                  + (f" (the MatMuls' output error on the calibration samples: {share:.0%} of "
                                                f"nearest rounding's)" if share is not None else ""),
                fix="nothing to do; --rounding gptq asks for it directly, --rounding nearest for ORT's levels"))
    if (options.accuracy_level == "auto" and trials.settings.get("accuracy_level") == 4 and best.path is not None
            and eval_feeds):
        before = best
        best, compute = try_float_compute(trials, source, best)
        compute = compute or None
        if compute is not None and compute["kept"]:
            if before.passed:
                timed = (f" ({compute['ms']['4']:.3f} ms against {compute['ms']['0']:.3f} ms; the float model "
                         f"{compute['ms']['float']:.3f} ms)" if compute.get("ms") else "")
                why = (f"the CPU EP's int8 compute (accuracy_level 4) is not clearly faster on the samples' "
                       f"shapes{timed}, and float32 is the more precise; it passes the gate too (lowest cosine "
                       f"{fmt_cosine(best.cosine)})")
            else:
                why = ("with the CPU EP's int8 compute (accuracy_level 4: activations quantized per block at run "
                       "time) "
                       f"the result failed the gate at lowest cosine {fmt_cosine(before.cosine)}; in float32, "
                       f"{fmt_cosine(best.cosine)}")
            report.add(Finding.of("QNT031", f"float32 compute kept (accuracy_level 0): {why}",
                                  fix="nothing to do; --accuracy-level 0 or 4 asks for one directly"))
    return best, rounding, compute


def settings_after(settings: dict, outcome: Outcome, options: QuantizeOptions) -> dict:
    """The settings as the outcome used them: its calibration method, and for --weight-only the
    rounding and compute kept (the report's preset and weight_only records read them)."""
    settings = {**settings, "method": outcome.method}
    if options.mode == "weight-only":
        # gptq only where it rewrote a weight: with every MatMul kept at nearest the file is ORT's own levels
        used = (outcome.rounding is not None and (outcome.rounding.get("asked") or outcome.rounding.get("kept"))
                and (outcome.rounding.get("matmuls") or 0) > 0)
        settings = {**settings, "rounding": "gptq" if used else "nearest", "rounding_record": outcome.rounding,
                    "compute_record": outcome.compute}
        if outcome.compute is not None and outcome.compute["kept"]:
            settings["accuracy_level"] = 0
    return settings
