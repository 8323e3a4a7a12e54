"""Proof on real EPs that run on a plain x86 Linux machine: QNN's HTP backend (the x86 simulator
in onnxruntime-qnn 2.x, a plugin next to onnxruntime) and OpenVINO's CPU device (the
onnxruntime-openvino wheel, in its own environment .venv-openvino). `make install` sets up both;
without them these tests skip with the reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import onnx

import models
from cli_helpers import invoke
from ep_marks import OPENVINO_PYTHON, needs_qnn, needs_openvino, on_x86
from conftest import ROOT, SAMPLES

pytestmark = on_x86


@pytest.fixture(scope="module")
def qdq_cnn(tmp_path_factory) -> Path:
    """The CNN sample quantized with the QNN preset (QDQ, uint16 activations, static shapes)."""
    folder = tmp_path_factory.mktemp("qdq")
    calib = folder / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for index in range(10):
        np.savez(calib / f"s{index}.npz", image=rng.random((1, 3, 32, 32), dtype=np.float32))
    out = folder / "cnn.qdq.onnx"
    result = invoke("quantize", SAMPLES / "cnn.onnx", "--static", "--calib", calib, "--ep", "qnn", "-o", out)
    assert result.exit_code == 0, result.stderr
    return out


def _only(record: dict) -> dict:
    assert len(record["results"]) == 1
    return record["results"][0]


def codes(record: dict) -> set[str]:
    return {f["code"] for f in record["findings"]}


@needs_qnn
def test_qdq_sample_on_the_real_qnn_htp_simulator(qdq_cnn):
    result = invoke("load", qdq_cnn, "--ep", "qnn", "--runs", "2", "--json")
    record = result.json()
    qnn = _only(record)
    assert qnn["status"] == "fallback" and qnn["package"].startswith("onnxruntime-qnn 2.")
    # All but the graph-input Q and graph-output DQ run on QNN, in one subgraph; outputs match the CPU EP.
    assert qnn["nodes_on_ep"] / qnn["nodes_total"] >= 0.9
    assert sorted(qnn["fallback_nodes"]) == ["image_QuantizeLinear", "logits_DequantizeLinear"]
    assert [ep for ep, _ in qnn["subgraphs"]].count("QNNExecutionProvider") == 1
    assert qnn["outputs_match"] is True
    # QNN's own reason for the two CPU nodes is captured; check predicted exactly this placement.
    assert "configured to not take Q nodes" in qnn["rejected_nodes"]["image_QuantizeLinear"]["reason"]
    comparison = qnn["check_comparison"]
    assert comparison["node_agreement"] == 1.0 and comparison["differing_op_types"] == {}
    assert comparison["predicted_partitions"] == comparison["actual_partitions"] == 1
    assert comparison["predicted_verdict"] == comparison["actual_verdict"] == "partial"
    assert "LOD001" not in codes(record) and result.exit_code == 0


@needs_qnn
def test_qnn_rejection_names_the_node_and_the_reason():
    """Dynamic shapes: QNN rejects every node ("Cannot get shape"); check predicts the same."""
    record = invoke("load", SAMPLES / "transformer_block.onnx", "--ep", "qnn", "--runs", "1", "--json").json()
    qnn = _only(record)
    assert qnn["nodes_on_ep"] == 0
    rejected = qnn["rejected_nodes"]
    assert rejected["ln1"] == {"op_type": "LayerNormalization", "reason": "Cannot get shape of input 0"}
    finding = next(f for f in record["findings"] if f["code"] == "LOD008" and f["node"] == "ln1")
    assert "Cannot get shape" in finding["message"] and "--fix-shape" in finding["fix"]
    assert qnn["check_comparison"]["node_agreement"] == 1.0
    assert qnn["check_comparison"]["predicted_verdict"] == qnn["check_comparison"]["actual_verdict"] == "none"


@needs_qnn
def test_unnamed_nodes_are_placed_one_by_one(qdq_cnn, tmp_path):
    """ORT records its graph assignment by node name: with every name empty, the whole model was one
    node '' and check --prove said 'none' for a model QNN takes. Each node now keeps the label check
    gives it (OP#INDEX), so the proof and load count them one by one."""
    model = onnx.load(qdq_cnn)
    for node in model.graph.node:
        node.name = ""
    unnamed = tmp_path / "unnamed.onnx"
    onnx.save(model, unnamed)
    first_q = next(i for i, n in enumerate(model.graph.node) if n.op_type == "QuantizeLinear")
    named = _only(invoke("check", qdq_cnn, "--ep", "qnn", "--prove", "--json").json())["proof"]
    proof = _only(invoke("check", unnamed, "--ep", "qnn", "--prove", "--json").json())
    # the same placement as the named file's (ORT adds a few DQ copies of its own: more than 20 nodes)
    assert named["nodes_total"] > 20
    assert (proof["proof"]["nodes_total"], proof["proof"]["nodes_on_ep"]) == (
        named["nodes_total"],
        named["nodes_on_ep"],
    )
    assert proof["verdict"] == proof["predicted_verdict"] == "partial"
    assert f"QuantizeLinear#{first_q}" in proof["proof"]["fallback_nodes"]
    assert proof["proof"]["comparison"]["node_agreement"] == 1.0
    loaded = _only(invoke("load", unnamed, "--ep", "qnn", "--runs", "1", "--json").json())
    assert (loaded["nodes_on_ep"], loaded["nodes_total"]) == (named["nodes_on_ep"], named["nodes_total"])
    assert loaded["check_comparison"]["actual_verdict"] == "partial"
    assert onnx.load(unnamed).graph.node[0].name == ""  # the user's file is not touched


@needs_openvino
def test_unnamed_nodes_are_labelled_in_an_ep_environment_without_onnx(qdq_cnn, tmp_path):
    """onnxruntime-openvino's own environment (make install's .venv-openvino) has no onnx: the
    worker there labels the unnamed nodes at the protobuf wire level. Before, check --prove of the
    PP-Structure layout detector (unnamed nodes) said 'none' there: "No module named 'onnx'"."""
    model = onnx.load(qdq_cnn)
    for node in model.graph.node:
        node.name = ""
    unnamed = tmp_path / "unnamed.onnx"
    onnx.save(model, unnamed)
    import subprocess

    if subprocess.run([str(OPENVINO_PYTHON), "-c", "import onnx"], capture_output=True).returncode == 0:
        pytest.skip("onnx is installed beside onnxruntime-openvino here: the path without it is not exercised")
    runtime = ("--runtime", f"openvino-cpu={OPENVINO_PYTHON}")
    named = _only(invoke("check", qdq_cnn, "--ep", "openvino-cpu", "--prove", *runtime, "--json").json())
    proof = _only(invoke("check", unnamed, "--ep", "openvino-cpu", "--prove", *runtime, "--json").json())
    assert proof["proof"]["status"] == "created", proof["proof"]
    assert (proof["proof"]["nodes_total"], proof["proof"]["nodes_on_ep"]) == (named["proof"]["nodes_total"],
                                                                              named["proof"]["nodes_on_ep"])
    assert proof["verdict"] == named["verdict"]


def test_the_wire_level_labels_equal_checks():
    """runtime/requests/sessions.label_unnamed_nodes names each unnamed main-graph node OP#INDEX and
    leaves everything else as it was: read back by onnx, the same model with those names."""
    from ortprep.runtime.requests.sessions import label_unnamed_nodes

    model = models.diamond()
    model.graph.node[1].name = ""
    model.graph.node[2].name = ""
    labelled = onnx.load_from_string(label_unnamed_nodes(model.SerializeToString()))
    assert [n.name for n in labelled.graph.node] == [
        n.name or f"{n.op_type}#{i}" for i, n in enumerate(model.graph.node)
    ]
    for index in (1, 2):
        labelled.graph.node[index].name = ""
    assert labelled == model  # field by field: nothing else changed


@needs_qnn
def test_float_model_runs_on_qnn_htp():
    """Measured: the simulator takes the float CNN whole (QNN001 is a warning, not an error)."""
    record = invoke("load", SAMPLES / "cnn.onnx", "--ep", "qnn", "--runs", "5", "--json").json()
    qnn = _only(record)
    assert qnn["status"] == "ok" and qnn["nodes_on_ep"] == qnn["nodes_total"] and qnn["outputs_match"] is True
    # the simulator's time is not the device's: no timed runs (eleven runs of the layout detector
    # took longer than load's 300 s), and the record says why
    assert qnn["latency_ms"] is None and "simulator" in qnn["latency_not_timed"]
    check = invoke("check", SAMPLES / "cnn.onnx", "--ep", "qnn", "--json").json()
    assert check["results"][0]["verdict"] == "full" and "QNN001" in codes(check)
    # the fix loads the quantized output against the float model, not the float model again
    fix = next(f["fix"] for f in check["findings"] if f["code"] == "QNN001")
    assert f"load {SAMPLES / 'cnn.qdq.onnx'} --ep qnn --reference {SAMPLES / 'cnn.onnx'}" in fix


@needs_openvino
def test_qdq_sample_on_real_openvino_cpu(qdq_cnn, tmp_path):
    result = invoke("load", qdq_cnn, "--ep", "openvino-cpu", "--runtime", f"openvino-cpu={OPENVINO_PYTHON}",
                    "--runs", "2", "--json")
    assert result.exit_code == 0, result.stdout
    ov = _only(result.json())
    assert ov["status"] == "ok" and ov["nodes_on_ep"] == ov["nodes_total"] > 20
    assert ov["outputs_match"] is True and ov["runtime"] == str(OPENVINO_PYTHON)
    assert ov["check_comparison"]["node_agreement"] == 1.0
    assert ov["check_comparison"]["predicted_partitions"] == ov["check_comparison"]["actual_partitions"] == 1
    # The same through a config file, with the runtime path relative to it.
    shutil.copy(qdq_cnn, tmp_path / "m.onnx")
    relative = os.path.relpath(OPENVINO_PYTHON, tmp_path)
    (tmp_path / "ortprep.toml").write_text(
        f'model = "m.onnx"\n[[steps]]\nrun = "load"\neps = ["openvino"]\nruns = 1\n'
        f'runtimes = {{ openvino = "{relative}" }}\n')
    run = invoke("run", tmp_path / "ortprep.toml", "--json")
    assert run.exit_code == 0 and run.json()["steps"][0]["report"]["results"][0]["status"] == "ok"


def test_unknown_runtime_path_is_a_usage_error(tmp_path):
    result = invoke("load", SAMPLES / "cnn.onnx", "--runtime", f"openvino-cpu={tmp_path / 'nope' / 'python'}")
    assert result.exit_code == 2 and "no Python interpreter" in result.stderr


@needs_qnn
def test_doctor_lists_the_qnn_plugin_without_a_clash():
    record = invoke("doctor", "--json").json()
    assert "DOC001" not in codes(record)
    assert [d["name"] for d in record["onnxruntime"]["distributions"]] == ["onnxruntime"]
    qnn = next(row for row in record["eps"] if row["ep"] == "qnn")
    assert qnn["available"] and qnn["via"] == "plugin" and qnn["package"].startswith("onnxruntime-qnn 2.")
    assert qnn["devices"] and qnn["requires"] and qnn["requires"].startswith("onnxruntime")
    cuda = next(row for row in record["eps"] if row["ep"] == "cuda")
    assert not cuda["available"] and "onnxruntime-gpu" in cuda["install"]


def test_plugin_packages_are_not_flavours():
    from ortprep.runtime.providers import is_plugin_package

    assert is_plugin_package("onnxruntime-qnn", "2.7.0") and not is_plugin_package("onnxruntime-qnn", "1.22.0")
    assert is_plugin_package("onnxruntime-ep-openvino", "1.8.1")
    assert not is_plugin_package("onnxruntime-gpu", "1.32.0")


@needs_openvino
def test_a_crash_inside_ort_stays_in_the_probe_child():
    """onnxruntime-openvino 1.24.1 dies with SIGSEGV in get_all_opkernel_def; ortprep asks in a child."""
    from ortprep.runtime.providers import probe_runtime

    crashed = probe_runtime(str(OPENVINO_PYTHON), kernels=True)
    if crashed.ok:
        pytest.skip("this onnxruntime-openvino build no longer crashes in its kernel registry")
    assert "died" in crashed.error
    fine = probe_runtime(str(OPENVINO_PYTHON))
    assert fine.ok and "OpenVINOExecutionProvider" in fine.providers and fine.runs("openvino-cpu")


@needs_qnn
def test_qnn_compile_round_trip(qdq_cnn, tmp_path):
    out = tmp_path / "cnn.ctx.onnx"
    result = invoke("compile", qdq_cnn, "--ep", "qnn", "-o", out, "--json")
    assert result.exit_code == 0, result.stdout
    record = result.json()
    assert record["schema"] == "ortprep.compile/1" and record["output"] == str(out) and out.exists()
    assert record["ep_context_nodes"] == 1 and record["partitions"][0]["source"] == "QNNExecutionProvider"
    assert record["compatibility"]["QNNExecutionProvider"].startswith("v")  # the EP's compatibility string
    assert record["outputs"][0]["within_tolerance"] is True and record["outputs"][0]["cosine"] > 0.999
    assert "CMP003" in codes(record)  # graph-input Q / output DQ stay outside, on the CPU
    assert not list(tmp_path.glob(".ortprep-tmp*"))  # nothing left from the atomic write
    # The compiled model loads and runs on QNN, through load too.
    loaded = _only(invoke("load", out, "--ep", "qnn", "--runs", "1", "--json").json())
    assert loaded["status"] == "fallback" and "QNNExecutionProvider" in [ep for ep, _ in loaded["subgraphs"]]
    assert "LOD001" not in codes(invoke("load", out, "--ep", "qnn", "--runs", "1", "--json").json())
    # check knows the EPContext node is QNN's: predicted as the session places it, not a float
    # model (QNN001) nor an unknown op; another EP is told only QNN runs it
    checked = invoke("check", out, "--ep", "qnn", "--prove", "--json").json()
    target = _only(checked)
    assert target["predicted_verdict"] == target["verdict"] and target["proof"]["comparison"]["node_agreement"] == 1.0
    assert not codes(checked) & {"QNN001", "PRV001", "EP001", "EP005"}
    other = invoke("check", out, "--ep", "openvino-cpu", "--json").json()
    refusal = next(f for f in other["findings"] if f["code"] == "EP001")
    assert refusal["op_type"] == "EPContext" and "compiled for QNNExecutionProvider" in refusal["message"]
    # Steps that change a model refuse a compiled one with one line, and write nothing.
    for args in (["convert", out, "--fp16"], ["quantize", out, "--dynamic"], ["simplify", out]):
        refused = invoke(*args, "-o", tmp_path / "x.onnx")
        assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert "compiled EPContext model (QNNExecutionProvider)" in refused.stderr
        assert not (tmp_path / "x.onnx").exists()


@needs_qnn
def test_compile_refuses_what_it_cannot_compile(tmp_path):
    bad_ep = invoke("compile", SAMPLES / "cnn.onnx", "--ep", "cuda")
    assert bad_ep.exit_code == 2 and "compiles EPContext models for qnn" in bad_ep.stderr
    # A dynamic model: QNN takes no node, so nothing is compiled, and nothing is written.
    result = invoke("compile", SAMPLES / "transformer_block.onnx", "--ep", "qnn", "-o", tmp_path / "t.onnx", "--json")
    assert result.exit_code == 1 and "CMP001" in codes(result.json()) and not (tmp_path / "t.onnx").exists()


@needs_openvino
def test_openvino_compile_failure_is_a_finding(qdq_cnn, tmp_path):
    result = invoke("compile", qdq_cnn, "--ep", "openvino-cpu", "--runtime", f"openvino-cpu={OPENVINO_PYTHON}",
                    "-o", tmp_path / "ov.onnx", "--json")
    record = result.json()
    if result.exit_code == 0:
        assert record["outputs"][0]["within_tolerance"] is True  # a release that reloads its own context
        return
    assert result.exit_code == 1 and "CMP001" in codes(record) and not (tmp_path / "ov.onnx").exists()
    assert record["stage"] == "reload" and "source model" in next(
        f["fix"] for f in record["findings"] if f["code"] == "CMP001"
    )


@needs_qnn
def test_the_qnn_path_end_to_end(tmp_path):
    """float -> static shapes -> QDQ with the QNN preset -> the real QNN HTP simulator, with the
    three-way comparison that tells quantization loss from EP error."""
    static = tmp_path / "tb.static.onnx"
    assert (
        invoke("convert", SAMPLES / "transformer_block.onnx", "--fix-shape", "hidden=1,16,64", "-o", static).exit_code
        == 0
    )
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for index in range(10):
        np.savez(calib / f"s{index}.npz", hidden=rng.standard_normal((1, 16, 64)).astype(np.float32))
    qdq = tmp_path / "tb.qdq.onnx"
    quantized = invoke("quantize", static, "--static", "--calib", calib, "--ep", "qnn", "-o", qdq, "--json")
    assert quantized.exit_code == 0, quantized.stdout
    assert quantized.json()["preset"]["activation_type"] == "uint16"
    result = invoke("load", qdq, "--ep", "qnn", "--reference", static, "--runs", "1", "--json")
    qnn = _only(result.json())
    assert qnn["nodes_on_ep"] / qnn["nodes_total"] > 0.9 and qnn["outputs_match"] is True
    three = qnn["three_way"]
    assert three["ep"]["cosine"] > 0.9999  # int8 on QNN against int8 on the CPU EP: the EP adds ~nothing
    assert three["quantization"]["cosine"] > 0.99 and three["total"]["cosine"] > 0.99
    assert three["ep"]["max_abs_diff"] < three["quantization"]["max_abs_diff"]  # the loss is quantization's


LOADS = "import sys, onnxruntime as ort; ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])"


def test_ir14_model_against_ort_124(tmp_path):
    """onnx 1.23 writes IR 14; ONNX Runtime 1.24 (the release that ships several EP packages) loads
    IR <= 13. check names it, convert --ir-version fixes it, and ORT 1.24 loads the fix."""
    import subprocess

    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=14)
    path = tmp_path / "ir14.onnx"
    onnx.save(model, str(path))
    record = invoke("check", path, "--ep", "cpu", "--ort-version", "1.24", "--json").json()
    finding = next(f for f in record["findings"] if f["code"] == "MOD009")
    assert (
        finding["severity"] == "error"
        and "ONNX Runtime 1.24" in finding["message"]
        and "--ir-version 13" in finding["fix"]
    )
    assert "measured" in finding["source"] and record["results"][0]["verdict"] == "none"
    assert "MOD009" in codes(invoke("inspect", path, "--ort-version", "1.24", "--json").json())
    assert "MOD009" not in codes(invoke("check", path, "--ep", "cpu", "--json").json())  # the installed ORT loads it
    fixed = tmp_path / "ir13.onnx"
    converted = invoke("convert", path, "--ir-version", "13", "-o", fixed, "--json")
    assert converted.exit_code == 0 and converted.json()["verify"]["passed"] is True
    assert onnx.load(str(fixed)).ir_version == 13
    assert "MOD009" not in codes(invoke("check", fixed, "--ep", "cpu", "--ort-version", "1.24", "--json").json())
    if OPENVINO_PYTHON.exists():  # onnxruntime-openvino 1.24.1: the real release
        refused = subprocess.run([str(OPENVINO_PYTHON), "-c", LOADS, str(path)], capture_output=True, text=True)
        assert refused.returncode != 0 and "IR version" in refused.stderr + refused.stdout
        loaded = subprocess.run([str(OPENVINO_PYTHON), "-c", LOADS, str(fixed)], capture_output=True, text=True)
        assert loaded.returncode == 0, loaded.stderr


def test_ort_version_must_be_known():
    result = invoke("check", SAMPLES / "cnn.onnx", "--ep", "cpu", "--ort-version", "0.9")
    assert result.exit_code == 2 and "no data for ONNX Runtime 0.9" in result.stderr and "1.24" in result.stderr
    doctor = invoke("doctor", "--ort-version", "1.24", "--json").json()
    assert doctor["target_runtime"]["max_ir_version"] == 13 and doctor["onnxruntime"]["max_ir_version"] >= 13


def test_opset_newer_than_the_named_release(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "op26.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)], ir_version=10), str(path))
    record = invoke("check", path, "--ep", "cpu", "--ort-version", "1.24", "--json").json()
    finding = next(f for f in record["findings"] if f["code"] == "MOD010")
    assert "up to 25" in finding["message"] and "--opset 25" in finding["fix"]
    assert "MOD010" not in codes(invoke("check", path, "--ep", "cpu", "--ort-version", "1.26", "--json").json())


@needs_qnn
def test_compiled_outputs_that_differ_are_not_written(qdq_cnn, tmp_path, monkeypatch):
    import ortprep.fidelity.ep_match as tolerance

    # any difference at all counts
    monkeypatch.setattr(tolerance, "tolerance_for", lambda *args: tolerance.Tolerance(0.0, "no difference allowed"))
    # and no output held by its decision (the sample's 'logits' is gated by its name; its top-1 agrees)
    monkeypatch.setattr(tolerance, "DECISION_COSINE", 2.0)
    result = invoke("compile", qdq_cnn, "--ep", "qnn", "-o", tmp_path / "c.onnx", "--json")
    assert result.exit_code == 1 and "CMP002" in codes(result.json()) and not (tmp_path / "c.onnx").exists()
    assert (
        "allowed 0: no difference allowed"
        in next(f for f in result.json()["findings"] if f["code"] == "CMP002")["message"]
    )
    kept = invoke("compile", qdq_cnn, "--ep", "qnn", "-o", tmp_path / "c.onnx", "--keep-failed", "--json")
    assert kept.exit_code == 1 and not (tmp_path / "c.onnx").exists() and (tmp_path / "c.failed.onnx").exists()
    assert kept.json()["kept_failed"] == str(tmp_path / "c.failed.onnx") and kept.json()["output"] is None


@needs_qnn
def test_compile_eval_judges_every_sample_and_names_the_one_that_fails(qdq_cnn, tmp_path, monkeypatch):
    """compile --eval: the compiled model on QNN against the source on the CPU EP, sample by sample.
    Here the tolerance is made zero for the output of one sample (a black image), so that sample
    fails while the --inputs run and the other samples pass: the compile fails on it, named."""
    import onnxruntime as ort

    import ortprep.fidelity.ep_match as tolerance

    samples = tmp_path / "eval"
    samples.mkdir()
    rng = np.random.default_rng(4)
    for index in range(6):
        image = np.zeros((1, 3, 32, 32), np.float32) if index == 3 else rng.random((1, 3, 32, 32), dtype=np.float32)
        np.savez(samples / f"s{index}.npz", image=image)
    black = ort.InferenceSession(str(qdq_cnn)).run(None, {"image": np.zeros((1, 3, 32, 32), np.float32)})[0]
    passed = invoke("compile", qdq_cnn, "--ep", "qnn", "-o", tmp_path / "ok.onnx", "--eval", samples, "--json")
    assert passed.exit_code == 0, passed.stdout
    assert passed.json()["eval"]["samples"] == 6 and passed.json()["eval"]["failed"] == 0
    assert passed.json()["eval"]["lowest_cosine"] > 0.99
    human = invoke("compile", qdq_cnn, "--ep", "qnn", "-o", tmp_path / "ok2.onnx", "--eval", samples).stdout
    assert "eval: 6 sample(s), 0 failed, lowest cosine" in human  # the human report says it too
    original = tolerance.tolerance_for

    def strict_for_large(ep, value, *args):
        return tolerance.Tolerance(0.0, "no difference on the black image") if np.array_equal(value, black) \
            else original(ep, value, *args)

    monkeypatch.setattr(tolerance, "tolerance_for", strict_for_large)
    monkeypatch.setattr(tolerance, "DECISION_COSINE", 2.0)  # no output held by its decision alone
    failed = invoke("compile", qdq_cnn, "--ep", "qnn", "-o", tmp_path / "c.onnx", "--eval", samples, "--json")
    record = failed.json()
    assert failed.exit_code == 1 and not (tmp_path / "c.onnx").exists()
    assert record["eval"]["worst"]["sample"] == 3 and record["eval"]["failed"] == 1
    message = next(f["message"] for f in record["findings"] if f["code"] == "CMP002")
    assert "on --eval sample 3 (1 of 6 samples fail)" in message


def test_measured_tables_are_what_check_uses():
    """The QNN and OpenVINO tables come from the probe tool: check takes the measurement over the
    documents, and names the measurement when it rejects an op the documents list."""
    import json

    from ortprep.eps.tables import load_documented_table
    from ortprep.runtime.kernels import support_table as load_table

    for ep in ("qnn", "openvino-cpu"):
        measured = json.loads((ROOT / "ortprep" / "eps" / "data" / "measured" / f"{ep}.json").read_text())
        assert measured["source"]["probes"] > 1000 and (ROOT / "docs" / f"measured-{ep}.md").exists()
        table, documented = load_table(ep), load_documented_table(ep)
        assert "measured" in table.sources
        never = [name for name, facts in measured["ops"].items() if not facts["ran"] and not facts["qdq_ran"]
                 and documented.lookup(*name.split(":", 1)) and "Linear" not in name]
        assert never
        for name in never:  # documented, never taken: kept, but under the measured condition
            entries = table.lookup(*name.split(":", 1))
            assert entries and all(e.src == "measured" and "single-op probes" in e.condition for e in entries)
        taken = [name for name, facts in measured["ops"].items() if facts["ran"] or facts["qdq_ran"]]
        assert taken and all(table.lookup(*name.split(":", 1)) for name in taken)


def test_domain_imported_twice(tmp_path):
    """A defect some converters write: onnx's checker and ORT accept it, ORT's quantizer does not."""
    import onnx

    model = onnx.load(str(SAMPLES / "cnn.onnx"))
    extra = model.opset_import.add()
    extra.domain, extra.version = "", model.opset_import[0].version
    path = tmp_path / "twice.onnx"
    onnx.save(model, str(path))
    for args in (["inspect", path], ["check", path, "--ep", "cpu"]):
        finding = next(f for f in invoke(*args, "--json").json()["findings"] if f["code"] == "MOD011")
        assert "imports domain 'ai.onnx' 2 times" in finding["message"] and "--repair" in finding["fix"]
    quantized = invoke("quantize", path, "--dynamic", "--calib", "random", "-o", tmp_path / "q.onnx", "--json")
    assert quantized.exit_code == 1 and not (tmp_path / "q.onnx").exists()  # a finding with JSON, not exit 2 or 4
    failure = next(f for f in quantized.json()["findings"] if f["code"] == "QNT008")
    assert "Failed to find proper ai.onnx domain" in failure["message"]
    repaired = invoke("convert", path, "--repair", "-o", tmp_path / "fixed.onnx", "--json")
    assert repaired.exit_code == 0 and repaired.json()["verify"]["passed"] is True
    assert len(onnx.load(str(tmp_path / "fixed.onnx")).opset_import) == 1
    # (judged by cosine: the sample's 'logits' decision cannot be judged on seeded inputs, QNT019)
    assert invoke("quantize", tmp_path / "fixed.onnx", "--dynamic", "--calib", "random", "--metric", "logits=cosine",
                  "-o", tmp_path / "q.onnx").exit_code in (0, 1)
    assert (tmp_path / "q.onnx").exists()


def test_converter_written_classifier_with_zipmap(tmp_path):
    """A scikit-learn-style pipeline whose output is a sequence of maps goes through every command
    without an internal error; the maps are compared like tensors (flattened, keys in order)."""
    import models

    path = tmp_path / "clf.onnx"
    __import__("onnx").save(models.zipmap_classifier(), str(path))
    outputs = {o["name"]: o for o in invoke("inspect", path, "--json").json()["outputs"]}
    assert outputs["probabilities"]["kind"].startswith("sequence(map(")
    assert invoke("check", path, "--ep", "cpu", "--json").json()["results"][0]["verdict"] == "full"
    loaded = invoke("load", path, "--ep", "cpu", "--runs", "2", "--json")
    assert loaded.exit_code == 0, loaded.stdout
    assert loaded.json()["results"][0]["status"] == "ok"
    for args in (["convert", path, "--fp16", "-o", tmp_path / "c.onnx"],
                 ["convert", path, "--fix-dim", "N=2", "-o", tmp_path / "d.onnx"],
                 ["quantize", path, "--dynamic", "--calib", "random", "-o", tmp_path / "q.onnx"],
                 ["simplify", path, "-o", tmp_path / "s.onnx"]):
        result = invoke(*args, "--json")
        assert result.exit_code in (0, 1), (args[0], result.stderr)
        assert "internal error" not in result.stderr and result.json()["schema"].startswith("ortprep.")
    fixed = invoke("convert", path, "--fix-dim", "N=2", "-o", tmp_path / "e.onnx", "--json").json()
    assert fixed["verify"]["passed"] is True and fixed["verify"]["outputs"][1]["max_abs_diff"] == 0.0


@needs_openvino
def test_runtime_flag_repeats():
    record = invoke(
        "doctor",
        "--runtime",
        f"openvino-cpu={OPENVINO_PYTHON}",
        "--runtime",
        f"openvino-gpu={OPENVINO_PYTHON}",
        "--json",
    ).json()
    rows = {row["ep"]: row for row in record["eps"]}
    assert rows["openvino-cpu"]["runtime"] == rows["openvino-gpu"]["runtime"] == str(OPENVINO_PYTHON)
    assert rows["openvino-cpu"]["available"] and rows["openvino-cpu"]["via"] == "built in"


def depthwise_strided(path: Path) -> Path:
    """A depthwise Conv with strides [2, 1]: the QNN HTP simulator's default SoC fails it at graph
    finalize (QNN_COMMON_ERROR_MEM_ALLOC); with soc_model 60 the session is created (issue 20)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 1, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], group=8, strides=[2, 1], pads=[1, 1, 1, 1], name="dw"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@needs_qnn
def test_the_device_is_part_of_the_qnn_target(tmp_path):
    """The strided depthwise Conv finalizes for ortprep's default device (Snapdragon X Elite,
    soc_model 60), which every report names; for the Snapdragon 888 (soc_model 30) the real session
    fails at graph finalize, and that failure is the proven verdict."""
    model = depthwise_strided(tmp_path / "dw.onnx")
    result = invoke("check", model, "--ep", "qnn", "--ep", "dml", "--prove", "--json")
    assert result.exit_code == 0
    record = result.json()
    qnn, dml = record["results"]
    assert qnn["device"]["name"] == "x-elite" and qnn["device"]["chosen_by"] == "default"
    assert qnn["device"]["provider_options"] == {"soc_model": "60"} and "dml" not in [r["ep"] for r in record["results"]
                                                                                        if "device" in r]
    proof = qnn["proof"]
    assert qnn["verdict"] == qnn["predicted_verdict"] == "full" and proof["status"] == "created"
    assert proof["provider_options"]["soc_model"] == "60" and proof["nodes_on_ep"] == proof["nodes_total"]
    assert proof["comparison"]["node_agreement"] == 1.0
    assert not any(f["code"].startswith("PRV") and f["target"] == "qnn" for f in record["findings"])
    # DirectML does not run here: its verdict stays the prediction, and says so
    assert dml["proof"]["status"] == "unavailable" and dml["verdict"] == dml["predicted_verdict"] == "full"
    assert any(f["code"] == "PRV003" and f["target"] == "dml" for f in record["findings"])
    # the table-only check names the device too
    assert invoke("check", model, "--ep", "qnn", "--json").json()["results"][0]["device"]["name"] == "x-elite"

    older = invoke("check", model, "--ep", "qnn", "--prove", "--device", "sm8350", "--json")
    assert older.exit_code == 1  # the proven verdict fails the gate
    qnn = older.json()["results"][0]
    assert qnn["device"]["name"] == "888" and qnn["device"]["chosen_by"] == "--device"
    # the tables know this pattern fails on that SoC (measured, QNN004): predicted and proven "none"
    assert qnn["predicted_verdict"] == "none" and qnn["verdict"] == "none"
    assert any(f["code"] == "QNN004" and f["node"] == "dw" for f in older.json()["findings"])
    assert qnn["proof"]["status"] == "failed" and "finalize" in qnn["proof"]["message"].lower()
    assert qnn["proof"]["provider_options"]["soc_model"] == "30"
    failure = next(f for f in older.json()["findings"] if f["code"] == "PRV002")
    assert "QNN_COMMON_ERROR_MEM_ALLOC" in failure["message"]
    assert [n["name"] for n in qnn["proof"]["culprit"]["nodes"]] == ["dw"]


@needs_openvino
def test_int64_elementwise_on_real_openvino_is_predicted_and_proven(tmp_path):
    """onnx's single-op cases never probe int64 Mul/Add; the measured table used to send them to the
    CPU (the OpenVINO regression of issue 20) while the real OpenVINO CPU session takes the whole
    model. Now the measurement takes away only the dtypes that failed: predicted full, proven full."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "k"], ["m"], name="mul_i64"),
            helper.make_node("Add", ["m", "k"], ["a"], name="add_i64"),
            helper.make_node("Cast", ["a"], ["f"], to=TensorProto.FLOAT, name="cast"),
            helper.make_node("Relu", ["f"], ["y"], name="relu"),
        ],
        "i64",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.arange(16, dtype=np.int64).reshape(1, 16), "k")],
    )
    path = tmp_path / "i64.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    record = invoke("check", path, "--ep", "openvino-cpu", "--prove", "--runtime", f"openvino-cpu={OPENVINO_PYTHON}",
                    "--json").json()
    target = record["results"][0]
    assert target["predicted_verdict"] == target["verdict"] == "full" and target["proof"]["status"] == "created"
    assert target["proof"]["comparison"]["node_agreement"] == 1.0
    assert not any(f["code"] in ("EP003", "EP006", "PRV001") for f in record["findings"])


def control_flow_model(path: Path, kind: str) -> Path:
    """A minimal If (its condition from a ReduceSum) or Loop (three doublings), then a Relu."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if kind == "if":
        then = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"], name="t_add")], "then", [],
                                 [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])],
                                 [numpy_helper.from_array(np.ones((1, 4), np.float32), "one")])
        other = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["e"], name="e_mul")], "else", [],
                                  [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])],
                                  [numpy_helper.from_array(np.full((1, 4), 2, np.float32), "two")])
        nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
                 helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
                 helper.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other, name="if")]
        inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    else:
        body = helper.make_graph(
            [
                helper.make_node("Identity", ["cond_in"], ["cond_out"], name="b_id"),
                helper.make_node("Mul", ["v_in", "two"], ["v_out"], name="b_mul"),
            ],
            "body",
            [
                helper.make_tensor_value_info("i", TensorProto.INT64, []),
                helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4]),
            ],
            [
                helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4]),
            ],
            [numpy_helper.from_array(np.full((1, 4), 2, np.float32), "two")],
        )
        nodes = [helper.make_node("Loop", ["n", "c0", "x"], ["y0"], body=body, name="loop")]
        inits = [numpy_helper.from_array(np.array(3, np.int64), "n"), numpy_helper.from_array(np.array(True), "c0")]
    graph = helper.make_graph(nodes + [helper.make_node("Relu", ["y0"], ["y"], name="relu")], kind, [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@needs_openvino
def test_prove_control_flow_on_real_openvino(tmp_path):
    """The tables say OpenVINO takes these whole. The real OpenVINO CPU session (onnxruntime-openvino
    1.24.1) leaves the If model's ReduceSum on the CPU (PRV001, the node named) and is not created
    for the Loop model at all (PRV002, with OpenVINO's words), which check now predicts (EP009)."""
    runtime = f"openvino-cpu={OPENVINO_PYTHON}"
    branch = invoke("check", control_flow_model(tmp_path / "if.onnx", "if"), "--ep", "openvino-cpu", "--prove",
                    "--runtime", runtime, "--json").json()
    target = branch["results"][0]
    assert target["predicted_verdict"] == "full" and target["verdict"] == "partial"
    assert target["proof"]["fallback_nodes"] == ["sum"] and target["proof"]["comparison"]["differing_op_types"] == {
        "ReduceSum": 1
    }
    prv = next(f for f in branch["findings"] if f["code"] == "PRV001")
    assert "'partial' (check predicted 'full')" in prv["message"] and "sum" in prv["message"]
    loop = invoke("check", control_flow_model(tmp_path / "loop.onnx", "loop"), "--ep", "openvino-cpu", "--prove",
                  "--runtime", runtime, "--json")
    assert loop.exit_code == 1
    target = loop.json()["results"][0]
    # the Loop is now predicted (EP009, eps/session_rules.py): the prediction equals the real session
    assert (
        target["predicted_verdict"] == "none" and target["verdict"] == "none" and target["proof"]["status"] == "failed"
    )
    assert any(f["code"] == "PRV002" and "initialization" in f["message"] for f in loop.json()["findings"])
    assert any(f["code"] == "EP009" and f["node"] == "loop" for f in loop.json()["findings"])


@needs_qnn
def test_load_keeps_the_prediction_when_the_session_is_not_created(tmp_path):
    """The QNN session fails at finalize (for the Snapdragon 888); load still shows what check
    predicted next to "none", and names the device."""
    model = depthwise_strided(tmp_path / "dw.onnx")
    record = invoke("load", model, "--ep", "qnn", "--device", "888", "--json").json()
    qnn = next(r for r in record["results"] if r["ep"] == "qnn")
    assert qnn["status"] == "failed" and "finalize" in qnn["message"].lower()
    assert qnn["check_comparison"]["predicted_verdict"] == "none"  # QNN004: measured to fail on this SoC
    assert qnn["check_comparison"]["actual_verdict"] == "none" and qnn["check_comparison"]["session"] == "not created"


@needs_qnn
def test_a_sigmoid_output_on_qnn_scaled_and_not(tmp_path):
    """A QDQ MatMul -> Sigmoid quantized as ORT's quantize_static does by default (uint16, the
    Sigmoid's output encoding calibrated): in the session a user creates (CPU fallback allowed, so
    the graph output's DequantizeLinear stays on the CPU) QNN's fixed Sigmoid encoding meets the
    calibrated DQ scale, and the output comes out scaled as a whole (by the largest calibrated
    output, about 0.6 here: the small weights keep the Sigmoid near 0.5). Cosine stays ~1; the norm ratio
    shows it and load fails it (it ran the strict session before, which hid it). ortprep's own
    quantize --ep qnn writes QNN's fixed encoding into the model: its output keeps its size."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Sigmoid", ["m"], ["y"], name="sig"),
        ],
        "sig",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.02).astype(np.float32), "w")],
    )
    model = tmp_path / "sig.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(model))
    samples = [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(16)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = iter(samples)

        def get_next(self):
            value = next(self.left, None)
            return None if value is None else {"x": value}

    plain = tmp_path / "sig.plain.qdq.onnx"
    quantize_static(str(model), str(plain), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt16,
                    weight_type=QuantType.QUInt8)
    result = invoke("load", plain, "--ep", "qnn", "--reference", model, "--json")
    assert result.exit_code == 1
    qnn = next(r for r in result.json()["results"] if r["ep"] == "qnn")
    assert qnn["outputs_match"] is False and qnn["cosine"] > 0.999 and qnn["norm_ratio"] < 0.8
    assert qnn["three_way"]["ep"]["norm_ratio"] < 0.8 and abs(qnn["three_way"]["quantization"]["norm_ratio"] - 1) < 0.01
    finding = next(f for f in result.json()["findings"] if f["code"] == "LOD006")
    assert "scaled as a whole" in finding["message"] and "Sigmoid" in finding["fix"]
    # ortprep's quantize --ep qnn: the fixed encoding is in the model, and QNN's output keeps its size
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, value in enumerate(samples):
        np.savez(calib / f"s{index}.npz", x=value)
    ours = tmp_path / "sig.qdq.onnx"
    # judged as a thresholded map: its 32 scores sit together near 0.5, and their ranking (which
    # 8-bit weights change) is not what this test is about
    assert (
        invoke(
            "quantize", model, "--static", "--ep", "qnn", "--calib", calib, "-o", ours, "--metric", "y=map"
        ).exit_code
        == 0
    )
    scale = next(t for t in onnx.load(str(ours)).graph.initializer if t.name.startswith("y_scale"))
    assert float(numpy_helper.to_array(scale)) == 1.0 / 65536.0
    loaded = invoke("load", ours, "--ep", "qnn", "--reference", model, "--json")
    assert loaded.exit_code == 0, loaded.stdout[-1500:]
    qnn = next(r for r in loaded.json()["results"] if r["ep"] == "qnn")
    assert qnn["outputs_match"] is True and abs(qnn["three_way"]["total"]["norm_ratio"] - 1) < 0.02
    # load reads the [1, 32] Sigmoid output as a ranked map unless told otherwise, as quantize does
    assert qnn["outputs"][0]["decision"]["ranked"] is True and "ranking" in qnn["outputs"][0]["decision"]
    told = invoke("load", ours, "--ep", "qnn", "--reference", model, "--metric", "y=map", "--json")
    decision = next(r for r in told.json()["results"] if r["ep"] == "qnn")["outputs"][0]["decision"]
    assert decision["chosen_by"] == "--metric" and "ranking" not in decision and "ranked" not in decision


@needs_qnn
def test_prove_reduces_a_failing_qnn_session_to_its_culprit(tmp_path):
    """Seven nodes, one of which (a depthwise Conv with strides [2, 1]) fails at QNN graph finalize
    on the simulator's default SoC: the reduction names it alone, within 2 * log2(nodes) + 1 probe
    sessions, with its attributes and input shapes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1, "w1"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.1, "w3")]
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu0"),
             helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["b"], ["c"], name="relu1"),
             helper.make_node("Conv", ["c", "w2"], ["d"], group=8, strides=[2, 1], pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("Relu", ["d"], ["e"], name="relu2"),
             helper.make_node("Conv", ["e", "w3"], ["f"], name="pw"),
             helper.make_node("Sigmoid", ["f"], ["y"], name="sig")]
    graph = helper.make_graph(nodes, "net7", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 16])], inits)
    path = tmp_path / "net7.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    record = invoke("check", path, "--ep", "qnn", "--prove", "--device", "888", "--json").json()
    proof = record["results"][0]["proof"]
    culprit = proof["culprit"]
    assert [n["name"] for n in culprit["nodes"]] == ["dw"]
    assert culprit["nodes"][0]["attributes"]["strides"] == [2, 1]
    assert culprit["nodes"][0]["inputs"] == ["float32[1,8,16,16]", "float32[8,1,3,3]"]
    assert culprit["probes"] <= 2 * 3 + 1 and "finalize" in culprit["message"].lower()
    failure = next(f for f in record["findings"] if f["code"] == "PRV002")
    assert "fail alone: dw (Conv float32[1,8,16,16], float32[8,1,3,3], strides [2, 1], group 8)" in failure["message"]
    # the named device stays, so the fix is the graph change, printed as the convert line
    assert proof["fix"]["kind"] == "graph" and failure["fix"].startswith(f"ortprep convert {path} --keep-off-ep=dw -o ")


@needs_qnn
def test_qnn_sessions_with_other_options_never_share_a_worker(tmp_path):
    """QNN keeps one HTP backend per process and the first session's soc_model sticks there: a
    default-SoC session after a soc_model 60 one in the same process was created where it fails
    alone. QNN requests with different options get workers of their own (their affinity)."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.requests import Prove
    from ortprep.runtime.targets import ep_runtime, session_options
    from ortprep.runtime.worker import workers_scope

    model = str(depthwise_strided(tmp_path / "dw.onnx"))
    target = ep_runtime(resolve_ep("qnn"))
    default = {k: v for k, v in session_options(target).items() if k != "soc_model"}  # the simulator's own default
    with workers_scope() as pool:
        named = pool.call(
            Prove(
                model=model,
                provider="QNNExecutionProvider",
                provider_options={**default, "soc_model": "60"},
                plugin=target.plugin,
            )
        )
        plain = pool.call(
            Prove(model=model, provider="QNNExecutionProvider", provider_options=default, plugin=target.plugin)
        )
        assert named.ok and plain.status == "failed" and "finalize" in plain.message.lower()
        assert pool.started >= 2


@needs_qnn
def test_a_weight_only_model_runs_wholly_on_qnn(tmp_path):
    """quantize --weight-only int4 writes MatMulNBits; QNN's table lists it, and the real session
    (HTP simulator) takes every node and matches the CPU EP within load's tolerance."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((128, 64)) / 11).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "proj",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64])], [weight])
    model = tmp_path / "proj.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    made = invoke("quantize", model, "--weight-only", "int4", "--ep", "qnn", "--eval", "random", "-o",
                  tmp_path / "q.onnx", "--json")
    assert made.exit_code == 0, made.stdout
    assert "QNT018" not in {f["code"] for f in made.json()["findings"]}
    loaded = invoke("load", tmp_path / "q.onnx", "--ep", "qnn", "--json")
    assert loaded.exit_code == 0, loaded.stdout
    [record] = [r for r in loaded.json()["results"] if r["ep"] == "qnn"]
    assert record["nodes_on_ep"] == record["nodes_total"] == 1


def test_sessions_on_an_ep_never_rerun_silently_on_the_cpu():
    """ORT's Python re-runs a session on the CPU EP when an EP fails at run time, prints 'EP Error'
    and returns the CPU's outputs (measured: PP-OCRv4's recogniser as a QDQ model on QNN, whose run
    failed with QNN_GRAPH_ERROR_INVALID_TENSOR, passed load at max abs diff 0.0 against the CPU EP).
    ortprep's sessions turn that off, so such a failure is the result."""
    import onnxruntime as ort

    from ortprep.runtime.requests.sessions import no_silent_cpu_rerun

    session = ort.InferenceSession(str(SAMPLES / "cnn.onnx"), providers=["CPUExecutionProvider"])
    assert session._enable_fallback is True  # ORT's own default
    no_silent_cpu_rerun(session)
    assert session._enable_fallback is False


@needs_qnn
def test_the_workers_ep_sessions_are_built_without_the_fallback():
    """The wiring, not the helper: a QNN session as ortprep's worker builds it (build_session) has
    ORT's Python fallback off, and a CPU EP session keeps ORT's default."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.runtime.protocol import WorkerState
    from ortprep.runtime.requests.sessions import SessionSpec, build_session
    from ortprep.runtime.targets import ep_runtime, session_options

    target = ep_runtime(resolve_ep("qnn"), {})
    plugin = target.plugin or {}
    spec = SessionSpec(str(SAMPLES / "cnn.onnx"), provider=target.spec.provider,
                       provider_options=tuple(sorted(session_options(target, {}, None).items())),
                       plugin_library=plugin.get("library"),
                       device_metadata=tuple(sorted((plugin.get("device_metadata") or {}).items())))
    state = WorkerState()
    on_qnn = build_session(state, spec).session
    assert "QNNExecutionProvider" in on_qnn.get_providers() and on_qnn._enable_fallback is False
    on_cpu = build_session(state, SessionSpec(str(SAMPLES / "cnn.onnx"))).session
    assert on_cpu._enable_fallback is True


def test_synthetic_feeds_follow_the_inputs_and_refuse_dynamic_dims(tmp_path):
    import onnxruntime as ort

    from ortprep.runtime.requests.placement import synthetic_feeds

    fixed = ort.InferenceSession(str(SAMPLES / "cnn.onnx"), providers=["CPUExecutionProvider"])
    feeds = synthetic_feeds(fixed)
    (name, value), = feeds.items()
    assert name == fixed.get_inputs()[0].name and list(value.shape) == fixed.get_inputs()[0].shape
    assert value.dtype == np.float32 and value.std() > 0.1
    onnx.save(models.relu(), tmp_path / "dynamic.onnx")  # x: ["n", 4]
    assert (
        synthetic_feeds(ort.InferenceSession(str(tmp_path / "dynamic.onnx"), providers=["CPUExecutionProvider"]))
        is None
    )


@needs_qnn
def test_prove_runs_the_session_once(tmp_path):
    result = invoke("check", SAMPLES / "cnn.onnx", "--ep", "qnn", "--prove", "--json")
    proof = result.json()["results"][0]["proof"]
    assert proof["status"] == "created" and proof["run"] == "ran"


def _loop_model(folder: Path, weight_elements: int) -> Path:
    """Relu in the main graph (QNN takes it), then a Loop whose body reads, from the main graph, a
    MatMul weight of ``weight_elements`` floats and a one-element scale."""
    from onnx import TensorProto, helper, numpy_helper

    side = int(weight_elements ** 0.5)
    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
         helper.make_node("MatMul", ["state_in", "w"], ["mm"], name="body_mm"),
         helper.make_node("Mul", ["mm", "s"], ["state_out"], name="body_scale")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [1, side])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [1, side])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Loop", ["trips", "go", "r"], ["y"], name="loop", body=body)],
        "looped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, side])],
        [numpy_helper.from_array((rng.standard_normal((side, side)) * 0.1).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([0.5], np.float32), "s"),
         numpy_helper.from_array(np.array(2, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go")])
    path = folder / f"loop{weight_elements}.onnx"
    onnx.save_model(models.make(graph, ir_version=9), str(path))
    return path


@needs_qnn
def test_compile_copies_small_body_initializers_and_feeds_the_larger_ones(tmp_path):
    """ORT's EP-context writer (1.32) keeps only the initializers main-graph nodes read: a Loop body
    reading its scale and a 16-float weight from the main graph did not compile before; compile
    copies such small ones (<= 127 bytes) into the body (CMP005) and the result loads and matches.
    A 256-float weight it cannot keep either way (dropped, or an in-memory marker in the body):
    compile reads it through an Identity node in the main graph (CMP006), and the result loads and
    matches too."""
    small = _loop_model(tmp_path, 16)
    result = invoke("compile", small, "--ep", "qnn", "-o", tmp_path / "small_ctx.onnx", "--json")
    record = result.json()
    assert result.exit_code == 0, record["findings"]
    assert record["localized_initializers"] == ["s", "w"]
    assert any(f["code"] == "CMP005" for f in record["findings"])
    assert onnx.load(str(small)).graph.initializer[0].name == "w"  # the input is not changed
    large = _loop_model(tmp_path, 256)
    given = large.read_bytes()
    result = invoke("compile", large, "--ep", "qnn", "-o", tmp_path / "large_ctx.onnx", "--json")
    record = result.json()
    assert result.exit_code == 0 and (tmp_path / "large_ctx.onnx").exists(), record["findings"]
    assert record["fed_initializers"] == ["w"] and record["localized_initializers"] == ["s"]
    assert any(f["code"] == "CMP006" for f in record["findings"])
    assert all(output["within_tolerance"] for output in record["outputs"]), record["outputs"]
    assert large.read_bytes() == given  # the input is not changed


@needs_qnn
def test_the_answer_line_is_the_real_sessions_where_it_is_proven(tmp_path, monkeypatch):
    """A Clip whose min and max are computed (not initializers), as openwakeword's mel front end
    writes it: QNN's session gives the Clip back to the CPU ("doesn't support dynamic min/max").
    The tables know it since QNN010; with that rule taken out they predict every node on QNN, a
    gap of the kind the proof exists for. The one-line answer and the summary row are the real
    session's (they said "yes: every node runs on qnn" next to the proven 'partial')."""
    from onnx import TensorProto, helper, numpy_helper

    from ortprep.eps import qnn_rules

    table_rule = qnn_rules.qnn_node
    monkeypatch.setattr(qnn_rules, "qnn_node", lambda node, verdict, *io: (
        verdict if table_rule(node, verdict, *io).code == "QNN010" else table_rule(node, verdict, *io)))

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("ReduceMax", ["c"], ["top"], keepdims=0, name="top"),
         helper.make_node("Sub", ["top", "eighty"], ["floor"], name="floor"),
         helper.make_node("Clip", ["c", "floor", ""], ["y"], name="clip_dynamic")],
        "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 4, 1, 1)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array(0.5, np.float32), "eighty")])
    path = tmp_path / "clip.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    run = invoke("check", path, "--ep", "qnn", "--prove", "--json")
    target = run.json()["results"][0]
    assert (target["predicted_verdict"], target["verdict"]) == ("full", "partial")
    assert target["proof"]["fallback_nodes"] == ["clip_dynamic"]
    human = invoke("check", path, "--ep", "qnn", "--prove", env={"COLUMNS": "200"}).stdout
    assert (
        "qnn: yes, with 1 CPU fallback(s) in the real session: "
        f"{target['proof']['comparison']['actual_partitions']} partition(s)" in human
    )
    assert "every node runs on qnn" not in human
    total = target["proof"]["nodes_total"]
    assert f"{total - 1}/{total}" in human


@needs_qnn
def test_fallbacks_the_real_session_contradicts_are_dropped(tmp_path):
    """A Reshape whose shape comes from a ReduceMax of the input's Shape: onnx's inference cannot
    follow it, so the tables predict QNN002 ("no static shape") on the Reshape and the Relu and
    'none'; ORT folds the shape (the input is static) and QNN takes both. With --prove the verdict
    is the session's, and the QNN002 findings it contradicts go (akiki's GRU VAD listed 36 of them
    beside a proof of every node on QNN)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("ReduceMax", ["s"], ["m"], keepdims=1, name="rmax"),
        helper.make_node("Concat", ["head", "m"], ["shp"], axis=0, name="concat"),
        helper.make_node("Reshape", ["x", "shp"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "folded_shape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])],
                              [numpy_helper.from_array(np.array([1, 4], np.int64), "head")])
    path = tmp_path / "folded.onnx"
    onnx.save(models.make(graph), str(path))
    predicted = invoke("check", path, "--ep", "qnn", "--json").json()
    assert predicted["results"][0]["verdict"] == "none"
    assert {f["node"] for f in predicted["findings"] if f["code"] == "QNN002"} == {"reshape", "relu"}
    proven = invoke("check", path, "--ep", "qnn", "--prove", "--json").json()
    assert proven["results"][0]["verdict"] == "full" and proven["results"][0]["proof"]["fallback_nodes"] == []
    assert not {f["code"] for f in proven["findings"]} & {"QNN002", "EP007"}
