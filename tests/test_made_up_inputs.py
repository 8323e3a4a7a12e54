"""Made-up inputs are not a verification of int8 (issue 52): a quantization judged only on inputs
ortprep made up exits 1 and writes nothing (QNT033), unless asked for with --eval random; the
report then says what the inputs were (evaluation_data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from cli_helpers import quantize, write_samples
from onnx import TensorProto, helper, numpy_helper


def _projection(path: Path) -> Path:
    """A MatMul and a Tanh: outputs with no decision to infer (a feature vector)."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
                               helper.make_node("Tanh", ["h"], ["y"], name="tanh")], "proj",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_dynamic_without_data_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "q.onnx"
    code, record, _ = quantize(_projection(tmp_path / "proj.onnx"), "--dynamic", "-o", out, "--keep-failed")
    assert code == 1 and not out.exists() and not list(tmp_path.glob("*.failed.onnx"))
    (refusal,) = [f for f in record["findings"] if f["code"] == "QNT033"]
    assert refusal["severity"] == "error" and "made up" in refusal["message"]
    assert "--eval DIR" in refusal["fix"] and "--calib DIR" in refusal["fix"] and "--eval random" in refusal["fix"]
    assert record["output"] is None and record["evaluation_data"] is None


def test_eval_random_is_written_and_says_the_inputs_were_made_up(tmp_path):
    out = tmp_path / "q.onnx"
    code, record, _ = quantize(_projection(tmp_path / "proj.onnx"), "--dynamic", "--eval", "random", "-o", out)
    assert code == 0 and out.exists(), record["findings"]
    assert record["evaluation_data"] == "random" and record["evaluation_inputs"].startswith("random (8 seeded")
    assert [f["severity"] for f in record["findings"] if f["code"] == "QNT011"] == ["warning"]
    assert not any(f["code"] == "QNT033" for f in record["findings"])


def test_weight_only_without_data_is_refused_and_real_samples_are_named(tmp_path):
    model = _projection(tmp_path / "proj.onnx")
    code, record, _ = quantize(model, "--weight-only", "int8", "--auto", "-o", tmp_path / "w.onnx")
    assert code == 1 and not (tmp_path / "w.onnx").exists()
    assert any(f["code"] == "QNT033" for f in record["findings"])
    assert len(record["auto"]["tried"]) == 1  # no other precision changes a want of data
    data = write_samples(tmp_path / "data", "x", (1, 64), 4)
    code, record, _ = quantize(model, "--dynamic", "--eval", data, "-o", tmp_path / "d.onnx")
    assert code == 0 and record["evaluation_data"] == "samples", record["findings"]


def test_auto_goes_on_to_a_dynamic_attempt_where_one_real_sample_leaves_none_held_back(tmp_path):
    """--auto with one real --calib sample: the static attempts have none to hold back (QNT033), but
    the sample is real, so the dynamic attempt judges on it and writes; only made-up or absent data
    stops --auto at its first attempt."""
    from conftest import SAMPLES

    calib = write_samples(tmp_path / "calib", "image", (1, 3, 32, 32), 1)
    code, record, _ = quantize(SAMPLES / "cnn.onnx", "--static", "--calib", calib, "--auto", "-o", tmp_path / "q.onnx")
    tried = record["auto"]["tried"]
    assert "QNT033" in tried[0]["codes"] and tried[-1]["label"].startswith("dynamic"), tried
    assert code == 0 and record["evaluation_data"] == "samples" and (tmp_path / "q.onnx").exists()
