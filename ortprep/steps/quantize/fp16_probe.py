"""FP16 held to quantize's own gate, where ``--auto`` found no quantized precision that passes.

A refusal that only says "try FP16" leaves the user to find out whether FP16 would do: this
measures it. The model is converted as ``ortprep convert MODEL --fp16`` converts it (verified,
mixed precision where needed, on seeded inputs; for an EP, the ops it has no FP16 kernel for stay
FP32), and the result is judged by the gate the quantized attempts failed: the same held-back samples, the same
decisions and their expected agreement on unseen inputs, the same margin as --auto's later
attempts. It is judged on the CPU EP (where ORT has no FP16 kernel for an op it computes it in
float32 through casts, so there this is mostly the FP16 weights' error) and, like the attempts, on
the target EP where it runs here (QNN's HTP simulator computes a float model in FP16); nothing is
written at the output.

When FP16 fails too, on a decision, the float model's decisions on these samples sit closer to
their boundaries than even FP16's rounding moves them: no reduced precision keeps them, and the
report says so instead of sending the user on to another precision.
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
from pathlib import Path
from typing import Any

import onnx

from ortprep.errors import OrtprepError
from ortprep.findings import Severity
from ortprep.model import ModelHandle
from ortprep.options import ConvertOptions, QuantizeOptions
from ortprep.report import StepResult
from ortprep.runtime.budget import step_spent, timed
from ortprep.steps.base import ProgressCallback
from ortprep.fidelity.graph import output_bounds
from ortprep.steps.quantize import fp16_off_ep
from ortprep.steps.quantize.calibrate import evaluation_feeds, plan_data
from ortprep.steps.quantize.ep_gate import gate_target
from ortprep.steps.quantize.evaluate import evaluate
from ortprep.steps.quantize.findings import SMALL_WEIGHTS, float_weight_bytes
from ortprep.fidelity.words import failing_words, fmt_cosine
from ortprep.steps.quantize.presets import resolve_settings
from ortprep.steps.quantize.runner import margin_samples
from ortprep.steps.quantize.trials import margin_aim
from ortprep.transforms.conversion import convert_model
from ortprep.transforms.verify import model_bytes


# convert's refusal where its verification fails (transforms/common.py)
VERIFICATION_FAILED = "CNV006"
# FP16 is not measured for a model above this size (its conversion and runs would add minutes to a
# refusal); QNT017 then names the command that measures it.
PROBE_MAX_BYTES = 1 << 30
# The seconds of the step's own bound (--step-seconds) --auto's attempts leave to this probe where it
# judges on a target EP: its judgement there is bound by --ep-seconds, and by this where that is larger
PROBE_HOLD = 150.0


def probe_hold(options: QuantizeOptions) -> float:
    """What --auto's attempts keep back of the step's own bound for this probe (budget.hold_step)."""
    on_target = options.ep not in (None, "cpu") and options.verify and options.on_ep is not False
    return min(options.ep_seconds, PROBE_HOLD) if on_target else 0.0


def measure_fp16(handle: ModelHandle, options: QuantizeOptions, progress: ProgressCallback | None = None
                 ) -> dict[str, Any] | None:
    """FP16's verdict by quantize's gate (see the module's docstring); None when there is nothing
    to judge it on (no model file, --no-verify, data that cannot be read). A probe is advisory:
    whatever goes wrong in it is its record's ``reason``, never the step's failure."""
    if handle.path is None or not options.verify:
        return None
    with timed("fp16_probe"):
        return _probe(handle, options, progress)


def _probe(handle: ModelHandle, options: QuantizeOptions, progress: ProgressCallback | None) -> dict[str, Any] | None:
    source = Path(handle.path)
    scratch = StepResult(step="quantize", schema="scratch")  # the data's findings are the attempts' already
    # calibration data splits as for a static attempt (a fifth held back, the rest's margins)
    static = dataclasses.replace(options,
                                 mode="static") if options.mode != "static" and options.calib not in (None, "random") \
        else options
    settings = resolve_settings(static)
    ep = options.ep if options.ep not in (None, "cpu") else None
    target_file = source.with_name(f"{source.stem}.fp16.onnx")
    metrics = dict(options.metrics or {})
    command = " ".join(["ortprep", "convert", shlex.quote(str(source)), "--fp16", *(["--ep", ep] if ep else []),
                        *(part for name, kind in metrics.items()
                          for part in ("--metric", shlex.quote(f"{name}={kind}"))),
                        "--keep-io-types", "-o", shlex.quote(str(target_file))])
    # where quantize refuses a result for not being smaller (the CPU preset, dynamic and weight-only
    # modes, a model with enough float weights for int8 to shrink it), FP16 is held to that too
    needs_smaller = ((settings["preset"] == "cpu" or options.mode != "static")
                     and float_weight_bytes(onnx.load(str(source), load_external_data=False)) >= SMALL_WEIGHTS)
    if step_spent("FP16's probe"):
        return {"passed": False, "command": command, "converted": False, "measured": False,
                "reason": "not measured: the step's own time (--step-seconds) was spent; the command converts and "
                          "verifies it"}
    if model_bytes(source) > PROBE_MAX_BYTES:
        return {"passed": False, "command": command, "converted": False, "measured": False,
                "reason": f"not measured: the model is over {PROBE_MAX_BYTES >> 30} GiB; the command converts and "
                          "verifies it"}
    try:
        plan = plan_data(handle, static, settings, scratch)
        if plan.eval_set is None or plan.eval_set.kind == "random":
            # seeded noise says nothing of the application's decisions (QNT019): no verdict on it,
            # and no seeded inputs made for it
            return {"passed": False, "command": command, "converted": False, "measured": False,
                    "reason": "not measured: there are no real samples to judge it on (--calib DATA or --eval DATA)"}
        feeds, _ = evaluation_feeds(handle, plan, static, scratch)
        target = gate_target(static, scratch)  # the EP the attempts were judged on, where it runs here
        target.precision, target.candidate = "", "FP16 probe"
    except OrtprepError:
        return None
    if not feeds:
        return None
    # a real sample for the conversion's own verification, where seeded inputs verify nothing (a
    # detector's map is flat on noise): the first held-back sample's own file
    sample_file = None
    if plan.eval_set.kind == "npz-files" and plan.eval_indices:
        sample_file = Path(plan.eval_set.files[plan.eval_indices[0]])
    try:
        return _measure(source, handle, options, feeds, margin_samples(plan), target, ep, metrics, command,
                        needs_smaller,
                        progress, sample_file)
    except Exception as error:  # noqa: BLE001 - advisory: its failure is reported, the refusal stands
        return {"passed": False, "command": command, "converted": False, "measured": False,
                "reason": f"not measured: {' '.join(str(error).split())[:300] or type(error).__name__}"}


def _measure(source: Path, handle: ModelHandle, options: QuantizeOptions, feeds: list, margins: list, target,
             ep: str | None,
             metrics: dict[str, str], command: str, needs_smaller: bool, progress: ProgressCallback | None,
             sample_file: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ortprep-fp16-probe-") as tmp:
        converted = Path(tmp) / "fp16.onnx"
        if progress is not None:
            progress("FP16", 0, 2)
        try:
            # as the printed command converts it (float32 inputs and outputs, as the gate feeds them),
            # on one of the user's own samples where there is one: the nodes kept in FP32 are chosen
            # from the activations the conversion's inputs reach, and seeded inputs reach neither a
            # real input's range (openwakeword's mel front end: NaN on audio after a conversion
            # verified on random [0, 1) samples) nor, for a detector, anything (every output flat).
            # The gate below judges the result on every real sample.
            if sample_file is not None:
                command = command.replace(" --keep-io-types ",
                                          f" --keep-io-types --inputs {shlex.quote(str(sample_file))} ")
            result = _convert(source, converted, ConvertOptions(fp16=True, ep=ep, metrics=metrics, keep_io_types=True,
                                                                inputs=sample_file))
            if result.output is None and sample_file is not None and any(f.code == VERIFICATION_FAILED
                                                                         for f in result.findings):
                # convert refuses FP16 on that sample: the conversion it verifies on its own inputs is
                # judged by the gate on every sample, which says what fails (a decision at a near
                # tie, an output), and the printed command is the one that writes what was judged
                result = _convert(source, converted,
                                  ConvertOptions(fp16=True, ep=ep, metrics=metrics, keep_io_types=True))
                command = command.replace(f" --inputs {shlex.quote(str(sample_file))} ", " ")
        except OrtprepError as error:
            return {"passed": False, "command": command, "converted": False, "measured": True, "reason": str(error)}
        if result.output is None:
            errors = [f.message for f in result.findings if f.severity >= Severity.ERROR]
            return {"passed": False, "command": command, "converted": False, "measured": True,
                    "reason": errors[0] if errors else "convert --fp16 wrote nothing"}
        if progress is not None:
            progress("FP16", 1, 2)
        aim = margin_aim(options.min_cosine)

        def judge(path: Path):
            # a conversion the CPU EP already fails is not run on the target EP (it cannot pass there)
            judged = evaluate(source, path, feeds, options.min_cosine, {}, output_bounds(handle.proto), target,
                              metrics, lambda: margins, ep_after_cpu_fails=False, confirm_feeds=lambda: margins,
                              early_misses=True)
            return judged, held_to_aim(judged, aim)

        evaluation, why = judge(converted)
        kept_off: dict[str, Any] | None = None
        if not evaluation.passed and evaluation.ep_only and options.auto_exclude:
            # the EP alone computes FP16 otherwise: one op's nodes kept off it (fp16_off_ep.py)
            used = sample_file if sample_file is not None and " --inputs " in command else None
            base = ConvertOptions(fp16=True, ep=ep, metrics=metrics, keep_io_types=True, inputs=used)
            mended, names, tried, written = fp16_off_ep.mend(
                source, Path(tmp), base, lambda src, dest, opts: _convert(src, dest, opts).output,
                lambda path: judge(path)[0])
            kept_off = {"op": tried[-1]["op"] if mended is not None else None, "nodes": names[:64],
                        "count": len(names), "tried": tried}
            if mended is not None and written is not None:
                evaluation, why, converted = mended, None, written
                command = fp16_off_ep.keep_off_command(command, names)
        if progress is not None:
            progress("FP16", 2, 2)
        refused = target.clock is not None and target.clock.stopped_by is not None
        if refused and evaluation.on_ep is not None and evaluation.on_ep.error is not None:
            # its judgement on the EP did not run (the step's time): no verdict on FP16 there
            return {"passed": False, "command": command, "converted": True, "measured": False,
                    "reason": f"not measured on {target.ep}: {evaluation.on_ep.error}"}
        decided = [o["decision"] for o in evaluation.outputs if (o.get("decision") or {}).get("gated")]
        size_ratio = round(model_bytes(converted) / max(1, model_bytes(source)), 4)
        smaller = size_ratio < 1.0 or not needs_smaller
        return {"passed": bool(evaluation.passed) and smaller, "command": command, "converted": True, "measured": True,
                "gate_passed": bool(evaluation.passed), "smaller": size_ratio < 1.0, "cosine": evaluation.gate_cosine,
                "min_cosine": aim, "size_ratio": size_ratio, "latency_ratio": evaluation.latency_ratio,
                "judged_on": evaluation.judged_on, "ep_only": evaluation.ep_only,
                "ep_error": evaluation.on_ep is not None and evaluation.on_ep.error is not None,
                # where the target EP judged: how much of the FP16 model it took (the rest ran on the CPU EP)
                "placement": evaluation.on_ep.placement if evaluation.on_ep is not None else None,
                "decision_failed": any(d.get("passed") is False for d in decided),
                "decisions": [{k: d.get(k) for k in ("kind", "agreement", "expected_agreement", "required", "passed")}
                              for d in decided], "error": evaluation.error, "kept_off_ep": kept_off,
                "why": why or failing_words(evaluation, options.min_cosine)}


def held_to_aim(evaluation, aim: float) -> str | None:
    """FP16 named after the quantized attempts failed on the same held-back samples is held to the
    cosine aim of --auto's later attempts (``aim``, half-way from --min-cosine to 1) on an output no
    gated decision reads, on every side judged (the calibration samples' too). An output a gated
    decision reads is held to its decision, as every attempt's, and to --min-cosine: a cosine aim
    on top of a decision that holds is a threshold the application never named
    (docs/decisions/gate-fp16-probe-margin.md). Marks the sides that fall short (``failed_on``,
    ``ep_only`` read them) and ``evaluation.passed``; returns what fell short first, or None."""
    if not evaluation.passed:
        return None

    def short(outputs) -> dict | None:
        for output in outputs:
            decided = (output.get("decision") or {}).get("passed") is not None
            cosine = output.get("cosine")
            if not decided and output.get("judged_by") == "cosine" and cosine is not None and cosine < aim:
                return output
        return None

    def words(where: str, output: dict) -> str:
        return (f"{where}: cosine {fmt_cosine(output['cosine'])} on output '{output['name']}', which no decision "
                f"reads (the gate asks {aim:g} of a precision named after others failed)")

    said: list[str] = []
    cpu_miss = short(evaluation.outputs)
    if cpu_miss is not None:
        said.append(words("on the CPU EP", cpu_miss))
    if evaluation.on_ep is not None and (miss := short(evaluation.on_ep.outputs)) is not None:
        evaluation.on_ep.passed = False
        said.append(words(f"on {evaluation.on_ep.ep}", miss))
    confirmation = evaluation.confirmation
    for side in (confirmation.cpu, confirmation.on_ep) if confirmation is not None else ():
        if side is not None and (miss := short(side.outputs)) is not None:
            side.passed = False
            where = "the CPU EP" if side.ep == "cpu" else side.ep
            said.append(words(f"with the samples it was calibrated on, on {where}", miss))
    if not said:
        return None
    evaluation.cpu_passed = cpu_miss is None
    evaluation.passed = False
    return said[0]


def _convert(source: Path, dest: Path, options: ConvertOptions) -> StepResult:
    """``ortprep convert SOURCE --fp16 ...`` to ``dest``: what the convert step runs."""
    return convert_model(ModelHandle.open(source), dest, options, force=True)


def fp16_words(probe: dict[str, Any]) -> tuple[str, str]:
    """(what the report says of FP16, the fix) for a probe's record."""
    sides = " and ".join(probe.get("judged_on") or ["cpu"])
    if probe["passed"]:
        decisions = "; ".join(f"{d['kind']} {d['agreement']:.1%}, about {d['expected_agreement']:.1%} expected on "
                              "unseen inputs"
                              for d in probe["decisions"] if d.get("agreement") is not None
                              and d.get("expected_agreement") is not None)
        placed = probe.get("placement") or {}
        off = probe.get("kept_off_ep") or {}
        parts = [f"lowest cosine {fmt_cosine(probe['cosine'])}", decisions, f"{probe['size_ratio']:.2f}x the size",
                 f"with its {off['count']} {off['op']} node(s) kept off {probe['judged_on'][-1]} (the EP computes them "
                 "otherwise: the FP16 file alone failed there)" if off.get("op") else "",
                 f"{placed['nodes_on_ep']} of {placed['nodes_total']} nodes on {probe['judged_on'][-1]}"
                 if placed.get("nodes_total") and len(probe.get("judged_on") or []) > 1 else "",
                 f"{probe['latency_ratio']:.2f}x the float model's time on the CPU EP here"
                 if probe.get("latency_ratio") else ""]
        said = f"FP16 passes the same gate on {sides}: " + "; ".join(part for part in parts if part)
        return said, (f"{probe['command']} writes it (the gate above judged that conversion on these samples); FP16 "
                      "pays where the EP has FP16 kernels (GPU, NPU)")
    if not probe.get("measured", True):
        return f"FP16 was {probe['reason']}", f"{probe['command']}, or keep the float model"
    if not probe.get("converted"):
        # convert refused its own result (its verification failed, or it could not convert)
        return (f"FP16 is refused by convert itself ({probe['command'].split(' -o ')[0]}): {probe.get('reason')}",
                "keep the float model: neither int8 nor FP16 keeps what it computes")
    if probe.get("error"):
        return f"FP16 could not be judged: {probe['error']}", f"{probe['command']} converts and verifies it on its own"
    if probe.get("gate_passed") and not probe.get("smaller"):
        return (f"FP16 passes the gate on {sides} but is not smaller either ({probe['size_ratio']:.2f}x the size)",
                "keep the float model: neither int8 nor FP16 makes this model smaller")
    if probe["decision_failed"]:
        return (f"FP16 fails it too on {sides}, on a decision: the float model's decisions on these samples sit closer "
                "to their boundaries than even FP16's rounding moves them, so no reduced precision keeps them"), (
                "keep the float model; or judge on samples more like the application's (--calib DATA), "
                "or --metric OUTPUT=cosine where no application reads that decision")
    why = probe.get("why") or f"lowest cosine {fmt_cosine(probe.get('cosine'))}"
    return (f"FP16 fails it too (judged on {sides}): {why}",
            "keep the float model; ortprep convert MODEL --fp16 --block-op OP keeps the ops that lose precision "
            "in FP32")
