"""FP16 held to quantize's own gate, where ``--auto`` found no quantized precision that passes.

A refusal that only says "try FP16" leaves the user to find out whether FP16 would do: this
measures it. The model is converted as ``ortprep convert MODEL --fp16`` converts it (verified,
mixed precision where needed, on seeded inputs; for an EP, the ops it has no FP16 kernel for stay
FP32), and the result is judged by the gate the quantized attempts failed: the same held-back samples, the same
decisions and their expected agreement on unseen inputs, the same margin as --auto's later
attempts. It is judged on the CPU EP (where ORT has no FP16 kernel for an op it computes it in
float32 through casts, so this is mostly the FP16 weights' error); nothing is written at the output.

When FP16 fails too, on a decision, the float model's decisions on these samples sit closer to
their boundaries than even FP16's rounding moves them: no reduced precision keeps them, and the
report says so instead of sending the user on to another precision.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError
from ortprep.findings import Severity
from ortprep.model import ModelHandle
from ortprep.options import ConvertOptions, QuantizeOptions
from ortprep.report import StepResult
from ortprep.runtime.compare import output_bounds
from ortprep.steps.quantize.calibrate import evaluation_feeds, plan_data
from ortprep.steps.quantize.evaluate import evaluate, fmt_cosine
from ortprep.steps.quantize.presets import resolve_settings
from ortprep.steps.quantize.search import margin_aim, margin_samples
from ortprep.transforms.verify import model_bytes


def measure_fp16(handle: ModelHandle, options: QuantizeOptions) -> dict[str, Any] | None:
    """FP16's verdict by quantize's gate (see the module's docstring); None when there is nothing
    to judge it on (no model file, no held-back samples) or the data cannot be read."""
    if handle.path is None or not options.verify:
        return None
    source = Path(handle.path)
    scratch = StepResult(step="quantize", schema="scratch")  # the data's findings are the attempts' already
    static = dataclasses.replace(options, mode="static") if options.mode == "dynamic" and options.calib not in (None, "random") \
        else options
    try:
        plan = plan_data(handle, static, resolve_settings(static), scratch)
        feeds, _ = evaluation_feeds(handle, plan, static, scratch)
    except OrtprepError:
        return None
    if not feeds:
        return None
    margins = margin_samples(plan)
    ep = options.ep if options.ep not in (None, "cpu") else None
    command = f"ortprep convert {source.name} --fp16" + (f" --ep {ep}" if ep else "") + f" -o {source.stem}.fp16.onnx"
    with tempfile.TemporaryDirectory(prefix="ortprep-fp16-probe-") as tmp:
        folder = Path(tmp)
        converted = folder / "fp16.onnx"
        try:
            # as the printed command converts it (its own verification on seeded inputs); the gate
            # below judges it on the real samples
            result = _convert(source, converted, ConvertOptions(fp16=True, ep=ep, metrics=options.metrics))
        except OrtprepError as error:
            return {"passed": False, "command": command, "converted": False, "reason": str(error)}
        if result.output is None:
            errors = [f.message for f in result.findings if f.severity >= Severity.ERROR]
            return {"passed": False, "command": command, "converted": False,
                    "reason": errors[0] if errors else "convert --fp16 wrote nothing"}
        evaluation = evaluate(source, converted, feeds, margin_aim(options.min_cosine), {}, output_bounds(handle.proto), None,
                              options.metrics, lambda: margins, confirm_feeds=lambda: margins)
        decided = [o["decision"] for o in evaluation.outputs if (o.get("decision") or {}).get("gated")]
        return {"passed": bool(evaluation.passed), "command": command, "converted": True,
                "cosine": evaluation.gate_cosine, "min_cosine": margin_aim(options.min_cosine),
                "size_ratio": round(model_bytes(converted) / max(1, model_bytes(source)), 4),
                "latency_ratio": evaluation.latency_ratio, "judged_on": "cpu",
                "decision_failed": any(d.get("passed") is False for d in decided),
                "decisions": [{k: d.get(k) for k in ("kind", "agreement", "expected_agreement", "required", "passed")}
                              for d in decided], "error": evaluation.error}


def _convert(source: Path, dest: Path, options: ConvertOptions) -> StepResult:
    from ortprep.steps.convert import convert_model

    return convert_model(ModelHandle.open(source), dest, options, force=True)


def fp16_words(probe: dict[str, Any]) -> tuple[str, str]:
    """(what the report says of FP16, the fix) for a probe's record."""
    if probe["passed"]:
        decided = probe["decisions"]
        decisions = "; ".join(f"{d['kind']} {d['agreement']:.1%}, about {d['expected_agreement']:.1%} expected on unseen inputs"
                              for d in decided if d.get("agreement") is not None and d.get("expected_agreement") is not None)
        timed = probe.get("latency_ratio")
        said = (f"FP16 passes the same gate (lowest cosine {fmt_cosine(probe['cosine'])}"
                + (f"; {decisions}" if decisions else "") + f"; {probe['size_ratio']:.2f}x the size"
                + (f"; {timed:.2f}x the float model's time on the CPU EP here" if timed is not None else "") + ")")
        return said, (f"{probe['command']} writes it (the gate above judged that conversion on these samples); FP16 "
                      "pays where the EP has FP16 kernels (GPU, NPU)")
    if not probe.get("converted"):
        return f"FP16 could not be made: {probe.get('reason')}", "keep the float model"
    if probe["decision_failed"]:
        return ("FP16 fails it too, on a decision: the float model's decisions on these samples sit closer to their "
                "boundaries than even FP16's rounding moves them, so no reduced precision keeps them"), (
                "keep the float model; or judge on samples more like the application's (--calib DATA), "
                "or --metric OUTPUT=cosine where no application reads that decision")
    return (f"FP16 fails it too (lowest cosine {fmt_cosine(probe.get('cosine'))})",
            "keep the float model; ortprep convert MODEL --fp16 --block-op OP keeps the ops that lose precision in FP32")
