"""``quantize --auto``: when the precision asked for fails the gate, try the others in a stated
order and keep the first that passes, so a refusal comes with the path that works. With
--auto-exclude, --search-seconds bounds the searches of all the attempts together (each later one
gets the time the earlier ones left; with none left, a later precision runs without a search).
--ep-total-seconds bounds the target EP's judgements over all the attempts alike; the baseline of
an attempt that fails on the CPU EP while later ones remain is not judged on the target EP (it
cannot pass); its search's trials are, once one passes on the CPU EP.

The order (each a full quantize, judged by the same gate; nothing is written until one passes):

1. what the options ask (static or dynamic, the EP's preset);
2. static with 16-bit activations and 8-bit weights (A16W8: ORT's CPU EP and QNN's HTP run it),
   where the first was static with 8-bit activations and calibration data is at hand;
   then, for an EP whose preset is per tensor and that runs per-channel weights (PER_CHANNEL_EPS:
   QNN's HTP), the same with signed 8-bit weights per output channel (a Conv with its
   BatchNormalization folded in has channels of very different ranges, which one 8-bit grid per
   tensor cannot hold); then 16-bit weights (A16W16) for an EP that runs them on its accelerator
   (WIDE_WEIGHT_EPS: QNN's HTP, measured); where 16-bit activations still fail, 8-bit weights are
   the error left;
3. dynamic int8 (weights only), for the CPU and CUDA EPs, which run its integer ops, where the
   first was static;
4. static int8, then A16W8, where the first was dynamic and real samples are at hand: --calib's,
   or else --eval's (EVAL_AS_CALIB_MIN or more), which the static attempts then calibrate on as
   --calib (a share held back for their gate).

Every attempt after the first is held to the search's margin (half-way from --min-cosine to 1,
0.995 for the default): choosing the first of several that passes on the same held-back samples
favours a lucky one. When none passes, the report says so and names FP16 (``ortprep convert MODEL --fp16``) as the
way left. ``auto`` in the JSON lists every attempt with its verdict.

Speed is part of the verdict where the target is the CPU EP (the latency the gate measures is
this CPU's): a result that passes but runs slower than the float model (dynamic int8 of a CNN:
several times slower without VNNI, measured in bench/RESULTS.md) does not end the search while
other precisions remain; of those that pass, the fastest is written (a later one only when it
measured at least 10% faster), and the report says what the others measured. For another EP the
CPU's latency says nothing: where that EP ran the gate here and its time is the device's (OpenVINO's
CPU, CUDA; not QNN's simulator), its own time judges the same way; elsewhere the first that passes
is kept.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions
from ortprep.prove.reduction import Budget
from ortprep.report import StepResult
from ortprep.runtime.budget import EpClock, hold_step, step_left, step_spent
from ortprep.steps.base import ProgressCallback
from ortprep.steps.quantize.evaluate import target_latency_ratio
from ortprep.steps.quantize.fp16_probe import fp16_words, measure_fp16, probe_hold
from ortprep.steps.quantize.attempt import engine_refusal, quantize_model, refuse_engine
from ortprep.steps.quantize.ladder import attempt_flags, auto_order, eval_sample_count
from ortprep.steps.quantize.mend import mend_summary, mend_words
from ortprep.steps.quantize.presets import resolve_settings
from ortprep.steps.quantize.trials import margin_aim


def quantize_auto(handle: ModelHandle, dest: Path, options: QuantizeOptions, *, force: bool = False,
                  progress: ProgressCallback | None = None) -> StepResult:
    """Each precision of the ladder (ladder.auto_order) quantized and judged in turn until one
    passes (see the module's docstring); the report of the one kept, with ``auto`` listing all."""
    tried: list[dict[str, Any]] = []
    report: StepResult | None = None
    # --keep-failed keeps the latest refused attempt's model (NAME.failed.onnx) and says which
    kept, kept_label = None, None
    order = auto_order(options, eval_sample_count(handle, options))
    # the CPU's latency judges only a CPU target; a result written over its own input is not moved
    in_place = handle.path is not None and Path(handle.path).resolve() == dest.resolve()
    on_cpu = options.ep in (None, "cpu") and not in_place
    best: tuple[dict[str, Any], StepResult] | None = None  # the fastest attempt that passed, written at dest
    aside = dest.with_name(f".{dest.name}.auto-best")  # the written best while a later attempt runs
    search = Budget(seconds=options.search_seconds)  # --search-seconds bounds the whole step
    clock = EpClock(options.ep_total_seconds)  # the target EP's time, over every attempt (--ep-total-seconds)
    # trials judged and failed on the held-back samples by the attempts so far: a later precision
    # kept is chosen after them, and holds the decision margin (runner.Trials.held_to_margin) as it
    # holds the cosine's (floor, below)
    earlier = (0, 0)
    hold_step(probe_hold(options))  # the attempts leave FP16's probe its time of --step-seconds
    try:
        for number, (label, changes) in enumerate(order):
            # --search-seconds bounds the whole step: a later precision's search gets what is left
            # (and --step-seconds all of it)
            left, step = search.seconds_left(), step_left()
            left = step if left is None else left if step is None else min(left, step)
            # a later precision is held to the margin the search aims for: the first of several that
            # passes on the same held-back samples is more often a lucky one (docs/decisions/
            # reduce-quantize-measurements.md)
            floor = options.min_cosine if number == 0 else margin_aim(options.min_cosine)
            # --keep-failed: each refused attempt replaces the one before at NAME.failed.onnx, so that
            # when none passes the file kept is the one the report describes (the last attempt's);
            # after the first attempt the output is free (a result that passed is set aside) and the
            # failed file is this run's own, hence force
            attempt = dataclasses.replace(options, auto=False, keep_failed=options.keep_failed,
                                          search_seconds=left, min_cosine=floor, engine=options.engine_name(),
                                          **changes)
            # what is left of --step-seconds is FP16's probe's once it would not hold another trial
            if number > 0 and step_spent(f"--auto's {label}", trial=True):
                tried.append({"label": label, "flags": attempt_flags(changes), "passed": False, "cosine": None,
                              "latency_ratio": None, "judged_on": None, "codes": [],
                              "error": "not tried: the step's own time (--step-seconds) was spent"})
                continue
            refusal = engine_refusal_for(attempt)
            if refusal is not None and number == 0:  # the precision asked for: refused as without --auto
                refuse_engine(attempt, resolve_settings(attempt))
            if refusal is not None:  # --engine NAME that cannot write this precision: the next one
                tried.append({"label": label, "flags": attempt_flags(changes), "passed": False, "cosine": None,
                              "latency_ratio": None, "judged_on": None, "codes": [], "error": refusal})
                continue
            # an attempt that fails on the CPU EP while later ones remain leaves the EP's time to them
            spare = number + 1 < len(order)
            if best is not None:
                os.replace(dest, aside)
                try:
                    report = quantize_model(handle, dest, attempt, force=force or number > 0, progress=progress,
                                            clock=clock, spare_failing_baseline=spare, earlier=earlier)
                except OrtprepError as error:  # a later precision's refusal: the one that passed stays
                    tried.append({"label": label, "flags": attempt_flags(changes), "passed": False, "cosine": None,
                                  "latency_ratio": None, "judged_on": None, "codes": [], "error": str(error)})
                    os.replace(aside, dest)
                    continue
            else:
                report = quantize_model(handle, dest, attempt, force=force or number > 0, progress=progress,
                                        clock=clock,
                                        spare_failing_baseline=spare, earlier=earlier)
            if report.data.get("kept_failed"):
                kept, kept_label = report.data["kept_failed"], label
            verify = report.data.get("verify") or {}
            passed = not any(f.severity >= Severity.ERROR for f in report.findings) and bool(report.data.get("output"))
            counted = verify.get("trials") or {}
            earlier = (counted.get("failed", earlier[0]), counted.get("judged", earlier[1]))
            ratio = target_latency_ratio(verify)
            timed_here = on_cpu or bool(verify.get("ep_latency"))
            entry = {"label": label, "flags": attempt_flags(changes), "passed": passed, "cosine": verify.get("cosine"),
                     "latency_ratio": ratio, "timed_on": (verify.get("ep_latency") or {}).get("ep", "cpu"),
                     "judged_on": verify.get("judged_on"),
                     "failed_on": (verify.get("gate") or {}).get("failed_on") if not passed else None,
                     "ep_error": (verify.get("ep") or {}).get("error") is not None,
                     "codes": sorted({f.code for f in report.findings if f.severity >= Severity.ERROR})}
            mend = mend_summary((report.data.get("search") or {}).get("mend"))
            if mend is not None:  # its session failed on the EP: mended, or the culprits named (mend.py)
                entry["mend"] = mend
            tried.append(entry)
            # a later result replaces the one written only when both were timed in the same place
            if passed and (best is None or (entry["timed_on"] == best[0]["timed_on"]
                                            and _faster(ratio, best[0]["latency_ratio"]))):
                best = (entry, report)
                aside.unlink(missing_ok=True)
            elif best is not None:
                if passed:
                    dest.unlink(missing_ok=True)
                os.replace(aside, dest)  # the earlier, faster result stays the one written
            if best is not None and not (timed_here and _slow(best[0]["latency_ratio"]) and number + 1 < len(order)
                                         and not _external(dest)):
                break  # a pass (and, on the CPU EP, not slower than float, or nothing left to try)
            no_samples = str(options.calib or "random") == "random"
            if not passed and report.data.get("quantized_ops", 0) == 0 and number == 0 and any(
                    f.code in ("QNT002", "QNT010") or (f.code == "QNT033" and no_samples) for f in report.findings):
                # nothing to quantize at all, or no data to judge on: no other precision changes that
                # (real --calib samples too few to hold any back leave a dynamic attempt to judge on them)
                break
    finally:
        hold_step(0.0)
        if aside.exists() and not dest.exists():
            os.replace(aside, dest)
        aside.unlink(missing_ok=True)
    assert report is not None
    chosen = best[0] if best is not None else None
    if best is not None:
        report = best[1]
    report.data["auto"] = {"order": [label for label, _ in order], "tried": tried,
                           "chosen": chosen["label"] if chosen else None,
                           "kept_failed_attempt": kept_label if kept else None}
    failed_first = tried[0]["label"]
    slower = [t for t in tried if t["passed"] and t is not chosen]
    if chosen is not None and slower:
        report.add(Finding.of(
            "QNT017", f"--auto: {chosen['label']} passed and runs at {_times(chosen['latency_ratio'])} the float "
            f"model's time on {'this CPU' if chosen.get('timed_on', 'cpu') == 'cpu' else chosen['timed_on']}; written "
            "instead of " + ", ".join(f"{t['label']} (passed, {_times(t['latency_ratio'])})" for t in slower),
            fix=_ask_directly(chosen["flags"])))
    elif chosen is not None and chosen is not tried[0]:
        report.add(Finding.of("QNT017", f"--auto: {failed_first} failed the gate; {chosen['label']} passed and was "
                              f"written" + (f" ({len(tried) - 2} other(s) failed before it)" if len(tried) > 2 else ""),
                              fix=_ask_directly(chosen["flags"])))
    elif chosen is None and (len(tried) > 1 or _gate_failed(tried)):
        # FP16, measured by the same gate, so that the refusal says whether it would do (fp16_probe)
        probe = measure_fp16(handle, options, progress) if _gate_failed(tried) else None
        report.data["auto"]["fp16"] = probe
        said, fix = fp16_words(probe) if probe is not None else (
            "", "FP16 keeps float arithmetic: ortprep convert MODEL --fp16 (verified); or --auto-exclude to keep the "
                "nodes that add the error in float")
        fix = cpu_deployment_words(tried, probe, options.ep) or fix
        report.add(Finding.of("QNT017", "--auto: no precision passed the gate: " + "; ".join(
            f"{t['label']} ({', '.join(t['codes']) or 'failed'}{mend_words(t.get('mend'))})" for t in tried)
                              + (f"; {said}" if said else ""), fix=fix))
    if kept:
        report.data["kept_failed"] = kept
    return report


def cpu_deployment_words(tried: list[dict], probe: dict | None, ep: str | None) -> str | None:
    """QNT017's fix where the EP computes the model otherwise in every precision: each attempt passed
    on the CPU EP and failed on the EP alone, and FP16 did too (an audio front end on QNN's HTP:
    docs/decisions/mend52-failing-sessions.md). What passes is the CPU EP; None otherwise."""
    if not ep or not tried or probe is None or not probe.get("ep_only") or probe.get("ep_error"):
        return None
    # computed otherwise: each ran on the EP (a session that failed there is not that: QNT040's case)
    if not all(t.get("failed_on") == [ep] and not t.get("ep_error") and not t.get("mend") for t in tried):
        return None
    return (f"{ep} computes this model otherwise than the CPU EP in every precision tried, FP16 included, and the "
            f"CPU EP passes each: deploy it on the CPU EP (the float model, or int8 judged there: ortprep quantize "
            f"MODEL --static --gate-on-cpu); where it is part of a larger model, keep that part off {ep} "
            "(search.off_ep names the sets tried, --max-float-share bounds them)")


def engine_refusal_for(attempt: QuantizeOptions) -> str | None:
    """Why the engine named with --engine (not auto) cannot quantize this attempt, or None."""
    name = attempt.engine_name()
    if name == "auto":
        return None
    why = engine_refusal(name, attempt.mode, resolve_settings(attempt))
    return f"--engine {name}: {why}" if why else None


def _ask_directly(flags: str) -> str:
    """QNT017's fix: the flags that ask for the precision --auto chose."""
    text = f"to ask for it directly: ortprep quantize MODEL {flags} ..."
    if "--calib" in flags:
        text += " (the samples as --calib, not as --eval: the gate then holds back a share of them)"
    return text


def _gate_failed(tried: list[dict[str, Any]]) -> bool:
    """Whether an attempt failed on accuracy (QNT005) or on size (QNT003): what FP16 may answer."""
    return any(code in ("QNT005", "QNT003") for t in tried for code in t["codes"])


def _slow(ratio: float | None) -> bool:
    """Slower than the float model on this CPU (the latency the gate measured)."""
    return ratio is not None and ratio > 1.0


# A later precision replaces an earlier one that passed only when it measured this much faster:
# a few timed runs differ by some percent from one process to the next.
FASTER_BY = 0.9


def _faster(ratio: float | None, than: float | None) -> bool:
    return ratio is not None and (than is None or ratio < FASTER_BY * than)


def _times(ratio: float | None) -> str:
    return "an unmeasured share of" if ratio is None else f"{ratio:.2f}x"


def _external(path: Path) -> bool:
    """Whether the written model keeps weights beside it (then it is not moved aside and back)."""
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - nothing readable: nothing to keep aside either
        return True
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
