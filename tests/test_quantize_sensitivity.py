"""The 16-bit rung's order: each activation's quantization alone, measured on the outputs
(steps/quantize/sensitivity.py), against the tensors' own rounding noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import models
from cli_helpers import quantize
from ortprep.steps.quantize.diagnose import tensor_noise
from ortprep.steps.quantize.sensitivity import NONFINITE_CHANGE, _change, gated_model, tensor_sensitivity


class _Reader(CalibrationDataReader):
    def __init__(self, inputs: list[np.ndarray]):
        self.rows = iter([{"x": x} for x in inputs])

    def get_next(self):
        return next(self.rows, None)


def _variance_pair(folder: Path, clamp: bool = True) -> tuple[Path, Path, list[dict]]:
    """The written-out variance model, ORT's static QDQ of it (uint8 activations), two unseen feeds."""
    float_path, quant_path = folder / "float.onnx", folder / "quant.onnx"
    onnx.save(models.variance_written_out(clamp=clamp), str(float_path))
    inputs = models.variance_inputs(np.random.default_rng(0), 10)
    quantize_static(str(float_path), str(quant_path), _Reader(inputs[:8]), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    return float_path, quant_path, [{"x": x} for x in inputs[8:]]


def test_sensitivity_finds_the_cancellation_the_noise_ranking_misses(tmp_path):
    """E[x^2] - E[x]^2 near 100 - 100: the three tensors that feed the subtraction move the output
    by more than its own size when quantized alone; each one's rounding is under 0.2% of its
    values, so the noise ranking puts the normalised tensor and the output first."""
    float_path, quant_path, feeds = _variance_pair(tmp_path)
    moved = tensor_sensitivity(float_path, quant_path, feeds, seconds=60)
    assert {name for name, _ in moved[:3]} == {"mean", "mean_sq", "x_sq"}
    assert min(change for _, change in moved[:3]) > 1.0 and max(change for _, change in moved[3:]) < 0.05
    noisy = [name for name, _ in tensor_noise(float_path, quant_path, feeds)]
    assert noisy[:2] == ["y", "normed"] and not {"mean", "mean_sq", "x_sq"} & set(noisy[:3])
    assert not list(tmp_path.glob("*.gated.onnx"))  # its working model is removed


def test_outputs_turned_nan_count_as_the_largest_change(tmp_path):
    """Without the clamp, a variance rounded below zero makes NaN where the float model has numbers:
    such a tensor ranks first (NONFINITE_CHANGE), not last for want of finite elements to compare."""
    assert _change({"y": np.ones(4, np.float32)}, {"y": np.full(4, np.nan, np.float32)}) == NONFINITE_CHANGE
    assert _change({"y": np.ones(4, np.float32)}, {"y": np.ones(4, np.float32)}) == 0.0
    float_path, quant_path, feeds = _variance_pair(tmp_path, clamp=False)
    moved = tensor_sensitivity(float_path, quant_path, feeds, seconds=60)
    assert {name for name, _ in moved[:3]} == {"mean", "mean_sq", "x_sq"}
    assert moved[0][1] == NONFINITE_CHANGE


def test_gated_model_switches_one_quantization_at_a_time(tmp_path):
    """With every gate off the gated model is the float model; with one on, only that tensor is
    rounded (here the mean's square: the output moves). The graph output and the input stay ungated."""
    float_path, quant_path, feeds = _variance_pair(tmp_path)
    float_proto = onnx.load(str(float_path))
    from ortprep.steps.quantize.sensitivity import activation_encodings

    encodings = activation_encodings(onnx.load(str(quant_path)), {o for n in float_proto.graph.node for o in n.output})
    gated, order = gated_model(float_proto, encodings)
    assert "y" not in order and "x" not in order and "mean_sq" in order
    path = tmp_path / "gated.onnx"
    onnx.save(gated, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    off = {f"ortprep_gate_{i}": np.array(False) for i in range(len(order))}
    reference = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    np.testing.assert_array_equal(session.run(None, {**feeds[0], **off})[0], reference)
    one = {**off, f"ortprep_gate_{order.index('mean_sq')}": np.array(True)}
    moved = session.run(None, {**feeds[0], **one})[0]
    assert np.linalg.norm(moved - reference) > 0.5 * np.linalg.norm(reference)


def test_rung_gives_16_bits_to_the_tensor_that_moves_the_outputs(tmp_path):
    """quantize --auto-exclude on the written-out variance: the rung's first trial widens the square
    that feeds E[x^2] (by the outputs' change) and passes; ranked by noise it took 3 tensors and 4
    trials (session 37's run). Every weight stays int8."""
    folder = tmp_path / "calib"
    folder.mkdir()
    for index, x in enumerate(models.variance_inputs(np.random.default_rng(0), 20)):
        np.savez(folder / f"{index:03d}.npz", x=x)
    model = tmp_path / "variance.onnx"
    onnx.save(models.variance_written_out(), str(model))
    code, record, _ = quantize(model, "--static", "--calib", folder, "--auto-exclude", "-o", tmp_path / "out.onnx")
    assert code == 0, record["findings"]
    assert record["wide_activations"] == ["x_sq"]
    wide = [t for t in record["search"]["trials"] if t["activations_16bit"]]
    assert wide[0]["label"] == "16-bit activations: the worst 1 of 4 ranked tensor(s) by the outputs' change"
    assert wide[0]["passed"] and record["verify"]["cosine"] > 0.998
    assert record["search"]["sensitivity"][0]["tensor"] == "x_sq" and record["search"]["sensitivity"][0]["change"] > 1
    assert record["quantized_weight_share"] == 1.0


def _two_relus(opset: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """x -> Relu -> h -> Relu -> y at ``opset``, and the same graph with h quantized (uint8)."""
    from onnx import TensorProto, helper, numpy_helper

    def graph(nodes, inits):
        return helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)

    plain = [helper.make_node("Relu", ["x"], ["h"], name="a"), helper.make_node("Relu", ["h"], ["y"], name="b")]
    quantized = [plain[0], helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"], name="q"),
                 helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["hd"], name="dq"),
                 helper.make_node("Relu", ["hd"], ["y"], name="b")]
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.uint8), "z")]
    return (models.make(graph(plain, []), opset=opset),
            models.make(graph(quantized, inits), opset=max(opset, 10)))


def test_sensitivity_falls_back_where_the_gated_model_cannot_run(tmp_path):
    """At opset 10 there is no Round: the gated model's session fails and the ranking is empty (the
    rung then keeps the noise order), nothing raised and no copy left behind. At opset 13 the same
    pair is measured; with no time at all nothing is run."""
    feeds = [{"x": np.linspace(-1, 3, 8, dtype=np.float32)[None]}]
    for opset, expected in ((10, 0), (13, 1)):
        float_proto, quant_proto = _two_relus(opset)
        float_path, quant_path = tmp_path / f"f{opset}.onnx", tmp_path / f"q{opset}.onnx"
        onnx.save(float_proto, str(float_path))
        onnx.save(quant_proto, str(quant_path))
        moved = tensor_sensitivity(float_path, quant_path, feeds, seconds=60)
        assert len(moved) == expected and (not moved or moved[0][0] == "h")
        assert not list(tmp_path.glob("*.gated.onnx"))
    assert tensor_sensitivity(float_path, quant_path, feeds, seconds=0) == []
