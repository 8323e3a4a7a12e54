"""check --ep qnn knows the Erf that QNN's EP fuses into a Gelu (eps/qnn_fusions.py): predicted on
QNN in float32 and float16, and held against the real session on QNN's HTP simulator; an Erf
outside the pattern stays predicted on the CPU EP, as the session puts it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import models
from cli_helpers import invoke
from ep_marks import needs_qnn, on_x86


def _check(tmp_path, model: onnx.ModelProto, *extra) -> dict:
    path = tmp_path / "gelu.onnx"
    onnx.save(model, str(path))
    result = invoke("check", path, "--ep", "qnn", "--json", *extra)
    assert result.exit_code in (0, 1), result.stderr
    return json.loads(result.stdout)


def _erf_findings(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f.get("op_type") == "Erf"]


@pytest.mark.parametrize("order", ["half_first", "half_last", "root_last"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_erf_of_a_gelu_is_predicted_on_qnn(tmp_path, order, dtype):
    report = _check(tmp_path, models.erf_gelu(order, dtype=dtype))
    assert report["results"][0]["verdict"] == "full"
    assert _erf_findings(report) == []


def test_an_erf_outside_the_shape_stays_on_the_cpu(tmp_path):
    report = _check(tmp_path, models.erf_gelu(erf_alone=True))  # MatMul, Erf: no GELU around it
    assert report["results"][0]["verdict"] == "partial"
    assert [f["node"] for f in _erf_findings(report)] == ["gelu/erf"]


@on_x86
@needs_qnn
@pytest.mark.parametrize("kwargs, verdict",
                         [({}, "full"), ({"divisor": 10.0}, "full"), ({"erf_alone": True}, "partial"),
                          ({"order": "root_last"}, "full"), ({"scale": float(1 / np.sqrt(2.0))}, "full"),
                          ({"scale": 0.5, "order": "half_last"}, "full")])
def test_the_real_session_agrees(tmp_path, kwargs, verdict):
    report = _check(tmp_path, models.erf_gelu(**kwargs), "--prove")
    result = report["results"][0]
    assert result["predicted_verdict"] == verdict
    assert result["verdict"] == verdict  # the session's word
    assert (result["proof"]["comparison"] or {}).get("differing_op_types") == {}


def test_a_shape_that_is_not_a_gelu_is_said(tmp_path):
    report = _check(tmp_path, models.erf_gelu(divisor=10.0))
    assert report["results"][0]["verdict"] == "full"  # QNN takes it: the placement is whole
    told = [f for f in report["findings"] if f["code"] == "QNN011"]
    assert len(told) == 1 and told[0]["node"] == "gelu/erf"
    assert "the divisor is 10, not 1.41421" in told[0]["message"]
    assert "--keep-off-ep gelu/erf" in told[0]["fix"]
    assert not [f for f in _check(tmp_path, models.erf_gelu())["findings"] if f["code"] == "QNN011"]


@on_x86
@needs_qnn
def test_qnn_computes_a_gelu_where_the_shape_is_not_one_and_the_fix_mends_it(tmp_path):
    path, fixed = tmp_path / "g10.onnx", tmp_path / "g10.kept.onnx"
    onnx.save(models.erf_gelu(divisor=10.0), str(path))
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(1, 8, 16)).astype(np.float32))
    loaded = json.loads(invoke("load", path, "--ep", "qnn", "--inputs", tmp_path / "x.npz", "--json").stdout)
    assert loaded["results"][0]["outputs_match"] is False  # the measured fault: a GELU, not x / 10
    assert loaded["results"][0]["max_abs_diff"] > 0.5
    result = invoke("convert", path, "--keep-off-ep", "gelu/erf", "-o", fixed, "--inputs", tmp_path / "x.npz")
    assert result.exit_code == 0, result.stderr
    loaded = json.loads(invoke("load", fixed, "--ep", "qnn", "--inputs", tmp_path / "x.npz", "--json").stdout)
    assert loaded["results"][0]["outputs_match"] is True
    assert not [f for f in _check(tmp_path, onnx.load(str(fixed)))["findings"] if f["code"] == "QNN011"]


def test_a_dynamic_shape_still_refuses_it(tmp_path):
    model = models.erf_gelu()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    report = _check(tmp_path, model)
    assert report["results"][0]["verdict"] == "none"
    assert [f["code"] for f in report["findings"] if f.get("node") == "gelu/erf"] == ["QNN002"]


def test_a_constant_node_is_read_and_an_unnamed_node_has_its_label(tmp_path):
    from onnx import helper

    model = models.erf_gelu()
    kept = [t for t in model.graph.initializer if t.name != "root2"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.node.insert(0, helper.make_node("Constant", [], ["root2"], value_float=float(np.sqrt(2.0))))
    assert not [f for f in _check(tmp_path, model)["findings"] if f["code"] == "QNN011"]  # a GELU: nothing said
    model = models.erf_gelu(scale=0.5)  # x * 0.5 inside the Erf: not a GELU
    for node in model.graph.node:
        node.name = ""
    told = [f for f in _check(tmp_path, model)["findings"] if f["code"] == "QNN011"]
    assert len(told) == 1 and "builds Mul#1, Erf#2, Add#3, Mul#4, Mul#5 as one Gelu" in told[0]["message"]
    assert "the scale is 0.5, not 0.707107" in told[0]["message"]
