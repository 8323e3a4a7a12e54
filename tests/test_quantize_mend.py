"""quantize --auto-exclude mends a candidate whose session fails on the target EP (issue 52, item 2;
ortprep/steps/quantize/mend.py), on the real QNN HTP simulator for the Snapdragon 888 (soc_model
30): the reduction of check --prove names the culprits of the trial's own QDQ file, and the trial
is quantized again with them kept off QNN; where nothing lets the session be created, the search
ends naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from onnx import TensorProto, helper, numpy_helper

import models
from cli_helpers import quantize
from ep_marks import needs_qnn
from test_prove import DEVICE, Qnn, planted_chain

pytestmark = needs_qnn


def se_gate_model(folder: Path) -> tuple[Path, Path]:
    """Conv/Relu pairs with a squeeze-excite gate (GlobalAveragePool, HardSigmoid, Mul) half-way,
    and calibration samples for it. Quantized with the gate's pool and HardSigmoid kept float
    (--exclude-node), the QDQ model fails QNN's graph finalize on the 888
    (QNN_COMMON_ERROR_MEM_ALLOC; measured, onnxruntime-qnn 2.7.0); quantized whole, it does not."""
    model = planted_chain(folder / "se.onnx", pairs=6, plant={0.5: "hs"})
    data = folder / "x"
    data.mkdir()
    rng = np.random.default_rng(0)
    for index in range(10):
        np.savez(data / f"{index:02d}.npz", x=rng.standard_normal((1, 8, 16, 16)).astype(np.float32))
    return model, data


def findings(record: dict, code: str) -> list[dict]:
    return [f for f in record["findings"] if f["code"] == code]


def test_a_qdq_session_that_fails_finalize_is_mended_and_written(tmp_path):
    model, data = se_gate_model(tmp_path)
    out = tmp_path / "se.qdq.onnx"
    code, record, _ = quantize(model, "--static", "--ep", "qnn", "--device", DEVICE, "--calib", data,
                               "--exclude-node", "culprit_hs", "--exclude-node", "se_pool", "--auto-exclude", "-o", out)
    assert code == 0 and out.exists(), [f["message"] for f in record["findings"]]
    mend = record["search"]["mend"]
    assert mend["mended"] is True and mend["ep"] == "qnn" and len(mend["rounds"]) == 1
    first = mend["rounds"][0]
    assert first["trial"] == "baseline (preprocessed)" and "QNN_COMMON_ERROR_MEM_ALLOC" in first["message"]
    # the reduction's own record: one 1-minimal set, the HardSigmoid on the [1, 8, 1, 1] gate
    assert [group["nodes"] for group in first["culprit"]["culprits"]] == [["culprit_hs"]]
    assert first["culprit"]["nodes"][0]["op_type"] == "HardSigmoid" and first["culprit"]["probes"] > 0
    assert first["fix"]["kind"] == "graph" and first["fix"]["kept_off"] == ["culprit_hs"]
    assert first["trial_after"]["passed"] is True and first["trial_after"]["error"] is None
    assert mend["kept_off_ep"] == ["culprit_hs"] and mend["culprits"] == ["culprit_hs"]
    # the report: kept off QNN and why, judged on both EPs, how much stays on QNN
    assert [(e["name"], e["op_type"]) for e in record["kept_off_ep"]] == [("culprit_hs", "HardSigmoid")]
    assert "QNN_COMMON_ERROR_MEM_ALLOC" in record["kept_off_ep"][0]["reason"]
    ep = record["verify"]["ep"]
    assert record["verify"]["passed"] is True and ep["passed"] is True and ep["error"] is None
    assert 0 < ep["placement"]["nodes_on_ep"] < ep["placement"]["nodes_total"]
    said = findings(record, "QNT040")
    assert len(said) == 1 and said[0]["severity"] == "info" and "culprit_hs" in said[0]["message"]
    assert f"{ep['placement']['nodes_on_ep']} of {ep['placement']['nodes_total']} nodes stay on qnn" in said[0][
        "message"]
    # the file written: the HardSigmoid in an If the CPU EP runs, and QNN's session for it is created
    proto = onnx.load(str(out))
    assert [node.name for node in proto.graph.node if node.op_type == "If"] == ["ortprep_off_ep_culprit_hs"]
    created, message, assignment = Qnn().session(str(out))
    assert created, message
    assert sum(placed == "QNNExecutionProvider" for placed in assignment.values()) == ep["placement"]["nodes_on_ep"]


def test_a_session_whose_every_conv_the_reduction_names_is_mended_with_fewer_kept_off(tmp_path):
    """16-bit weights in a Conv on the 888: QNN's layout transformer inserts an NHWC Conv it then
    does not take, for every Conv, and the reduction names all six. Kept off QNN together (one If
    with the graph input's QuantizeLinear inside), QNN takes the rest, and the fix search finds
    that three of them off let the session be created: written, judged on QNN. (Before the input's
    QuantizeLinear moved with the region, QNN took no node of such a rewrite, and this was refused:
    tests/test_off_ep_shared_dq.py.)"""
    model, data = se_gate_model(tmp_path)
    out = tmp_path / "se.qdq.onnx"
    code, record, _ = quantize(model, "--static", "--ep", "qnn", "--device", DEVICE, "--calib", data,
                               "--activation-type", "uint16", "--weight-type", "int16", "--per-tensor",
                               "--auto-exclude", "-o", out)
    assert code == 0 and out.exists(), record["findings"]
    mend = record["search"]["mend"]
    assert mend["culprits"] == [f"conv{index}" for index in range(6)]
    assert "not selected by that EP" in mend["rounds"][0]["message"]
    assert mend["mended"] is True and 0 < len(mend["kept_off_ep"]) < 6
    assert set(mend["kept_off_ep"]) < set(mend["culprits"])
    ep = record["verify"]["ep"]
    assert record["verify"]["passed"] is True and ep["passed"] is True and ep["error"] is None
    assert 0 < ep["placement"]["nodes_on_ep"] < ep["placement"]["nodes_total"]
    said = findings(record, "QNT040")
    assert len(said) == 1 and said[0]["severity"] == "info"
    assert sorted(e["name"] for e in record["kept_off_ep"]) == sorted(mend["kept_off_ep"])
    created, message, _ = Qnn().session(str(out))
    assert created, message


def test_region_sets_are_the_span_to_the_wrong_output_and_the_front_end():
    """front_end.region_sets on a graph: input -> stft -> pow -> log -> head -> y, and a side branch
    pow -> side -> z. The EP parts first at log, and gets y wrong: the front end is stft, pow, log;
    the span log, head (not side: it leads to z); then both together."""
    from onnx import TensorProto, helper

    from ortprep.steps.quantize.front_end import region_sets

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="stft"), helper.make_node("Relu", ["a"], ["b"], name="pow"),
             helper.make_node("Relu", ["b"], ["c"], name="log"), helper.make_node("Relu", ["c"], ["y"], name="head"),
             helper.make_node("Relu", ["b"], ["z"], name="side")]
    value = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in ("x", "y", "z")]
    graph = helper.make_graph(nodes, "g", value[:1], value[1:])
    sets = region_sets(helper.make_model(graph), ["log", "head"], ["y"])
    assert [names for _, names in sets] == [["stft", "pow", "log"], ["log", "head"], ["stft", "pow", "log", "head"]]
    assert sets[0][0].startswith("the front end: the 3 node(s)") and sets[1][0].startswith("the 2 node(s) from log")
    assert region_sets(helper.make_model(graph), ["unknown"], ["y"]) == []


def test_a_restarted_region_is_closed_upstream_in_the_float_graph():
    """front_end.upstream: a region named from a QDQ graph misses a node the quantizer fused away
    (a Relu into its Conv); read from the float graph, the region takes every compute node its nodes
    read from (not side, which nothing in it reads; no Constant node), so nothing of it is left on
    the EP between two Ifs."""
    from onnx import TensorProto, helper

    from ortprep.steps.quantize.front_end import upstream

    nodes = [helper.make_node("Constant", [], ["k"], name="k", value_float=2.0),
             helper.make_node("Mul", ["x", "k"], ["a"], name="conv"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Relu", ["b"], ["c"], name="bn"), helper.make_node("Relu", ["c"], ["y"], name="head"),
             helper.make_node("Relu", ["x"], ["z"], name="side")]
    value = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in ("x", "y", "z")]
    graph = helper.make_graph(nodes, "g", value[:1], value[1:])
    assert upstream(graph, ["conv", "bn"]) == ["conv", "relu", "bn"]
    assert upstream(graph, ["head"]) == ["conv", "relu", "bn", "head"]
    assert upstream(graph, ["unknown"]) == []


def test_auto_says_which_attempts_failed_on_the_session_and_their_culprits():
    from ortprep.steps.quantize.mend import mend_summary, mend_words

    record = {"ep": "qnn", "mended": False, "culprits": ["conv0", "conv1", "conv2", "conv3", "conv4"],
              "kept_off_ep": [], "reason": "the EP took no node at all", "rounds": []}
    summary = mend_summary(record)
    assert summary == {"mended": False, "culprits": record["culprits"], "kept_off_ep": [],
                       "reason": "the EP took no node at all"}
    assert mend_words(summary) == "; its session fails on the EP, culprits conv0, conv1, conv2, conv3, ... not mended"
    assert mend_words(mend_summary({**record, "mended": True})) == "" and mend_summary(None) is None


def mel_keywords(folder: Path, samples: int = 2000, batch_norm: bool = False) -> tuple[Path, Path]:
    """A keyword classifier with its audio front end inside, as openwakeword's mel model writes
    it: STFT as two strided Convs (Hann-windowed cosines and sines), Pow 2 each, their sum, mel
    filters as a MatMul, a floor (Clip at 1e-10), Log, dB, and the top-80-dB floor (a Clip whose min
    is computed); then three Conv/Relu blocks and a Gemm. Audio in int16's scale. On QNN's HTP
    (soc_model 60) the front end comes out wrong in every precision: quantized, with the float Log
    kept off QNN, the logits' norm ratio 0.73 (A16W16); in FP16 0.32 (measured, onnxruntime-qnn
    2.7.0: docs/decisions/mend52-failing-sessions.md)."""
    n_fft, hop, bins, mels = 400, 160, 64, 32
    frames = 1 + (samples - n_fft) // hop
    steps, rows = np.arange(n_fft), np.arange(bins)[:, None]
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * steps / n_fft)
    filters = np.zeros((bins, mels), np.float32)
    for band in range(mels):
        low, high = int(band * bins / (mels + 1)), min(bins, int((band + 2) * bins / (mels + 1)) + 1)
        filters[low:high, band] = np.hanning(high - low + 2)[1:-1]
    rng = np.random.default_rng(2)
    inits = {"cos": (np.cos(2 * np.pi * rows * steps / n_fft) * hann)[:, None, :],
             "sin": (-np.sin(2 * np.pi * rows * steps / n_fft) * hann)[:, None, :], "filters": filters,
             "axis": np.array([1], np.int64), "two": np.array(2.0), "amin": np.array(1e-10), "top_db": np.array(80.0),
             "db": np.array(10 / np.log(10)), "mean": np.array(-40.0), "scale": np.array(1 / 20.0),
             "head_w": rng.standard_normal((10, 16)) * 0.5, "head_b": np.zeros(10)}
    nodes = [helper.make_node("Unsqueeze", ["audio", "axis"], ["a3"], name="unsqueeze"),
             helper.make_node("Conv", ["a3", "cos"], ["re"], strides=[hop], name="stft_real"),
             helper.make_node("Conv", ["a3", "sin"], ["im"], strides=[hop], name="stft_imag"),
             helper.make_node("Pow", ["re", "two"], ["re2"], name="pow_real"),
             helper.make_node("Pow", ["im", "two"], ["im2"], name="pow_imag"),
             helper.make_node("Add", ["re2", "im2"], ["power"], name="power"),
             helper.make_node("Transpose", ["power"], ["frames"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("MatMul", ["frames", "filters"], ["mel"], name="mel"),
             helper.make_node("Clip", ["mel", "amin", ""], ["floored"], name="amin_clip"),
             helper.make_node("Log", ["floored"], ["ln"], name="log"),
             helper.make_node("Mul", ["ln", "db"], ["decibels"], name="to_db"),
             helper.make_node("ReduceMax", ["decibels"], ["peak"], keepdims=0, name="peak"),
             helper.make_node("Sub", ["peak", "top_db"], ["floor"], name="floor"),
             helper.make_node("Clip", ["decibels", "floor", ""], ["spec"], name="top_db_clip"),
             helper.make_node("Unsqueeze", ["spec", "axis"], ["s4"], name="image"),
             helper.make_node("Sub", ["s4", "mean"], ["centred"], name="centre"),
             helper.make_node("Mul", ["centred", "scale"], ["x0"], name="normalise")]
    current, width = "x0", 1
    for index, channels in enumerate((8, 16, 16)):
        inits[f"w{index}"] = rng.standard_normal((channels, width, 3, 3)) * np.sqrt(2 / (width * 9))
        nodes += [helper.make_node("Conv", [current, f"w{index}"], [f"c{index}"], pads=[1, 1, 1, 1],
                                   strides=[1 if index == 0 else 2] * 2, name=f"conv{index}"),
                  helper.make_node("Relu", [f"c{index}"], [f"x{index + 1}"], name=f"relu{index}")]
        current, width = f"x{index + 1}", channels
        if batch_norm and index == 0:  # after the Relu, as openWakeWord's embedding has it: not folded
            inits.update({"bn_scale": np.geomspace(0.01, 5.0, channels), "bn_bias": rng.normal(0, 0.3, channels),
                          "bn_mean": rng.uniform(0.1, 1.0, channels), "bn_var": np.geomspace(10.0, 1e-4, channels)})
            nodes.append(helper.make_node("BatchNormalization", [current, "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                                          ["normed"], name="bn0"))
            current = "normed"
    nodes += [helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"),
              helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "head_w", "head_b"], ["logits"], transB=1, name="head")]
    tensors = [numpy_helper.from_array(value if value.dtype == np.int64 else value.astype(np.float32), name)
               for name, value in inits.items()]
    graph = helper.make_graph(nodes, "mel_keywords", [helper.make_tensor_value_info("audio", TensorProto.FLOAT,
                                                                                    [1, samples])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], tensors)
    path = folder / "mel_keywords.onnx"
    onnx.save_model(models.make(graph, ir_version=9), str(path))
    data = folder / "audio"
    data.mkdir()
    rng = np.random.default_rng(1)
    time = np.arange(samples) / 16000
    for index in range(16):  # voiced, with harmonics, a gliding pitch and noise, at int16's scale
        pitch = rng.uniform(90, 220) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * time))
        phase = 2 * np.pi * np.cumsum(pitch) / 16000
        voiced = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.3 + rng.normal(0, 0.01, samples)
        np.savez(data / f"{index:02d}.npz", audio=(voiced * 32767 * rng.uniform(0.2, 1.0)).astype(np.float32)[None])
    return path, data


def test_a_front_end_qnn_computes_wrongly_runs_on_the_cpu_and_the_rest_on_qnn(tmp_path):
    """The search keeps the front end off QNN (front_end.region_move) where keeping its Log off
    (moves) does not mend the logits: written, exit 0, the classifier on QNN."""
    model, data = mel_keywords(tmp_path)
    out = tmp_path / "kw.qdq.onnx"
    code, record, _ = quantize(model, "--static", "--ep", "qnn", "--calib", data, "--auto-exclude",
                               "--max-exclude-rounds", "2", "-o", out)
    assert code == 0 and out.exists(), [f["message"] for f in record["findings"]]
    front = [m for m in record["search"]["off_ep"] if m["label"].startswith("the front end")]
    assert len(front) == 1 and front[0]["kept"] is True and front[0]["passed"] is True, record["search"]["off_ep"]
    assert record["search"]["stopped"].endswith("then a region kept off the EP passed the gate (search.front_end)")
    off = {entry["name"] for entry in record["kept_off_ep"]}
    assert {"stft_real", "stft_imag", "pow_real", "pow_imag", "mel", "log"} <= off
    assert not off & {"conv0", "conv1", "conv2", "head"}  # the classifier stays on QNN
    ep = record["verify"]["ep"]
    assert ep["passed"] is True and abs(ep["norm_ratio"] - 1) < 0.02 and ep["cosine"] > 0.999
    placed = ep["placement"]
    said = [f for f in findings(record, "QNT022")][0]["message"]
    assert f"{placed['nodes_on_ep']} of {placed['nodes_total']} nodes stay on qnn" in said
    assert "the front end" in said or any("the front end" in e["reason"] for e in record["kept_off_ep"])


def test_a_region_restart_that_does_not_improve_is_not_taken(tmp_path):
    """front_end.region_restart: after the region move, the front end kept off with nothing else
    float is tried afresh, and the EP's moves from there. Here (a BatchNormalization after the first
    Relu, its channels' scales 0.01 to 5 and variances 10 to 1e-4) the region move's result, with
    the search's float nodes, measures better than the restart without them, and stays the one
    reported."""
    model, data = mel_keywords(tmp_path, batch_norm=True)
    out = tmp_path / "kw.qdq.onnx"
    code, record, _ = quantize(model, "--static", "--ep", "qnn", "--calib", data, "--auto-exclude",
                               "--max-exclude-rounds", "2", "-o", out)
    moves = record["search"]["off_ep"]
    restarts = [m for m in moves if m.get("restart") and m["label"].endswith("the rest quantized afresh")]
    region = [m for m in moves if m["label"].startswith("the front end") and not m.get("restart")]
    assert restarts and restarts[0]["kept"] is False and restarts[0]["cosine_after"] < region[0]["cosine_after"], moves
    assert region[0]["kept"] is True and "superseded" not in region[0]
    assert record["verify"]["cosine"] > 0.999
    assert "the rest quantized afresh" not in " ".join(e["reason"] for e in record["kept_off_ep"])
