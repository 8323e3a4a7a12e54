"""One quantize attempt (``quantize`` without ``--auto``): :func:`quantize_model`.

The orchestration alone: the settings (:mod:`.presets`), the refusals and the prepared graph
(:mod:`.prepare`), the data (:mod:`.calibrate`), the trials and the search (:mod:`.outcome`), the
findings (:mod:`.findings`) and the record (:mod:`.record`); the result is written only when no
finding at error level stands (``--keep-failed`` writes it beside, as NAME.failed.onnx).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from ortprep.errors import EnvironmentMissingError, UsageError
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, failed_path
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.runtime.budget import EpClock
from ortprep.fidelity.graph import output_bounds
from ortprep.steps.base import ProgressCallback
from ortprep.steps.quantize.calibrate import evaluation_data, evaluation_feeds, made_up_refusal, plan_data
from ortprep.steps.quantize.engines import Exclusion, engine
from ortprep.steps.quantize.ep_gate import gate_target
from ortprep.steps.quantize.evaluate import measure_on_target
from ortprep.steps.quantize.findings import Attempt, cost_findings, quality_findings
from ortprep.steps.quantize.mend import mend_finding
from ortprep.steps.quantize.outcome import quantize_and_search, settings_after
from ortprep.steps.quantize.prepare import prepare, refused
from ortprep.steps.quantize.presets import resolve_settings
from ortprep.steps.quantize.record import SCHEMA, base_record
from ortprep.transforms.qdq.encodings import OUTPUT_HEADROOM_16
from ortprep.transforms.qdq.facts import quantization_stats
from ortprep.transforms.verify import model_bytes


def refuse_engine(options: QuantizeOptions, settings: dict) -> None:
    """The engine named with --engine (not auto) cannot run here (exit code 3, environment), or cannot
    write what the settings ask (exit code 2, usage): one line, nothing written."""
    name = options.engine_name()
    if name == "auto":
        return
    hint = "or --engine auto, which tries each engine that can"
    missing = engine(name).available()
    if missing is not None:
        raise EnvironmentMissingError(f"--engine {name}: {missing}", hint=hint)
    why = engine_refusal(name, options.mode, settings)
    if why is not None:
        raise UsageError(f"--engine {name}: {why}", hint=hint)


def engine_refusal(name: str, mode: str, settings: dict) -> str | None:
    """Why engine ``name`` cannot quantize with ``settings`` here (not installed, not supported), or None."""
    chosen = engine(name)
    return chosen.available() or chosen.supports(mode, settings, Exclusion())


def quantize_model(handle: ModelHandle, dest: Path, options: QuantizeOptions, *, force: bool = False,
                   progress: ProgressCallback | None = None, clock: EpClock | None = None,
                   spare_failing_baseline: bool = False, earlier: tuple[int, int] = (0, 0)) -> StepResult:
    """Quantize ``handle``'s model and write ``dest`` when the accuracy gate passes.
    ``progress(stage, done, total)`` is called during calibration and evaluation. ``earlier``:
    (failed, judged) trials of --auto's earlier attempts (runner.Trials)."""
    settings = resolve_settings(options)
    refuse_engine(options, settings)  # --engine nncf with 16-bit activations stops here, before any work
    report = StepResult(step="quantize", schema=SCHEMA)
    size_before = model_bytes(handle.path)
    if refused(handle, options, report):
        report.data = base_record(handle, options, settings, size_before)
        return report
    plan = plan_data(handle, options, settings, report)
    if made_up_refusal(plan, options, report):  # judged on made-up inputs, unasked: QNT033, nothing written
        report.data = base_record(handle, options, settings, size_before)
        return report
    target = gate_target(options, report, clock)  # before any work: --gate-on-ep without the EP stops here
    calibration, calib_indices = plan.calibration, plan.calib_indices
    handle.load_weights()
    eval_feeds, eval_source = evaluation_feeds(handle, plan, options, report)
    bounds = output_bounds(handle.proto)
    with tempfile.TemporaryDirectory(prefix="ortprep-quantize-") as tmp:
        workdir = Path(tmp)
        prepared = prepare(handle, options, settings, eval_feeds, workdir, report)
        sources, settings = prepared.sources, prepared.settings
        float_path = prepared.float_path
        outcome = quantize_and_search(workdir, sources, options, settings, plan, eval_feeds, prepared.big, bounds,
                                      progress, report, prepared.sentinels, target, spare_failing_baseline, earlier)
        settings = settings_after(settings, outcome, options)
        preprocess_detail = prepared.preprocess_detail
        if outcome.source == "as given" and options.preprocess and len(sources) > 1:
            preprocess_detail += "; not used: quantizing without it evaluated better"
        report.data = base_record(handle, options, settings, size_before)
        report.data.update({"preprocess": preprocess_detail, "evaluation_samples": len(eval_feeds),
                            "output_headroom": {"factor": OUTPUT_HEADROOM_16, "outputs": outcome.widened,
                                                "activations": outcome.widened_activations},
                            "raised_weight_scales": outcome.floored,
                            "reader_ranges": {"activations": len(outcome.cut), "tensors": outcome.cut[:64]},
                            "fp16_matmuls": outcome.fp16_matmuls,
                            "folded_biases": prepared.folded,
                            "folded_batch_norms": prepared.folded_norms,
                            "gate_target": target.record(),
                            "evaluation_inputs": eval_source,
                            "evaluation_data": evaluation_data(plan, options),
                            "calibration": {"samples": len(calib_indices),
                                            "source": calibration.source if calibration else None,
                                            "kind": calibration.kind if calibration else None}})
        report.data["engine"] = {"asked": options.engine_name(), "used": outcome.engine,
                                 "candidates": outcome.engines, "best": outcome.engine_best}
        report.data["timing"] = {"engine_seconds": round(outcome.engine_seconds, 3)}
        if outcome.trial is None:
            quantizer = "ONNX Runtime's quantizer" if outcome.engine == "ort" else f"the {outcome.engine} engine"
            report.add(Finding.of("QNT008", f"{quantizer} failed on this model: {outcome.failure}",
                                  fix="--exclude-op / --exclude-node for the op it names, --no-preprocess, or check "
                                      "the "
                                  "model first: ortprep check MODEL --ep cpu"))
            return report
        result_path = outcome.trial.path
        evaluation, excluded = outcome.evaluation, outcome.excluded
        quantized = onnx.load(str(result_path))
        stats = quantization_stats(quantized)
        attempt = Attempt(options, settings, plan, target, outcome, quantized, Path(float_path), eval_feeds, workdir,
                          sources, diagnose=not spare_failing_baseline)
        quality_findings(report, attempt, stats)
        mended = mend_finding((outcome.search or {}).get("mend"), evaluation.on_ep.placement
                              if evaluation is not None and evaluation.on_ep is not None else None)
        if mended is not None:  # a session the EP could not build, mended or named (mend.py)
            report.add(mended)
        if evaluation is not None and evaluation.passed:
            measure_on_target(evaluation, target, Path(float_path), result_path, eval_feeds)
        cost_findings(report, attempt, size_before)
        size_after = model_bytes(result_path)
        # A refusal (the gate, nothing quantized, not smaller) writes nothing at -o; --keep-failed
        # writes the refused model beside it, under a name of its own (NAME.failed.onnx).
        failed = any(f.severity >= Severity.ERROR for f in report.findings)
        written = kept_failed = None
        external = True if prepared.big else None
        if not failed:
            written = ModelHandle(proto=quantized, path=None).save(dest, force=force, external_data=external)
            report.artifacts.append(str(written))
        elif options.keep_failed:
            kept_failed = ModelHandle(proto=quantized, path=None).save(failed_path(dest), force=force,
                                                                        external_data=external)
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
