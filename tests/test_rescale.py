"""An input scaled down before FP16 where its activations overflow, the scale taken out at a Log or
cancelled by a division (transforms/rescale.py), and QNN's Clip with bounds computed at run time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
import ortprep
from ep_marks import needs_qnn
from ortprep.transforms.rescale import AIM, FP16_MIN_NORMAL, apply_rescale, plan_rescale, rescaled, trace
from ortprep.transforms.verify import Intermediates


def audio(seed: int, samples: int) -> np.ndarray:
    """Speech-like noise in int16's scale, as openWakeWord feeds its front end."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples)
    tone = np.sin(2 * np.pi * rng.uniform(0.02, 0.2) * t) * rng.uniform(0.3, 0.9)
    return ((tone + 0.05 * rng.normal(size=samples)) * 32767 / 1.2).astype(np.float32)[None]


def cpu(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def spectrum_and_feed(seed: int = 1):
    model = models.power_spectrum_db()
    samples = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    return model, {"audio": audio(seed, samples)}


def test_the_power_spectrum_is_scaled_and_the_log_takes_the_scale_out():
    model, feed = spectrum_and_feed()
    peaks = Intermediates(model, feed).peaks()
    assert max(peaks.values()) > 65504  # the premise: FP16 overflows here
    (plan,) = plan_rescale(model, peaks, 65504 / 2)
    assert plan.source == "audio" and plan.absorbed_at == ["log"]
    assert plan.degrees["re"] == 1 and plan.degrees["power"] == 2 and plan.degrees["mel_floor"] == 2
    assert "ln" not in plan.degrees and "out" not in plan.degrees  # unscaled after the Log
    rescaled = apply_rescale(model, plan)
    onnx.checker.check_model(rescaled, full_check=True)
    for seed in (1, 2, 3):  # the same outputs in FP32, on inputs the plan was not made on too
        feed = spectrum_and_feed(seed)[1]
        np.testing.assert_allclose(cpu(rescaled, feed), cpu(model, feed), rtol=1e-6, atol=0)  # float32 rounding
    after = Intermediates(rescaled, feed).peaks()
    assert max(value for name, value in after.items() if name != "audio") <= AIM * 4
    # the floor before the Log moved past it as its log (scaled, 1e-10 would fall below FP16)
    assert plan.floors and "floor" not in {init.name for init in rescaled.graph.initializer}
    assert [n.op_type for n in rescaled.graph.node][-4:-1] == ["Log", "Add", "Clip"]
    assert [n.name for n in model.graph.node] == [n.name for n in models.power_spectrum_db().graph.node]


def test_a_division_of_two_scaled_tensors_cancels_the_scale():
    model = models.fp16_overflowing_activations()  # x*1000 over its L2 norm
    feed = {"x": np.random.default_rng(0).uniform(0, 1, (1, 64)).astype(np.float32)}
    (plan,) = plan_rescale(model, Intermediates(model, feed).peaks(), 65504 / 2)
    assert plan.absorbed_at == [] and "y" not in plan.degrees and plan.degrees["n"] == 1
    np.testing.assert_allclose(cpu(apply_rescale(model, plan), feed), cpu(model, feed), rtol=1e-6, atol=1e-7)


def _chain(op: str) -> onnx.ModelProto:
    """x -> Mul by 1e4 -> OP -> y: an overflow that reaches ``op``."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "big"], ["b"], name="up"), helper.make_node(op, ["b"], ["c"], name="op"),
         helper.make_node("Log", ["c"], ["y"], name="log")],
        "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(1e4, np.float32), "big")])
    return models.make(graph)


@pytest.mark.parametrize("op", ["Sigmoid", "Exp", "Softmax"])
def test_an_op_that_does_not_carry_a_scale_stops_the_plan(op):
    assert trace(_chain(op), "x") is None


def test_a_scaled_graph_output_or_an_unscaled_addend_stops_the_plan():
    model = _chain("Relu")
    assert trace(model, "x") is not None  # Relu carries it to the Log
    model.graph.node[2].op_type = "Abs"  # the output is now x*1e4 itself, still scaled
    assert trace(model, "x") is None
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "big"], ["b"]), helper.make_node("Add", ["b", "x2"], ["c"]),
         helper.make_node("Log", ["c"], ["y"])],
        "mixed", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in ("x", "x2")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(1e4, np.float32), "big")])
    assert trace(models.make(graph), "x") is None


def _convert(tmp_path: Path, name: str, **options) -> dict:
    model, feed = spectrum_and_feed()
    source, sample = tmp_path / "spectrum.onnx", tmp_path / "sample.npz"
    if not source.exists():
        onnx.save(model, str(source))
        np.savez(sample, **feed)
    return ortprep.convert(source, tmp_path / name, fp16=True, inputs=sample, **options).to_record()


def test_convert_fp16_rescales_instead_of_keeping_fp32(tmp_path):
    record = _convert(tmp_path, "fp16.onnx")
    assert record["verify"]["passed"] is True, record["verify"]
    codes = {f["code"] for f in record["findings"]}
    assert "CNV020" in codes and "CNV003" not in codes
    assert record["kept_fp32_nodes"] == []
    written = onnx.load(str(tmp_path / "fp16.onnx"))
    assert {"audio_rescale", "log_unscale"} <= {n.name for n in written.graph.node}
    without = _convert(tmp_path, "kept.onnx", rescale=False)  # as before: the overflowing nodes stay FP32
    assert without["verify"]["passed"] is True
    assert {"re_squared", "im_squared", "power", "filter_bank"} <= {k["name"] for k in without["kept_fp32_nodes"]}
    assert "CNV020" not in {f["code"] for f in without["findings"]}


@needs_qnn
def test_the_rescaled_fp16_file_is_right_on_qnn_and_the_kept_one_is_not(tmp_path):
    """QNN's HTP computes a float model in FP16, the nodes convert kept in FP32 included: they
    overflow there (openWakeWord's mel front end: norm ratio 0.0016). The rescaled file agrees."""
    _convert(tmp_path, "fp16.onnx")
    _convert(tmp_path, "kept.onnx", rescale=False)
    reference = tmp_path / "spectrum.onnx"
    good = ortprep.test_load(tmp_path / "fp16.onnx", eps=["qnn"], reference=reference,
                             inputs=tmp_path / "sample.npz").to_record()
    bad = ortprep.test_load(tmp_path / "kept.onnx", eps=["qnn"], reference=reference,
                            inputs=tmp_path / "sample.npz").to_record()
    (good_qnn,), (bad_qnn,) = good["results"], bad["results"]
    assert good_qnn["nodes_on_ep"] == good_qnn["nodes_total"] and good_qnn["outputs_match"] is True, good_qnn
    assert good_qnn["cosine"] > 0.9999 and "LOD006" not in {f["code"] for f in good["findings"]}
    assert bad_qnn["outputs_match"] is False and bad_qnn["cosine"] < 0  # (measured: -0.99995)
    assert "LOD006" in {f["code"] for f in bad["findings"]}


def test_check_says_qnn_gives_a_clip_with_run_time_bounds_back(tmp_path):
    def clip_model(bound_from_input: bool) -> Path:
        nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0, name="top"),
                 helper.make_node("Sub", ["top", "eighty"], ["low"], name="low"),
                 helper.make_node("Clip", ["x", "low" if bound_from_input else "fixed"], ["y"], name="floor")]
        graph = helper.make_graph(nodes, "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                                  [numpy_helper.from_array(np.array(80.0, np.float32), "eighty"),
                                   numpy_helper.from_array(np.array(-3.0, np.float32), "fixed")])
        path = tmp_path / f"clip_{bound_from_input}.onnx"
        onnx.save(models.make(graph), str(path))
        return path

    def findings(path: Path) -> list[dict]:
        return [f for f in ortprep.check(path, ["qnn"]).to_record()["findings"] if f["code"] == "QNN010"]

    (found,) = findings(clip_model(True))
    assert found["node"] == "floor"
    assert findings(clip_model(False)) == []
    fed = onnx.load(str(clip_model(False)))  # the bound an initializer a caller may feed: not constant
    fed.graph.input.append(helper.make_tensor_value_info("fixed", TensorProto.FLOAT, []))
    onnx.save(fed, str(tmp_path / "fed.onnx"))
    (found,) = findings(tmp_path / "fed.onnx")
    assert found["node"] == "floor"
    folded = onnx.load(str(clip_model(False)))  # a bound ORT folds before partitioning: constant
    folded.graph.node.insert(0, helper.make_node("Identity", ["fixed"], ["fixed_copy"], name="copy"))
    folded.graph.node[-1].input[1] = "fixed_copy"
    onnx.save(folded, str(tmp_path / "folded.onnx"))
    assert findings(tmp_path / "folded.onnx") == []


def test_the_fp16_file_keeps_silence_and_quiet_input(tmp_path):
    """Digital silence reaches the floor: scaled by 2^-2k it would be zero in FP16 (+18 dB where
    the original says -100 dB; found by review); moved past the Log it is log(1e-10)."""
    _convert(tmp_path, "fp16.onnx")
    model, loud = spectrum_and_feed()
    written = onnx.load(str(tmp_path / "fp16.onnx"))
    for gain in (0.0, 1e-5, 1e-3, 1.0):
        feed = {"audio": (loud["audio"] * gain).astype(np.float32)}
        assert np.abs(cpu(written, feed) - cpu(model, feed)).max() < 0.25, gain  # dB


def test_two_inputs_are_each_rescaled_on_the_graph_the_other_left():
    """The second plan's node indices move when the first adds its Mul and Adds: each is traced
    again (found by review: the wrong constant was scaled, or an IndexError)."""
    nodes, inputs, inits = [], [], []
    for i in (1, 2):
        nodes += [helper.make_node("Mul", [f"x{i}", f"big{i}"], [f"a{i}"]),
                  helper.make_node("Pow", [f"a{i}", "two"], [f"p{i}"]),
                  helper.make_node("Relu", [f"p{i}"], [f"r{i}"]),
                  helper.make_node("Add", [f"r{i}", "eps"], [f"e{i}"]),
                  helper.make_node("Log", [f"e{i}"], [f"y{i}"])]
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 8]))
        inits.append(numpy_helper.from_array(np.array(1e4 * i, np.float32), f"big{i}"))
    inits += [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
              numpy_helper.from_array(np.array(1e5, np.float32), "eps")]  # scaled at degree 2 in both
    graph = helper.make_graph(nodes, "two", inputs, [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 8])
                                                     for i in (1, 2)], inits)
    model = models.make(graph)
    rng = np.random.default_rng(0)
    feed = {f"x{i}": rng.uniform(0.5, 2, (1, 8)).astype(np.float32) for i in (1, 2)}
    plans = plan_rescale(model, Intermediates(model, feed).peaks(), 65504 / 2)
    assert [p.source for p in plans] == ["x1", "x2"]
    both, applied = rescaled(model, plans)
    assert applied == plans
    onnx.checker.check_model(both, full_check=True)
    session = ort.InferenceSession(both.SerializeToString(), providers=["CPUExecutionProvider"])
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, feed), original.run(None, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_scaled_constant_stays_within_fp16_and_a_fed_initializer_is_no_constant():
    """An epsilon added at degree 2 bounds the octaves (found by review: scaled past FP16's range it
    became zero); an initializer listed as a graph input may be fed, so nothing is scaled from it."""
    def chain(eps: float, fed: bool) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("Mul", ["x", "big"], ["a"]), helper.make_node("Pow", ["a", "two"], ["p"]),
             helper.make_node("Add", ["p", "eps"], ["e"]), helper.make_node("Log", ["e"], ["y"])],
            "eps", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])]
            + ([helper.make_tensor_value_info("eps", TensorProto.FLOAT, [])] if fed else []),
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
            [numpy_helper.from_array(np.array(1e4, np.float32), "big"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(eps, np.float32), "eps")])
        return models.make(graph)

    feed = {"x": np.random.default_rng(0).uniform(0.5, 2, (1, 8)).astype(np.float32)}
    model = chain(1e3, fed=False)
    (plan,) = plan_rescale(model, Intermediates(model, feed).peaks(), 65504 / 2)
    assert 1e3 * 2.0 ** (-2 * plan.octaves) >= FP16_MIN_NORMAL
    tiny = chain(1e-6, fed=False)  # no octave count both fits the squares and keeps 1e-6 * 2^-2k in FP16
    assert plan_rescale(tiny, Intermediates(tiny, feed).peaks(), 65504 / 2) == []
    fed = chain(1.0, fed=True)
    assert trace(fed, "x") is None
