"""QDQ models with If and Loop on QNN (issue 52): check's tables-only verdict against the real
session's (tools/probe_sessions.py's qdq_* cases, measured in eps/data/measured/sessions.json).
Two rules stand on them: an If whose branches read a value that a node off QNN makes stays on the
CPU EP, and a partition of one lone Q/DQ node is given back to the CPU EP (QNN009)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

from cli_helpers import invoke
from ep_marks import needs_qnn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import probe_sessions  # noqa: E402

QDQ_CASES = ["qdq_if", "qdq_loop", "qdq_if_loop", "qdq_loop_if", "qdq_loop_first", "qdq_loop_only"]


def _case(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(probe_sessions.CASES[name](), str(path))
    return path


def _check(path: Path, *extra: str) -> tuple[dict, dict]:
    result = invoke("check", path, "--ep", "qnn", *extra, "--json")
    document = result.json()
    return document["results"][0], document


@pytest.mark.parametrize("name, verdict, if_on_qnn", [
    ("qdq_if", "partial", True),  # the branches read the Conv's DQ, on QNN: the If goes with them
    ("qdq_loop_if", "partial", False),  # they read the Loop's DQ, off QNN: the If stays on the CPU EP
    ("qdq_loop_only", "none", None),  # the graph input's lone DQ is all QNN would take: none
])
def test_tables_only_verdict_of_qdq_control_flow(tmp_path, name, verdict, if_on_qnn):
    result, document = _check(_case(tmp_path, name))
    assert result["verdict"] == verdict
    if if_on_qnn is not None:
        assert ("branch" in result["fallback_nodes"]) is not if_on_qnn
    if name == "qdq_loop_if":
        why = next(f for f in document["findings"] if f["node"] == "branch")
        assert "'ld'" in why["message"] and "ld_dq" in why["message"]
    lone = [f["node"] for f in document["findings"] if f["code"] == "QNN009"]
    assert lone == (["xd_dq"] if name == "qdq_loop_only" else [])


@needs_qnn
@pytest.mark.parametrize("name", QDQ_CASES)
def test_tables_only_verdict_equals_the_real_qnn_session(tmp_path, name):
    result, _ = _check(_case(tmp_path, name), "--prove")
    proof = result["proof"]
    assert proof["status"] == "created", proof
    assert result["predicted_verdict"] == proof["comparison"]["actual_verdict"], proof["comparison"]
    # where the If and the Loop went, as the session placed them
    for node in ("branch", "loop"):
        predicted_off = node in result["fallback_nodes"]
        if node in {n.name for n in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node}:
            assert predicted_off == (node in proof["fallback_nodes"]), (node, proof["fallback_nodes"])
