"""The AIMET-ONNX engine (ortprep/steps/quantize/engines/aimet.py, runtime/requests/aimet_quantize.py)
with the real aimet-onnx in .venv-aimet: its candidates load in ORT's CPU EP and agree with the
float model, a kept node keeps float weights, 16-bit activations write 16-bit zero points, a model
AIMET refuses comes back as a failed run with one line, and a net whose first conv's channels
differ 100x in scale passes quantize's gate per-tensor with AIMET's CLE where ORT's MinMax fails.
Skipped, with the reason, where no AIMET environment exists (make install creates it)."""

from __future__ import annotations

import contextvars
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import SAMPLES
from ortprep.fidelity.decisions import infer_decisions
from ortprep.fidelity.quantized import judge_quantized
from ortprep.options.steps import DEFAULT_MIN_COSINE
from ortprep.runtime.calibration import CalibrationSet
from ortprep.runtime.requests import Quantize
from ortprep.runtime.worker import WorkerPool, call, workers_scope
from ortprep.steps.quantize.engines.aimet import ENGINE, PYTHON_VARIABLE
from ortprep.steps.quantize.engines.base import Exclusion

MISSING = ENGINE.available()
needs_aimet = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
W8A8 = {"preset": "cpu", "format": "qdq", "activation_type": "uint8", "weight_type": "int8", "per_channel": True}


@pytest.fixture(scope="module")
def pool():
    """One pool for the module: AIMET's worker (torch and aimet_onnx imported once) serves every test."""
    with WorkerPool() as shared, workers_scope(shared, prestart=False):
        yield shared


def random_set(name: str, shape: list[int], count: int = 16) -> CalibrationSet:
    return CalibrationSet("random", "random", count=count, inputs=[{"name": name, "dtype": "float32", "shape": shape}])


def outputs(path: Path, feeds: list[dict]) -> list[dict]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, feed))) for feed in feeds]


def fresh(name: str, shape: list[int], count: int = 32, seed: int = 99) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def aimet(tmp_path: Path, model: Path, settings: dict, data: CalibrationSet, exclusion: Exclusion = Exclusion(),
          name: str = "aimet.onnx", big: bool = False, **more):
    return ENGINE.quantize(tmp_path / "work", model, tmp_path / name, "static", settings, data,
                           list(range(data.count)), exclusion, big, **more)


def cle_net(path: Path, spread: float = 1000.0, seed: int = 0, channels: int = 8) -> Path:
    """Conv -> ReLU -> Conv -> pool -> Gemm whose first conv's output channels differ ``spread``x in
    scale, undone by the second conv's input channels (the float function is an ordinary one):
    per-tensor weights and activations lose the small channels, cross-layer equalization evens
    them out. No ``group`` attribute, as many exporters write Conv."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(1.0 / spread, 1.0, channels).astype(np.float32)
    w1 = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.5 * scales[:, None, None, None]
    b1 = rng.standard_normal(channels).astype(np.float32) * 0.1 * scales
    w2 = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.3 / scales[None, :, None, None]
    arrays = {"w1": w1, "b1": b1, "w2": w2, "b2": np.zeros(channels, np.float32),
              "w3": rng.standard_normal((10, channels)).astype(np.float32), "b3": np.zeros(10, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "cle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(a, n) for n, a in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def weight_dequantized(model: onnx.ModelProto, node_name: str) -> bool:
    """Whether ``node_name``'s weight input comes out of a DequantizeLinear."""
    node = next(n for n in model.graph.node if n.name == node_name)
    return any(n.op_type == "DequantizeLinear" and node.input[1] in n.output for n in model.graph.node)


def test_available_names_the_interpreter_and_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv(PYTHON_VARIABLE, str(tmp_path / "nowhere" / "python"))
    reason = ENGINE.available()
    assert reason is not None and PYTHON_VARIABLE in reason and "nowhere" in reason
    run = ENGINE.quantize(tmp_path, SAMPLES / "cnn.onnx", tmp_path / "q.onnx", "static", W8A8,
                          random_set("image", [1, 3, 32, 32]), [0], Exclusion(), False)
    assert not run.ok and run.error.startswith("aimet ") and "\n" not in run.error
    assert not (tmp_path / "q.onnx").exists()


def test_supports_static_qdq_only():
    assert "static" in ENGINE.supports("dynamic", W8A8, Exclusion())
    assert "static" in ENGINE.supports("weight-only", W8A8, Exclusion())
    assert "QDQ" in ENGINE.supports("static", {**W8A8, "format": "qoperator"}, Exclusion())
    assert "int4" in ENGINE.supports("static", {**W8A8, "weight_type": "int4"}, Exclusion())
    assert ENGINE.supports("static", {**W8A8, "activation_type": "uint16"}, Exclusion()) is None


@needs_aimet
def test_w8a8_with_cle_loads_and_agrees_with_the_float_model(pool, tmp_path):
    source = SAMPLES / "cnn.onnx"
    before = source.read_bytes()
    seen = []
    run = aimet(tmp_path, source, W8A8, random_set("image", [1, 3, 32, 32]), progress=lambda *done: seen.append(done))
    assert run.ok, run.error
    assert seen and seen[-1][0] == seen[-1][1] == 4  # load, CLE, calibration, export
    assert run.detail["cle"] and not run.detail["seq_mse"] and run.detail["version"].startswith("2.")  # defaults
    assert run.seconds > 0 and run.detail["peak_rss"] > 0
    assert source.read_bytes() == before  # CLE changed the worker's copy only
    model = onnx.load(run.output)
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "BatchNormalization" not in ops  # folded by CLE
    feeds = fresh("image", [1, 3, 32, 32])
    reference, candidate = outputs(source, feeds), outputs(run.output, feeds)
    for ref, cand in zip(reference, candidate):
        a, b = ref["logits"].ravel(), cand["logits"].ravel()
        assert a.argmax() == b.argmax()
        assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.99
    assert not list((tmp_path / "work").iterdir())  # AIMET's scratch went with the run


@needs_aimet
def test_a_kept_node_has_no_qdq_on_its_weight(pool, tmp_path):
    # with SeqMSE: AIMET 2.42's own nodes_to_exclude crashes it when the kept node reads the graph input
    run = aimet(tmp_path, SAMPLES / "cnn.onnx", {**W8A8, "aimet": {"seq_mse": True}},
                random_set("image", [1, 3, 32, 32]), Exclusion(nodes=("conv1", "renamed_away")))
    assert run.ok, run.error
    assert run.detail["seq_mse"] and "seq_mse" in run.detail["pass_seconds"]
    assert run.detail["kept_float"] == ["conv1"] and run.detail["not_found"] == ["renamed_away"]
    model = onnx.load(run.output)
    assert not weight_dequantized(model, "conv1")
    assert weight_dequantized(model, "conv2") and weight_dequantized(model, "fc")
    conv1 = next(n for n in model.graph.node if n.name == "conv1")
    assert conv1.input[0] == "image"  # its only reader kept float: the graph input is not quantized either
    outputs(run.output, fresh("image", [1, 3, 32, 32], count=2))  # loads and runs


@needs_aimet
def test_w8a16_writes_16_bit_zero_points_at_opset_21(pool, tmp_path):
    run = aimet(tmp_path, SAMPLES / "cnn.onnx", {**W8A8, "activation_type": "uint16"},
                random_set("image", [1, 3, 32, 32], count=8), big=True)
    assert run.ok, run.error
    assert (tmp_path / "aimet.onnx.data").stat().st_size > 0  # big: the weights beside the graph
    model = onnx.load(run.output)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 21
    initializers = {i.name: i for i in model.graph.initializer}
    zero_points = {initializers[n.input[2]].data_type for n in model.graph.node
                   if n.op_type == "QuantizeLinear" and len(n.input) > 2}
    assert zero_points == {TensorProto.UINT16}
    feeds = fresh("image", [1, 3, 32, 32], count=4)
    for ref, cand in zip(outputs(SAMPLES / "cnn.onnx", feeds), outputs(run.output, feeds)):
        assert ref["logits"].argmax() == cand["logits"].argmax()


@needs_aimet
def test_a_hang_is_a_failed_run_with_one_line(tmp_path, monkeypatch):
    # the worker's test hook holds the request for 60 s; the deadline ends that worker (an empty context:
    # a one-shot worker, not the module pool's warm one)
    monkeypatch.setenv("ORTPREP_TEST_WORKER_DELAY", "AimetQuantize:60")
    run = contextvars.Context().run(aimet, tmp_path, SAMPLES / "cnn.onnx", W8A8,
                                    random_set("image", [1, 3, 32, 32], count=2), timeout=1.0)
    assert not run.ok and run.error.startswith("aimet 2.") and "timed out" in run.error and "\n" not in run.error
    assert not (tmp_path / "aimet.onnx").exists() and not list((tmp_path / "work").iterdir())


@needs_aimet
def test_a_model_aimet_refuses_is_a_failed_run_with_one_line(pool, tmp_path):
    first = aimet(tmp_path, SAMPLES / "cnn.onnx", {**W8A8, "aimet": {"cle": False}},
                  random_set("image", [1, 3, 32, 32], count=4), name="first.onnx")
    assert first.ok, first.error
    again = aimet(tmp_path, first.output, W8A8, random_set("image", [1, 3, 32, 32], count=4), name="again.onnx")
    assert not again.ok and again.output is None
    assert again.error.startswith("aimet 2.") and "QuantizeLinear" in again.error and "\n" not in again.error
    assert again.detail["traceback"] and not (tmp_path / "again.onnx").exists()


@needs_aimet
def test_cle_passes_the_gate_per_tensor_where_ort_minmax_fails(pool, tmp_path):
    source = cle_net(tmp_path / "cle.onnx")
    data = random_set("x", [1, 3, 16, 16], count=32)
    per_tensor = {**W8A8, "per_channel": False}
    run = aimet(tmp_path, source, per_tensor, data)
    assert run.ok, run.error
    ort_file = tmp_path / "ort.onnx"
    plain = call(Quantize(workdir=str(tmp_path), model=str(source), output=str(ort_file), mode="static",
                          options={**per_tensor, "method": "minmax", "extra_options": {}},
                          calibration=data.to_json(), calibration_indices=list(range(data.count))))
    assert plain.ok, plain.message
    feeds = fresh("x", [1, 3, 16, 16], count=16)
    reference = outputs(source, feeds)
    decisions = infer_decisions(onnx.load(source), reference)
    verdicts = {name: judge_quantized("cpu", reference, outputs(path, feeds), DEFAULT_MIN_COSINE, {}, decisions)
                for name, path in (("aimet", run.output), ("ort", ort_file))}
    assert verdicts["aimet"].passed and verdicts["aimet"].cosine > 0.999
    assert not verdicts["ort"].passed and verdicts["ort"].cosine < 0.9
