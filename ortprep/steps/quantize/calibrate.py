"""Calibration: the data quantize reads (which samples calibrate, which are held back to
evaluate) and ORT's quantizer, driven on an ortprep worker (pre-processing and quantization).

The quantizer runs on an ortprep worker (ortprep.runtime), with a private temp folder as its
working directory for the time of the request: a crash ends only the worker, and every temp file
stays in that folder. :func:`_run_quantizer` is the one place this package sends it work.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ortprep.errors import UsageError
from ortprep.findings import Finding
from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.runtime.calibration import CalibrationSet, discover, split
from ortprep.runtime.requests import Quantize, QuantizeReply
from ortprep.runtime.requests.quantize import MAX_STRIDE, largest_divisor
from ortprep.transforms.verify import EXPOSED_BYTES, exposure_groups
from ortprep.runtime.worker import call
from ortprep.runtime.feeds import input_specs, random_feeds
from ortprep.steps.base import ProgressCallback
from ortprep.steps.quantize.presets import quantizer_op_types

log = logging.getLogger(__name__)

TIMEOUT = 1800.0
MIN_EVAL_SAMPLES = 8  # held back at least this many when there are twice as many samples
# Fewer evaluation samples than this and the verdict is flagged as weak evidence (QNT014)
# (docs/decisions/reduce-quantize-measurements.md).
WEAK_EVIDENCE = 16
RANDOM_EVAL_SAMPLES = 8


def _run_quantizer(request: dict, *, poll: Callable[[], None] | None = None) -> QuantizeReply:
    """ORT's quantizer on ``request`` (model, output, mode, settings, calibration), on a worker of
    the pipeline's pool (or a one-shot one), in the request's ``workdir``."""
    return call(Quantize.from_request(request), timeout=TIMEOUT, poll=poll)


@dataclass
class DataPlan:
    """Which samples calibrate and which evaluate."""

    calibration: CalibrationSet | None
    calib_indices: list[int]
    eval_set: CalibrationSet | None
    eval_indices: list[int]


def held_back_share(count: int) -> float:
    """Every fifth sample is held back, but at least 8 when 16 or more exist (half of fewer)."""
    wanted = max(count // 5, min(MIN_EVAL_SAMPLES, count // 2))
    return wanted / count if count else 0.2


def rounds_on_samples(options: QuantizeOptions, calibration: CalibrationSet | None) -> bool:
    """Whether --weight-only may round on the calibration samples (--rounding gptq, or auto with
    real samples): they are then split as static calibration's are, so that the gate judges the
    result on samples the rounding did not see."""
    return (options.mode == "weight-only" and options.rounding != "nearest" and calibration is not None
            and calibration.kind != "random")


def plan_data(handle: ModelHandle, options: QuantizeOptions, settings: dict[str, Any], report: StepResult) -> DataPlan:
    """Check the data against the model (names, shapes, dtypes) before any work; split it."""
    specs = input_specs(handle.proto)
    if settings["requires_static_shapes"]:
        dynamic = [s.name for s in specs if s.shape is None or any(not isinstance(d, int) or d <= 0 for d in s.shape)]
        if dynamic:
            raise UsageError(
                f"the {settings['preset']} preset needs static shapes; dynamic inputs: {', '.join(dynamic)}",
                hint="fix them first: ortprep convert MODEL --fix-dim NAME=VALUE -o MODEL.static.onnx",
            )
    image = options.image()
    calibration = discover(str(options.calib), specs, image=image) if options.calib else None
    # --eval random asks for seeded inputs of the model's own shapes (evaluation_feeds makes them)
    evaluation_set = discover(str(options.eval), specs, image=image) \
        if options.eval and str(options.eval) != "random" else None
    if calibration is not None and calibration.kind == "random":
        used_for = "calibration" if options.mode == "static" else "the evaluation"
        report.add(Finding.of("QNT001", f"{used_for} used random data: the result says little about real inputs",
                              fix="pass real samples with --calib DIR"))
    calib_indices: list[int] = []
    eval_indices: list[int] = []
    if calibration is not None:
        count = min(calibration.count, options.samples) if options.samples else calibration.count
        if options.mode == "dynamic" or (options.mode == "weight-only" and (
                not rounds_on_samples(options, calibration) or (count < 2 and evaluation_set is None))):
            eval_indices = list(range(count))  # nothing is calibrated: all samples evaluate
        elif evaluation_set is None and options.mode == "weight-only":
            # rounding reads only its inputs' second moments: half is held back for the gate, so
            # that a result nearest rounding already passes is judged on as many samples as it can
            calib_indices, eval_indices = split(count, holdout=0.5)
        elif evaluation_set is None:
            calib_indices, eval_indices = split(count, holdout=held_back_share(count))
        else:
            calib_indices = list(range(count))
    if options.mode == "weight-only" and options.rounding == "gptq" and not calib_indices:
        raise UsageError("--rounding gptq measures each MatMul's inputs on calibration samples, and none is left to it "
                         f"({len(eval_indices)} sample(s), held back for the gate)",
                         hint="give two or more samples with --calib DATA (or --eval DATA beside them), or --rounding "
                              "nearest")
    if evaluation_set is not None:
        return DataPlan(calibration, calib_indices, evaluation_set, list(range(evaluation_set.count)))
    return DataPlan(calibration, calib_indices, calibration, eval_indices)


def made_up_refusal(plan: DataPlan, options: QuantizeOptions, report: StepResult) -> bool:
    """Whether the result would be judged only on inputs ortprep made up, unasked (no --eval or
    --calib samples to judge on, and no --eval random / --calib random): then QNT033 (error) and
    nothing is quantized or written. An int8 model's error depends on the ranges its activations
    take on real inputs; a verdict on seeded noise is no verification of it (FP16's conversion keeps
    its seeded verification). ``plan``: plan_data's."""
    if not options.verify or str(options.eval) == "random":
        return False
    if plan.eval_set is not None and plan.eval_indices:
        return False  # samples given, or made-up ones asked for with --calib random
    given = plan.calibration is not None and plan.calibration.kind != "random"
    report.add(Finding.of(
        "QNT033", "the quantized model would be judged only on inputs ortprep made up ("
        + (f"the {plan.calibration.count} --calib sample(s) all calibrate, and none is left to judge on"
           if given else "no --eval or --calib data was given")
        + "): a verdict on seeded random inputs says nothing of the inputs the application feeds, so nothing "
        "was quantized or written",
        fix="pass real samples: --eval DIR (a folder of .npz/.npy or images, one per input set) or --calib DIR; "
            "--eval random judges on seeded random inputs anyway, and the report then says so (evaluation_data)"))
    return True


def evaluation_data(plan: DataPlan, options: QuantizeOptions) -> str | None:
    """What the verdict was judged on, for the report: "samples" (the user's), "random" (seeded
    inputs ortprep made up, asked for with --eval random or --calib random), or None (not judged)."""
    if not options.verify:
        return None
    if plan.eval_set is not None and plan.eval_indices and plan.eval_set.kind != "random":
        return "samples"
    return "random"


def evaluation_feeds(handle: ModelHandle, plan: DataPlan, options: QuantizeOptions, report: StepResult
                     ) -> tuple[list[dict], str | None]:
    """The held-back samples; without any, seeded inputs and a warning (never "not run")."""
    if not options.verify:
        return [], None
    if plan.eval_set is not None and plan.eval_indices:
        feeds = list(plan.eval_set.samples(plan.eval_indices))
        if len(feeds) < WEAK_EVIDENCE:
            report.add(Finding.of("QNT014",
                                  f"the accuracy verdict rests on {len(feeds)} evaluation sample(s); fewer than "
                                  f"{WEAK_EVIDENCE} are weak evidence: a decision that flips on 1 input in 10 can "
                                  "pass them all",
                                  fix=f"give more samples (--eval DATA with {WEAK_EVIDENCE} or more, or --calib with "
                                      "at least "
                                      f"{5 * WEAK_EVIDENCE})"))
        return feeds, plan.eval_set.source
    specs = input_specs(handle.proto)
    # One input policy (runtime/feeds.choose_feeds): dims that must be guessed are tried on the
    # float model until it runs (its names, the sizes its constants imply, common sizes), as load
    # and convert do; the seeded samples then take the shapes that ran.
    from ortprep.runtime.feeds import choose_feeds
    from ortprep.runtime.isolated import run_isolated

    runs = (lambda feeds: run_isolated(handle.path, feeds)) if handle.path is not None else None
    choice = choose_feeds(specs, proto=handle.proto, runs=runs)
    shapes = {name: list(value.shape) for name, value in choice.feeds.items()}
    feeds = [random_feeds(specs, seed=seed, shapes=shapes) for seed in range(RANDOM_EVAL_SAMPLES)]
    report.add(Finding.of(
        "QNT011", f"no evaluation data: the quantized model was evaluated on {RANDOM_EVAL_SAMPLES} seeded random "
        "inputs (--eval random), which prove little about real inputs", severity=None,
        fix="pass real samples with --eval DATA (or --calib DATA); --fail-on warning makes this fail CI"))
    if "guessed from " not in choice.how:
        return feeds, f"random ({RANDOM_EVAL_SAMPLES} seeded samples)"
    reason = choice.how.split("guessed from ", 1)[1].split(":")[0]
    shown = ", ".join(f"{name}={'x'.join(map(str, dims))}" for name, dims in shapes.items())
    return feeds, f"random ({RANDOM_EVAL_SAMPLES} seeded samples; {shown}, dims guessed from {reason})"


def run_quantizer(workdir: Path, model: Path, output: Path, mode: str, settings: dict,
                  calibration: CalibrationSet | None,
                  indices: list[int], exclude_nodes: list[str], exclude_ops: tuple[str, ...], big: bool,
                  progress: ProgressCallback | None = None) -> tuple[bool, str]:
    """Quantize ``model`` into ``output`` (calibrating on ``indices`` of ``calibration`` in static
    mode), keeping ``exclude_nodes`` and ``exclude_ops`` float: (True, "") or (False, why)."""
    op_types = settings["op_types"]
    if exclude_ops:
        if op_types is None:
            op_types = quantizer_op_types(mode, settings["format"])
        op_types = [op for op in op_types if op not in exclude_ops]
    stride = None
    if mode == "static" and settings.get("method") in HISTOGRAM_METHODS and indices:
        first = calibration.sample(indices[0]) if calibration is not None else {}
        stride, why = histogram_stride(model, len(indices),
                                       {name: list(np.shape(value)) for name, value in first.items()})
        if stride is None:
            return False, why
    request = {
        "workdir": str(workdir),
        "model": str(model),
        "output": str(output),
        "mode": mode,
        "calibration": calibration.to_json() if calibration else None,
        "calibration_indices": indices,
        "options": {**settings, "op_types": op_types, "exclude_nodes": exclude_nodes, "external_data": big,
                    "stride": stride,
                    "calibration_cache": (str(calibration_cache(workdir, model, settings, op_types, stride, indices))
                                          if mode == "static" and calibration is not None else None)},
        "progress": str(workdir / "quantize-progress.txt"),
    }

    def poll() -> None:
        done_total = _read_progress(Path(request["progress"])) if progress is not None else None
        if done_total:
            progress("calibrating", *done_total)

    reply = _run_quantizer(request, poll=poll)
    if reply.status == "timeout":
        return False, f"the quantizer did not finish within {TIMEOUT:.0f} s"
    poll()
    if reply.status == "crashed":
        return False, f"the quantizer's process died ({reply.message[-300:]})"
    if not reply.ok:
        log.debug("quantizer traceback:\n%s", reply.traceback)
        return False, f"{reply.error_type}: {reply.message}"
    return True, ""


def calibration_cache(workdir: Path, model: Path, settings: dict, op_types: list[str] | None, stride: int | None,
                      indices: list[int]) -> Path:
    """Where the calibrated ranges of ``model`` are kept for the step's later trials (ORT's
    quantize_static ``calibration_cache_path``): one file per model, method, ops calibrated,
    activation type, stride, samples and calibration options. The nodes kept float and the weights'
    type and granularity do not change what calibration measures, so the search's trials and
    --auto's weight widenings on one source reuse one calibration (a calibration can take a minute:
    docs/decisions/reduce-quantize-measurements.md)."""
    # the sources are the step's own files in its work folder: path, size and time name one (no byte
    # of a model of gigabytes read again per trial)
    stat = model.stat()
    extra = {k: v for k, v in (settings.get("extra_options") or {}).items() if k != "TensorQuantOverrides"}
    key = json.dumps([str(model), stat.st_size, stat.st_mtime_ns, settings.get("method"), sorted(op_types or []),
                      settings.get("activation_type"), stride, list(indices), extra], sort_keys=True, default=str)
    return workdir / f"calibration-{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"


# Calibration methods whose calibrator (ORT's HistogramCalibrater) keeps every intermediate tensor
# of every sample in a stride until it builds its histograms; MinMax reduces each tensor to two
# numbers inside the calibration graph, so its memory does not grow with the activations.
HISTOGRAM_METHODS = ("percentile", "entropy")
# What a histogram stride may hold of activations (the bound is the model's size x 3 + 1 GB
# for the whole process; the model's sessions and ORT's arenas take the rest).
ACTIVATION_BUDGET = 512 * 2**20


def activation_bytes(model: Path, input_shapes: dict[str, list[int]] | None = None) -> int | None:
    """Bytes of every float intermediate tensor of one sample, from the shapes the graph holds
    (after ORT's pre-processing, its shape inference), with the graph inputs set to
    ``input_shapes`` (a calibration sample's: dynamic dims become known); None where a float
    tensor's size is still not known. The weights are not read."""
    sizes = tensor_bytes(model, input_shapes)
    if any(size is None for size in sizes.values()):
        return None
    return sum(size for size in sizes.values() if size)


def tensor_bytes(model: Path, input_shapes: dict[str, list[int]] | None = None) -> dict[str, int | None]:
    """Bytes of each intermediate tensor of one sample (node outputs, in graph order): 0 for
    tensors that are not float, None where the size is not known. As :func:`activation_bytes`."""
    import onnx

    from ortprep.graphops import intermediate_bytes

    return intermediate_bytes(onnx.load(str(model), load_external_data=False), input_shapes, float_only=True)


_ACTIVATION_BYTES: dict[tuple, int | None] = {}


def histogram_stride(model: Path, count: int,
                     input_shapes: dict[str, list[int]] | None = None) -> tuple[int | None, str]:
    """How many samples a histogram calibration stride holds at once: as many as ACTIVATION_BUDGET
    takes (at most MAX_STRIDE, a divisor of ``count`` as ORT's strided protocol needs), or (None,
    why) when one sample's activations alone exceed it. Unknown sizes keep MAX_STRIDE's rule."""
    key = (str(model), Path(model).stat().st_mtime_ns,
           tuple(sorted((k, tuple(v)) for k, v in (input_shapes or {}).items())))
    if key not in _ACTIVATION_BYTES:  # every trial of a search asks again for the same source
        _ACTIVATION_BYTES.clear()
        _ACTIVATION_BYTES[key] = activation_bytes(model, input_shapes)
    per_sample = _ACTIVATION_BYTES[key]
    fits = MAX_STRIDE if per_sample is None or per_sample == 0 else min(MAX_STRIDE, ACTIVATION_BUDGET // per_sample)
    if fits < 1:
        return None, (f"histogram calibration keeps every activation of a sample until it builds its histograms: "
                      f"{per_sample / 2**20:.0f} MB per sample here, past the {ACTIVATION_BUDGET / 2**20:.0f} MB "
                      "ortprep allows it; --method minmax reduces each tensor in the graph and stays small")
    return largest_divisor(count, fits), ""


def _read_progress(path: Path) -> tuple[int, int] | None:
    try:
        done, total = path.read_text(encoding="utf-8").split()
        return int(done), int(total)
    except (OSError, ValueError):
        return None


def preprocess(workdir: Path, source: Path, report: StepResult) -> tuple[Path, str]:
    """ORT's quantization pre-processing (shape inference, graph optimization), on a worker."""
    target = workdir / "preprocessed.onnx"
    try:
        import sympy  # noqa: F401 - ORT's symbolic shape inference needs it

        symbolic = True
    except ImportError:
        symbolic = False
    request = {
        "workdir": str(workdir),
        "model": str(source),
        "output": str(target),
        "mode": "preprocess",
        "options": {"symbolic": symbolic, "external_data": source.with_name(source.name + ".data").exists()},
    }
    reply = _run_quantizer(request)
    if not reply.ok or not target.exists():
        reason = reply.message if reply.status == "failed" else f"its process died ({reply.message[-300:]})"
        folded = fuse_bn_into_conv(source, workdir / "bn_folded.onnx")
        report.add(Finding.of("QNT007", f"pre-processing failed ({reason}); quantizing the model as it is"
                              + (", and with its BatchNormalizations folded into the Convs before them" if folded
                                 else ""),
                              fix="pass --no-preprocess to skip it, or simplify the model first"))
        if folded:
            return folded, "ORT's failed; BatchNormalization folded into Conv (onnxoptimizer fuse_bn_into_conv)"
        return source, "skipped (failed)"
    detail = "ORT optimization and onnx shape inference"
    if "Optimization Failed" in reply.stderr:
        # quant_pre_process swallows this failure and writes the model unoptimized.
        report.add(Finding.of("QNT007", "pre-processing could not run ORT's optimizations on this model; quantizing it "
                              "with shape inference only", fix="check the model: ortprep check MODEL --ep cpu"))
        detail = "onnx shape inference only (ORT optimization failed)"
    if not symbolic:
        detail += " (symbolic shape inference skipped: it needs sympy)"
    return target, detail


def fuse_bn_into_conv(source: Path, target: Path) -> Path | None:
    """``source`` with each BatchNormalization that follows a Conv folded into that Conv's weights
    (onnxoptimizer's fuse_bn_into_conv), written to ``target``; None when there is none to fold,
    the weights live in external data, or the pass fails.

    ORT's pre-processing folds them; where it fails, a BatchNormalization left standing is
    quantized as an op of its own, and an EP may compute it otherwise than the CPU EP
    (docs/decisions/reduce-quantize-measurements.md). The caller checks the result
    against the model as given, as it checks ORT's pre-processing."""
    import onnx

    if source.with_name(source.name + ".data").exists():
        return None
    proto = onnx.load(str(source))
    producers = {out: node for node in proto.graph.node for out in node.output}
    if not any(node.op_type == "BatchNormalization" and node.input
               and (producers.get(node.input[0]) or node).op_type == "Conv"
               for node in proto.graph.node):
        return None
    try:
        import onnxoptimizer

        folded = onnxoptimizer.optimize(proto, ["fuse_bn_into_conv"])
    except Exception:  # noqa: BLE001 - a pass that fails leaves the model as given
        return None
    if sum(n.op_type == "BatchNormalization" for n in folded.graph.node) >= sum(
            n.op_type == "BatchNormalization" for n in proto.graph.node):
        return None
    onnx.save(folded, str(target))
    return target


def exposure_chunks(model: Path, names: list[str], feeds: list[dict[str, np.ndarray]],
                    budget: int | None = None) -> list[list[str]]:
    """``names`` (intermediates of ``model``) in groups whose values on ``feeds`` take at most
    ``budget`` bytes (EXPOSED_BYTES): one run per group exposes them. Sizes come from shape
    inference with the feeds' shapes; a tensor of unknown size counts as the largest known one. The
    search's blame and noise rankings read every tensor of both models, which on a large detector is
    gigabytes at once; they run once per group instead."""
    sizes = tensor_bytes(model, {name: list(np.shape(value)) for name, value in feeds[0].items()}) if feeds else {}
    return exposure_groups(names, sizes, EXPOSED_BYTES if budget is None else budget, scale=len(feeds),
                           none_known="budget")
