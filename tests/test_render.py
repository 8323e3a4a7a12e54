"""The human renderers at 80 columns: every table's headers whole, cells folded rather than cut
(issue 23: headers came out as 'partiti…' and 'fallbac…' on an 80-column terminal)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ortprep.render.console import render_check, render_load
from ortprep.render.console_writes import render_quantize

LONG_NODE = "/model/encoder/layers.11/self_attn/MatMul_with_a_very_long_exported_name"


def _check_record() -> dict:
    results = []
    for ep in ("qnn", "dml-npu", "openvino-cpu,dml", "tensorrt,cuda"):
        results.append({"ep": ep, "nodes": 123456, "supported_nodes": 120000, "node_share": 0.9719, "partitions": 1234,
                        "fallback_nodes": [LONG_NODE] * 12, "copies": 23456, "mac_share": 0.9912, "verdict": "partial"})
    findings = [
        {
            "code": "EP001",
            "severity": "error",
            "message": f"node '{LONG_NODE}' (Det) is not supported by {r['ep']}",
            "node": LONG_NODE,
            "op_type": "Det",
            "ep": r["ep"],
            "fix": "replace Det",
            "source": None,
            "target": r["ep"],
        }
        for r in results
    ]
    return {"model": "/a/rather/long/path/to/models/encoder_decoder_transformer.onnx", "results": results,
            "findings": findings}


def _load_record() -> dict:
    results = [{"ep": ep, "status": status, "nodes_on_ep": 120000, "nodes_total": 123456, "outputs_match": match,
                "latency_ms": {"median": 12345.678, "p90": 23456.789}}
               for ep, status, match in (("openvino-cpu", "fallback", False), ("qnn", "inputs_guessed", True),
                                         ("cpu", "ok", None), ("tensorrt", "unavailable", None))]
    return {"model": "/a/rather/long/path/to/models/encoder_decoder_transformer.onnx",
            "available": ["CPUExecutionProvider", "QNNExecutionProvider"], "results": results, "findings": []}


def _quantize_record() -> dict:
    trials = [{"label": f"keep {LONG_NODE} and {n} others in float", "kept_in_float": 123 + n, "cosine": 0.99912345,
               "size_ratio": 0.2612345, "passed": n % 2 == 0} for n in range(3)]
    return {
        "input": "/a/rather/long/path/to/models/encoder_decoder_transformer.onnx",
        "output": "/a/rather/long/path/to/models/encoder_decoder_transformer.qdq.onnx",
        "preset": {"ep": "qnn", "activation_type": "uint16", "weight_type": "uint8", "per_channel": True,
                   "reason": "QNN HTP takes 16-bit activations", "method": "minmax"},
        "weight_only": None, "mode": "static", "format": "qdq",
        "calibration": {"source": "random", "kind": "random", "samples": 8},
        "preprocess": "onnxruntime quant_pre_process", "quantized_ops": 1234, "quantized_weights": 567,
        "size_before": 400_000_000, "size_after": 100_000_000,
        "verify": {"passed": True, "cosine": 0.9991, "max_abs_diff": 0.0123, "latency_ratio": 0.61},
        "evaluation_samples": 8, "evaluation_inputs": "random",
        "search": {"stopped": "the gate passed with the fewest nodes kept in float", "trials": trials},
        "excluded_nodes": [], "findings": [],
    }


# (renderer, record, the headers of every table it draws)
CASES = {
    "check": (
        render_check,
        _check_record,
        ["EP", "EP takes", "parts", "on CPU", "copies", "MACs on EP", "errors", "verdict"],
    ),
    "load": (render_load, _load_record, ["EP", "status", "nodes on EP", "outputs match", "median ms", "p90 ms"]),
    "quantize": (
        render_quantize,
        _quantize_record,
        ["trial", "nodes kept in float", "lowest cosine", "size ratio", "gate"],
    ),
}


@pytest.mark.parametrize("report", sorted(CASES))
def test_tables_at_80_columns_keep_every_header_word_whole(report):
    """Wide cells (long node and model names, large numbers) squeeze the columns; each header may
    wrap onto lines of its own but no word of it is cut, and no cell ends in an ellipsis."""
    render, record, headers = CASES[report]
    out = io.StringIO()
    render(record(), Console(file=out, width=80, color_system=None, legacy_windows=False))
    lines = out.getvalue().splitlines()
    table = [line for line in lines if line[:1] in "┏┃│┡└"]
    assert table and max(len(line) for line in table) <= 80
    assert "…" not in "\n".join(table)
    header_rows = [line for line in lines if line.startswith("┃")]
    header_cells = [" ".join(row.split("┃")[i].strip() for row in header_rows).split()
                    for i in range(1, len(header_rows[0].split("┃")) - 1)]
    assert [" ".join(words) for words in header_cells] == headers


def test_a_trial_past_the_gate_short_of_the_decision_margin_says_so():
    """The search table's gate column: a pass whose decisions fall short of the margin a chosen
    result must hold is not shown as a plain pass (quantize's decision margin)."""
    record = _quantize_record()
    record["search"]["trials"] = [
        {**record["search"]["trials"][0], "label": "short", "passed": True, "decision_margin_gap": 0.0167},
        {**record["search"]["trials"][0], "label": "held", "passed": True, "decision_margin_gap": 0.0},
        {**record["search"]["trials"][0], "label": "failed", "passed": False, "decision_margin_gap": 0.2}]
    out = io.StringIO()
    render_quantize(record, Console(file=out, width=200, color_system=None, legacy_windows=False))
    rows = {line.split("│")[1].strip(): line.split("│")[5].strip() for line in out.getvalue().splitlines()
            if line.startswith("│")}
    assert rows == {"short": "pass, short of the margin", "held": "pass", "failed": "fail"}


def test_the_answer_and_the_row_are_the_real_sessions_where_proven():
    """proven_placement() and answer() read the proof where check --prove built the session: its nodes on
    the EP, partitions and CPU nodes; copies only where partitions and verdict agree with check's.
    Without a proof (or one not created) they are the prediction."""
    from ortprep.render.console import answer
    from ortprep.report import proven_placement as placement

    predicted = {"ep": "qnn", "nodes": 20, "supported_nodes": 20, "node_share": 1.0, "partitions": 1, "copies": 2,
                 "fallback_nodes": [], "verdict": "full"}
    assert placement(predicted) == {"proven": False, "on_ep": 20, "nodes": 20, "share": 1.0, "partitions": 1,
                                    "fallbacks": 0, "copies": 2}
    assert answer(predicted, []) == "yes: every node runs on qnn"
    proven = {
        **predicted,
        "verdict": "partial",
        "predicted_verdict": "full",
        "proof": {
            "status": "created",
            "nodes_total": 17,
            "nodes_on_ep": 16,
            "fallback_nodes": ["Clip_28"],
            "comparison": {"actual_partitions": 1, "actual_verdict": "partial", "predicted_verdict": "full"},
        },
    }
    placed = placement(proven)
    assert (placed["proven"], placed["on_ep"], placed["nodes"], placed["fallbacks"], placed["copies"]) == (
        True,
        16,
        17,
        1,
        None,
    )
    assert answer(proven, []) == "yes, with 1 CPU fallback(s) in the real session: 1 partition(s)"
    blocked = answer(proven, [{"code": "SHP001", "severity": "error"}])
    assert blocked.startswith("not as it is: 16/17 nodes are on qnn in the real session, but 1 problem(s)")
    failed = {**predicted, "verdict": "none", "proof": {"status": "failed", "message": "finalize"}}
    assert placement(failed)["proven"] is False and answer(failed, []).startswith("no: it runs nowhere on qnn")
