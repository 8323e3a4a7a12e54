"""Activation encodings cut to their readers' knees (transforms/qdq/saturation.py), on models
quantized by ORT's real quantizer and run by real ORT sessions."""

from __future__ import annotations

import math
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from ortprep.transforms.qdq.saturation import cut_to_readers, knees
from tests.cli_helpers import quantize, write_samples


def _model(path, written_out=False):
    """x -> Conv (outputs down to about -20) -> HardSwish -> Conv -> y; beside it a Conv whose
    output a HardSwish and an Add read (-> z). ``written_out``: the first HardSwish as
    ``c1 * HardSigmoid(c1)``, as ORT's pre-processing leaves it."""
    rng = np.random.default_rng(5)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(np.linspace(-16, 2, 8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) / 3).astype(np.float32), "w2")
    w3 = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w3")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             *([helper.make_node("HardSigmoid", ["c1"], ["g1"], name="gate1", alpha=1 / 6, beta=0.5),
                helper.make_node("Mul", ["c1", "g1"], ["h1"], name="hs1")] if written_out else
               [helper.make_node("HardSwish", ["c1"], ["h1"], name="hs1")]),
             helper.make_node("Conv", ["h1", "w2"], ["y"], name="conv2"),
             helper.make_node("Conv", ["x", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c3"], ["h3"], name="hs3"),
             helper.make_node("Add", ["h3", "c3"], ["z"], name="add")]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w1, b1, w2, w3])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


class _Reader(CalibrationDataReader):
    def __init__(self, samples):
        self.samples = iter(samples)

    def get_next(self):
        return next(self.samples, None)


def _samples(count, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 4, 16, 16)).astype(np.float32)} for _ in range(count)]


def _encoding(path, tensor):
    """(low, high, step) of the QuantizeLinear that reads ``tensor``."""
    proto = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    node = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    scale, zero = float(inits[node.input[1]]), int(inits[node.input[2]])
    info = np.iinfo(inits[node.input[2]].dtype)
    return (info.min - zero) * scale, (info.max - zero) * scale, scale


def _outputs(path, samples):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [session.run(["y"], s)[0] for s in samples]


@pytest.mark.parametrize("activation, written_out", [(QuantType.QUInt8, False), (QuantType.QInt8, False),
                                                     (QuantType.QUInt16, False), (QuantType.QUInt8, True)])
def test_hardswish_input_cut_to_its_knee(tmp_path, activation, written_out):
    model = _model(tmp_path / "hs.onnx", written_out)
    plain = tmp_path / "plain.onnx"
    quantize_static(str(model), str(plain), _Reader(_samples(16, 1)), quant_format=QuantFormat.QDQ,
                    activation_type=activation, weight_type=QuantType.QInt8)
    cut = tmp_path / "cut.onnx"
    shutil.copy(plain, cut)
    assert cut_to_readers(cut) == ["c1"]  # c3 is read by the Add too: its range is the Add's as well
    low0, high0, step0 = _encoding(plain, "c1")
    low, high, step = _encoding(cut, "c1")
    assert low0 < -6  # the calibrated range reaches well below the knee
    # the lower end at the knee or one step below it, never above it (-3 must still read as -3)
    assert -3 - step <= low <= -3 and step < step0 * (high0 + 3) / (high0 - low0) * 1.01
    assert high == pytest.approx(high0, abs=step0 + step)
    assert _encoding(cut, "c3") == _encoding(plain, "c3")
    # the same function at a finer step: closer to the float model on unseen inputs
    unseen = _samples(8, 9)
    reference = _outputs(model, unseen)

    def error(path):
        return float(np.mean([np.mean((a - b) ** 2) for a, b in zip(_outputs(path, unseen), reference)]))

    if activation != QuantType.QUInt16:  # at 16 bits the weights' rounding is all there is to see
        assert error(cut) < 0.85 * error(plain), (error(cut), error(plain))


def test_symmetric_encodings_are_left_alone(tmp_path):
    model = _model(tmp_path / "hs.onnx")
    quantized = tmp_path / "q.onnx"
    quantize_static(str(model), str(quantized), _Reader(_samples(8, 1)), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True})
    before = quantized.read_bytes()
    assert cut_to_readers(quantized, symmetric=True) == []
    assert quantized.read_bytes() == before


def test_knees_of_each_reader():
    inits = {"lo": numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             "hi": numpy_helper.from_array(np.array(6.0, np.float32), "hi")}
    assert knees(helper.make_node("HardSwish", ["a"], ["b"]), inits) == (-3.0, math.inf)
    low, high = knees(helper.make_node("HardSigmoid", ["a"], ["b"], alpha=0.2, beta=0.5), inits)
    assert (low, high) == pytest.approx((-2.5, 2.5))
    assert knees(helper.make_node("Relu", ["a"], ["b"]), inits) == (0.0, math.inf)
    assert knees(helper.make_node("Clip", ["a", "lo", "hi"], ["b"]), inits) == (0.0, 6.0)
    assert knees(helper.make_node("Clip", ["a", "", "hi"], ["b"]), inits) == (-math.inf, 6.0)
    assert knees(helper.make_node("Clip", ["a", "computed"], ["b"]), inits) is None  # a bound known at run time
    assert knees(helper.make_node("Sigmoid", ["a"], ["b"]), inits) is None  # never flat


def test_quantize_reports_the_cut(tmp_path):
    model = _model(tmp_path / "hs.onnx")
    calib = write_samples(tmp_path / "calib", "x", (1, 4, 16, 16), 24)
    code, record, _ = quantize(model, "--static", "--calib", calib, "-o", tmp_path / "q.onnx",
                               "--metric", "y=cosine", "--metric", "z=cosine")
    assert code == 0, record["findings"]
    assert record["reader_ranges"] == {"activations": 1, "tensors": ["c1"]}
    low, _, _ = _encoding(record["output"], "c1")
    assert -3.2 < low <= -3


def _hand_qdq(path, reader: str, low: float, high: float, zero_type=TensorProto.UINT8, before: str | None = None):
    """x -> [before] -> Q/DQ over [low, high] -> READER -> y, the encoding written by hand."""
    info = np.iinfo(helper.tensor_dtype_to_np_dtype(zero_type))
    scale = (high - low) / (int(info.max) - int(info.min))
    point = int(round(info.min - low / scale))
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"),
             helper.make_tensor("z", zero_type, [], [point]),
             numpy_helper.from_array(np.array(-1.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    nodes = ([helper.make_node(before, ["x"], ["t"], name="before")] if before else
             [helper.make_node("Identity", ["x"], ["t"], name="before")])
    nodes += [helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"], name="q"),
              helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["td"], name="dq")]
    hard_sigmoid = helper.make_node("HardSigmoid", ["td"], ["y"], name="r", alpha=0.2, beta=0.5)
    clip = helper.make_node("Clip", ["td", "lo", "hi"], ["y"], name="r")
    nodes.append(hard_sigmoid if reader == "HardSigmoid" else clip)
    graph = helper.make_graph(nodes, "hand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [9])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


@pytest.mark.parametrize("reader, saturated", [("HardSigmoid", {0: 0.0, 7: 1.0, 8: 1.0}),
                                               ("Clip", {0: -1.0, 1: -1.0, 8: 6.0})])
def test_both_knees_still_read_as_the_knee(tmp_path, reader, saturated):
    """A reader flat past a finite upper knee too (HardSigmoid, Clip): after the cut, the values
    past either knee give the reader's saturated output exactly, and the values between are
    closer to the float reader's (a finer step)."""
    plain = _hand_qdq(tmp_path / "plain.onnx", reader, -10.0, 12.0)
    cut = tmp_path / "cut.onnx"
    shutil.copy(plain, cut)
    assert cut_to_readers(cut) == ["t"]
    x = np.array([-9.0, -3.0, -1.0, -0.37, 0.0, 1.3, 2.2, 2.5, 9.0], np.float32)

    def run(path):
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]

    ideal = np.clip(0.2 * x + 0.5, 0, 1) if reader == "HardSigmoid" else np.clip(x, -1, 6)
    got = run(cut)
    for index, value in saturated.items():
        assert got[index] == value, (index, got[index])
    inside = [i for i in range(len(x)) if i not in saturated]
    assert np.max(np.abs(got[inside] - ideal[inside])) < np.max(np.abs(run(plain)[inside] - ideal[inside]))


def test_symmetric_and_fixed_encodings_are_not_cut(tmp_path):
    """An encoding written symmetric (zero point at the grid's middle) stays symmetric, whatever
    the preset says; a Tanh output's encoding (QNN fixes it) stays as the EP imposes it."""
    symmetric = _hand_qdq(tmp_path / "sym.onnx", "Clip", -12.0, 12.0, TensorProto.INT8)
    before = symmetric.read_bytes()
    assert cut_to_readers(symmetric) == [] and symmetric.read_bytes() == before
    tanh = _hand_qdq(tmp_path / "tanh.onnx", "HardSigmoid", -1.0, 0.99, TensorProto.UINT16, before="Tanh")
    assert cut_to_readers(tanh) == []
    moved = _hand_qdq(tmp_path / "relu.onnx", "HardSigmoid", -1.0, 0.99, TensorProto.UINT16, before="Relu")
    assert cut_to_readers(moved) == []  # [-1, 0.99] lies inside HardSigmoid's knees: nothing to gain


def test_diagnostics_measure_a_cut_tensor_within_its_readers_range(tmp_path):
    """The search's noise ranking and error-start ranking compare a tensor's values as its readers
    tell them apart: the cut tensor, clipped below -3 on purpose, is less noisy than before the
    cut, not the noisiest of the model."""
    from ortprep.steps.quantize.diagnose import tensor_noise, worst_nodes

    model = _model(tmp_path / "hs.onnx")
    plain = tmp_path / "plain.onnx"
    quantize_static(str(model), str(plain), _Reader(_samples(16, 1)), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    cut = tmp_path / "cut.onnx"
    shutil.copy(plain, cut)
    assert cut_to_readers(cut) == ["c1"]
    feeds = _samples(4, 3)
    noise_before, noise_after = dict(tensor_noise(model, plain, feeds)), dict(tensor_noise(model, cut, feeds))
    assert noise_after["c1"] < noise_before["c1"]
    blamed = {name: cosine for name, _, cosine in worst_nodes(model, cut, feeds[0], set(), limit=None)}
    assert blamed.get("conv1", 1.0) > 0.99  # the Conv whose output was cut is not where the error starts
