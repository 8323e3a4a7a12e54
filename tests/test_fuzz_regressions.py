"""Cases `make fuzz` (protobuf-field mutations, tools/fuzz_fields.py) once failed, each replayed, and
the root of each failure pinned by a small test."""

from __future__ import annotations

import numpy as np

from cli_helpers import invoke
from conftest import SAMPLES
from tools.fuzz_fields import mutate_fields

from ortprep.fidelity.gate import EXACT_GATE, judge_run
from ortprep.runtime.isolated import RunOutcome


def test_a_reference_that_did_not_run_passes_nothing():
    """The root of case 730: quantize upgraded an opset-6 model to 13 for per-channel QDQ and judged
    the upgrade against the original's run, which ORT had refused (no BatchNormalization(6) kernel).
    With no reference outputs, every check held: "verified", then an exit 4 formatting its None diff."""
    reference = RunOutcome(status="failed", message="Could not find an implementation for BatchNormalization(6)")
    candidate = RunOutcome(status="ok", outputs={"y": np.ones(4, np.float32)})
    result = judge_run(reference, candidate, EXACT_GATE)
    assert not result.passed and "original model does not run" in result.error
    assert "BatchNormalization(6)" in result.error
    same = RunOutcome(status="ok", outputs={"y": np.ones(4, np.float32)})
    assert judge_run(same, candidate, EXACT_GATE).passed  # the control: a reference that ran is compared


def test_case_730_static_quantize_of_an_opset6_model(tmp_path):
    """cnn.onnx, field case 730 (opset_version: ai.onnx 6), `quantize --static --calib random`: exit 4
    (TypeError formatting max_abs_diff None). Now the upgrade is not called verified, and no exit 4."""
    kind, data = mutate_fields((SAMPLES / "cnn.onnx").read_bytes(), 730)
    assert kind == "opset_version"
    model = tmp_path / "case730.onnx"
    model.write_bytes(data)
    result = invoke("quantize", model, "--static", "--calib", "random", "--samples", "12", "-o", tmp_path / "o.onnx",
                    "--json")
    assert result.exit_code in (0, 1, 2, 3) and "internal error" not in result.stderr, result.stderr
    messages = [f["message"] for f in result.json().get("findings", [])]
    assert not any("upgraded to 13 and verified" in m for m in messages), messages


def test_cases_454_664_a_custom_node_named_like_gemm_is_no_crash(tmp_path):
    """custom_op.onnx, field cases 454 and 664 (op_type): the custom node renamed Gemm, one input.
    onnxsim and onnxoptimizer match Gemm by name alone and read its missing second input: simplify
    died with SIGSEGV. Now both are skipped with the reason, and simplify ends normally."""
    import onnx

    from ortprep.transforms.simplify import standard_name_clash

    kind, data = mutate_fields((SAMPLES / "custom_op.onnx").read_bytes(), 664)
    assert kind == "op_type"
    proto = onnx.load_from_string(data)
    assert "named like ONNX's Gemm but has 1 inputs (Gemm takes 2-3)" in standard_name_clash(proto)
    model = tmp_path / "case664.onnx"
    model.write_bytes(data)
    result = invoke("simplify", model, "-o", tmp_path / "o.onnx", "--json")
    assert result.exit_code in (0, 1), result.stderr
    skipped = [f["message"] for f in result.json()["findings"] if f["code"] == "SIM001"]
    assert skipped and all("named like ONNX's Gemm" in m for m in skipped), skipped
    for path in sorted(SAMPLES.glob("*.onnx")):  # the control: no sample model is taken for a clash
        assert standard_name_clash(onnx.load(str(path), load_external_data=False)) is None, path
