from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from rich.console import Console

from cli_helpers import invoke
from conftest import HAVE_ORT, ROOT, SAMPLE_MODELS, saw_codes
from models import broken_undefined_input, contrib_op, relu
from ortprep.model import ModelHandle
from ortprep.render.console import render_inspect
from ortprep.render.json import dumps
from ortprep.runtime.providers import ort_max_opset
from ortprep.steps.inspect import inspect_model

needs_ort = pytest.mark.skipif(not HAVE_ORT, reason="compares with the installed ONNX Runtime")

GOLDEN = ROOT / "tests" / "golden"


def record_of(path: Path) -> dict:
    return inspect_model(ModelHandle.open(path)).to_record()


def codes(record: dict) -> set[str]:
    return {f["code"] for f in record["findings"]}


def save(tmp_path: Path, model: onnx.ModelProto, name: str = "m.onnx") -> Path:
    path = tmp_path / name
    onnx.save_model(model, str(path))
    return path


# ---------------------------------------------------------------- sample models


@pytest.mark.parametrize("path", SAMPLE_MODELS, ids=lambda p: p.name)
def test_cli_inspect_every_sample_model(path):
    human = invoke("inspect", path)
    assert human.exit_code == 0, human.stderr
    assert "IR version 8" in human.stdout
    as_json = invoke("inspect", path, "--json")
    assert as_json.exit_code == 0
    record = as_json.json()  # stdout holds the JSON document and nothing else
    assert record["schema"] == "ortprep.inspect/1"
    assert record["opsets"]["ai.onnx"] == 17


@needs_ort
def test_cnn_facts(samples):
    record = record_of(samples / "cnn.onnx")
    assert record["op_histogram"]["ai.onnx"] == {
        "BatchNormalization": 2,
        "Conv": 2,
        "Relu": 2,
        "Flatten": 1,
        "Gemm": 1,
        "GlobalAveragePool": 1,
    }
    assert record["inputs"] == [{"name": "image", "kind": "tensor", "dtype": "float", "shape": [1, 3, 32, 32]}]
    # conv1 8*3*3*3+8, bn1 4*8, conv2 16*8*3*3+16, bn2 4*16, fc 10*16+10
    assert record["parameters"] == 224 + 32 + 1168 + 64 + 170
    assert record["findings"] == []


def test_symbolic_dims_are_named(samples):
    record = record_of(samples / "transformer_block.onnx")
    assert record["inputs"][0]["shape"] == ["batch", "sequence", 64]
    assert record["op_histogram"]["ai.onnx"]["MatMul"] == 8  # q, k, v, qk, attend, o, ffn1, ffn2
    # the human table prints them: '[batch, sequence, 64]' is the model's text, not Rich markup
    # (openwakeword's '[batch_size, samples]' was printed as an empty cell)
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_inspect(record, console)
    assert "[batch, sequence, 64]" in console.file.getvalue()
    # metadata and the producer are the model's text too: '[/data/labels.txt]' raised MarkupError
    record = {**record, "metadata": {"labels": "in [/data/labels.txt]", "imgsz": "[batch_size, 640]"},
              "producer": {"name": "exporter [/x]", "version": "1"}}
    render_inspect(record, console)
    text = console.file.getvalue()
    assert "metadata labels: in [/data/labels.txt]" in text and "metadata imgsz: [batch_size, 640]" in text
    assert "producer: exporter [/x] 1" in text


def test_subgraph_nodes_counted(samples):
    record = record_of(samples / "control_flow.onnx")
    assert record["nodes"] == {"total": 6, "top_level": 2, "in_subgraphs": 4, "subgraphs": 3}
    assert record["op_histogram"]["ai.onnx"]["Add"] == 2


def test_fp16_initializers(samples):
    record = record_of(samples / "cnn_fp16.onnx")
    assert list(record["initializers"]) == ["float16"]
    assert record["inputs"][0]["dtype"] == "float16"


def test_external_data_listed_without_reading(samples):
    record = record_of(samples / "external_data" / "mlp.onnx")
    assert record["external_data"] == [
        {"location": "mlp.onnx.data", "size": 37888, "tensors": 2, "bytes_referenced": 37888}
    ]
    assert record["initializers"]["float"]["count"] == 4
    assert record["parameters"] == 128 * 64 + 128 + 10 * 128 + 10


def test_hash_data_adds_data_file_digest(samples):
    record = invoke("inspect", samples / "external_data" / "mlp.onnx", "--json", "--hash-data").json()
    assert set(record["model"]["sha256"]) == {"mlp.onnx", "mlp.onnx.data"}


def test_report_file_written(tmp_path, samples):
    report = tmp_path / "inspect.json"
    result = invoke("inspect", samples / "cnn.onnx", "--report", report)
    assert result.exit_code == 0
    assert json.loads(report.read_text())["schema"] == "ortprep.inspect/1"


def _normalized(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    record["model"]["path"] = "<path>"
    record["runtime"] = "<runtime>"
    return record


@needs_ort
@pytest.mark.parametrize("name", ["cnn.onnx", "custom_op.onnx", "control_flow.onnx"])
def test_golden_json(samples, name):
    record = _normalized(invoke("inspect", samples / name, "--json").json())
    golden = GOLDEN / f"inspect_{name.removesuffix('.onnx')}.json"
    if os.environ.get("ORTPREP_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(record, indent=2) + "\n")
        pytest.fail(f"golden file {golden.name} rewritten; review the diff and rerun without ORTPREP_UPDATE_GOLDEN")
    assert record == json.loads(golden.read_text())


# ---------------------------------------------------------------- findings: raised and not raised


def test_mod001_checker_failure(tmp_path):
    record = record_of(save(tmp_path, broken_undefined_input()))
    assert "MOD001" in codes(record)
    assert record["checker"]["passed"] is False
    assert invoke("inspect", tmp_path / "m.onnx").exit_code == 1
    assert invoke("inspect", tmp_path / "m.onnx", "--fail-on", "never").exit_code == 0
    assert "MOD001" not in codes(record_of(save(tmp_path, relu(), "ok.onnx")))


@needs_ort
def test_mod002_opset_newer_than_ort(tmp_path):
    limit = ort_max_opset()
    assert limit is not None and limit >= 17
    newer = record_of(save(tmp_path, relu(opset=limit + 1), "newer.onnx"))
    assert "MOD002" in codes(newer)
    assert "MOD002" not in codes(record_of(save(tmp_path, relu(opset=limit), "same.onnx")))


def test_mod003_opset_newer_than_onnx(tmp_path):
    beyond = onnx.defs.onnx_opset_version() + 1
    assert "MOD003" in codes(record_of(save(tmp_path, relu(opset=beyond), "beyond.onnx")))
    assert "MOD003" not in codes(record_of(save(tmp_path, relu(), "ok.onnx")))


def test_mod004_custom_domain(samples):
    record = record_of(samples / "custom_op.onnx")
    finding = next(f for f in record["findings"] if f["code"] == "MOD004")
    assert "com.example.ortprep" in finding["message"] and "FancyActivation" in finding["message"]
    assert record["custom_domains"] == ["com.example.ortprep"]
    assert "MOD004" not in codes(record_of(samples / "cnn.onnx"))


def test_mod005_contrib_domain(tmp_path, samples):
    record = record_of(save(tmp_path, contrib_op()))
    assert "MOD005" in codes(record) and "MOD004" not in codes(record)
    assert "MOD005" not in codes(record_of(samples / "custom_op.onnx"))


def test_mod007_ir_version_newer_than_onnx(tmp_path):
    assert "MOD007" in codes(record_of(save(tmp_path, relu(ir_version=onnx.IR_VERSION + 1), "ir.onnx")))
    assert "MOD007" not in codes(record_of(save(tmp_path, relu(), "ok.onnx")))


def test_mod008_no_default_opset(tmp_path):
    model = relu()
    del model.opset_import[:]
    model.opset_import.append(onnx.helper.make_opsetid("ai.onnx.ml", 3))
    assert "MOD008" in codes(record_of(save(tmp_path, model, "noopset.onnx")))
    assert "MOD008" not in codes(record_of(save(tmp_path, relu(), "ok.onnx")))


# ---------------------------------------------------------------- without ONNX Runtime

# Runs ortprep in a child whose import of onnxruntime fails, as on a machine without it.
NO_ORT = """
import sys
sys.modules["onnxruntime"] = None
sys.argv = ["ortprep"] + sys.argv[1:]
from ortprep.cli.app import main
main()
"""


@needs_ort
def test_mod006_and_inspect_work_without_ort(samples):
    child = subprocess.run(
        [sys.executable, "-c", NO_ORT, "inspect", str(samples / "cnn.onnx"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    record = json.loads(child.stdout)
    saw_codes(record)
    assert record["runtime"]["onnxruntime"] is None and record["runtime"]["ort_max_opset"] is None
    finding = next(f for f in record["findings"] if f["code"] == "MOD006")
    assert "pip install 'ortprep[cpu]'" in finding["fix"]
    assert "MOD006" not in codes(record_of(samples / "cnn.onnx"))


def test_require_ort_exits_3_with_install_line():
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        "from ortprep.errors import OrtprepError\n"
        "from ortprep.runtime.providers import require_ort\n"
        "try:\n    require_ort()\n"
        "except OrtprepError as exc:\n    print(exc.one_line()); sys.exit(int(exc.exit_code))\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 3
    assert "ONNX Runtime is not installed" in child.stdout
    assert "pip install 'ortprep[cpu]'" in child.stdout


# ---------------------------------------------------------------- the models shipped with onnx

ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
ONNX_MODELS = sorted(ONNX_DATA.rglob("*.onnx"))


def test_onnx_backend_models_exist():
    assert len(ONNX_MODELS) > 100


@pytest.mark.parametrize("path", ONNX_MODELS, ids=lambda p: str(p.relative_to(ONNX_DATA)))
def test_inspect_onnx_backend_model(path):
    record = record_of(path)
    assert json.loads(dumps(record))["schema"] == "ortprep.inspect/1"
    assert record["nodes"]["total"] >= 1
    text = io.StringIO()
    render_inspect(record, Console(file=text, width=120))
    assert f"IR version {record['ir_version']}" in text.getvalue()
