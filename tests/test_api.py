"""The library is usable from Python without the CLI."""

from __future__ import annotations

import ortprep
from conftest import SAMPLES


def test_python_api(tmp_path):
    assert ortprep.inspect(SAMPLES / "cnn.onnx").to_record()["schema"] == "ortprep.inspect/1"
    assert ortprep.check(SAMPLES / "cnn.onnx", ["dml-npu"]).to_record()["results"][0]["verdict"] == "partial"
    converted = ortprep.convert(SAMPLES / "cnn.onnx", tmp_path / "f.onnx", fp16=True, ep="cuda").to_record()
    assert converted["verify"]["passed"] is True and (tmp_path / "f.onnx").exists()
    assert ortprep.simplify(SAMPLES / "cnn.onnx", tmp_path / "s.onnx").to_record()["verify"]["passed"] is True
    assert ortprep.test_load(SAMPLES / "cnn.onnx", eps=["cpu"]).to_record()["results"][0]["status"] == "ok"
    assert ortprep.quantize(SAMPLES / "cnn.onnx", tmp_path / "q.onnx", mode="static", calib="random").to_record()[
        "verify"
    ]["passed"]
    assert "onnxruntime" in ortprep.doctor().to_record()
