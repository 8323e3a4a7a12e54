"""The CUDA and TensorRT paths on a real GPU. CI has none: every test here skips with the reason
unless onnxruntime-gpu runs its CUDA EP on this machine (bench/studies/gpu_proof.sh sets one up)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import invoke
from conftest import ROOT, SAMPLES

from ortprep.runtime.providers import probe_runtime

HAVE_CUDA = probe_runtime().runs("cuda")
pytestmark = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA EP here (onnxruntime-gpu and an NVIDIA GPU are needed)")


def test_load_on_cuda_puts_every_node_there_and_matches_the_cpu():
    result = invoke("load", SAMPLES / "cnn.onnx", "--ep", "cuda", "--ep", "cpu", "--json")
    assert result.exit_code == 0, result.stdout
    rows = {row["ep"]: row for row in result.json()["results"]}
    cuda = rows["cuda"]
    assert cuda["status"] == "ok" and cuda["nodes_on_ep"] == cuda["nodes_total"]
    assert cuda["outputs_match"] is True and cuda["max_abs_diff"] < 1e-4


def test_load_package_picks_the_fp16_variant_for_cuda(tmp_path):
    rng = np.random.default_rng(3)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, image=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    made = invoke("package", SAMPLES / "cnn.onnx", "-o", tmp_path / "pkg", "--target", "cpu", "--target", "cuda",
                  "--inputs", inputs, "--json")
    assert made.exit_code == 0, made.stdout
    cuda_proofs = json.loads((tmp_path / "pkg/model/component.json").read_text())["variants"]["cuda"]
    # proven here, not predicted
    assert cuda_proofs["additional_metadata"]["ortprep"]["proofs"]["load"]["status"] == "ok"
    result = invoke("load", "--package", tmp_path / "pkg", "--ep", "cuda", "--ep", "cpu", "--inputs", inputs, "--json")
    assert result.exit_code == 0, result.stdout
    rows = {row["ep"]: row for row in result.json()["results"]}
    assert rows["cuda"]["variant"] == "cuda" and rows["cpu"]["variant"] == "cpu"
    load = rows["cuda"]["load"]
    assert load["nodes_on_ep"] == load["nodes_total"]
    assert load["three_way"]["total"]["cosine"] > 0.999  # FP16 on the GPU against the float variant


def test_tensorrt_without_its_libraries_is_reported_not_silent():
    if importlib.util.find_spec("tensorrt_libs") or importlib.util.find_spec("tensorrt"):
        pytest.skip("TensorRT libraries are installed here: the fallback case does not arise")
    result = invoke("load", SAMPLES / "cnn.onnx", "--ep", "tensorrt", "--json")
    record = result.json()
    # ortprep's session takes no ORT fallback: the TensorRT session is not created, in ORT's words,
    # and the report says where an application's Python session would have gone instead
    failed = [f for f in record["findings"] if f["code"] == "LOD004"]
    assert result.exit_code == 1 and failed, record["findings"]
    assert "TensorRT libraries" in failed[0]["message"] and "silently" in failed[0]["message"]
    assert failed[0]["fix"].startswith("ortprep doctor")


@pytest.mark.skipif(
    importlib.util.find_spec("cuda") is None, reason="cuda-bindings (NVIDIA's CUDA Python) not installed"
)
def test_ort_cuda_sessions_survive_a_foreign_cuda_context():
    """The seeds' clash (TensorRT under pycuda.autoinit next to ORT's CUDA EP: "invalid resource
    handle") put to ORT alone: a foreign, non-primary context current at session creation, destroyed
    before the next run, or pushed after creation. Measured on an H100 with onnxruntime-gpu 1.31.1
    (2026-11-25): ORT's CUDA EP ran in every case, so the handle that goes invalid is TensorRT's
    (its engine and buffers made in pycuda's context), not ORT's; doctor's SCN001/DOC004 say so."""
    script = ROOT / "bench/studies/gpu_context_clash.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    rows = {row["scenario"]: row for row in map(json.loads, filter(None, done.stdout.splitlines()))}
    assert set(rows) == {"ort_alone", "foreign_current_at_create_then_destroyed", "foreign_pushed_after_create",
                         "foreign_pushed_and_popped_around_use"}
    for row in rows.values():
        assert row["status"] == "ok" and row["providers"][0] == "CUDAExecutionProvider", row
    assert "run after it ok" in rows["foreign_current_at_create_then_destroyed"]["steps"]


def _tf32_sensitive(tmp_path):
    """x @ w where each pair of x's columns differs by less than half a TF32 step and w's matching
    rows cancel: float32 keeps the difference (every output about -1.23), TF32 rounds it away (0)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    u = rng.integers(16, 32, (64, 2048)).astype(np.float32) / 16  # exact in TF32: [1, 2) in steps of 1/16
    v = rng.integers(16, 32, 2048).astype(np.float32) / 16
    x = np.empty((64, 4096), np.float32)
    x[:, 0::2], x[:, 1::2] = u, u + np.float32(4e-4)  # TF32's step in [1, 2) is 2**-10; half of it is 4.9e-4
    w = np.empty((4096, 64), np.float32)
    w[0::2], w[1::2] = v[:, None], -v[:, None]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "tf32",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "tf32.onnx"
    path.write_bytes(model.SerializeToString())
    np.savez(tmp_path / "x.npz", x=x)
    return path, tmp_path / "x.npz"


def test_load_on_cuda_puts_a_tf32_difference_down_to_tf32(tmp_path):
    from ortprep.runtime.gpu import compute_capability

    if (compute_capability() or 8.0) < 8.0:
        pytest.skip("this GPU predates TF32 (compute capability below 8.0): its CUDA session computes in float32")
    model, inputs = _tf32_sensitive(tmp_path)
    result = invoke("load", model, "--ep", "cuda", "--ep", "cpu", "--inputs", inputs, "--json")
    record = result.json()
    cuda = {row["ep"]: row for row in record["results"]}["cuda"]
    codes = {f["code"] for f in record["findings"]}
    # CUDA's default session (use_tf32 on) loses the difference; the same session with it off keeps it
    assert result.exit_code == 1 and "LOD006" in codes and cuda["outputs_match"] is False, record["findings"]
    assert cuda["max_abs_diff"] > 1.0
    assert (
        cuda["tf32_off"]["ran"]
        and cuda["tf32_off"]["outputs_match"] is True
        and cuda["tf32_off"]["max_abs_diff"] < 1e-2
    )
    told = [f for f in record["findings"] if f["code"] == "LOD010"]
    assert told and "use_tf32=0" in told[0]["fix"]
    # and asked for float32 from the start, it matches
    plain = invoke("load", model, "--ep", "cuda", "--ep", "cpu", "--inputs", inputs,
                   "--provider-option", "cuda:use_tf32=0", "--json")
    assert plain.exit_code == 0, plain.stdout
    assert {row["ep"]: row for row in plain.json()["results"]}["cuda"]["outputs_match"] is True
