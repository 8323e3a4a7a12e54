"""No silent fallback (issue 52): load, check --prove and compile fail (exit 1) when the EP asked for
runs none of the model, and --min-share asks for more than none. The models are QDQ cases of
tools/probe_sessions.py: qdq_loop_only (QNN takes none of it) and qdq_if (QNN takes most of it)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

from cli_helpers import invoke
from ep_marks import needs_qnn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import probe_sessions  # noqa: E402


def _case(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(probe_sessions.CASES[name](), str(path))
    return path


def _codes(document: dict, code: str) -> list[dict]:
    return [f for f in document["findings"] if f["code"] == code]


@needs_qnn
def test_load_fails_when_qnn_runs_none_of_the_model(tmp_path):
    result = invoke("load", _case(tmp_path, "qdq_loop_only"), "--ep", "qnn", "--json")
    assert result.exit_code == 1, result.stderr
    document = result.json()
    (none,) = _codes(document, "LOD011")
    assert none["severity"] == "error" and "qnn runs none of the model's" in none["message"]
    qnn = next(r for r in document["results"] if r["ep"] == "qnn")
    assert qnn["nodes_on_ep"] == 0 and qnn["node_share"] == 0.0


@needs_qnn
def test_load_min_share_names_the_share_and_the_nodes_left(tmp_path):
    path = _case(tmp_path, "qdq_if")
    result = invoke("load", path, "--ep", "qnn", "--min-share", "0.99", "--json")
    assert result.exit_code == 1
    (short,) = _codes(result.json(), "LOD011")
    assert "below --min-share 0.99" in short["message"] and "xd_q" in short["message"]
    assert "%" in short["message"]


def test_min_share_must_be_a_share(tmp_path):
    result = invoke("load", _case(tmp_path, "qdq_if"), "--ep", "qnn", "--min-share", "1.5")
    assert result.exit_code == 2 and "--min-share 1.5" in result.stderr


def test_check_min_share_gates_the_tables_prediction(tmp_path):
    path = _case(tmp_path, "qdq_if")
    failed = invoke("check", path, "--ep", "qnn", "--min-share", "0.95", "--json")
    assert failed.exit_code == 1
    (short,) = _codes(failed.json(), "PRV004")
    assert "prediction from its tables" in short["message"] and "below --min-share 0.95" in short["message"]
    held = invoke("check", path, "--ep", "qnn", "--min-share", "0.5", "--json")
    assert held.exit_code == 0 and not _codes(held.json(), "PRV004")


@needs_qnn
def test_check_prove_fails_when_the_real_session_runs_none(tmp_path):
    result = invoke("check", _case(tmp_path, "qdq_loop_only"), "--ep", "qnn", "--prove", "--json")
    assert result.exit_code == 1
    (none,) = _codes(result.json(), "PRV004")
    assert "in the real session" in none["message"] and "runs none" in none["message"]


@needs_qnn
def test_compile_names_an_ep_that_takes_none_and_writes_nothing(tmp_path):
    out = tmp_path / "none.ctx.onnx"
    result = invoke("compile", _case(tmp_path, "qdq_loop_only"), "--ep", "qnn", "-o", out, "--json")
    assert result.exit_code == 1 and not out.exists()
    assert "runs none" in _codes(result.json(), "CMP007")[0]["message"]
    # a share below a bar is load's to judge (the real session's assignment), not compile's
    result = invoke("compile", _case(tmp_path, "qdq_if"), "--ep", "qnn", "--min-share", "0.99", "-o", out)
    assert result.exit_code == 2 and "--min-share" in result.stderr
