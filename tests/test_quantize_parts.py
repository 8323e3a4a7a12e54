"""quantize's parts on their own: presets as data, graph edits, the evaluation gate, the search's
selection logic (trials and ranking given as numbers), the held-back share."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from cli_helpers import invoke
from conftest import SAMPLES
from ortprep.eps.registry import EPS, resolve_ep, valid_names
from ortprep.errors import UsageError
from ortprep.options import QuantizeOptions
from ortprep.steps.quantize.calibrate import held_back_share
from ortprep.transforms.qdq.facts import quantization_stats, with_outputs
from ortprep.transforms.qdq.prepare import already_quantized, constants_to_initializers, name_nodes, sentinel_readers
from ortprep.steps.quantize.presets import FORMATS, QUANT_TYPES, presets, resolve_settings
from ortprep.prove.reduction import Budget
from ortprep.steps.quantize.strategy import Search, rule_sets
from ortprep.steps.quantize.trials import Trial, margin_aim

# --- presets -------------------------------------------------------------------------------------


def test_presets_are_keyed_by_registry_ep_names():
    table = presets()
    assert set(table) <= set(valid_names())
    assert set(table) == {spec.name for spec in EPS if spec.quantize is not None}
    assert {"cpu", "cuda", "tensorrt", "dml", "qnn", "openvino-cpu"} <= set(table)
    assert not {"coreml", "nnapi", "xnnpack"} & set(table)  # no preset: quantize refuses them
    for name, preset in table.items():
        assert resolve_ep(name).quantize is preset
        assert preset.format in FORMATS, name
        assert preset.activation_type in QUANT_TYPES and preset.weight_type in QUANT_TYPES, name
        assert preset.reason and preset.source, name
        assert preset.dynamic_op_types is None or (preset.dynamic_op_types and "Conv" not in preset.dynamic_op_types), (
            name
        )


def test_presets_hold_the_documented_choices():
    table = presets()
    cpu, trt, qnn = table["cpu"], table["tensorrt"], table["qnn"]
    assert (cpu.format, cpu.activation_type, cpu.weight_type, cpu.per_channel, cpu.symmetric) == (
        "qdq",
        "uint8",
        "int8",
        True,
        False,
    )
    assert (trt.activation_type, trt.weight_type, trt.symmetric) == ("int8", "int8", True)
    assert (qnn.activation_type, qnn.weight_type, qnn.per_channel) == ("uint16", "uint8", False)
    assert [name for name, preset in table.items() if preset.requires_static_shapes] == ["qnn"]


def test_resolve_settings_applies_overrides_and_dynamic_rules():
    static = resolve_settings(QuantizeOptions(mode="static", ep="trt"))  # an alias resolves to the EP's name
    assert static["preset"] == "tensorrt" and static["format"] == "qdq" and static["op_types"] is None
    assert static["extra_options"] == {"ActivationSymmetric": True, "WeightSymmetric": True}
    override = resolve_settings(QuantizeOptions(mode="static", ep="cpu", per_channel=False, activation_type="int8"))
    assert (override["per_channel"], override["activation_type"], override["weight_type"]) == (False, "int8", "int8")
    dynamic = resolve_settings(QuantizeOptions(mode="dynamic", ep="cuda"))
    assert dynamic["format"] == "qoperator"
    assert dynamic["op_types"] == ["MatMul", "Gemm", "Attention", "LSTM", "EmbedLayerNormalization", "Gather"]
    assert resolve_settings(QuantizeOptions(mode="dynamic", ep="cuda", format="qdq"))["format"] == "qdq"
    with pytest.raises(UsageError, match="no quantization preset for 'coreml'"):
        resolve_settings(QuantizeOptions(mode="static", ep="coreml"))


# --- graph edits ---------------------------------------------------------------------------------


def test_constants_to_initializers_gives_the_exact_graph():
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["W"], name="weight", value=numpy_helper.from_array(weight)),
         helper.make_node("MatMul", ["x", "W"], ["y"], name="project")],
        "constant_weight",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = models.make(graph)
    assert constants_to_initializers(model) == 1
    assert [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == [
        ("project", "MatMul", ["x", "W"], ["y"])]
    assert [t.name for t in model.graph.initializer] == ["W"]
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), weight)
    onnx.checker.check_model(model, full_check=True)
    assert constants_to_initializers(model) == 0  # nothing left to move


def test_with_outputs_exposes_only_what_the_graph_computes(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["mid"], name="relu"), helper.make_node("Neg", ["mid"], ["y"], name="neg")],
        "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "chain.onnx"
    onnx.save_model(models.make(graph), str(path))
    exposed = with_outputs(path, ["mid", "ghost", "y", "x"])
    assert exposed == tmp_path / "chain.exposed.onnx"
    assert [v.name for v in onnx.load(str(exposed)).graph.output] == ["y", "mid"]
    assert [v.name for v in onnx.load(str(path)).graph.output] == ["y"]  # the original is untouched


def test_name_nodes_names_unnamed_nodes_by_op_and_index(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"], name="negate"),
         helper.make_node("Relu", ["b"], ["y"])],
        "unnamed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "unnamed.onnx"
    onnx.save_model(models.make(graph), str(path))
    name_nodes(path)
    assert [n.name for n in onnx.load(str(path)).graph.node] == ["Relu_0", "negate", "Relu_2"]


def test_sentinel_readers_are_the_nodes_reading_inf_nan_or_huge_constants():
    graph = helper.make_graph(
        [helper.make_node("Max", ["x", "minus_inf"], ["a"], name="safe_max"),
         helper.make_node("Min", ["a", "huge"], ["b"], name="clip_huge"),
         helper.make_node("Add", ["b", "one"], ["y"], name="plain_add")],
        "sentinels", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(-np.inf, np.float32), "minus_inf"),
         numpy_helper.from_array(np.array(3e38, np.float32), "huge"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    assert sentinel_readers(models.make(graph)) == ["safe_max", "clip_huge"]


def test_already_quantized_and_stats_read_a_qdq_graph():
    qdq = models.qdq_relu()
    found = already_quantized(qdq)
    assert found == "1 QuantizeLinear, 1 DequantizeLinear; 0 8-bit (or smaller) integer weight tensor(s)"
    assert quantization_stats(qdq) == {"quantized_ops": 1, "quantized_weights": 0,  # the Relu reads the DQ
                                       "quantized_weight_share": None}  # no weight at all
    assert already_quantized(models.matmul_weights()) is None
    float_weights = models.matmul_weights()
    assert quantization_stats(float_weights) == {
        "quantized_ops": 0,
        "quantized_weights": 0,
        "quantized_weight_share": 0.0,
    }


def test_weight_share_counts_integer_and_float_weight_values():
    """One MatMul's 16x8 weight stored as int8 (through a DequantizeLinear), the other's 8x4 kept
    float: 128 of 160 weight values are integers; the scale and zero point are scalars."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.integers(-100, 100, (16, 8)).astype(np.int8), "Wq"),
        numpy_helper.from_array(np.array(0.01, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
        numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W2"),
    ]
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["W1"], name="dq"),
                               helper.make_node("MatMul", ["x", "W1"], ["h"], name="m1"),
                               helper.make_node("MatMul", ["h", "W2"], ["y"], name="m2")], "mixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    stats = quantization_stats(models.make(graph))
    assert stats["quantized_weight_share"] == pytest.approx(128 / 160, abs=1e-4)
    assert stats["quantized_ops"] == 1 and stats["quantized_weights"] == 1


# --- evaluation ----------------------------------------------------------------------------------


def _matmul_then(tmp_path: Path, name: str, scale: float | None) -> Path:
    """y = x @ W, optionally times ``scale`` (a second, distorted copy of the same model)."""
    weight = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m" if scale is not None else "y"], name="matmul")]
    inits = [numpy_helper.from_array(weight, "W")]
    if scale is not None:
        nodes.append(helper.make_node("Mul", ["m", "s"], ["y"], name="scale"))
        inits.append(numpy_helper.from_array(np.array(scale, np.float32), "s"))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(models.make(graph), str(path))
    return path


def _feeds(count: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.default_rng(seed).standard_normal((2, 32)).astype(np.float32)} for seed in range(count)]


def test_evaluate_identical_model_passes_the_gate(tmp_path):
    from ortprep.steps.quantize.evaluate import evaluate

    reference = _matmul_then(tmp_path, "float", None)
    same = _matmul_then(tmp_path, "same", None)
    result = evaluate(reference, same, _feeds(), min_cosine=0.99)
    assert result.passed is True and result.error is None
    assert result.cosine == 1.0 and result.max_abs_diff == 0.0
    assert result.sample_cosines == [1.0, 1.0, 1.0, 1.0]
    assert result.spread == {"samples": 4, "min": 1.0, "median": 1.0, "max": 1.0}
    assert [o["name"] for o in result.outputs] == ["y"] and result.outputs[0]["judged_by"] == "cosine"


def test_evaluate_output_scaled_by_half(tmp_path):
    # Cosine does not see scale; the gate also holds each output's norm within 2% of the float
    # model's, so an output scaled by 0.5 fails on its norm ratio at cosine 1. A sign flip fails on cosine.
    from ortprep.steps.quantize.evaluate import evaluate

    reference = _matmul_then(tmp_path, "float", None)
    feeds = _feeds()
    halved = evaluate(reference, _matmul_then(tmp_path, "halved", 0.5), feeds, min_cosine=0.99)
    assert halved.passed is False and halved.cosine == pytest.approx(1.0, abs=1e-9)
    assert halved.norm_ratio == pytest.approx(0.5)
    expected_abs = max(float(np.abs(f["x"] @ _weight()).max()) * 0.5 for f in feeds)
    assert halved.max_abs_diff == pytest.approx(expected_abs, rel=1e-5)
    flipped = evaluate(reference, _matmul_then(tmp_path, "flipped", -1.0), feeds, min_cosine=0.99)
    assert flipped.passed is False and flipped.cosine == pytest.approx(-1.0, abs=1e-9)


def test_evaluate_flat_output_scaled_by_half_fails_the_gate(tmp_path):
    # an output the samples leave constant is judged by absolute error against its scale, so
    # there halving it fails the gate
    def constant_output(name: str, value: float) -> Path:
        graph = helper.make_graph(
            [helper.make_node("Mul", ["x", "zero"], ["z"], name="zero_out"),
             helper.make_node("Add", ["z", "c"], ["y"], name="offset")],
            name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
            [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(value, np.float32), "c")])
        path = tmp_path / f"{name}.onnx"
        onnx.save_model(models.make(graph), str(path))
        return path

    from ortprep.steps.quantize.evaluate import evaluate

    reference = constant_output("float", 2.0)
    same = evaluate(reference, constant_output("same", 2.0), _feeds(), min_cosine=0.99)
    assert same.passed is True and same.degenerate == [("y", "constant (2)")]
    halved = evaluate(reference, constant_output("halved", 1.0), _feeds(), min_cosine=0.99)
    assert halved.passed is False and halved.max_abs_diff == 1.0
    assert halved.outputs[0]["judged_by"] == "absolute error <= 0.1 (output constant (2))"


def _weight() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)


# --- the search's selection logic ----------------------------------------------------------------

NOISE = {"m1": 0.001, "m2": 0.05, "m3": 0.002, "m4": 0.003}  # what quantizing each node costs the cosine


def _chain() -> onnx.ModelProto:
    """x -> m1 -> m2 -> m3 -> m4 -> y, four MatMuls with a 4x4 weight each (16 elements: equal cost)."""
    rng = np.random.default_rng(1)
    names = ["x", "a1", "a2", "a3", "y"]
    nodes = [helper.make_node("MatMul", [names[i], f"W{i + 1}"], [names[i + 1]], name=f"m{i + 1}") for i in range(4)]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), f"W{i + 1}") for i in range(4)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return models.make(graph)


def _search(max_float_share: float, max_trials: int = 10) -> tuple[Search, list[list[str]]]:
    attempted: list[list[str]] = []

    def attempt(kept: list[str], label: str) -> Trial:
        attempted.append(list(kept))
        cosine = round(1 - sum(cost for node, cost in NOISE.items() if node not in kept), 6)
        return Trial(label, list(kept), cosine, cosine >= 0.99, 100)

    def rank(trial: Trial, kept: list[str]) -> list[tuple[str, list[str], float]]:
        # the quantized model's name for m2 (dynamic quantization appends _quant) maps back to m2
        return [("a1", ["m2_quant"], 0.5), ("x", ["m1"], 0.1), ("a3", ["m4"], 0.01)]

    proto = _chain()
    search = Search(proto, attempt, rank, quantizable_nodes={n.name for n in proto.graph.node},
                    max_float_share=max_float_share, budget=Budget(probes=max_trials), fixed=[], aim=margin_aim(0.99))
    return search, attempted


def test_rule_sets_of_a_matmul_chain():
    assert rule_sets(_chain()) == [("heads (the last Conv/MatMul/Gemm before each output)", ["m4"])]


def test_search_keeps_the_rule_that_helps_then_bisects_the_ranked_tensors():
    search, attempted = _search(max_float_share=1.0)
    assert search.aim == pytest.approx(0.995)
    baseline = Trial("baseline", [], 0.944, False, 100)
    result = search.run(baseline)
    # the heads rule keeps m4 and what writes its input (m3): 0.944 -> 0.949, kept; then the ranked
    # tensors: the worst two pass (1.0), bisected to the worst one (m2: 0.999)
    assert attempted == [["m4", "m3"], ["m4", "m3", "m2", "m1"], ["m4", "m3", "m2"]]
    assert [t.label for t in result.trials] == [
        "baseline", "rule: heads (the last Conv/MatMul/Gemm before each output)",
        "ranked (pass 1): worst 2 tensor(s), 2 node(s)", "ranked (pass 1): worst 1 tensor(s), 1 node(s)"]
    assert result.best.kept == ["m4", "m3", "m2"] and result.best.cosine == pytest.approx(0.999)
    assert result.stopped == "the gate passed with the margin"
    assert result.rules == [{"rule": "heads (the last Conv/MatMul/Gemm before each output)", "nodes": 2,
                             "cosine_before": 0.944, "cosine_after": 0.949, "kept": True}]
    assert [r["tensor"] for r in result.ranked] == ["a1", "x"]  # a3's nodes are already kept
    assert result.reasons["m2"] == "ranked #1: keeps tensor 'a1' float (quantization noise 0.5 of its median magnitude)"
    assert result.reasons["m4"] == ("rule: heads (the last Conv/MatMul/Gemm before each output) "
                                    "(cosine 0.9440 -> 0.9490)")


def test_search_stops_at_the_weight_budget():
    search, attempted = _search(max_float_share=0.5)  # at most 2 of the 4 equal weights may stay float
    result = search.run(Trial("baseline", [], 0.944, False, 100))
    assert attempted == [["m4", "m3"]]  # the rule fits the budget exactly; no ranked prefix does
    assert result.best.kept == ["m4", "m3"]
    assert result.stopped == "keeping more in float would leave less than 50% of the weights quantized"


def test_search_stops_at_the_trial_limit():
    search, attempted = _search(max_float_share=1.0, max_trials=2)  # the baseline and one more
    result = search.run(Trial("baseline", [], 0.944, False, 100))
    assert attempted == [["m4", "m3"]]
    # past the limit, the bisection from the float end has no point between the best trial and the
    # float model: keeping m2 float keeps m1 (what writes its input), and that is every node left
    assert result.stopped == ("the trial limit (2) was reached; only the float model is past it: keeping the first of "
                              "the 2 node(s) still quantized in float keeps them all (with what writes their inputs)")
    assert result.best.cosine == pytest.approx(0.949)


def test_ok_needs_the_gate_and_the_aim():
    search, _ = _search(max_float_share=1.0)
    assert search.ok(Trial("t", [], 0.996, True, 1)) is True
    assert search.ok(Trial("t", [], 0.993, True, 1)) is False  # passes the gate, short of the margin
    assert search.ok(Trial("t", [], 0.999, False, 1)) is False


# --- data --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "share"), [(10, 0.5), (20, 0.4), (40, 0.2), (100, 0.2), (0, 0.2)])
def test_held_back_share(count, share):
    assert held_back_share(count) == pytest.approx(share)


def test_cpu_preset_uses_7_bit_weights_where_int8_saturates():
    """U8S8 on an x86-64 CPU without VNNI saturates in ORT's int8 kernels (runtime/cpu.py: one
    per-channel MatMul measured 0.9395 fused vs 0.99986 unfused here): the CPU preset then uses 7-bit
    weights; other EPs' presets never do."""
    from ortprep.options import QuantizeOptions
    from ortprep.runtime.cpu import int8_saturates
    from ortprep.steps.quantize.presets import resolve_settings

    cpu = resolve_settings(QuantizeOptions(mode="static", calib="random", ep="cpu"))
    assert cpu["reduce_range"] is bool(int8_saturates())
    assert resolve_settings(QuantizeOptions(mode="static", calib="random", ep="qnn"))["reduce_range"] is False
    assert (
        resolve_settings(QuantizeOptions(mode="static", calib="random", ep="cpu", activation_type="int8"))[
            "reduce_range"
        ]
        is False
    )


def test_batch_norms_are_folded_into_their_convs(tmp_path):
    """Where ORT's pre-processing fails, quantize folds each Conv -> BatchNormalization itself
    (PP-OCR's direction classifier: a standing BatchNormalization, quantized, parted QNN from the
    CPU EP at cosine 0.32). The folded model computes the same; a model with nothing to fold is
    left alone."""
    import onnxruntime as ort

    from ortprep.steps.quantize.calibrate import fuse_bn_into_conv

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.uniform(0.1, 3, 8).astype(np.float32), "var")]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
            helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], name="bn"),
            helper.make_node("Relu", ["b"], ["y"], name="relu"),
        ],
        "convbn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        inits,
    )
    source = tmp_path / "convbn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    folded = fuse_bn_into_conv(source, tmp_path / "folded.onnx")
    assert folded is not None and "BatchNormalization" not in [n.op_type for n in onnx.load(str(folded)).graph.node]
    feed = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # ORT must not fold it for us
    expected = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = ort.InferenceSession(str(folded), options, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    plain = tmp_path / "plain.onnx"
    onnx.save(models.matmul_weights(), plain)  # no BatchNormalization at all
    assert fuse_bn_into_conv(plain, tmp_path / "none.onnx") is None and not (tmp_path / "none.onnx").exists()


def _wide_activations(path, size: int, layers: int):
    """1x1 Convs on a 1x4xSIZExSIZE image: each activation is 16 * SIZE^2 bytes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, name = [], [], "x"
    for layer in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.5, f"w{layer}"))
        nodes.append(helper.make_node("Conv", [name, f"w{layer}"], [f"c{layer}"], name=f"conv{layer}"))
        name = f"c{layer}"
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4, size, size])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_histogram_calibration_strides_within_the_activation_budget(tmp_path):
    """Percentile and entropy calibration keep every activation of a stride's samples (the issue's
    7.3-8.7 GB for a layout detector): the stride is as many samples as 512 MB of activations
    takes, and a model whose one sample exceeds that is refused with the numbers."""
    from ortprep.steps.quantize.calibrate import activation_bytes, histogram_stride

    small = _wide_activations(tmp_path / "small.onnx", 256, 6)  # 6 x 1 MB per sample
    assert activation_bytes(small) == 6 * 16 * 256 * 256
    assert histogram_stride(small, 24) == (8, "")
    middle = _wide_activations(tmp_path / "middle.onnx", 1024, 8)  # 8 x 16 MB = 128 MB: 4 samples fit
    assert histogram_stride(middle, 24) == (4, "") and histogram_stride(middle, 21) == (3, "")
    big = _wide_activations(tmp_path / "big.onnx", 1024, 40)  # 640 MB per sample
    stride, why = histogram_stride(big, 24)
    assert stride is None and "640 MB per sample" in why and "--method minmax" in why
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(10):
        np.savez(
            calib / f"{index}.npz",
            x=np.random.default_rng(index).standard_normal((1, 4, 1024, 1024)).astype(np.float32),
        )
    result = invoke("quantize", big, "--static", "--method", "percentile", "--calib", calib, "-o", tmp_path / "q.onnx",
                    "--no-verify", "--json")
    assert result.exit_code == 1 and not (tmp_path / "q.onnx").exists()
    assert "640 MB per sample" in result.stdout


def test_the_search_starts_no_trial_past_its_time_bound():
    """--search-seconds: the search stops starting trials once its time is up, keeps the best so
    far, and says which limit stopped it (the trial limit is far away here). Each trial is a
    Trial the search's own callables return: what is tested is the search's bookkeeping."""
    import time

    from ortprep.steps.quantize.strategy import Search
    from ortprep.steps.quantize.trials import Trial

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["y0"], name="mm0")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((4, 4), np.float32), "w0")],
    )
    proto = helper.make_model(graph)
    started = []

    def attempt(kept, label):
        started.append(label)
        time.sleep(0.2)
        return Trial(label, list(kept), 0.5, False, 1)

    def blame(trial, kept):  # always one node where the error starts, never fixed
        return [("mm0", "MatMul", 0.5)] if "mm0" not in kept else []

    search = Search(proto, attempt, lambda trial, kept: [], quantizable_nodes={"mm0"}, max_float_share=1.0,
                    budget=Budget(probes=50, seconds=0.1), fixed=[], blame=blame)
    time.sleep(0.15)
    result = search.run(Trial("baseline", [], 0.5, False, 1))
    assert started == []  # the bound had passed before the first trial
    assert result.stopped.startswith("the time bound (0.1 s, --search-seconds) was reached")
    unbounded = Search(proto, attempt, lambda trial, kept: [], quantizable_nodes={"mm0"}, max_float_share=1.0,
                       budget=Budget(probes=50), fixed=[], blame=blame)
    assert "time bound" not in unbounded.run(Trial("baseline", [], 0.5, False, 1)).stopped and started
    # --auto's later attempt, given what the earlier ones left (nothing): said as such, not "a bound of 0 s"
    spent = Search(proto, attempt, lambda trial, kept: [], quantizable_nodes={"mm0"}, max_float_share=1.0,
                   budget=Budget(probes=50, seconds=0.0), fixed=[], blame=blame)
    assert spent.run(Trial("baseline", [], 0.5, False, 1)).stopped.startswith("no search time was left")


def test_activation_bytes_of_a_dynamic_model_come_from_a_sample(tmp_path):
    """A detector exported with [N, 4, H, W]: the graph alone gives no sizes, a calibration
    sample's shape does (the bound holds for dynamic models too)."""
    from ortprep.steps.quantize.calibrate import activation_bytes, histogram_stride

    model = _wide_activations(tmp_path / "m.onnx", 1024, 40)
    proto = onnx.load(str(model))
    for dim, name in zip(proto.graph.input[0].type.tensor_type.shape.dim, ("N", None, "H", "W")):
        if name:
            dim.dim_param = name
    proto.graph.output[0].type.tensor_type.shape.Clear()
    onnx.save(proto, str(model))
    assert activation_bytes(model) is None
    assert activation_bytes(model, {"x": [1, 4, 1024, 1024]}) == 40 * 16 * 1024 * 1024
    stride, why = histogram_stride(model, 24, {"x": [1, 4, 1024, 1024]})
    assert stride is None and "640 MB per sample" in why
    assert histogram_stride(model, 24, {"x": [1, 4, 256, 256]}) == (8, "")


def test_error_rankings_expose_intermediates_in_bounded_groups_with_the_same_result(tmp_path, monkeypatch):
    """The search's blame (worst_nodes) and noise (tensor_noise) rankings read every intermediate of
    both models. Under a budget of a few bytes each tensor is exposed by a run of its own, and the
    rankings are the same as when one run exposes them all (memory bounded, nothing lost)."""
    from ortprep.steps.quantize import calibrate
    from ortprep.steps.quantize import diagnose as evaluate

    rng = np.random.default_rng(5)
    first = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    first[0, :] = 500.0  # an outlier row: the first MatMul's 8-bit weights lose most of it
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="outlier_mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="head_mm"),
        ],
        "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            numpy_helper.from_array(first, "w1"),
            numpy_helper.from_array((rng.standard_normal((16, 8)) / 4).astype(np.float32), "w2"),
        ],
    )
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    feeds = []
    for index in range(16):
        x = rng.standard_normal((1, 16)).astype(np.float32)
        x[0, 0] = 1e-4
        np.savez(calib / f"{index:02d}.npz", x=x)
        feeds.append({"x": x})
    result = invoke("quantize", model, "--static", "--calib", calib, "-o", tmp_path / "q.onnx", "--metric", "y=cosine",
                    "--keep-failed", "--min-cosine", "1.0", "--json")
    quantized = tmp_path / "q.failed.onnx" if (tmp_path / "q.failed.onnx").exists() else tmp_path / "q.onnx"
    assert quantized.exists(), result.stdout
    whole_blame = evaluate.worst_nodes(model, quantized, feeds[0], set(), limit=None)
    whole_noise = evaluate.tensor_noise(model, quantized, feeds[:4])
    assert len(calibrate.exposure_chunks(model, ["h", "r", "y"], feeds[:4])) == 1
    monkeypatch.setattr(calibrate, "EXPOSED_BYTES", 8)
    assert len(calibrate.exposure_chunks(model, ["h", "r", "y"], feeds[:4])) == 3  # a run per tensor
    assert evaluate.worst_nodes(model, quantized, feeds[0], set(), limit=None) == whole_blame
    assert evaluate.tensor_noise(model, quantized, feeds[:4]) == whole_noise
    assert whole_blame and whole_blame[0][0] == "outlier_mm"  # where the error starts


def test_search_goes_on_below_the_noise_floor_before_it_stops():
    """Nothing ranks above the noise floor, yet the gate fails (a decision near its boundary needs
    less error): the tensors below the floor are ranked next, bisected, and the fewest that pass
    are kept; without a fine ranking the search stops short, saying nothing adds measurable error."""
    noise = {"m1": 0.002, "m2": 0.004, "m3": 0.0005, "m4": 0.0}
    attempted: list[list[str]] = []

    def attempt(kept: list[str], label: str) -> Trial:
        attempted.append(list(kept))
        cosine = round(1 - sum(cost for node, cost in noise.items() if node not in kept), 6)
        return Trial(label, list(kept), cosine, cosine >= 0.998, 100)

    proto = _chain()
    fine = [("a1", ["m2"], 0.015), ("x", ["m1"], 0.008), ("a2", ["m3"], 0.001)]
    common = dict(
        quantizable_nodes={n.name for n in proto.graph.node},
        max_float_share=1.0,
        budget=Budget(probes=20),
        fixed=[],
        aim=0.998,
    )
    result = Search(proto, attempt, lambda trial, kept: [], fine_rank=lambda trial, kept: fine, **common).run(
        Trial("baseline", [], 0.9935, False, 100))
    assert result.stopped == "the gate passed with the margin"
    # the heads rule keeps m4 and m3 first (0.9935 -> 0.994); then m2 and m1 from below the floor
    # pass (1.0), bisected to m2 alone (0.998)
    assert result.best.kept == ["m4", "m3", "m2"] and result.best.cosine == pytest.approx(0.998)
    assert [t.label for t in result.trials[-2:]] == [
        "ranked below the noise floor (pass 1): worst 2 tensor(s), 2 node(s)",
        "ranked below the noise floor (pass 1): worst 1 tensor(s), 1 node(s)",
    ]
    short = Search(proto, attempt, lambda trial, kept: [], **common).run(Trial("baseline", [], 0.9935, False, 100))
    assert short.stopped.startswith("no quantized tensor left adds measurable error; only the float model is past it")
    assert short.best.cosine == pytest.approx(0.994)
    # the same search where the CPU EP passes and the target EP fails: the stop says the ranking's
    # noise is the CPU's, where nothing is left to find, and the error is the EP's

    def on_ep(kept: list[str], label: str) -> Trial:
        trial = attempt(kept, label)
        trial.sides = {
            "judged_on": ["cpu", "qnn"],
            "cpu": {"ep": "cpu", "passed": True},
            "ep": {"ep": "qnn", "passed": False},
        }
        trial.passed = False
        return trial

    ep_only = Search(proto, on_ep, lambda trial, kept: [], **common).run(on_ep([], "baseline"))
    # (no bisection from the float end: where only the EP fails, the float model need not pass there)
    assert ep_only.stopped == ("no quantized tensor left adds measurable error on the CPU EP, where it passes; what "
                               "fails is qnn's own error, which that ranking does not see")


def test_search_reads_decisions_where_the_cosine_cannot_show_progress():
    """A classifier whose cosine is 0.9999 in every trial, failing the gate on its decision alone
    (its expected agreement short of 99%): keeping the worst-ranked tensors float brings the
    decision closer, and the search keeps them and ranks again until the gate passes. Judged by
    cosine alone, it stopped after the first ranked trial, saying it did not improve."""
    shortfall = {"m1": 0.004, "m2": 0.012, "m3": 0.0, "m4": 0.0}
    attempted: list[list[str]] = []

    def attempt(kept: list[str], label: str) -> Trial:
        attempted.append(list(kept))
        short = round(sum(cost for node, cost in shortfall.items() if node not in kept), 6)
        return Trial(label, list(kept), 0.9999, short == 0, 100, shortfall=short)

    ranks = iter([[("a1", ["m2"], 0.05)], [("x", ["m1"], 0.03)]])
    proto = _chain()
    common = dict(
        quantizable_nodes={n.name for n in proto.graph.node},
        max_float_share=1.0,
        budget=Budget(probes=20),
        fixed=[],
        aim=0.995,
    )
    result = Search(proto, attempt, lambda trial, kept: next(ranks, []), **common).run(
        Trial("baseline", [], 0.9999, False, 100, shortfall=0.016))
    assert result.stopped == "the gate passed with the margin"
    # the heads rule (m4 and what feeds it) changes nothing and is not kept; m2 brings the decision
    # 1.2 points closer: kept, ranked again; m1 passes
    assert attempted == [["m4", "m3"], ["m2"], ["m2", "m1"]]
    assert result.best.kept == ["m2", "m1"] and result.best.shortfall == 0
    assert result.rules[0]["kept"] is False
    assert result.reasons["m2"].startswith("ranked #1: keeps tensor 'a1' float")
    # the same trials without the shortfall: the cosine never moves, and the search stops at the first ranked trial
    ranks = iter([[("a1", ["m2"], 0.05)], [("x", ["m1"], 0.03)]])
    blind = Search(
        proto,
        lambda kept, label: Trial(label, list(kept), 0.9999, False, 100),
        lambda trial, kept: next(ranks, []),
        **common,
    ).run(Trial("baseline", [], 0.9999, False, 100))
    assert blind.stopped.startswith("keeping the 1 nodes around the 1 worst-ranked tensors in float did not improve")
    assert blind.best.kept == []


def _fan() -> onnx.ModelProto:
    """x -> m1..m6 (six MatMuls side by side) -> Sum -> m7 -> y: keeping one of m1..m6 float keeps no
    other (their input is the graph's)."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", f"W{i}"], [f"a{i}"], name=f"m{i}") for i in range(1, 7)]
    nodes += [helper.make_node("Sum", [f"a{i}" for i in range(1, 7)], ["s"], name="sum"),
              helper.make_node("MatMul", ["s", "W7"], ["y"], name="m7")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), f"W{i}") for i in range(1, 8)]
    graph = helper.make_graph(nodes, "fan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return models.make(graph)


FAN_NOISE = {"m1": 0.001, "m2": 0.004, "m3": 0.003, "m4": 0.0005, "m5": 0.0, "m6": 0.0, "m7": 0.0}


def _fan_search(needed: float = 0.002, **overrides) -> tuple[Search, list[list[str]]]:
    """A search whose ranking points at a node that adds nothing (m5), so that its own phases stop
    short ("did not improve"); the fine ranking knows m2, m3 and m1. A trial passes when the
    noise of the nodes left quantized is at most ``needed``."""
    attempted: list[list[str]] = []

    def attempt(kept: list[str], label: str) -> Trial:
        attempted.append(list(kept))
        cosine = round(1 - sum(cost for node, cost in FAN_NOISE.items() if node not in kept), 6)
        return Trial(label, list(kept), cosine, cosine >= 1 - needed, 100, path=Path(label))

    proto = _fan()
    settings = dict(
        quantizable_nodes={f"m{i}" for i in range(1, 8)},
        max_float_share=1.0,
        budget=Budget(probes=20),
        fixed=[],
        aim=0.998,
        fine_rank=lambda trial, kept: [("a2", ["m2"], 0.04), ("a3", ["m3"], 0.03), ("a1", ["m1"], 0.01)],
    )
    seconds = overrides.pop("seconds", None)
    settings.update(overrides, budget=Budget(probes=20, seconds=seconds))
    return Search(proto, attempt, lambda trial, kept: [("a5", ["m5"], 0.05)], **settings), attempted


def test_search_converges_from_the_float_end():
    """Where the search's own phases stop short of the gate (the ranked node does not help), the
    nodes still quantized are ordered by the noise they add and bisected against the float model:
    it ends at the fewest that pass (m2 and m3), where it used to stop and refuse."""
    search, attempted = _fan_search()
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert result.best.passed and result.best.kept == ["m2", "m3"]
    assert result.best.cosine == pytest.approx(0.9985)
    # the heads rule (m7 and the Sum) and the ranked m5 change nothing; then 3 of the 7 ordered
    # nodes (m2, m3, m1: 0.9995) pass, 1 (m2: 0.9955) fails, 2 (m2, m3) pass
    assert attempted[-3:] == [["m2", "m3", "m1"], ["m2"], ["m2", "m3"]]
    assert [t.label for t in result.trials[-3:]] == [f"from the float end: {n} node(s) kept float, the first {n} of 7"
                                                     for n in (3, 1, 2)]
    assert result.stopped == (
        "keeping the 1 nodes around the 1 worst-ranked tensors in float did not improve the result; "
        "then the bisection from the float end passed the gate with the margin, keeping 2 more "
        "node(s) in float (the first 2 of the 7 still quantized)"
    )
    assert result.reasons["m3"] == "from the float end: #2 by the noise it adds (the fewest kept float that pass)"
    assert "m1" not in result.reasons


def test_search_says_when_only_the_float_model_passes():
    search, attempted = _fan_search(needed=0.0)  # any quantized noise fails, m4's 0.0005 included
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert not result.best.passed
    # never all 7 groups (m7's brings the Sum that writes its input): the float model is not run
    assert [t.label for t in result.trials[-3:]] == [
        f"from the float end: {n + (n > 3)} node(s) kept float, the first {n} of 7" for n in (3, 5, 6)
    ]
    assert attempted[-1] == ["m2", "m3", "m1", "m7", "sum", "m6", "m5"]
    assert result.stopped.endswith("; the bisection from the float end found no pass short of the float model "
                                   "(keeping the first 6 of the 7 nodes still quantized in float failed)")


def test_float_end_bisection_keeps_the_weight_cap_and_the_time_bound():
    # at most 2 of the 7 equal weights float: the nearest point to the float end is run (it passes),
    # then bisected
    search, attempted = _fan_search(max_float_share=2 / 7 + 1e-6)
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert attempted[-2:] == [["m2", "m3"], ["m2"]] and result.best.kept == ["m2", "m3"] and result.best.passed
    capped, attempted = _fan_search(max_float_share=1 / 7 + 1e-6)
    result = capped.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert attempted[-1] == ["m2"] and not result.best.passed
    assert result.stopped.endswith("keeping the first 1 of the 7 nodes still quantized in float (the most "
                                   f"--max-float-share {1 / 7 + 1e-6:g} allows) did not pass either")
    spent, attempted = _fan_search(seconds=0.0)
    result = spent.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert attempted == [] and result.stopped == spent.limit_reached() and "float end" not in result.stopped


def test_search_gives_16_bits_before_it_keeps_nodes_float():
    """With a 16-bit rung (static, 8-bit activations), the ranked tensors get 16 bits, the worst 1,
    then 2 (a2 and a3: their nodes' noise gone, 0.9985 passes), before any node is kept float; the
    weights stay quantized."""
    search, attempted = _fan_search()
    tensors_of = {"a1": "m1", "a2": "m2", "a3": "m3"}
    widened: list[list[str]] = []

    def attempt_wide(kept: list[str], tensors: list[str], label: str) -> Trial:
        widened.append(list(tensors))
        quiet = {tensors_of[t] for t in tensors}
        cosine = round(1 - sum(cost for node, cost in FAN_NOISE.items() if node not in kept and node not in quiet), 6)
        return Trial(label, list(kept), cosine, cosine >= 0.998, 100, path=Path(label), wide=list(tensors))

    search.attempt_wide = attempt_wide
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert widened == [["a2"], ["a2", "a3"]]
    assert result.best.wide == ["a2", "a3"] and result.best.kept == [] and result.best.passed
    assert not any(t.label.startswith("from the float end") for t in result.trials)
    assert result.stopped.endswith("then 16-bit activations on the 2 worst-ranked tensor(s) passed the gate with the "
                                   "margin (the weights stay as asked)")
    assert result.best.to_record(100)["activations_16bit"] == 2
    # where no count of 16-bit tensors passes, the float end follows
    search, attempted = _fan_search()
    search.attempt_wide = lambda kept, tensors, label: Trial(label, list(kept), 0.99, False, 100, path=Path(label),
                                                             wide=list(tensors))
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert [t.label for t in result.trials if t.wide] == [f"16-bit activations: the worst {n} of 3 ranked tensor(s)"
                                                         for n in (1, 2, 3)]
    assert "16-bit activations on the worst 1 to 3 of 3 ranked tensors did not pass" in result.stopped
    assert result.best.kept == ["m2", "m3"] and result.best.passed


def test_rung_that_runs_out_of_time_says_so():
    """The time bound falls while the rung ranks its tensors: no trial runs, the search says which
    bound, and nothing raises."""
    search, attempted = _fan_search(seconds=20)
    search.attempt_wide = lambda kept, tensors, label: Trial(label, list(kept), 0.99, False, 100, path=Path(label),
                                                             wide=list(tensors))
    ranking = search.fine_rank

    def slow_rank(trial, kept):
        search.budget.started = time.monotonic() - 21  # the bound (20 s) falls during the ranking
        return ranking(trial, kept)

    search.fine_rank = slow_rank
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert not any(t.wide for t in result.trials)
    assert result.stopped.endswith("16-bit activations on the worst 1 to 0 of 3 ranked tensors did not pass (then: "
                                   "the time bound (20 s, --search-seconds) was reached)")


def test_rung_pass_short_of_the_margin_is_kept_after_the_float_end():
    """Two 16-bit tensors pass the gate but not the margin; the float end (from the trial before
    the rung, every tensor at 8 bits) finds nothing better within the cap: the rung's trial is the
    result, and the float end's trials carried no 16-bit tensor."""
    search, attempted = _fan_search(max_float_share=1 / 7 + 1e-6, seconds=20)

    def attempt_wide(kept, tensors, label):
        short = len(tensors) >= 2
        return Trial(label, list(kept), 0.996 if short else 0.99, short, 100, path=Path(label), wide=list(tensors))

    search.attempt_wide = attempt_wide
    search.aim = 0.998
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert result.best.wide == ["a2", "a3"] and result.best.passed and not search.ok(result.best)
    assert result.stopped.endswith("; the best kept is the rung's: 16-bit activations on 2 tensor(s), passing the gate "
                                   "short of the margin")
    assert all(not t.wide for t in result.trials if t.label.startswith("from the float end"))


def test_int8_compute_matmuls_skips_a_transposed_gemm():
    """A 16-bit activation into a MatMul and into a Gemm without transposes (ORT's CPU EP fuses both
    into MatMulNBits at accuracy level 4), and into a Gemm with transB=1 (PyTorch's Linear, which
    it does not fuse: measured, onnxruntime 1.32.0)."""
    from ortprep.transforms.qdq.facts import int8_compute_matmuls

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(0.01, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.uint16), "z16"),
        numpy_helper.from_array(np.array(0, np.int8), "z8"),
    ]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z16"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z16"], ["xd"], name="dq")]
    for name, op, attrs in (("plain", "MatMul", {}), ("gemm", "Gemm", {}), ("linear", "Gemm", {"transB": 1})):
        inits.append(numpy_helper.from_array(rng.integers(-9, 9, (8, 8)).astype(np.int8), f"{name}_w"))
        nodes += [helper.make_node("DequantizeLinear", [f"{name}_w", "s", "z8"], [f"{name}_wd"], name=f"{name}_dq"),
                  helper.make_node(op, ["xd", f"{name}_wd"], [f"{name}_y"], name=name, **attrs)]
    graph = helper.make_graph(
        nodes,
        "widths",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(f"{n}_y", TensorProto.FLOAT, [1, 8]) for n in ("plain", "gemm", "linear")],
        inits,
    )
    assert int8_compute_matmuls(models.make(graph, opset=21)) == ["plain", "gemm"]


def test_float_end_keeps_a_pass_short_of_the_margin_where_none_reaches_it():
    """No trial of the bisection reaches the margin (0.9999); three pass the gate (0.9995): the best
    of those is the result, as the search's own phases keep such a trial, not the failing baseline."""
    search, attempted = _fan_search(needed=0.006, aim=0.9999)
    result = search.run(Trial("baseline", [], 0.9915, False, 100, path=Path("baseline")))
    assert result.best.passed and not search.ok(result.best)
    assert result.best.cosine == pytest.approx(max(t.cosine for t in result.trials if t.passed and t.cosine))
    assert "passed the gate short of the margin at best" in result.stopped


def test_float_end_is_not_tried_where_only_the_target_ep_fails():
    """The CPU EP passes, the target EP fails: the float model need not pass on that EP either (it
    computes float in its own precision), so no bisection runs toward it."""
    search, attempted = _fan_search()

    def on_ep(kept: list[str], label: str) -> Trial:
        trial = Trial(label, list(kept), 0.999, False, 100, path=Path(label))
        trial.sides = {
            "judged_on": ["cpu", "qnn"],
            "cpu": {"ep": "cpu", "passed": True},
            "ep": {"ep": "qnn", "passed": False},
        }
        attempted.append(list(kept))
        return trial

    search.attempt = on_ep
    result = search.run(on_ep([], "baseline"))
    assert not any(t.label.startswith("from the float end") for t in result.trials)
    assert "float end" not in result.stopped


def test_decision_shortfall_is_the_largest_gap_to_the_gate():
    from ortprep.fidelity.decisions import decision_shortfall

    assert decision_shortfall(None) == 0.0
    assert decision_shortfall({"passed": True, "required": 0.99, "agreement": 0.5}) == 0.0
    assert decision_shortfall({"passed": None, "required": None, "agreement": 0.5}) == 0.0  # not gated
    top1 = {"passed": False, "required": 0.99, "agreement": 1.0, "expected_agreement": 0.968,
            "confidence": {"required": 0.99, "agreement": 0.95, "expected_agreement": 0.97}}
    assert decision_shortfall(top1) == pytest.approx(0.04)  # the confidence's 95% on the samples
    ctc = {"passed": False, "required": 0.99, "agreement": 0.995, "expected_agreement": 0.992,
           "required_sequences": 0.95, "sequence_agreement": 0.875, "expected_sequence_agreement": 0.9}
    assert decision_shortfall(ctc) == pytest.approx(0.075)
    mask = {"passed": False, "required": 0.98, "agreement": 0.989, "required_regions": 0.95, "region_agreement": 0.5}
    assert decision_shortfall(mask) == pytest.approx(0.45)


def test_margin_shortfall_asks_every_share_half_way_to_one():
    from ortprep.fidelity.decisions import margin_shortfall, with_margin

    assert with_margin(0.95) == pytest.approx(0.975) and with_margin(0.99) == pytest.approx(0.995)
    assert margin_shortfall(None) == 0.0
    assert margin_shortfall({"passed": None, "required": None, "agreement": 0.5}) == 0.0  # not gated
    # ddddocr's dynamic int8 of session 29: 23 of 24 strings pass the gate's 95%, not its margin
    ctc = {"passed": True, "required": 0.95, "agreement": 23 / 24, "expected_agreement": 0.968,
           "confidence": {"required": 0.95, "agreement": 1.0, "expected_agreement": 0.99}}
    assert margin_shortfall(ctc) == pytest.approx(0.975 - 23 / 24)
    # every share at the margin or above: nothing short
    assert margin_shortfall({**ctc, "agreement": 1.0, "expected_agreement": 0.975}) == 0.0
    # the nested and the region shares count too: a map whose regions hold 96% (the gate asks 95%)
    mask = {"passed": True, "required": 0.98, "agreement": 1.0, "required_regions": 0.95, "region_agreement": 0.96}
    assert margin_shortfall(mask) == pytest.approx(0.015)


def test_search_goes_on_past_a_pass_short_of_the_decision_margin():
    """A trial that passes the gate with its decisions short of the margin is not where the search
    stops: it keeps it (it improved) and ranks again, until a trial holds the margin too."""
    gaps = {"m2": 0.02, "m1": 0.01}  # what each node still quantized costs the decisions, in share points
    attempted: list[list[str]] = []

    def attempt(kept: list[str], label: str) -> Trial:
        attempted.append(list(kept))
        gap = round(sum(cost for node, cost in gaps.items() if node not in kept), 6)
        # the gate (95%) passes once m2 is float; the margin (97.5%) once m1 is too
        return Trial(label, list(kept), 0.9999, gap <= 0.02, 100, shortfall=max(0.0, gap - 0.02),
                     margin_gap=max(0.0, gap - 0.005))

    ranks = iter([[("a2", ["m2"], 0.05)], [("a1", ["m1"], 0.03)]])
    proto = _chain()
    search = Search(
        proto,
        attempt,
        lambda trial, kept: next(ranks, []),
        quantizable_nodes={n.name for n in proto.graph.node},
        max_float_share=1.0,
        budget=Budget(probes=20),
        fixed=[],
        aim=0.995,
    )
    assert search.ok(Trial("t", [], 0.9999, True, 1, margin_gap=0.005)) is False
    assert search.ok(Trial("t", [], 0.9999, True, 1, margin_gap=0.0)) is True
    result = search.run(Trial("baseline", [], 0.9999, False, 100, shortfall=0.01, margin_gap=0.025))
    assert result.stopped == "the gate passed with the margin"
    # heads (m4, m3) change nothing; m2 passes the gate short of the margin: kept, ranked again; m1 reaches it
    assert attempted == [["m4", "m3"], ["m2"], ["m2", "m1"]]
    assert result.best.kept == ["m2", "m1"] and result.best.margin_gap == 0.0
    assert result.trials[2].passed and result.trials[2].margin_gap == pytest.approx(0.005)


def test_improved_reads_the_margin_gap_only_between_passing_trials():
    """Two trials past the gate, the same cosine: the one nearer the decision margin improves on the
    other. A trial that fails (its cosine within IMPROVES of a passing one) never improves on it by
    its margin gap: the search would trade a pass for a failure."""
    from ortprep.steps.quantize.trials import improved

    held = Trial("held", [], 0.9999, True, 1, shortfall=0.0, margin_gap=0.0)
    short = Trial("short", [], 0.9999, True, 1, shortfall=0.0, margin_gap=0.0167)
    assert improved(held, short) is True and improved(short, held) is False
    # reaching the margin is progress however near the other came (0.18 points: below DECISION_IMPROVES)
    near = Trial("near", [], 0.9999, True, 1, shortfall=0.0, margin_gap=0.0018)
    assert improved(held, near) is True and improved(near, held) is False
    failing = Trial("failing", [], 0.99985, False, 1, shortfall=0.0, margin_gap=0.0)  # fails on its norm, say
    assert improved(failing, short) is False


def _ctc_pair(folder: Path, nudge: float) -> tuple[Path, Path, list[dict]]:
    """A float model (x + 0 -> Softmax: [1, 12, 6] character probabilities) and a candidate that adds
    ``nudge`` to class 2 at the first position, with 24 samples whose strings are clear except
    sample 5's first character (class 1 at 6.0 against class 2 at 5.9): the candidate reads 23 of
    the 24 strings as the float model does."""
    steps, classes = 12, 6

    def model(delta: np.ndarray) -> onnx.ModelProto:
        graph = helper.make_graph(
            [
                helper.make_node("Add", ["x", "d"], ["z"], name="nudge"),
                helper.make_node("Softmax", ["z"], ["y"], axis=-1),
            ],
            "ctc",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, steps, classes])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, steps, classes])],
            [numpy_helper.from_array(delta, "d")],
        )
        return models.make(graph)

    zero = np.zeros((1, steps, classes), np.float32)
    moved = zero.copy()
    moved[0, 0, 2] = nudge
    onnx.save(model(zero), str(folder / "float.onnx"))
    onnx.save(model(moved), str(folder / "candidate.onnx"))
    rng = np.random.default_rng(0)
    feeds = []
    for index in range(24):
        x = np.zeros((1, steps, classes), np.float32)
        x[0, np.arange(steps), rng.integers(1, classes, steps)] = 6.0
        if index == 5:
            x[0, 0, :] = 0.0
            x[0, 0, 1], x[0, 0, 2] = 6.0, 5.9
        feeds.append({"x": x})
    return folder / "float.onnx", folder / "candidate.onnx", feeds


def test_a_chosen_result_is_held_to_the_decision_margin(tmp_path):
    """Real sessions: the candidate reads 23 of 24 strings as the float model does, 95.8% against
    the gate's 95%: it passes the gate; chosen among trials on those samples, it must hold 97.5%,
    and fails, with a QNT005 that says so."""
    from ortprep.fidelity.evaluation import hold_to_margin
    from ortprep.steps.quantize.evaluate import evaluate
    from ortprep.steps.quantize.gate_findings import gate_finding

    float_model, candidate, feeds = _ctc_pair(tmp_path, 0.2)
    evaluation = evaluate(float_model, candidate, feeds, 0.99, metrics={"y": "ctc"}, latency_runs=0)
    decision = evaluation.outputs[0]["decision"]
    assert evaluation.passed and decision["strings_changed"] == 1 and decision["agreement"] == pytest.approx(23 / 24)
    assert evaluation.margin_gap == pytest.approx(0.975 - 23 / 24)
    selection = hold_to_margin(evaluation, trials=5)
    assert not evaluation.passed and evaluation.to_record()["gate"]["selection"] == selection
    assert selection == {"trials": 5, "samples": 24, "gap": pytest.approx(0.016667), "passed": False, "side": "cpu",
                         "output": "y", "kind": "ctc", "share": "agreement", "asked": 0.975,
                         "measured": pytest.approx(0.958333)}
    finding = gate_finding(evaluation, min_cosine=0.99, ep_text="cpu", stopped="", worst="none found", writers="",
                           searched=True)
    assert finding.code == "QNT005" and finding.message.startswith(
        "accuracy gate failed by its margin: output 'y' (ctc): agreement 95.8% on the CPU EP's 24 held-back samples "
        "passes the gate (95.0%) but not 97.5%, the margin asked of a result chosen among 5 trials")
    assert "--eval" in finding.fix
    # the same candidate with nothing changed holds the margin: the selection is recorded, it passes
    same, _, _ = _ctc_pair(tmp_path, 0.0)
    held = evaluate(float_model, same, feeds, 0.99, metrics={"y": "ctc"}, latency_runs=0)
    assert hold_to_margin(held, trials=2)["passed"] is True and held.passed


def test_not_smaller_says_which_ops_hold_the_weights_left_float():
    from ortprep.steps.quantize.findings import not_smaller_fix

    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((200, 128)).astype(np.float32), "table")  # 102,400 bytes
    weight = numpy_helper.from_array(rng.standard_normal((128, 4)).astype(np.float32), "w")  # 2,048 bytes
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"], name="lookup"),
                               helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")], "rec",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [table, weight])
    proto = models.make(graph)
    fix = not_smaller_fix(proto, proto, 2)
    assert fix.startswith("100% of the float weights stayed float (read by Gather 98%, MatMul 2%); 2 node(s) were kept")
    # the MatMul's weight quantized (an int8 initializer of its own name in the quantized model):
    # what stayed float is the table alone
    quantized = onnx.ModelProto()
    quantized.CopyFrom(proto)
    weight_q = numpy_helper.from_array(np.zeros((128, 4), np.int8), "w_quantized")
    del quantized.graph.initializer[1]
    quantized.graph.initializer.append(weight_q)
    quantized.graph.node[1].input[1] = "w_quantized"
    assert not_smaller_fix(proto, quantized, 0).startswith(
        "98% of the float weights stayed float (read by Gather 98%):"
    )
    tiny = models.make(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "tiny",
                                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128])],
                                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight]))
    assert not_smaller_fix(tiny, tiny, []).startswith("the model holds only 2,048 bytes of float weights")


def test_calibration_sessions_run_in_priority_order_and_compute_the_same(tmp_path):
    """ORT's MinMax calibrator makes every activation a graph output's input; in ORT's default
    execution order a sample's activations then all stay alive (PP-PicoDet layout: 1.86 GB peak
    in quantize_static, 0.24 GB in priority order; bench/RESULTS.md). Within the block the
    calibrator's session is priority-ordered, the quantized file is byte for byte the same, and
    ORT is left as it was after."""
    import hashlib

    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization import calibrate

    from ortprep.runtime.requests.quantize import calibration_in_priority_order

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.samples = iter([{"image": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(3)])

        def get_next(self):
            return next(self.samples, None)

    orders = []
    create = calibrate.CalibraterBase.create_inference_session

    def spy(self):
        create(self)
        orders.append(self.infer_session.get_session_options().execution_order)

    digests = []
    for ordered in (False, True):
        calibrate.CalibraterBase.create_inference_session = spy
        try:
            with calibration_in_priority_order() if ordered else contextlib.nullcontext():
                quantize_static(str(SAMPLES / "cnn.onnx"), str(tmp_path / f"q{ordered}.onnx"), Reader(),
                                quant_format=QuantFormat.QDQ, per_channel=True)
        finally:
            calibrate.CalibraterBase.create_inference_session = create
        digests.append(hashlib.sha256((tmp_path / f"q{ordered}.onnx").read_bytes()).hexdigest())
    assert orders == [onnxruntime.ExecutionOrder.DEFAULT, onnxruntime.ExecutionOrder.PRIORITY_BASED]
    assert digests[0] == digests[1]
    assert onnxruntime.SessionOptions().execution_order == onnxruntime.ExecutionOrder.DEFAULT


def test_later_trials_reuse_the_calibrated_ranges_and_quantize_alike(tmp_path):
    """run_quantizer keeps the ranges it calibrated (ORT's calibration_cache_path) for later
    trials on the same source: a second run, keeping a node float, quantizes without reading a
    sample (the samples are gone) and gives the same encodings as a run that calibrates again."""
    import shutil

    from ortprep.runtime.calibration import discover
    from ortprep.runtime.feeds import input_specs
    from ortprep.steps.quantize.calibrate import run_quantizer

    pytest.importorskip("onnxruntime.quantization")
    import inspect

    from onnxruntime.quantization import quantize_static
    if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
        pytest.skip("this onnxruntime has no calibration cache (before 1.32)")
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2"),
        ],
    )
    model = tmp_path / "two.onnx"
    onnx.save_model(models.make(graph), str(model))
    data = tmp_path / "data"
    data.mkdir()
    for index in range(6):
        np.savez(data / f"{index}.npz", x=rng.standard_normal((1, 16)).astype(np.float32))
    calibration = discover(str(data), input_specs(onnx.load(str(model))))
    settings = resolve_settings(QuantizeOptions(mode="static", ep="cpu"))
    work = tmp_path / "work"
    work.mkdir()
    ok, why = run_quantizer(
        work, model, tmp_path / "a.onnx", "static", settings, calibration, list(range(6)), [], (), False
    )
    assert ok, why
    assert len(list(work.glob("calibration-*.json"))) == 1
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    ok, why = run_quantizer(
        fresh, model, tmp_path / "c.onnx", "static", settings, calibration, list(range(6)), ["mm2"], (), False
    )
    assert ok, why
    shutil.rmtree(data)  # nothing left to calibrate on: the second trial in ``work`` must reuse the ranges
    ok, why = run_quantizer(
        work, model, tmp_path / "b.onnx", "static", settings, calibration, list(range(6)), ["mm2"], (), False
    )
    assert ok, why

    def encodings(path):
        return {t.name: numpy_helper.to_array(t).tolist() for t in onnx.load(str(path)).graph.initializer
                if t.name.endswith(("_scale", "_zero_point"))}

    assert encodings(tmp_path / "b.onnx") == encodings(tmp_path / "c.onnx") != {}
    assert "mm2" in {n.name for n in onnx.load(str(tmp_path / "b.onnx")).graph.node if n.op_type == "MatMul"}


def test_the_move_off_the_ep_tries_every_node_of_the_op_that_reads_activations_only(tmp_path):
    """off_target.candidate_sets from an attention MatMul (query by key: it reads two activations,
    no weight): the node alone, then every MatMul that reads activations only (the softmax-by-value
    one too, whose inputs come from other ops), never the projection that reads a weight (measured:
    PP-OCRv6's recogniser on QNN needed all four such MatMuls kept off, where the first alone and
    its alike did not mend the line). From the projection there is no such set."""
    from ortprep.steps.quantize.off_target import candidate_sets

    weight = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    value = numpy_helper.from_array(np.eye(8, dtype=np.float32), "wv")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"], name="proj"),
             helper.make_node("Transpose", ["x"], ["k"], name="keys", perm=[1, 0]),
             helper.make_node("MatMul", ["q", "k"], ["scores"], name="qk"),
             helper.make_node("Softmax", ["scores"], ["attn"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="values"),
             helper.make_node("MatMul", ["attn", "v"], ["y"], name="sv")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [weight, value])
    path = tmp_path / "attention.onnx"
    onnx.save_model(models.make(graph), str(path))
    sets = candidate_sets(path, "qk", 10)
    assert [names for _, names in sets] == [["qk"], ["qk", "sv"]], sets
    assert "read activations only" in sets[1][0]
    assert [names for _, names in candidate_sets(path, "proj", 10)] == [["proj"], ["proj", "values"]]
    assert [names for _, names in candidate_sets(path, "qk", 1)] == [["qk"]]  # the limit leaves the set out


def test_a_move_that_empties_the_eps_session_is_not_taken():
    """search.placement_lost: nodes kept off the EP take their Q/DQ nodes along (up to
    MOVE_NODE_SLACK each), no more. A move of 4 nodes after which the session put 0 of 1,002 nodes
    on the EP (measured: PP-OCRv6's recogniser, its attention MatMuls in If nodes, on QNN) says the
    EP's outputs were the CPU EP's; a move of 2 nodes that took 2 nodes and their Q/DQ off keeps
    the placement; unknown placements say nothing."""
    from types import SimpleNamespace

    from ortprep.steps.quantize.moves import MOVE_NODE_SLACK, placement_lost

    def judged(on_ep: int | None, total: int) -> SimpleNamespace:
        placement = None if on_ep is None else {"nodes_on_ep": on_ep, "nodes_total": total}
        return SimpleNamespace(on_ep=SimpleNamespace(placement=placement))

    paths = {name: Path(f"/nowhere/{name}.onnx") for name in ("before", "emptied", "kept", "unknown")}
    trials = SimpleNamespace(evaluations={paths["before"]: judged(962, 977), paths["emptied"]: judged(0, 1002),
                                          paths["kept"]: judged(960, 985), paths["unknown"]: judged(None, 0)})
    trial = {name: Trial(name, [], 0.999, True, 1, path) for name, path in paths.items()}
    lost = placement_lost(trials, trial["before"], trial["emptied"], 4)
    assert lost and "0 of 1002" in lost and "962 of 977" in lost
    assert placement_lost(trials, trial["before"], trial["kept"], 2) is None
    assert placement_lost(trials, trial["before"], trial["unknown"], 4) is None
    assert MOVE_NODE_SLACK * 4 < 962


def test_the_gate_finding_does_not_ask_for_the_search_that_ran():
    """QNT005's fix offered --auto-exclude to a user who had passed it (an unseen-model sweep); where
    the search ran, it offers more room for it instead."""
    from ortprep.fidelity.evaluation import Evaluation
    from ortprep.steps.quantize.gate_findings import gate_finding

    failed = Evaluation(0.97, 0.5, None, None, None, None, False,
                        outputs=[{"name": "y", "cosine": 0.97, "passed": False, "judged_by": "cosine"}])
    plain = gate_finding(failed, min_cosine=0.99, ep_text="cpu", stopped="", worst="none found", writers="")
    searched = gate_finding(failed, min_cosine=0.99, ep_text="cpu", stopped="", worst="none found", writers="",
                            searched=True)
    assert plain.fix.startswith("ortprep quantize ... --auto-exclude")
    assert "--auto-exclude" not in searched.fix and "--search-seconds" in searched.fix and "it ran" in searched.fix


def test_the_float_and_the_quantized_model_are_timed_in_turns(tmp_path, monkeypatch):
    """paired_latency: 2 x LATENCY_RUNS runs of each, one run of each in turn in one worker
    (TimeModels; in blocks, a level-4 file read 0.96x and 0.90x of its level-0 twin in two runs of
    one quantize beside another job), the medians of each; None where a run fails."""
    import onnx
    from onnx import TensorProto, helper

    from ortprep.steps.quantize import evaluate as ev

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(first))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(second))
    asked = []
    real = ev.time_isolated

    def recorded(models, feed, **kw):
        times = real(models, feed, **kw)
        asked.append(([m.name for m in models], kw["runs"], times))
        return times

    monkeypatch.setattr(ev, "time_isolated", recorded)
    feed = {"x": np.ones((1, 64), np.float32)}
    float_ms, quant_ms = ev.paired_latency(first, second, feed)
    [(names, runs, times)] = asked
    assert names == ["a.onnx", "b.onnx"] and runs == 2 * ev.LATENCY_RUNS and [len(t) for t in times] == [runs, runs]
    assert float_ms == float(np.median(times[0])) and quant_ms == float(np.median(times[1])) and float_ms > 0
    assert ev.paired_latency(first, tmp_path / "missing.onnx", feed) is None


def test_int8_compute_is_kept_where_float32_compute_alone_is_slower_than_float():
    """--accuracy-level auto keeps level 4 without judging level 0 where 4 runs clearly faster than
    0, or where 0 runs slower than the float model and 4 does not (gpt2_medium_slice's int4: 4 at
    0.86x float's time, 0 at 1.2x, 4 at 0.898x of 0: the 10% rule alone kept 0); elsewhere 0, the
    more precise, is judged."""
    from ortprep.steps.quantize.remedies import _int8_compute_pays

    assert _int8_compute_pays({"float": 10.0, "4": 8.0, "0": 10.0}).startswith("int8 compute runs clearly faster")
    assert _int8_compute_pays({"float": 10.0, "4": 9.5, "0": 10.2}).startswith(
        "float32 compute runs slower than the float"
    )
    assert _int8_compute_pays({"float": 10.0, "4": 11.0, "0": 11.5}) is None  # both slower than float
    assert _int8_compute_pays({"float": 10.0, "4": 9.5, "0": 9.8}) is None  # both faster: precision first
    # sub-ms: still the float line
    assert _int8_compute_pays({"float": 1.0, "4": 0.95, "0": 1.04}).startswith("float32")


def _relu_sigmoid_qdq(folder: Path) -> Path:
    """x -> Relu -> Q/DQ -> Sigmoid -> Q/DQ -> y: one exposed activation (the Relu's, as 'r_dq')."""
    scale = numpy_helper.from_array(np.float32(0.02), "scale")
    zero = numpy_helper.from_array(np.uint8(0), "zero")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "scale", "zero"], ["r_q"], name="r_q"),
             helper.make_node("DequantizeLinear", ["r_q", "scale", "zero"], ["r_dq"], name="r_dq"),
             helper.make_node("Sigmoid", ["r_dq"], ["s"], name="sigmoid"),
             helper.make_node("QuantizeLinear", ["s", "scale", "zero"], ["s_q"], name="s_q"),
             helper.make_node("DequantizeLinear", ["s_q", "scale", "zero"], ["y"], name="s_dq")]
    graph = helper.make_graph(nodes, "relu_sigmoid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [scale, zero])
    path = folder / "qdq.onnx"
    onnx.save(models.make(graph), path)
    return path


def test_a_simulated_ep_whose_first_pass_agrees_everywhere_is_passed_over_again(tmp_path):
    """The HTP simulator does not compute a model alike each time (measured: 2 of 80 exposure passes
    over a Conv+SiLU pair agreed with the CPU EP everywhere, where the rest parted at the first
    Sigmoid). On a simulated EP a pass that finds nothing parting is made once more, and the
    second pass's parting is what first_divergence answers; on an EP that is not simulated one
    pass is made, and nothing parts. The EP's runs here are the CPU EP's, the second one's Relu
    tensor turned over (cosine -1), so the test says which pass was made, not what an EP computes."""
    from dataclasses import dataclass

    from ortprep.runtime.isolated import run_isolated
    from ortprep.runtime.targets import simulated
    from ortprep.steps.quantize.ep_gate import GateTarget, first_divergence

    @dataclass
    class PartsOnItsSecondRun(GateTarget):
        runs: int = 0

        def run(self, model, feeds):
            self.runs += 1
            result = run_isolated(model, feeds, optimization="disable")
            if self.runs >= 2:
                for sample in result.samples:
                    if "r_dq" in sample:
                        sample["r_dq"] = -sample["r_dq"]
            return result

    model = _relu_sigmoid_qdq(tmp_path)
    feeds = [{"x": np.random.default_rng(index).standard_normal((1, 64)).astype(np.float32)} for index in range(2)]
    if simulated("qnn") is None:
        pytest.skip("QNN's HTP is a simulator only on an x86 machine")
    twice = PartsOnItsSecondRun("qnn")
    parted = first_divergence(twice, model, feeds, tmp_path)
    assert twice.runs == 2 and [(p["node"], p["op_type"], p["tensor"]) for p in parted] == [("relu", "Relu", "r_dq")]
    assert parted[0]["cosine"] == pytest.approx(-1.0)
    once = PartsOnItsSecondRun("openvino")
    assert simulated("openvino") is None
    assert first_divergence(once, model, feeds, tmp_path) == [] and once.runs == 1
