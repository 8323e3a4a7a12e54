"""load and doctor, on the CPU EP (the only one CI has); GPU runs skip with a reason."""

from __future__ import annotations

import json
import os
from pathlib import Path
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from cli_helpers import invoke
from conftest import saw_codes
from conftest import SAMPLES


def load(*args, env=None) -> tuple[int, dict, str]:
    result = invoke("load", *args, "--json", env=env)
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


@pytest.mark.parametrize("name", ["cnn.onnx", "transformer_block.onnx", "control_flow.onnx", "external_data/mlp.onnx"])
def test_cpu_ok_on_samples(name):
    code, record, _ = load(SAMPLES / name, "--ep", "cpu")
    assert code == 0, record
    assert record["schema"] == "ortprep.load/2"
    result = record["results"][0]
    assert result["ep"] == "cpu" and result["status"] == "ok"
    assert result["nodes_on_ep"] == result["nodes_total"] > 0 and result["fallback_nodes"] == []
    assert result["latency_ms"]["median"] > 0 and result["latency_ms"]["p90"] >= result["latency_ms"]["median"]
    assert result["nonfinite_outputs"] == []


def test_session_failure_is_a_status(samples):
    code, record, _ = load(samples / "custom_op.onnx", "--ep", "cpu")
    assert code == 1
    result = record["results"][0]
    assert result["status"] == "failed" and "FancyActivation" in result["message"]
    assert "[ONNXRuntimeError]" not in result["message"]


def test_crash_and_hang_leave_other_eps_reported(samples):
    # coreml: an EP no Linux machine has (cuda runs on a GPU machine)
    code, record, stderr = load(
        samples / "cnn.onnx",
        "--ep",
        "cpu",
        "--ep",
        "coreml",
        env={"ORTPREP_TEST_LOAD_HOOK": "crash:CPUExecutionProvider"},
    )
    statuses = {r["ep"]: r["status"] for r in record["results"]}
    assert statuses == {"cpu": "crashed", "coreml": "unavailable"}
    assert "SIGABRT" in record["results"][0]["message"]
    assert code == 3  # an EP asked for is missing; the crash is reported too
    assert "LOD003" in {f["code"] for f in record["findings"]}
    code, record, _ = load(
        samples / "cnn.onnx",
        "--ep",
        "cpu",
        "--timeout",
        "2",
        env={"ORTPREP_TEST_LOAD_HOOK": "hang:CPUExecutionProvider"},
    )
    assert code == 1 and record["results"][0]["status"] == "timeout"


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="CUDA runs here: the missing-EP message is for machines without it (seen on a lent H100)")
def test_unavailable_ep_exit_3_one_line(samples):
    result = invoke("load", samples / "cnn.onnx", "--ep", "cuda")
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cuda: not available" in lines[0] and "onnxruntime-gpu" in lines[0]


def test_outputs_compared_with_cpu_and_profile(samples):
    code, record, _ = load(samples / "transformer_block.onnx", "--profile", "--runs", "3")
    assert code == 0
    cpu = next(r for r in record["results"] if r["ep"] == "cpu")
    ops = [p["op_type"] for p in cpu["profile"]]
    assert "MatMul" in ops and len(ops) <= 10
    assert abs(sum(p["share"] for p in cpu["profile"]) - 1.0) < 0.05


def test_inputs_file_and_bad_provider_option(tmp_path, samples):
    np.savez(tmp_path / "in.npz", image=np.ones((1, 3, 32, 32), np.float32))
    code, record, _ = load(samples / "cnn.onnx", "--ep", "cpu", "--inputs", tmp_path / "in.npz")
    assert code == 0
    bad = invoke("load", samples / "cnn.onnx", "--provider-option", "cuda-device_id=0")
    assert bad.exit_code == 2 and "EP:KEY=VALUE" in bad.stderr


def test_prediction_disagreement_is_reported(samples):
    from ortprep.analysis import ModelAnalysis
    from ortprep.eps.registry import resolve_ep
    from ortprep.model import ModelHandle
    from ortprep.steps.load import compare_with_check

    handle = ModelHandle.open(samples / "cnn.onnx")
    analysis = ModelAnalysis(handle)
    # check predicts every node of the CNN on TensorRT; an assignment record that says otherwise:
    names = [n.name for n in handle.graph.node]
    assignment = {name: "TensorrtExecutionProvider" for name in names}
    comparison, findings = compare_with_check(
        analysis, resolve_ep("tensorrt"), assignment, [["TensorrtExecutionProvider", 9]]
    )
    assert findings == [] and comparison["node_agreement"] == 1.0 and comparison["actual_verdict"] == "full"
    assignment[names[2]] = "CPUExecutionProvider"
    assignment["fused_by_the_optimizer"] = "CPUExecutionProvider"  # not in the file: not compared
    comparison, findings = compare_with_check(analysis, resolve_ep("tensorrt"), assignment, [])
    assert [(f.code, f.node) for f in findings] == [("LOD001", names[2])]
    assert comparison["nodes_compared"] == len(names) and comparison["actual_verdict"] == "partial"
    assert comparison["differing_op_types"] == {handle.graph.node[2].op_type: 1}


def test_nan_outputs_are_reported(tmp_path):
    path = tmp_path / "sqrt.onnx"
    onnx.save_model(models.single_node("Sqrt", [("x", 1, [1, 4])], [("y", 1, [1, 4])]), str(path))
    np.savez(tmp_path / "neg.npz", x=np.array([[-1.0, 4.0, 9.0, 16.0]], np.float32))
    code, record, _ = load(path, "--ep", "cpu", "--inputs", tmp_path / "neg.npz")
    assert code == 1 and record["results"][0]["nonfinite_outputs"] == ["y"]
    assert "LOD007" in {f["code"] for f in record["findings"]}
    np.savez(tmp_path / "pos.npz", x=np.array([[1.0, 4.0, 9.0, 16.0]], np.float32))
    code, record, _ = load(path, "--ep", "cpu", "--inputs", tmp_path / "pos.npz")
    assert code == 0 and "LOD007" not in {f["code"] for f in record["findings"]}


def _qdq_output_model(scale: float, zero_type=None):
    """x -> QuantizeLinear -> DequantizeLinear -> Reshape -> y: y's range is scale x levels."""
    from onnx import TensorProto, helper, numpy_helper

    zero_type = zero_type or np.uint8
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), "s"),
        numpy_helper.from_array(np.array(0, zero_type), "z"),
        numpy_helper.from_array(np.array([3], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
        helper.make_node("Reshape", ["d", "shape"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_output_comparison_tolerances():
    """One rule for load and compile (fidelity/ep_match.py): float32 within 1e-3 of the output's
    scale, float16 (or an EP computing in float16) 1e-2, a quantized output two steps of an 8-bit
    grid over its DequantizeLinear's range, and always the norm within 2%."""
    from onnx import TensorProto, helper

    from ortprep.fidelity.ep_match import judge_ep_outputs
    from ortprep.fidelity.graph import output_ranges
    from ortprep.steps.load import _compare

    plain = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "f",
                                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]))
    reference = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    assert _compare(reference, {"y": np.array([1.0, 2.0, 3.0005], np.float32)}, plain, "cpu")[0] is True
    assert _compare(reference, {"y": np.array([1.0, 2.0, 3.01], np.float32)}, plain, "cpu")[0] is False
    assert _compare(reference, {"y": np.array([1.0, 2.0, 3.01], np.float32)}, plain, "qnn")[0] is True  # HTP: float16
    # float16 is looser
    assert _compare(reference, {"y": np.array([1.0, 2.0, 3.01], np.float16)}, plain, "cpu")[0] is True
    # CUDA's default session computes float32 products in TF32 (float16's mantissa); use_tf32=0 is float32
    tf32 = {"y": np.array([1.0, 2.0, 3.01], np.float32)}
    assert _compare(reference, tf32, plain, "cuda")[0] is True
    assert "TF32 compute on cuda" in _compare(reference, tf32, plain, "cuda")[2][0]["tolerance_rule"]
    assert _compare(reference, tf32, plain, "cuda", provider_options={"use_tf32": "0"})[0] is False
    assert _compare(reference, tf32, plain, "tensorrt")[0] is False  # no TF32 rule without a source for it
    assert _compare(reference, {"y": np.array([1.0, 2.0], np.float32)}, plain, "cpu")[0] is False
    assert _compare(None, {"y": reference["y"]}, plain, "cpu") == (None, None, [])
    # a uniformly scaled output fails on its norm, whatever its cosine
    judged = judge_ep_outputs(plain, "qnn", reference, {"y": reference["y"] * 0.5})
    assert judged[0]["cosine"] > 0.9999 and judged[0]["norm_ratio"] == 0.5 and judged[0]["within_tolerance"] is False

    # quantized: uint8 scale 0.1 -> range 25.5 -> two 8-bit steps = 0.2; uint16 scale 1e-3 -> 65.535 -> 0.514
    coarse, fine = _qdq_output_model(0.1), _qdq_output_model(1e-3, np.uint16)
    assert output_ranges(coarse) == {"y": pytest.approx(25.5)} and output_ranges(fine) == {"y": pytest.approx(65.535)}
    reference = {"y": np.array([10.0, 20.0, 30.0], np.float32)}
    off = {"y": np.array([10.0, 20.0, 30.15], np.float32)}  # 0.15: beyond 1% of 30 (0.3)? no; within two steps
    judged = judge_ep_outputs(coarse, "qnn", reference, off)[0]
    assert judged["within_tolerance"] is True and judged["tolerance"] == pytest.approx(0.3)  # 1% of the scale is larger
    further = {"y": np.array([10.0, 20.0, 30.45], np.float32)}
    assert judge_ep_outputs(coarse, "qnn", reference, further)[0]["within_tolerance"] is False
    judged = judge_ep_outputs(fine, "qnn", reference, further)[0]
    assert judged["within_tolerance"] is True and judged["tolerance"] == pytest.approx(2 * 65.535 / 255)
    assert "8-bit grid" in judged["tolerance_rule"]


def test_a_gpu_older_than_ampere_is_held_to_float32(tmp_path, monkeypatch):
    """TF32 exists from compute capability 8.0: on a T4 (7.5), as its driver's nvidia-smi reports
    it, CUDA's session computes in float32 and is held to float32's 1e-3."""
    from onnx import TensorProto, helper

    from ortprep.runtime.gpu import compute_capability
    from ortprep.steps.load import _compare

    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 7.5\necho 9.0\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    compute_capability.cache_clear()
    try:
        plain = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "f",
                                                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]))
        reference, tf32 = {"y": np.array([1.0, 2.0, 3.0], np.float32)}, {"y": np.array([1.0, 2.0, 3.01], np.float32)}
        assert compute_capability(0) == 7.5 and compute_capability(1) == 9.0
        assert _compare(reference, tf32, plain, "cuda")[0] is False  # device 0: a T4
        assert _compare(reference, tf32, plain, "cuda", provider_options={"device_id": "1"})[0] is True  # an H100
    finally:
        compute_capability.cache_clear()


def test_the_tf32_rerun_says_so_where_the_ep_took_nothing(tmp_path):
    """The run with TF32 off counts only where the EP took nodes: here CUDA does not run, and the
    record says the re-run did not run (no LOD010), in its own folder."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.model import ModelHandle
    from ortprep.options import LoadOptions
    from ortprep.report import StepResult
    from ortprep.runtime.targets import ep_runtime
    from ortprep.runtime.worker import workers_scope
    from ortprep.steps.load import _without_tf32

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA runs here: tests/test_gpu.py holds the re-run")
    model = SAMPLES / "cnn.onnx"
    feeds = {"image": np.zeros((1, 3, 32, 32), np.float32)}
    report = StepResult(step="load", schema="ortprep.load/2")
    with workers_scope():
        record = _without_tf32(ModelHandle(onnx.load(str(model)), model), ep_runtime(resolve_ep("cuda"), {}), feeds,
                               LoadOptions(provider_options={"cuda": {"device_id": "0"}}), tmp_path, False,
                               {"logits": np.zeros((1, 10), np.float32)}, report)
    assert record["option"] == "use_tf32=0" and record["ran"] is False, record
    assert record["error"] == "the session with use_tf32=0 took no node on cuda"  # ORT ran it on the CPU EP
    assert (tmp_path / "cuda-use_tf32-0").is_dir() and not report.findings



@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="no CUDA EP in this ONNX Runtime (CI has no GPU)",
)
def test_cuda_runs_samples():
    code, record, _ = load(SAMPLES / "cnn.onnx", "--ep", "cuda")
    assert record["results"][0]["status"] in ("ok", "fallback") and record["results"][0]["outputs_match"] is True


# ---------------------------------------------------------------- doctor


def test_doctor_reports_runtime():
    result = invoke("doctor", "--json")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["schema"] == "ortprep.doctor/1"
    assert record["onnxruntime"]["version"] == ort.__version__
    assert "CPUExecutionProvider" in record["onnxruntime"]["providers"]
    assert {lib["name"] for lib in record["libraries"]} == {"cudart", "cublas", "cublasLt", "cudnn", "nvinfer"}
    assert record["onnxruntime"]["max_opset"] >= 17


def test_doctor_without_ort():
    code = (
        "import sys; sys.modules['onnxruntime'] = None; sys.argv = ['ortprep', 'doctor', '--json']\n"
        "from ortprep.cli.app import main\nmain()"
    )
    import subprocess

    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    record = json.loads(child.stdout)
    saw_codes(record)
    assert "DOC005" in {f["code"] for f in record["findings"]} and child.returncode == 1


SCRIPTS = {
    "pycuda_user.py": """
        import pycuda.autoinit
        import onnxruntime as ort
        session = ort.InferenceSession("m.onnx", providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    """,
    "no_providers.py": """
        import onnxruntime as ort

        def make():
            return ort.InferenceSession("m.onnx")
    """,
    "mixed.py": """
        import onnxruntime as ort
        eps = [("DmlExecutionProvider", {}), "CUDAExecutionProvider"]
        session = ort.InferenceSession("m.onnx", providers=eps)
    """,
    "clean.py": """
        import onnxruntime as ort
        session = ort.InferenceSession("m.onnx", providers=["DmlExecutionProvider", "CPUExecutionProvider"])
        other = ort.InferenceSession("m.onnx", None, ["CPUExecutionProvider"])
    """,
}


def test_doctor_scan_finds_each_pitfall_once(tmp_path):
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "requirements.txt").write_text("numpy\nonnxruntime==1.31.1\nonnxruntime-gpu==1.31.1  # for CUDA\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "ignored.py").write_text("import onnxruntime as ort\nort.InferenceSession('x')\n")
    result = invoke("doctor", "--scan", tmp_path, "--json")
    assert result.exit_code == 1
    found = sorted((f["code"], f["source"]) for f in result.json()["findings"])
    assert found == [
        ("SCN001", "pycuda_user.py:2"),
        ("SCN002", "no_providers.py:5"),
        ("SCN003", "mixed.py:4"),
        ("SCN004", "requirements.txt:3"),
    ]


def test_doctor_scan_clean_script_gives_nothing(tmp_path):
    (tmp_path / "clean.py").write_text(textwrap.dedent(SCRIPTS["clean.py"]))
    (tmp_path / "requirements.txt").write_text("onnxruntime-gpu>=1.17\n")
    result = invoke("doctor", "--scan", tmp_path, "--json")
    assert result.exit_code == 0 and result.json()["findings"] == []


def test_doctor_scan_missing_path(tmp_path):
    result = invoke("doctor", "--scan", tmp_path / "nope")
    assert result.exit_code == 2 and "nothing to scan" in result.stderr


def test_missing_custom_op_library(tmp_path, samples):
    result = invoke("load", samples / "cnn.onnx", "--custom-op-library", tmp_path / "libnope.so")
    assert result.exit_code == 2 and "custom-op library not found" in result.stderr


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="the VNNI rule is for x86 CPUs")
def test_doc003_without_int8_instructions(monkeypatch):
    import ortprep.steps.doctor as doctor_module

    monkeypatch.setattr(doctor_module, "cpu_features", lambda: ["avx2"])
    assert "DOC003" in {f.code for f in doctor_module.doctor().findings}
    monkeypatch.setattr(doctor_module, "cpu_features", lambda: ["avx2", "avx512_vnni"])
    assert "DOC003" not in {f.code for f in doctor_module.doctor().findings}


def _conv1d_needing(length: int, tmp_path) -> Path:
    """A 1-D convolution with kernel ``length``: the dynamic input must be at least that long."""
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.ones((1, 1, length), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["audio", "w"], ["y"], name="conv")], "g",
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "samples"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, None])], [weights])
    path = tmp_path / f"conv{length}.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_load_guesses_inputs_until_one_runs(tmp_path):
    code, record, _ = load(_conv1d_needing(40, tmp_path), "--ep", "cpu")
    assert code == 0 and record["results"][0]["status"] == "ok"
    assert record["inputs"] == {"source": "random (seed 0), dims guessed from common sizes: audio=1x1x64",
                                "shapes": {"audio": [1, 1, 64]}, "tried": 2, "original_runs": True}


def test_the_models_own_constants_suggest_its_input_size(tmp_path):
    """A Reshape to [1, 320] runs only when the dynamic input holds 320 samples: none of the common
    sizes does, the model's own constant does (one input policy: runtime/feeds.choose_feeds)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Reshape", ["audio", "shape"], ["flat"], name="flatten"),
                               helper.make_node("Relu", ["flat"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, "samples"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 320])],
                              [numpy_helper.from_array(np.array([1, 320], np.int64), "shape")])
    path = tmp_path / "reshape.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    code, record, _ = load(path, "--ep", "cpu")
    assert code == 0 and record["results"][0]["status"] == "ok"
    assert record["inputs"]["shapes"] == {"audio": [1, 1, 320]} and record["inputs"]["tried"] == 2
    assert "from the model's constants" in record["inputs"]["source"]


def test_load_says_the_inputs_were_guessed(tmp_path):
    code, record, _ = load(_conv1d_needing(1000, tmp_path), "--ep", "cpu")
    result = record["results"][0]
    assert result["status"] == "inputs_guessed" and "pass --shape NAME=DIMS" in result["message"]
    assert "audio=1,1,8" in result["message"] and code == 0  # a warning, not a failure
    assert [f["code"] for f in record["findings"]] == ["LOD009"]
    code, record, _ = load(_conv1d_needing(1000, tmp_path), "--ep", "cpu", "--shape", "audio=1,1,1024")
    assert code == 0 and record["results"][0]["status"] == "ok" and record["inputs"]["source"] == "random (seed 0)"


def test_doctor_names_an_installable_package_per_gpu_library():
    """DOC002's fix: a pip line that installs the library for the CUDA major of the onnxruntime-gpu
    build (CUDA 13's runtime and cuBLAS wheels have no -cu13 suffix; TensorRT's major from the file)."""
    from ortprep.steps.doctor import _gpu_library_fix

    assert "pip install 'nvidia-cublas==13.*'" in _gpu_library_fix("cublas", "libcublas.so.13", 13)
    assert "pip install 'nvidia-cublas-cu12'" in _gpu_library_fix("cublas", "libcublas.so.12", 12)
    assert "pip install 'tensorrt-cu13-libs==10.*'" in _gpu_library_fix("nvinfer", "libnvinfer.so.10", 13)
    assert "pip install" not in _gpu_library_fix("cudnn", "libcudnn.so.9", 11)  # no guess for an unknown major


def test_made_up_token_inputs_attend_every_token():
    """Inputs ortprep makes for a transformer: token ids small and random, the attention mask all
    ones, token types all zeros. A MiniLM from a PyPI wheel fed a mask of 0..3 gave NaN, and every
    transform of it was refused as if it had changed the model's results."""
    from ortprep.runtime.feeds import InputSpec, random_feeds

    specs = [InputSpec(name, np.dtype(np.int64), [1, 12]) for name in ("input_ids", "attention_mask", "token_type_ids")]
    feeds = random_feeds(specs)
    assert (feeds["attention_mask"] == 1).all() and (feeds["token_type_ids"] == 0).all()
    assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 4 and len(set(feeds["input_ids"].ravel())) > 1


def test_the_norm_rule_needs_more_than_one_value():
    """A single value's norm ratio is its relative error, which the max abs diff already bounds: a
    VAD's probability of 0.0305 computed as 0.0273 on QNN (within 0.01) was refused at norm ratio
    0.89. Two or more values keep the rule: a pair scaled by half fails however small."""
    from ortprep.fidelity.ep_match import Tolerance, judge_output

    rule = Tolerance(0.01, "0.01 of the output's scale 1 (float16 compute on qnn)")
    one = judge_output("probability", np.array([0.0305], np.float32), np.array([0.0273], np.float32), rule)
    assert one["within_tolerance"] is True and one["norm_ratio"] < 0.9
    pair = judge_output("scores", np.array([0.004, 0.008], np.float32), np.array([0.002, 0.004], np.float32), rule)
    assert pair["max_abs_diff"] < 0.01 and pair["within_tolerance"] is False


def test_load_reference_takes_an_fp16_models_float16_inputs(tmp_path):
    """load --reference with a model made by convert --fp16 --fp16-io: the float model gets the
    same inputs cast to its float32, so the three-way comparison is made (it failed with
    "Unexpected input data type" before)."""
    fp16 = tmp_path / "cnn16.onnx"
    assert invoke("convert", SAMPLES / "cnn.onnx", "--fp16", "--fp16-io", "-o", fp16).exit_code == 0
    result = invoke("load", fp16, "--reference", SAMPLES / "cnn.onnx", "--ep", "cpu", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert not [f for f in record["findings"] if f["code"] == "LOD004"]
    cpu = record["results"][0]
    assert cpu["three_way"]["quantization"]["cosine"] > 0.999
