"""quantize: static (real calibration data) or dynamic, with EP presets and an accuracy verdict.

The step's orchestration: resolve the EP's preset, plan the data, prepare the graph, quantize
(pre-processed and as given), evaluate, search when asked, and report. The work lives beside it:
``presets`` (the settings), ``calibrate`` (the data and the quantizer's child process), ``edits``
(graph work), ``evaluate`` (model runs and the accuracy gate), ``ep_gate`` (the target EP's side
of the gate, where it runs here), ``search`` (--auto-exclude).

The quantizer runs in a child process whose working directory is a private temp folder: a crash
stays there, and so does every temp file. Calibration streams its samples. A share of the
samples is held back and both models run on it, on the CPU EP and, where it runs here, the
quantized one also on the target EP (the session an application creates for it): the gate holds
on the worse of the two. When the gate fails, the nodes where the error starts are named, and
--auto-exclude keeps them in float and tries again, judging every trial the same way.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.eps.htp import small_multipliers
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, failed_path, iter_graphs
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.runtime.budget import EpClock
from ortprep.runtime.compare import output_bounds
from ortprep.runtime.tolerance import FLOAT16_COMPUTE
from ortprep.steps.base import ProgressCallback, Step, StepContext, output_path
from ortprep.steps.quantize.calibrate import DataPlan, evaluation_feeds, plan_data, preprocess
from ortprep.transforms.qdq.encodings import OUTPUT_HEADROOM_16
from ortprep.transforms.qdq.facts import float_weighted, int8_compute_matmuls, output_writers, quantization_stats
from ortprep.transforms.qdq.prepare import (
    already_quantized,
    constants_to_initializers,
    fold_batch_norms,
    fold_conv_transpose_bias,
    name_nodes,
    sentinel_readers,
    upgrade_opset,
)
from ortprep.steps.quantize.ep_gate import GateTarget, gate_target
from ortprep.steps.quantize.evaluate import (
    Evaluation,
    confirm_on_target,
    fmt_cosine,
    gate_finding,
    hold_to_margin,
    latency_finding,
    limited_finding,
    measure_latency,
    measure_on_target,
    opset_upgrade_verified,
    worst_nodes,
)
from ortprep.steps.quantize.presets import resolve_settings
from ortprep.steps.quantize.moves import confirmation_move
from ortprep.steps.quantize.remedies import (
    rounding_done,
    try_calibration_methods,
    try_compensated_rounding,
    try_float_compute,
)
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.search import run_search
from ortprep.steps.quantize.trials import Trial, margin_aim, reaches_margin
from ortprep.transforms.fp16 import ensure_node_names
from ortprep.transforms.verify import model_bytes, save_temp

SCHEMA = "ortprep.quantize/1"
PREPROCESS_MARGIN = 1e-3  # cosine by which quantizing without pre-processing must win to be chosen


def legal_settings(proto: ModelProto, settings: dict, feeds: dict[str, np.ndarray] | None, report: StepResult
                   ) -> tuple[ModelProto, dict]:
    """Per-channel QDQ writes DequantizeLinear with an axis, which needs opset 13: upgrade the
    opset (verified) or fall back to per-tensor, and say which."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    if not (settings["per_channel"] and settings["format"] == "qdq" and opset < 13):
        return proto, settings
    upgraded = upgrade_opset(proto, 13)
    if upgraded is not None and feeds is not None:
        check = opset_upgrade_verified(proto, upgraded, feeds)
        if check.passed:
            report.add(Finding.of("QNT012", f"per-channel QDQ needs opset 13 (DequantizeLinear's axis); the model's opset "
                                  f"{opset} was upgraded to 13 and verified (max abs diff {check.max_abs_diff:.3g})",
                                  fix="nothing to do; --per-tensor keeps the opset"))
            return upgraded, settings
    report.add(Finding.of("QNT012", f"per-channel QDQ needs opset 13 (DequantizeLinear's axis) and the model's opset {opset} "
                          "could not be upgraded with verification: weights are quantized per tensor",
                          fix="upgrade it yourself (ortprep convert --opset 13) to get per-channel weights"))
    return proto, {**settings, "per_channel": False}


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
    widened: list[str] = field(default_factory=list)  # outputs given 16-bit headroom (edits.widen_activation_encodings)
    widened_activations: int = 0  # activations (outputs included) given 16-bit headroom
    floored: list[dict] = field(default_factory=list)  # weights whose scales were raised for QNN (edits.floor_weight_scales)
    fp16_matmuls: list[str] = field(default_factory=list)  # MatMuls of two 16-bit activations computed in FP16 (QNN)
    off_ep: list[dict] = field(default_factory=list)  # nodes kept off the target EP (off_target.py): name, op_type, reason
    wide: list[str] = field(default_factory=list)  # activations the search gave 16 bits (Search.widen)
    rounding: dict | None = None  # --weight-only: the compensated rounding asked for or tried (search.try_compensated_rounding)
    compute: dict | None = None  # --weight-only: float32 compute judged beside int8 compute (search.try_float_compute)
    # trials judged on the held-back samples, and those that failed the gate there (--auto's earlier
    # attempts' included: search.Trials)
    judged: dict = field(default_factory=lambda: {"judged": 0, "failed": 0})


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
    if not usable:
        return Outcome(None, None, [], failure=trials.failure, judged=trials.counts())
    chosen = usable[0]
    if len(usable) > 1:
        with_pre, without = usable[0], usable[1]
        first, second = with_pre[2], without[2]
        # without pre-processing wins when it passes where it fails, or is clearly more accurate
        if (second.passed and not first.passed) or (second.passed == first.passed and second.cosine is not None
                                                    and (first.cosine is None or second.cosine > first.cosine + PREPROCESS_MARGIN)):
            chosen = without
            report.add(Finding.of(
                "QNT013", f"quantization pre-processing made the result worse (cosine {fmt_cosine(with_pre[2].cosine)} with it, "
                f"{fmt_cosine(without[2].cosine)} without): the model is quantized as given",
                fix="nothing to do; --no-preprocess skips the comparison"))
    label, source, best = chosen
    search_record = None
    reasons: dict[str, str] = {}
    calibration: list[dict] = []
    aim = margin_aim(options.min_cosine)

    def short(trial: Trial) -> bool:
        """Fails the gate, or was chosen by the held-back samples and holds short of the decision margin."""
        return not trial.passed or (trials.held_to_margin(trial) and not reaches_margin(trial, None))

    searching = short(best) and options.auto_exclude and bool(eval_feeds)
    if not best.passed and options.auto_exclude and eval_feeds and options.mode == "static" and settings["method"] == "minmax":
        # the calibration method first, then the nodes
        baseline_cosine, first = best.cosine, best
        best, calibration, tried = try_calibration_methods(trials, source, best, aim)
        settings = trials.settings
        if settings["method"] != "minmax":
            report.add(Finding.of("QNT016", f"{settings['method']} calibration kept: lowest cosine {fmt_cosine(baseline_cosine)} "
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
                                          "ranked": [], "stopped": "the gate passed"}
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
                                                  "ranked": [], "stopped": "the gate passed on the held-back samples"}
                search_record["off_ep"] = [*search_record.get("off_ep", []), *moves]
                search_record["off_ep_reasons"] = {**search_record.get("off_ep_reasons", {}), **why_moved}
                if moved is best:
                    search_record["stopped"] = (f"{search_record['stopped']}; then {len(moves)} set(s) of nodes kept off "
                                                f"{target.ep} did not mend its calibration samples there (search.off_ep)")
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
                   floored=trials.floored.get(best.path, []), widened_activations=trials.widened_count.get(best.path, 0),
                   off_ep=off_ep, fp16_matmuls=trials.fp16_matmuls.get(best.path, []), wide=list(best.wide),
                   rounding=rounding, compute=compute)


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
                f"{fmt_cosine(before.cosine)}; with each weight's rounding error moved onto the weights not yet rounded, "
                f"{fmt_cosine(best.cosine)}" + (f" (the MatMuls' output error on the calibration samples: {share:.0%} of "
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
                why = (f"with the CPU EP's int8 compute (accuracy_level 4: activations quantized per block at run time) "
                       f"the result failed the gate at lowest cosine {fmt_cosine(before.cosine)}; in float32, "
                       f"{fmt_cosine(best.cosine)}")
            report.add(Finding.of("QNT031", f"float32 compute kept (accuracy_level 0): {why}",
                                  fix="nothing to do; --accuracy-level 0 or 4 asks for one directly"))
    return best, rounding, compute


# Ops of ORT's quantizer registries that only move or select data: a model of these alone has
# nothing whose arithmetic int8 would make cheaper.
_DATA_MOVEMENT = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split", "Pad", "Concat", "Where",
                  "TopK", "Gather", "GatherElements", "ArgMax"}


def _nothing_to_quantize(proto: ModelProto) -> str | None:
    """Why the model has nothing ORT's quantizer computes on (its registries: dynamic, QDQ and
    QOperator), or None. An ai.onnx.ml pipeline (a scikit-learn export: Scaler, LinearClassifier,
    ZipMap) made ORT's quantizer fail inside ("Failed to find proper ai.onnx domain", QNT008)."""
    from ortprep.runtime.quantizer_ops import all_registry_op_types

    quantizable = all_registry_op_types() - _DATA_MOVEMENT
    ops: dict[str, int] = {}
    for _, graph in iter_graphs(proto.graph):
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
            ops[key] = ops.get(key, 0) + 1
    if any(op in quantizable for op in ops):
        return None
    shown = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
    return f"none of its ops ({shown or 'no nodes'}) is one ONNX Runtime's quantizer computes on in int8"


def _parted(evaluation: Evaluation, target: GateTarget, model: Path, feeds: list, workdir: Path) -> list[dict]:
    """Where the EP's run first parts from the CPU EP's (ep_gate.first_divergence), when the EP
    side fails the gate worse than the CPU side does."""
    on_ep = evaluation.on_ep
    if on_ep is None or on_ep.error is not None or on_ep.passed or not feeds:
        return []
    if not evaluation.ep_only and (on_ep.cosine is None or evaluation.cosine is None or on_ep.cosine >= evaluation.cosine - 0.01):
        return []  # the CPU EP is as wrong: quantization's error, not the EP's
    from ortprep.steps.quantize.ep_gate import first_divergence

    return first_divergence(target, model, feeds[:2], workdir)


def _matmulnbits_on(ep: str, report: StepResult) -> None:
    """QNT018 when the target EP's table has no MatMulNBits kernel: the rewritten MatMuls would run
    on the CPU EP beside it (the EP's tables: ortprep/eps/data)."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.kernels import support_table

    name = resolve_ep(ep).name
    if support_table(name).lookup("com.microsoft", "MatMulNBits"):
        return
    report.add(Finding.of("QNT018", f"{name} has no MatMulNBits kernel in its operator table: the weight-only MatMuls "
                          f"would run on the CPU EP, beside {name}", ep=name,
                          fix=f"for {name}, --static (QDQ) keeps MatMuls on the EP; weight-only suits the CPU, CUDA, "
                              "DirectML and WebGPU EPs"))


def _no_matmul_weights(proto: ModelProto) -> str | None:
    """Why weight-only quantization has nothing to work on (MatMulNBits takes a MatMul whose second
    input is a constant 2-D weight), or None."""
    weights = {t.name: t for t in proto.graph.initializer}
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]
    if any(len(n.input) > 1 and n.input[1] in weights and len(weights[n.input[1]].dims) == 2 for n in matmuls):
        return None
    if not matmuls:
        return "the model has no MatMul (weight-only quantization rewrites MatMuls with constant 2-D weights)"
    return (f"none of its {len(matmuls)} MatMul(s) has a constant 2-D weight as its second input (a Gemm, a Conv or a "
            "MatMul of two computed tensors is not what MatMulNBits takes)")


def _base_record(handle: ModelHandle, options: QuantizeOptions, settings: dict, size_before: int) -> dict:
    return {
        "input": str(handle.path), "output": None, "kept_failed": None, "mode": options.mode, "format": settings["format"],
        "preset": {"ep": settings["preset"], "reason": settings["preset_reason"], "activation_type": settings["activation_type"],
                   "weight_type": settings["weight_type"], "per_channel": settings["per_channel"], "method": settings["method"],
                   "source": settings["preset_source"], "fixed_output_encodings": settings.get("fixed_output_encodings") or {},
                   "reduce_range": settings.get("reduce_range", False)},
        "weight_only": ({"bits": settings["weight_bits"], "block_size": settings["block_size"],
                         "symmetric": settings["symmetric"], "op": "com.microsoft:MatMulNBits",
                         "rounding": settings.get("rounding", "nearest"), "rounding_tried": settings.get("rounding_record"),
                         "accuracy_level": settings.get("accuracy_level", 0), "accuracy_tried": settings.get("compute_record")}
                        if options.mode == "weight-only" else None),
        "preprocess": "not run", "size_before": size_before, "size_after": None, "size_ratio": None,
        "calibration": {"samples": 0, "source": None, "kind": None}, "evaluation_samples": 0,
        "evaluation_inputs": None, "output_headroom": None, "raised_weight_scales": None, "fp16_matmuls": None, "folded_biases": None, "folded_batch_norms": None, "ep_divergence": None,
        "verify": {"cosine": None, "spread": None, "max_abs_diff": None, "top1_agreement": None, "latency_ratio": None,
                   "passed": None},
        "quantized_ops": 0, "quantized_weights": 0, "quantized_weight_share": None, "wide_activations": [], "excluded_nodes": [], "kept_off_ep": [], "search": None,
        "gate_target": None,
    }


def quantize_model(handle: ModelHandle, dest: Path, options: QuantizeOptions, *, force: bool = False,
                   progress: ProgressCallback | None = None, clock: EpClock | None = None,
                   spare_failing_baseline: bool = False, earlier: tuple[int, int] = (0, 0)) -> StepResult:
    """Quantize ``handle``'s model and write ``dest`` when the accuracy gate passes.
    ``progress(stage, done, total)`` is called during calibration and evaluation. ``earlier``:
    (failed, judged) trials of --auto's earlier attempts (search.Trials)."""
    settings = resolve_settings(options)
    report = StepResult(step="quantize", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    already = already_quantized(handle.proto)
    if already is not None:
        report.add(Finding.of("QNT010", f"the model is already quantized ({already}); quantizing it again would stack "
                              "a second quantization on the first", fix="quantize the float model it was made from"))
        report.data = _base_record(handle, options, settings, size_before)
        return report
    weight_only = options.mode == "weight-only"
    nothing = _no_matmul_weights(handle.proto) if weight_only else _nothing_to_quantize(handle.proto)
    if weight_only and nothing is None and "MatMul" in options.exclude_ops:
        # ORT's weight-only quantizer reads an empty op list as its default, MatMul: said, not done
        nothing = "--exclude-op MatMul leaves weight-only quantization no MatMul to rewrite"
    if nothing is not None:
        report.add(Finding.of("QNT002", f"nothing to quantize: {nothing}", fix=(
            "weight-only quantization is for MatMul weights (transformers); a CNN: --static or --dynamic" if weight_only else
            "nothing to do: the model stays as it is (for an ai.onnx.ml pipeline, convert its estimator to ONNX ops first)")))
        report.data = _base_record(handle, options, settings, size_before)
        return report
    if weight_only:
        _matmulnbits_on(options.ep, report)
    plan = plan_data(handle, options, settings, report)
    target = gate_target(options, report, clock)  # before any work: --gate-on-ep without the EP stops here
    calibration, calib_indices = plan.calibration, plan.calib_indices
    handle.load_weights()
    eval_feeds, eval_source = evaluation_feeds(handle, plan, options, report)
    bounds = output_bounds(handle.proto)
    with tempfile.TemporaryDirectory(prefix="ortprep-quantize-") as tmp:
        workdir = Path(tmp)
        proto = onnx.ModelProto()
        proto.CopyFrom(handle.proto)
        moved = constants_to_initializers(proto)
        if moved:
            report.add(Finding.of("QNT009", f"{moved} weight(s) held in Constant nodes became initializers so they can be quantized",
                                  fix="nothing to do"))
        ensure_node_names(proto)
        folded, folded_norms = [], []
        if settings.get("preset") == "qnn" and options.mode == "static":
            # QNN's HTP computes a quantized ConvTranspose's bias Add, and a quantized
            # BatchNormalization, wrongly (eps/htp.py)
            folded = fold_conv_transpose_bias(proto, keep=set(options.exclude_nodes))
            folded_norms = fold_batch_norms(proto, keep=set(options.exclude_nodes))
        for code, names, words in (
                ("QNT025", folded, "Add(s) of a constant per channel after a ConvTranspose were folded into its bias (the "
                 "same function in float): QNN's HTP computes such an Add wrongly once quantized (measured: 6.5% of the "
                 "output's range off, where the ConvTranspose with the bias folded in agrees within 0.02%)"),
                ("QNT026", folded_norms, "BatchNormalization(s) after a Conv were folded into its weights and bias (the "
                 "same function in float): QNN's HTP computes a BatchNormalization quantized on its own wrongly "
                 "(measured: up to half of the output's range off, cosine 0.975, in A16W16 and A8W8)")):
            if names:
                report.add(Finding.of(code, f"{len(names)} {words}: " + ", ".join(names[:4]) + (", ..." if len(names) > 4 else ""),
                                      fix="nothing to do"))
        sentinels = sentinel_readers(proto)
        if sentinels:
            report.add(Finding.of("QNT015", f"{len(sentinels)} node(s) read a non-finite or sentinel constant (such as the -inf "
                                  "of a safe maximum) that no 8-bit range can hold; they stay float: " + ", ".join(sentinels[:6]),
                                  fix="nothing to do"))
        proto, settings = legal_settings(proto, settings, eval_feeds[0] if eval_feeds else None, report)
        big = handle.has_external_data()
        float_path = save_temp(proto, workdir, "float.onnx")
        del proto
        preprocess_detail = "skipped (--no-preprocess)"
        sources = [("as given", float_path)]
        if options.mode == "weight-only":
            preprocess_detail = "not run: weight-only quantization changes MatMul weights alone"
        elif options.preprocess:
            preprocessed, preprocess_detail = preprocess(workdir, float_path, report)
            if preprocessed != float_path:
                name_nodes(preprocessed)
                # checked, not trusted: both are quantized and evaluated when there is data to judge by
                sources = [("preprocessed", preprocessed)] + (sources if eval_feeds else [])
        outcome = quantize_and_search(workdir, sources, options, settings, plan, eval_feeds, big, bounds, progress, report,
                                      sentinels, target, spare_failing_baseline, earlier)
        settings = {**settings, "method": outcome.method}
        if options.mode == "weight-only":
            # gptq only where it rewrote a weight: with every MatMul kept at nearest the file is ORT's own levels
            used = (outcome.rounding is not None and (outcome.rounding.get("asked") or outcome.rounding.get("kept"))
                    and (outcome.rounding.get("matmuls") or 0) > 0)
            settings = {**settings, "rounding": "gptq" if used else "nearest", "rounding_record": outcome.rounding,
                        "compute_record": outcome.compute}
            if outcome.compute is not None and outcome.compute["kept"]:
                settings["accuracy_level"] = 0
        if outcome.source == "as given" and options.preprocess and len(sources) > 1:
            preprocess_detail += "; not used: quantizing without it evaluated better"
        report.data = _base_record(handle, options, settings, size_before)
        report.data.update({"preprocess": preprocess_detail, "evaluation_samples": len(eval_feeds),
                            "output_headroom": {"factor": OUTPUT_HEADROOM_16, "outputs": outcome.widened,
                                            "activations": outcome.widened_activations},
                            "raised_weight_scales": outcome.floored,
                            "fp16_matmuls": outcome.fp16_matmuls,
                            "folded_biases": folded,
                            "folded_batch_norms": folded_norms,
                            "gate_target": target.record(),
                            "evaluation_inputs": eval_source,
                            "calibration": {"samples": len(calib_indices), "source": calibration.source if calibration else None,
                                            "kind": calibration.kind if calibration else None}})
        if outcome.trial is None:
            report.add(Finding.of("QNT008", f"ONNX Runtime's quantizer failed on this model: {outcome.failure}",
                                  fix="--exclude-op / --exclude-node for the op it names, --no-preprocess, or check the "
                                  "model first: ortprep check MODEL --ep cpu"))
            return report
        result_path = outcome.trial.path
        evaluation, excluded = outcome.evaluation, outcome.excluded
        quantized = onnx.load(str(result_path))
        stats = quantization_stats(quantized)
        if stats["quantized_ops"] == 0:
            report.add(Finding.of("QNT002", "nothing was quantized: no op computes on quantized data",
                                  fix="check --exclude-op/--exclude-node, and that the model's weights are initializers"))
        elif options.mode == "static":
            kept_float, weighted = float_weighted(quantized)
            if weighted >= 2 and 2 * len(kept_float) > weighted:
                # a MiniLM's QNN result kept 17 of its 18 Gemm weights float and said nothing of it
                report.add(Finding.of(
                    "QNT027", f"most of the model's weights stay float: {len(kept_float)} of {weighted} MatMul/Gemm/Conv "
                    f"node(s) keep float weights (" + ", ".join(kept_float[:6]) + (", ..." if len(kept_float) > 6 else "")
                    + "): the result is a float model with some quantized parts, and the target computes those nodes in "
                    "float (on an NPU: FP16, or on the CPU)",
                    fix="see excluded_nodes for why they stayed float; where the search kept them, a wider precision "
                        "(--auto) may quantize them; FP16 (ortprep convert MODEL --fp16) may be the format that fits"))
        if outcome.floored:
            channels = sum(f["channels"] for f in outcome.floored)
            shown = ", ".join(f"{f['node']} ({f['channels']}, down to 2^{np.log2(f['smallest']):.1f})" for f in outcome.floored[:4])
            report.add(Finding.of(
                "QNT020", f"{channels} channel(s) of {len(outcome.floored)} weight(s) had a requantization multiplier (input "
                f"scale x weight scale / output scale) below 2^-24, which QNN's HTP computes wrongly (measured: such a channel "
                f"puts out large values (8 to 70 measured) where the CPU EP gives 0): their scales were raised to 2^-23; their weights are tiny "
                f"against the output's range, which rounds them to about 0 either way: {shown}"
                + (", ..." if len(outcome.floored) > 4 else ""), fix="nothing to do"))
        if outcome.fp16_matmuls:
            shown = ", ".join(outcome.fp16_matmuls[:4]) + (", ..." if len(outcome.fp16_matmuls) > 4 else "")
            report.add(Finding.of(
                "QNT024", f"{len(outcome.fp16_matmuls)} MatMul(s) of two 16-bit activations compute in FP16 (a Cast to "
                "float16 around each; they stay on QNN): QNN's HTP computes such a MatMul far less precisely in 16 bits "
                "(measured: max abs diff 0.099 at an output range of 20.7, where the CPU EP's run of the same model is "
                f"off by 0.0007; in FP16 on the HTP, 0.0064): {shown}", fix="nothing to do"))
        if settings.get("preset") == "qnn" and options.mode == "static":
            left = small_multipliers(quantized)
            if left:
                report.add(Finding.of(
                    "QNN005", f"qnn: {sum(item['channels'] for item in left)} weight channel(s) of {len(left)} node(s) "
                    "still have a requantization multiplier below 2^-24, which QNN's HTP computes wrongly (an "
                    "initializer shared with another node, or a bias this edit could not keep consistent): "
                    + ", ".join(item["node"] for item in left[:5]), ep="qnn",
                    fix="ortprep load MODEL.qdq.onnx --ep qnn --reference MODEL shows whether the output suffers"))
        for name, what in (evaluation.degenerate if evaluation else []):
            report.add(Finding.of(
                "VFY001", f"output '{name}' is {what} on the evaluation samples: cosine similarity means nothing there, so "
                "it was judged by absolute error; these samples do not exercise it",
                fix="evaluate on real data that moves this output: --eval DATA"))
        if evaluation is not None and not evaluation.passed:
            # the CPU side's error is traced to its nodes; the EP's alone, to what writes the outputs it gets wrong
            worst = (worst_nodes(Path(float_path), result_path, eval_feeds[0], {e["name"] for e in excluded})
                     if evaluation.error is None and not evaluation.cpu_verdict else [])
            names = ", ".join(f"{n} ({op}, cosine {c:.4f})" for n, op, c in worst) or "none found"
            stopped = f"; the search stopped: {outcome.search['stopped']}" if outcome.search else ""
            writers = _writers_text(quantized, evaluation, target) if evaluation.ep_only else ""
            parted = _parted(evaluation, target, result_path, eval_feeds, workdir)
            report.data["ep_divergence"] = parted
            if parted:
                first = parted[0]
                writers = "; ".join(part for part in (writers, (
                    f"{target.ep} parts from the CPU EP first at {first['node']} ({first['op_type']}: cosine "
                    f"{first['cosine']:.4f} there, the model's own arithmetic on both)")) if part)
            from ortprep.steps.quantize.auto import auto_order

            # what --auto would try next, here
            held = (min(plan.eval_set.count, options.samples or plan.eval_set.count)
                    if plan.eval_set is not None and plan.eval_set.kind != "random" else None)
            others = [label + (f" (calibrated on {changes['calib']}, a share held back)" if changes.get("calib") else "")
                      for label, changes in auto_order(options, held)[1:]]
            report.add(gate_finding(evaluation, min_cosine=options.min_cosine, ep_text=target.describe(), stopped=stopped,
                                    worst=names, writers=writers, others=others, searched=bool(outcome.search)))
        int8_compute = int8_compute_matmuls(quantized) if options.mode == "static" and options.ep in (None, "cpu") else []
        if int8_compute:
            shown = ", ".join(int8_compute[:6]) + (", ..." if len(int8_compute) > 6 else "")
            report.add(Finding.of(
                "QNT029", f"{len(int8_compute)} MatMul/Gemm node(s) read 16-bit activations and 8-bit weights ({shown}): "
                "ORT's CPU EP fuses each into MatMulNBits at accuracy level 4, which quantizes the activation to int8 per "
                "block of 32 at run time (measured, onnxruntime 1.32: an activation with one large channel, cosine 0.70 "
                "against float; 0.9999 in float compute); the gate judged that default session",
                fix="where the application's output suffers there, its session can set "
                    "session.qdq_matmulnbits_accuracy_level=1 (float compute: SessionOptions.add_session_config_entry)"))
        if outcome.wide and evaluation is not None:
            report.add(Finding.of(
                "QNT028", f"--auto-exclude gave {len(outcome.wide)} activation(s) 16 bits, the weights staying "
                f"{settings['weight_type']} (" + ", ".join(outcome.wide[:8]) + (", ..." if len(outcome.wide) > 8 else "")
                + f"): lowest cosine {fmt_cosine(evaluation.gate_cosine)}",
                fix="see wide_activations and search; the CPU EP computes a 16-bit node in float between its Q/DQ pairs, "
                    "except a MatMul with an 8-bit weight (QNT029)"))
        auto = [e for e in excluded if e["reason"] != "--exclude-node"]
        if auto and evaluation is not None:
            judged = " and ".join(evaluation.judged_on)
            report.add(Finding.of("QNT006", f"--auto-exclude kept {len(auto)} node(s) in float ("
                                  + ", ".join(e["name"] for e in auto[:12]) + ("..." if len(auto) > 12 else "")
                                  + f"): lowest cosine {fmt_cosine(evaluation.gate_cosine)} (judged on {judged})",
                                  fix="see excluded_nodes and search"))
        if outcome.off_ep and target is not None:
            first = outcome.off_ep[0]
            report.add(Finding.of(
                "QNT022", f"{len(outcome.off_ep)} node(s) kept off {target.ep}, in If nodes that ORT runs on the CPU EP ("
                + ", ".join(e["name"] for e in outcome.off_ep[:8]) + ("..." if len(outcome.off_ep) > 8 else "")
                + f"): {first['reason']}", ep=target.ep,
                fix=f"nothing to do: the application creates its {target.ep} session as before; "
                    f"ortprep load MODEL --ep {target.ep} shows what runs where"))
        seeded = any(f.code == "QNT011" for f in report.findings) or (
            plan.eval_set is not None and plan.eval_set.kind == "random")  # --calib random, held back
        decided = [o for o in (evaluation.outputs if evaluation is not None else []) if (o.get("decision") or {}).get("gated")]
        if seeded and decided and evaluation is not None and evaluation.passed:
            # a decision (a class, a CTC string, a mask) on seeded noise says nothing of the application's
            # inputs: measured in bench/apps, a captcha OCR's dynamic int8 passed on seeded inputs at cosine
            # 0.9992 and changed 17% of the strings the application reads
            kinds = ", ".join(f"'{o['name']}' ({o['decision']['kind']})" for o in decided[:4])
            report.add(Finding.of("QNT019", f"the outputs {kinds} carry decisions the application reads, and the verdict "
                                  "rests on seeded random inputs, where those decisions mean nothing: not written",
                                  fix="pass a few real samples: --eval DATA (a folder of .npz, one per input set); "
                                      "--keep-failed keeps this result as NAME.failed.onnx; --metric OUTPUT=cosine if "
                                      "no application reads a decision from it"))
        if evaluation is not None and evaluation.passed:
            measure_on_target(evaluation, target, Path(float_path), result_path, eval_feeds)
        slower = latency_finding(evaluation)
        if slower is not None:
            report.add(slower)
        fewer = limited_finding(evaluation)
        if fewer is not None:
            report.add(fewer)
        if target.clock is not None and target.clock.refused:
            clock = target.clock
            report.add(Finding.of(
                "QNT023", f"the step's time on {target.ep} ({clock.total:g} s, --ep-total-seconds) was spent after "
                f"{clock.runs} judgement(s) there; {clock.refused} later one(s) did not run, and a trial not judged on "
                f"{target.ep} cannot pass the gate", ep=target.ep,
                fix=f"a larger --ep-total-seconds, or fewer judgements: --ep-seconds (each one's bound), fewer "
                    f"samples (--samples), or --gate-on-cpu to judge on the CPU EP only"))
        size_after = model_bytes(result_path)
        if size_after >= size_before:
            if settings["preset"] != "cpu" and options.mode == "static":
                # For an accelerator (an NPU above all) the point of a QDQ model is that the EP runs its ops in
                # integer; on a small model the Q/DQ pairs and scales outweigh the int8 weights, and that is fine.
                report.add(Finding.of("QNT003", f"the quantized model is not smaller ({size_after} bytes vs {size_before}): "
                                      f"kept, since for a static QDQ model for --ep {settings['preset']} the aim is integer ops on "
                                      "the EP, not size",
                                      severity=Severity.INFO, fix="nothing to do"))
            else:
                report.add(Finding.of("QNT003", f"the quantized model is not smaller ({size_after} bytes vs {size_before})",
                                      fix=not_smaller_fix(onnx.load(str(dict(sources)[outcome.source]),
                                                                    load_external_data=False), quantized, len(excluded))))
        # A refusal (the gate, nothing quantized, not smaller) writes nothing at -o; --keep-failed
        # writes the refused model beside it, under a name of its own (NAME.failed.onnx).
        failed = any(f.severity >= Severity.ERROR for f in report.findings)
        written = kept_failed = None
        if not failed:
            written = ModelHandle(proto=quantized, path=None).save(dest, force=force, external_data=True if big else None)
            report.artifacts.append(str(written))
        elif options.keep_failed:
            kept_failed = ModelHandle(proto=quantized, path=None).save(failed_path(dest), force=force,
                                                                        external_data=True if big else None)
            report.artifacts.append(str(kept_failed))
        if written or kept_failed:
            size_after = model_bytes(written or kept_failed)
    report.data.update({
        "output": str(written) if written else None,
        "kept_failed": str(kept_failed) if kept_failed else None,
        "size_after": size_after,
        "size_ratio": round(size_after / size_before, 4) if size_before else None,
        "verify": ({**evaluation.to_record(), "trials": outcome.judged} if evaluation else report.data["verify"]),
        "quantized_ops": stats["quantized_ops"],
        "quantized_weights": stats["quantized_weights"],
        "quantized_weight_share": stats["quantized_weight_share"],
        "wide_activations": outcome.wide,
        "excluded_nodes": excluded,
        "kept_off_ep": outcome.off_ep,
        "search": outcome.search,
    })
    report.output = written
    return report


def _writers_text(quantized: ModelProto, evaluation: Evaluation, target: GateTarget) -> str:
    """What writes the outputs the EP alone gets wrong: the quantized nodes to keep float, and the
    float nodes on the way, which an EP that computes float in float16 computes there."""
    wrong = evaluation.on_ep.wrong_outputs()
    ops = {node.name: node.op_type for node in quantized.graph.node}
    quantized_nodes, float_nodes = output_writers(quantized, wrong)
    parts = []
    if quantized_nodes:
        parts.append("the quantized nodes that write the outputs it gets wrong: "
                     + ", ".join(f"{n} ({ops.get(n, '?')})" for n in quantized_nodes[:6]))
    if float_nodes and target.ep in FLOAT16_COMPUTE:
        parts.append("float nodes on the way, which " + target.ep + " computes in float16 (its range ends at 65504, its "
                     "precision at 11 bits): " + ", ".join(f"{n} ({ops.get(n, '?')})" for n in float_nodes[:6]))
    return "; ".join(parts)


class QuantizeStep(Step):
    """The "quantize" step: :func:`quantize_model` on the pipeline's model."""

    name = "quantize"
    Options = QuantizeOptions
    memory_factor = 2.0
    refuses_ep_context = True
    reports_progress = True
    needs_ort = "always"
    default_suffix = ".int8.onnx"

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        if self.options.auto:
            from ortprep.steps.quantize.auto import quantize_auto

            return quantize_auto(model, output_path(self, model, ctx), self.options, force=ctx.force, progress=ctx.progress)
        return quantize_model(model, output_path(self, model, ctx), self.options, force=ctx.force, progress=ctx.progress)


# int8 weights save 3 bytes per float32 element, while every quantized tensor (activations
# included) adds a scale, a zero point and a Q/DQ pair with their names: on a model with fewer
# float weight bytes than this, that overhead is the reason QNT003 names (a rule of thumb, not a
# bound: the journey's conv1d_audio, 3.2 KB of weights, grew from 4,137 to 6,020 bytes)
SMALL_WEIGHTS = 64 * 1024


def not_smaller_fix(float_proto: onnx.ModelProto, quantized: onnx.ModelProto, kept_float: int) -> str:
    """QNT003's fix: why the quantized file is not smaller, from the weights alone (their dims,
    no data read), and what to do instead. ``float_proto``: the model that was quantized (ORT's
    pre-processing renames the weights it fuses, so not the file as given); ``kept_float``: how
    many nodes were kept float."""
    sizes = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.DOUBLE: 8}

    def float_weights(proto: onnx.ModelProto) -> dict[str, int]:
        return {t.name: int(np.prod(t.dims)) * sizes[t.data_type] for _, g in iter_graphs(proto.graph)
                for t in g.initializer if t.data_type in sizes}

    before, after = float_weights(float_proto), float_weights(quantized)
    total = sum(before.values())
    if total < SMALL_WEIGHTS:
        return (f"the model holds only {total:,} bytes of float weights: the scales, zero points and Q/DQ nodes cost "
                "more than int8 saves on them. Keep the float model; `ortprep convert MODEL --fp16` halves the weights "
                "where the EP takes FP16")
    by_op: dict[str, int] = {}
    for _, graph in iter_graphs(quantized.graph):
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                if name in after and name in before:
                    by_op[node.op_type] = by_op.get(node.op_type, 0) + after.pop(name)
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1])
    where = ", ".join(f"{op} {size / total:.0%}" for i, (op, size) in enumerate(ranked[:3]) if i == 0 or size >= total / 100)
    kept = f"; {kept_float} node(s) were kept float" if kept_float else ""
    stayed = sum(by_op.values())
    return (f"{stayed / total:.0%} of the float weights stayed float (read by {where or 'no node'}){kept}: "
            "int8 pays where the weights of the ops it quantizes dominate; else keep the float model")
