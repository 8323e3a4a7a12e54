"""Conclusion (session 26, 2026-11-28; bench/studies/bias_correction.md): empirical bias correction of
ORT's int8 Convs moves little and lifts no development-half model over its bar (ocr_rec 36 -> 38 of
50 strings, 95% asked; dddd_det and unet_small within 0.001 cosine); the "total error" variant hurts
(ocr_rec 12 of 50). Not added to quantize.

Whether bias correction earns a place in quantize (issue 22, point 2: "bias correction where it
measurably helps; keep a method only if the bench shows it raises the yield"). Measured on the
development half only, so that the evaluation half can judge a method chosen here.

For each model: its float file (the journey's, opset raised to 17 where older, ORT's basic
optimizations applied so that BatchNormalization is folded and tensor names hold), ORT's
quantize_static (QDQ, per-channel int8 weights, uint8 activations, minmax over 16 calibration
samples, seed 1 as quantize_yield), then two corrections of each quantized Conv's int32 bias,
both measured on the same 16 samples:

- ``total``: the per-channel mean of the quantized Conv's output minus the float model's (the
  error each layer inherits from those before it included);
- ``own``: the per-channel mean of the quantized Conv's output minus that of a float twin of the
  Conv (the float model's weights and bias) reading the same quantized input: the layer's own
  error, as empirical bias correction defines it.

Each file is judged on 50 fresh inputs (seed 99): the application's decision where the case has
one (journey.decide), and the lowest and mean output cosine.

    .venv/bin/python -m bench.studies.bias_correction [NAME ...]    (default: the dev half's Conv models)
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper, version_converter
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from bench.common import calibration_reader
from bench.paths import BENCH
from bench.referee import cosine, decide, same_decision
from bench.suite.journey_corpus import CORPUS
from bench.suite.quantize_yield import float_model

JOURNEY = BENCH / "out" / "journey"
DEFAULT = ("ocr_rec", "dddd_det", "unet_small")  # the dev half's Conv models the journey has run
CALIB, FRESH = 16, 50


def _options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return options


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), _options(), providers=["CPUExecutionProvider"])


def channel_means(model: onnx.ModelProto, names: list[str], feeds: list[dict]) -> dict[str, np.ndarray]:
    """Each named tensor's mean per channel (axis 1) over the feeds."""
    probe = copy.deepcopy(model)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names if n not in have
    )
    runner = session(probe)
    wanted = [o.name for o in runner.get_outputs()]
    sums: dict[str, np.ndarray] = {}
    for feed in feeds:
        values = dict(zip(wanted, runner.run(None, feed)))
        for name in names:
            value = values[name].astype(np.float64)
            mean = value.mean(axis=tuple(a for a in range(value.ndim) if a != 1))
            sums[name] = sums.get(name, 0.0) + mean
    return {name: total / len(feeds) for name, total in sums.items()}


def _bias_targets(float_model_: onnx.ModelProto, quantized: onnx.ModelProto):
    """(quantized Conv, its bias's DequantizeLinear, the float model's Conv it stands for). ORT's QDQ
    quantizer drops a Relu after a Conv (the QuantizeLinear after it clips) and gives the Conv the
    Relu's output name, so a float Conv is also found by its Relu's output; its own output (before
    the Relu) is what the quantized Conv computes."""
    inits = {i.name for i in quantized.graph.initializer}
    float_inits = {i.name for i in float_model_.graph.initializer}
    float_convs = {n.output[0]: n for n in float_model_.graph.node if n.op_type == "Conv"}
    readers: dict[str, list] = {}
    for node in float_model_.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for output, conv in list(float_convs.items()):
        after = readers.get(output, [])
        if len(after) == 1 and after[0].op_type == "Relu":
            float_convs.setdefault(after[0].output[0], conv)
    producer = {o: n for n in quantized.graph.node for o in n.output}
    for node in quantized.graph.node:
        twin = float_convs.get(node.output[0])
        if node.op_type != "Conv" or len(node.input) < 3 or twin is None or twin.input[1] not in float_inits:
            continue
        dq = producer.get(node.input[2])
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
            yield node, dq, twin


def corrected(
    float_model_: onnx.ModelProto, quantized: onnx.ModelProto, feeds: list[dict], own: bool
) -> onnx.ModelProto:
    result = copy.deepcopy(quantized)
    targets = list(_bias_targets(float_model_, result))
    float_inits = {i.name: i for i in float_model_.graph.initializer}
    if own:
        probe = copy.deepcopy(result)
        for node, _, twin in targets:
            inputs = [node.input[0]]
            for index, suffix in ((1, "__w"), (2, "__b")):
                if len(twin.input) > index and twin.input[index] in float_inits:
                    copied = copy.deepcopy(float_inits[twin.input[index]])
                    copied.name = node.output[0] + suffix
                    probe.graph.initializer.append(copied)
                    inputs.append(copied.name)
            extra = helper.make_node("Conv", inputs, [node.output[0] + "__twin"], name=node.name + "__twin")
            extra.attribute.extend(node.attribute)
            probe.graph.node.append(extra)
        means = channel_means(
            probe, [n for node, _, _ in targets for n in (node.output[0], node.output[0] + "__twin")], feeds
        )
        deltas = {node.output[0]: means[node.output[0]] - means[node.output[0] + "__twin"] for node, _, _ in targets}
    else:
        ours = channel_means(result, [node.output[0] for node, _, _ in targets], feeds)
        theirs = channel_means(float_model_, [twin.output[0] for _, _, twin in targets], feeds)
        deltas = {node.output[0]: ours[node.output[0]] - theirs[twin.output[0]] for node, _, twin in targets}
    inits = {i.name: i for i in result.graph.initializer}
    for node, dq, _ in targets:
        bias, scale = inits[dq.input[0]], numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
        values = numpy_helper.to_array(bias).astype(np.int64) - np.round(deltas[node.output[0]] / scale).astype(
            np.int64
        )
        bias.CopyFrom(numpy_helper.from_array(np.clip(values, -2**31, 2**31 - 1).astype(np.int32), bias.name))
    return result


def judge(case, wanted: list[list[np.ndarray]], candidate: onnx.ModelProto, fresh: list[dict]) -> tuple:
    """``candidate`` on ``fresh`` against the float model's outputs on them (``wanted``)."""
    theirs = session(candidate)
    agreed, cosines = 0, []
    for want, feed in zip(wanted, fresh):
        got = theirs.run(None, feed)
        for a, b in zip(want, got):
            cosines.append(cosine(a, b))
        if case.decision:
            index = case.decision_output
            agreed += same_decision(
                case.decision, decide(case.decision, want[index]), decide(case.decision, got[index])
            )
    return (f"{agreed}/{len(fresh)}" if case.decision else "-"), min(cosines), float(np.mean(cosines))


def main(names: list[str]) -> int:
    print("| model | half | decision | file | decision agrees | lowest cosine | mean cosine | Conv biases corrected |")
    print("|---|---|---|---|---|---|---|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            case = next(c for c in CORPUS if c.name == name)
            source = float_model(case, JOURNEY)
            if source is None:
                print(f"| {name} | {case.half} | - | no float model in {JOURNEY} | | | | |")
                continue
            model = onnx.load(str(source))
            if max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
                model = version_converter.convert_version(model, 17)  # per-channel DequantizeLinear needs 13
            options = _options()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            options.optimized_model_filepath = str(Path(folder) / f"{name}.float.onnx")
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            rng = np.random.default_rng(1)
            calib = [{k: np.ascontiguousarray(v) for k, v in case.inputs(rng, i).items()} for i in range(CALIB)]
            rng = np.random.default_rng(99)
            fresh = [{k: np.ascontiguousarray(v) for k, v in case.inputs(rng, i).items()} for i in range(FRESH)]
            quantized_path = Path(folder) / f"{name}.int8.onnx"
            quantize_static(options.optimized_model_filepath, str(quantized_path), calibration_reader(calib),
                            quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8)
            reference, quantized = onnx.load(options.optimized_model_filepath), onnx.load(str(quantized_path))
            count = len(list(_bias_targets(reference, quantized)))
            float_session = session(reference)
            wanted = [float_session.run(None, feed) for feed in fresh]  # the float model's outputs, once
            for label, candidate in (
                ("static int8", quantized),
                ("+ bias correction (total error)", corrected(reference, quantized, calib, own=False)),
                ("+ bias correction (own error)", corrected(reference, quantized, calib, own=True)),
            ):
                agreed, lowest, mean = judge(case, wanted, candidate, fresh)
                print(
                    f"| {name} | {case.half} | {case.decision or '-'} | {label} | {agreed} | {lowest:.4f} | {mean:.4f} "
                    f"| "
                    f"{0 if candidate is quantized else count} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(DEFAULT)))
