"""Rules from whole-model sessions (eps/session_rules.py, the QNN control-flow rule of
eps/rules.py): the tables' prediction on the cases of tools/probe_sessions.py, and, where the EP
runs here, the real session's outcome next to it (check --prove). A rule that a real session
contradicts fails here."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import onnx
import pytest

from cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import probe_sessions  # noqa: E402

OPENVINO = ROOT / ".venv-openvino" / "bin" / "python"
HAVE_QNN = importlib.util.find_spec("onnxruntime_qnn") is not None and platform.machine() in ("x86_64", "AMD64")
needs_qnn = pytest.mark.skipif(not HAVE_QNN, reason="onnxruntime-qnn (x86 simulator) is not installed")
needs_openvino = pytest.mark.skipif(not OPENVINO.exists(), reason=".venv-openvino is absent (make install makes it)")


def case(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(probe_sessions.CASES[name](), str(path))
    return path


def record(path: Path, ep: str, *extra: str) -> tuple[dict, dict]:
    result = invoke("check", path, "--ep", ep, *extra, "--json")
    document = result.json()
    return document["results"][0], document


@pytest.mark.parametrize("name", ["loop_conv_body", "loop_add_body", "loop_then_relu"])
def test_openvino_loop_is_predicted_to_fail_the_session(tmp_path, name):
    result, document = record(case(tmp_path, name), "openvino-cpu")
    assert result["verdict"] == "none"
    ep009 = [f for f in document["findings"] if f["code"] == "EP009"]
    assert len(ep009) == 1 and ep009[0]["node"] == "loop" and "Loop" in ep009[0]["message"]


def test_openvino_without_loop_has_no_session_rule(tmp_path):
    result, document = record(case(tmp_path, "if_simple"), "openvino-cpu")
    assert result["verdict"] != "none" and not any(f["code"] == "EP009" for f in document["findings"])


@needs_openvino
def test_openvino_loop_prediction_holds_on_the_real_session(tmp_path):
    result, _ = record(case(tmp_path, "loop_then_relu"), "openvino-cpu", "--prove", "--runtime",
                       f"openvino-cpu={OPENVINO}")
    assert result["predicted_verdict"] == "none" and result["proof"]["status"] == "failed"


def test_qnn_dynamic_batch_qdq_is_predicted_to_fail_and_static_is_not(tmp_path):
    dynamic, document = record(case(tmp_path, "qdq_dynamic_batch"), "qnn")
    assert dynamic["verdict"] == "none"
    assert any(f["code"] == "EP009" and "zero graph inputs" in f["message"] for f in document["findings"])
    static, document = record(case(tmp_path, "qdq_static_batch"), "qnn")
    assert static["verdict"] == "partial" and not any(f["code"] == "EP009" for f in document["findings"])


@pytest.mark.parametrize("name, verdict, if_on_qnn", [
    ("if_simple", "full", True),  # branches of Relu and Sigmoid*x: QNN takes the If whole
    ("if_reads_graph_input", "full", True),
    ("lstm_in_if", "partial", False),  # LSTM branches: the If stays on the CPU EP
])
def test_qnn_if_placement(tmp_path, name, verdict, if_on_qnn):
    path = case(tmp_path, name)
    result, _ = record(path, "qnn")
    assert result["verdict"] == verdict
    assert ("branch" in result["fallback_nodes"]) is not if_on_qnn


@needs_qnn
@pytest.mark.parametrize("name", ["if_simple", "lstm_in_if", "loop_add_body", "qdq_dynamic_batch", "qdq_static_batch"])
def test_qnn_control_flow_prediction_equals_the_real_session(tmp_path, name):
    result, _ = record(case(tmp_path, name), "qnn", "--prove")
    proof = result["proof"]
    assert result["predicted_verdict"] == result["verdict"], proof
    if proof["status"] == "created":
        assert proof["comparison"]["node_agreement"] == 1.0, proof["comparison"]
