"""quantize's engines (issue 51): ORT's quantizer and NNCF behind one interface, each judged by the
same gate; --engine's refusals; a failing engine is a failed candidate; NNCF's telemetry stays off."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import invoke, quantize, write_samples
from conftest import SAMPLES
from ortprep.runtime.requests.nncf_quantize import NncfQuantize
from ortprep.steps.quantize import engines
from ortprep.steps.quantize.engines.nncf import NncfEngine

needs_nncf = pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="nncf is not installed")


def outlier_channel_mlp(width: int = 64, classes: int = 8, outlier: float = 100.0) -> onnx.ModelProto:
    """Two dense layers whose first input has one channel 100x the others (its weights 100x smaller,
    so it counts as much as each): one 8-bit range per tensor for that input leaves the small
    channels a few levels. SmoothQuant (NNCF, transformer scheme) moves the outlier into the weights."""
    rng = np.random.default_rng(3)
    scale = np.ones((1, width), np.float32)
    scale[0, 0] = outlier
    w1 = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    w1[0, :] /= outlier
    w2 = (rng.standard_normal((width, classes)) / np.sqrt(width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["xs"], name="outlier_scale"),
         helper.make_node("MatMul", ["xs", "W1"], ["h"], name="dense1"),
         helper.make_node("Relu", ["h"], ["h_act"], name="relu1"),
         helper.make_node("MatMul", ["h_act", "W2"], ["logits"], name="dense2")],
        "outlier_channel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
        [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(w1, "W1"),
         numpy_helper.from_array(w2, "W2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def clustered_samples(model: onnx.ModelProto, folder: Path, count: int = 40, clusters: int = 8) -> Path:
    """Inputs around ``clusters`` prototypes (spread 2, noise 0.3), the prototypes chosen among 64
    for the widest top-1 margin of the float model: a classifier's inputs, far from its decision
    boundaries, so that a flipped class is the quantization's doing."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    candidates = rng.standard_normal((64, weights["W1"].shape[0])).astype(np.float32) * 2
    logits = np.maximum((candidates * weights["scale"]) @ weights["W1"], 0) @ weights["W2"]
    top = np.sort(logits, axis=1)
    prototypes = candidates[np.argsort(-(top[:, -1] - top[:, -2]) / np.linalg.norm(logits, axis=1))[:clusters]]
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        x = prototypes[rng.integers(clusters)] + 0.3 * rng.standard_normal(prototypes.shape[1])
        np.savez(folder / f"sample{index:03d}.npz", x=x[None].astype(np.float32))
    return folder


@pytest.mark.parametrize("engine, model, name, shape", [
    ("ort", "cnn.onnx", "image", (1, 3, 32, 32)),
    pytest.param("nncf", "cnn.onnx", "image", (1, 3, 32, 32), marks=needs_nncf),
    pytest.param("nncf", "transformer_block.onnx", "hidden", (2, 8, 64), marks=needs_nncf),
])
def test_engine_candidate_passes_the_gate_and_is_written(tmp_path, monkeypatch, engine, model, name, shape):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # NNCF's telemetry would write ~/intel
    calib = write_samples(tmp_path / "calib", name, shape, 10)
    code, record, _ = quantize(SAMPLES / model, "--static", "--calib", calib, "--engine", engine,
                               "-o", tmp_path / "q.onnx")
    assert code == 0, record["findings"]
    assert record["verify"]["passed"] is True and Path(record["output"]).exists()
    assert record["engine"]["asked"] == engine and record["engine"]["used"] == engine
    candidate = record["engine"]["candidates"][0]
    assert candidate["engine"] == engine and candidate["status"] == "judged" and candidate["passed"] is True
    assert record["timing"]["engine_seconds"] > 0
    assert "QuantizeLinear" in {n.op_type for n in onnx.load(record["output"]).graph.node}
    if engine == "nncf":
        assert candidate["detail"]["version"].startswith("3.")
        # SmoothQuant only where the graph is MatMul layers without Conv
        assert candidate["detail"]["model_type"] == ("transformer" if "transformer" in model else None)
        assert not (tmp_path / "home" / "intel").exists()  # telemetry off: nothing under ~/intel


@needs_nncf
def test_nncf_refuses_16_bit_activations_in_one_line(tmp_path):
    calib = write_samples(tmp_path / "calib", "image", (1, 3, 32, 32), 4)
    out = tmp_path / "q.onnx"
    code, _, stderr = quantize(SAMPLES / "cnn.onnx", "--static", "--calib", calib, "--engine", "nncf",
                               "--activation-type", "uint16", "-o", out)
    assert code == 2 and not out.exists()
    assert "--engine nncf: 16-bit activations or weights: NNCF's ONNX backend writes 8-bit Q/DQ only" in stderr
    assert "Traceback" not in stderr


def test_an_engine_missing_here_exits_3_in_one_line(tmp_path, monkeypatch):
    """An engine this machine lacks is the environment's shortfall (exit 3), not a usage error; with
    --auto as without it, and nothing is written."""
    monkeypatch.setenv("ORTPREP_AIMET_PYTHON", str(tmp_path / "no-such-python"))
    calib = write_samples(tmp_path / "calib", "image", (1, 3, 32, 32), 4)
    out = tmp_path / "q.onnx"
    for extra in ((), ("--auto",)):
        code, _, stderr = quantize(SAMPLES / "cnn.onnx", "--static", "--calib", calib, "--engine", "aimet",
                                   *extra, "-o", out)
        assert code == 3 and not out.exists(), stderr
        assert "--engine aimet: ORTPREP_AIMET_PYTHON=" in stderr and "is not an interpreter" in stderr
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1


class RaisingQuantize(NncfQuantize):
    """NNCF's request, raising where nncf.quantize would run: an engine that fails in the worker."""

    def _quantize(self, nncf):
        raise RuntimeError("engine exploded")


class RaisingEngine(NncfEngine):
    request_type = RaisingQuantize


@needs_nncf
def test_a_failing_engine_is_a_failed_candidate(tmp_path, monkeypatch):
    model = tmp_path / "outlier.onnx"
    onnx.save_model(outlier_channel_mlp(), str(model))
    calib = clustered_samples(outlier_channel_mlp(), tmp_path / "calib")
    monkeypatch.setitem(engines._ENGINES, "nncf", RaisingEngine())
    code, record, stderr = quantize(model, "--static", "--calib", calib, "--engine", "auto", "-o", tmp_path / "q.onnx")
    assert code == 1 and "Traceback" not in stderr  # ORT's candidate fails the gate; the step goes on to its verdict
    fates = {c["engine"]: c for c in record["engine"]["candidates"]}
    assert fates["ort"]["status"] == "judged" and fates["ort"]["passed"] is False and fates["ort"]["kept"]
    assert fates["nncf"]["status"] == "failed"
    assert fates["nncf"]["error"].startswith("nncf 3.") and "RuntimeError: engine exploded" in fates["nncf"]["error"]
    assert record["engine"]["used"] == "ort"


@needs_nncf
def test_only_nncf_passes_an_outlier_channel_and_auto_writes_it(tmp_path, monkeypatch):
    """ORT's per-tensor MinMax spends the 8-bit range of dense1's input on the 100x channel: the
    gate refuses its candidate (lowest cosine about 0.72). NNCF's SmoothQuant moves the outlier into
    the weights and passes (about 0.996, every top-1 kept); --engine auto writes NNCF's file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model = tmp_path / "outlier.onnx"
    onnx.save_model(outlier_channel_mlp(), str(model))
    calib = clustered_samples(outlier_channel_mlp(), tmp_path / "calib")
    code, plain, _ = quantize(model, "--static", "--calib", calib, "--engine", "ort", "-o", tmp_path / "ort.onnx")
    assert code == 1 and plain["output"] is None and plain["verify"]["cosine"] < 0.9
    assert "QNT005" in {f["code"] for f in plain["findings"]}
    code, record, _ = quantize(model, "--static", "--calib", calib, "--engine", "auto", "-o", tmp_path / "q.onnx")
    assert code == 0, record["findings"]
    fates = {c["engine"]: c for c in record["engine"]["candidates"]}
    assert fates["ort"]["passed"] is False and fates["ort"]["cosine"] < 0.9 and not fates["ort"]["kept"]
    assert fates["nncf"]["passed"] is True and fates["nncf"]["kept"]
    assert fates["nncf"]["detail"]["model_type"] == "transformer"
    assert record["engine"]["used"] == "nncf" and record["output"] == str(tmp_path / "q.onnx")
    assert record["verify"]["cosine"] > 0.99 and record["verify"]["top1_agreement"] == 1.0
    assert set(fates) == {"ort", "nncf", "aimet"} and record["timing"]["engine_seconds"] > 0
    assert not (tmp_path / "home" / "intel").exists()


def test_registry_names_a_missing_engine_as_not_available(monkeypatch):
    monkeypatch.delitem(engines._ENGINES, "aimet", raising=False)
    aimet = engines.engine("aimet")
    if importlib.util.find_spec("ortprep.steps.quantize.engines.aimet") is None:
        assert "no aimet engine" in aimet.available()
    assert engines.engine("ort").available() is None and engines.chosen("auto") == ["ort", "nncf", "aimet"]
    with pytest.raises(ValueError):
        engines.engine("tflite")


@pytest.mark.parametrize("mode, settings, wide, words", [
    ("dynamic", {}, (), "NNCF quantizes statically"),
    ("weight-only", {}, (), "MatMulNBits"),
    ("static", {"format": "qoperator"}, (), "QDQ models only"),
    ("static", {"format": "qdq", "activation_type": "uint16"}, (), "8-bit Q/DQ only"),
    ("static", {"format": "qdq", "activation_type": "uint8", "weight_type": "int16"}, (), "8-bit Q/DQ only"),
    ("static", {"format": "qdq", "activation_type": "uint8"}, ("h",), "8-bit Q/DQ only"),
])
def test_nncf_says_in_one_line_what_it_cannot_write(mode, settings, wide, words):
    why = engines.engine("nncf").supports(mode, settings, engines.Exclusion(wide_tensors=wide))
    assert words in why and "\n" not in why and why.endswith("--engine ort")
    assert engines.engine("nncf").supports("static", {"format": "qdq", "activation_type": "uint8",
                                                      "weight_type": "int8"}, engines.Exclusion()) is None


class SleepingQuantize(NncfQuantize):
    def _quantize(self, nncf):
        import time

        time.sleep(30)


class DyingQuantize(NncfQuantize):
    def _quantize(self, nncf):
        import os

        os._exit(3)


@needs_nncf
@pytest.mark.parametrize("request_type, error, timeout", [
    (SleepingQuantize, "nncf: did not finish within 3 s", 3),
    # a worker's start (its imports) alone can take seconds on a loaded machine: the dying one gets room
    (DyingQuantize, "nncf: its process died", 60),
])
def test_an_engine_that_hangs_or_dies_is_a_failed_run(tmp_path, request_type, error, timeout):
    """A hang ends at the deadline (the worker is killed), a dead worker is reported: the run fails
    in one line and writes nothing."""
    from ortprep.runtime.calibration import discover
    from ortprep.runtime.feeds import input_specs

    model = SAMPLES / "cnn.onnx"
    calibration = discover("random", input_specs(onnx.load(str(model))))
    engine = NncfEngine()
    engine.request_type = request_type
    run = engine.quantize(tmp_path, model, tmp_path / "q.onnx", "static",
                          {"format": "qdq", "activation_type": "uint8", "weight_type": "int8"},
                          calibration, [0, 1], engines.Exclusion(), False, timeout=timeout)
    assert not run.ok and run.output is None and run.error.startswith(error) and "\n" not in run.error
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("ep", ["cpu", "cuda", "qnn", "openvino-cpu"])
def test_auto_tries_16_bit_activations_on_every_ep(ep):
    """--auto's ladder has A16W8 (or, for QNN's 16-bit preset, starts there) on each EP, the CPU EP included."""
    from ortprep.options import QuantizeOptions
    from ortprep.steps.quantize.ladder import auto_order

    labels = [label for label, _ in auto_order(QuantizeOptions(mode="static", calib="random", ep=ep, auto=True))]
    assert any(label.startswith("static uint16 activations, int8 weights") for label in labels), labels


needs_aimet = pytest.mark.skipif(engines.engine("aimet").available() is not None,
                                 reason="AIMET-ONNX's environment is not here")


@pytest.mark.parametrize("passed, ratio, best_passed, best_ratio, kept", [
    (True, 0.5, True, 1.4, True),  # passes and runs clearly faster than the slow one that passed
    (True, 1.3, True, 1.4, False),  # within FASTER_BY of it: the earlier one stays
    (False, 0.3, True, 1.4, False),  # fails the gate: never kept over one that passed, however fast
    (True, None, True, 1.4, False),  # not timed: no evidence it is faster
])
def test_auto_keeps_a_later_engine_only_where_it_passes_and_runs_faster(passed, ratio, best_passed, best_ratio,
                                                                         kept):
    from ortprep.steps.quantize.choose import faster, slow

    assert slow(best_ratio) and not slow(0.99) and not slow(None)
    assert (passed and faster(ratio, best_ratio)) is kept


@needs_nncf
@needs_aimet
def test_auto_tries_every_engine_where_the_one_that_passed_is_slower_and_keeps_the_fastest(tmp_path, monkeypatch):
    """cnn.onnx on the CPU EP: ORT's candidate passes. Where it runs slower than the float model (a
    tiny CNN's Q/DQ pairs cost more than its int8 kernels save), NNCF and AIMET-ONNX quantize too
    and the fastest that passed is kept; where it does not, neither is tried. Each judged engine's
    record carries its latency ratio, and engine.best the kept one's."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    calib = write_samples(tmp_path / "calib", "image", (1, 3, 32, 32), 10)
    code, record, _ = quantize(SAMPLES / "cnn.onnx", "--static", "--calib", calib, "--engine", "auto",
                               "-o", tmp_path / "q.onnx")
    assert code == 0, record["findings"]
    fates = {c["engine"]: c for c in record["engine"]["candidates"]}
    ort = fates["ort"]
    assert ort["passed"] is True and ort["timed_on"] == "cpu" and ort["latency_ratio"] > 0
    best = record["engine"]["best"]
    assert best["engine"] == record["engine"]["used"] and best["passed"] is True
    assert best["writes_it"] == f"--engine {best['engine']} --keep-failed"
    if ort["latency_ratio"] <= 1.0:
        assert fates["nncf"]["status"] == fates["aimet"]["status"] == "not tried" and ort["kept"]
        assert "ort passed the gate at" in fates["nncf"]["reason"]
        assert [c["engine"] for c in record["engine"]["candidates"]] == ["ort", "nncf", "aimet"]  # AUTO_ORDER
        return
    judged = [c for c in record["engine"]["candidates"] if c["status"] == "judged"]
    # none skipped: the slow pass went on, in SPEED_ORDER (AIMET-ONNX's files ran fastest on the development half)
    assert [c["engine"] for c in judged] == ["ort", "aimet", "nncf"]
    kept = next(c for c in judged if c["kept"])
    assert kept["passed"] and kept["latency_ratio"] is not None
    for other in judged:  # nothing that passed ran clearly faster than the kept one (choose.FASTER_BY)
        if other is not kept and other["passed"]:
            assert other["latency_ratio"] >= 0.9 * kept["latency_ratio"] or judged.index(other) > judged.index(kept)
    if kept["latency_ratio"] > 1.0:  # still slower than float: QNT004 names each engine's ratio
        slower = next(f for f in record["findings"] if f["code"] == "QNT004")
        assert "the engines judged: ort (passed" in slower["message"]


@needs_nncf
def test_a_refusal_names_the_best_engines_candidate_and_keep_failed_keeps_it(tmp_path, monkeypatch):
    """Held to a cosine no 8-bit candidate reaches, every engine's is refused: nothing is written at
    -o, the refusal's fix names the engine whose candidate measured best with its figures and the
    options that write it, engine.best gives them, and --keep-failed keeps that candidate."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    calib = write_samples(tmp_path / "calib", "image", (1, 3, 32, 32), 10)
    out = tmp_path / "q.onnx"
    code, record, stderr = quantize(SAMPLES / "cnn.onnx", "--static", "--calib", calib, "--engine", "auto",
                                    "--metric", "logits=cosine", "--min-cosine", "0.9999999", "--keep-failed",
                                    "-o", out)
    assert code == 1 and not out.exists() and "Traceback" not in stderr
    judged = [c for c in record["engine"]["candidates"] if c["status"] == "judged"]
    assert len(judged) >= 2 and not any(c["passed"] for c in judged)
    best = record["engine"]["best"]
    kept = next(c for c in judged if c["kept"])
    assert best["engine"] == kept["engine"] == record["engine"]["used"] and best["passed"] is False
    assert best["cosine"] == pytest.approx(record["verify"]["cosine"])
    assert best["judged"] == [c["engine"] for c in judged]
    refusal = next(f for f in record["findings"] if f["code"] == "QNT005")
    assert (f"{best['engine']}'s candidate measured best (lowest cosine {best['cosine']:.4f}" in refusal["fix"]
            and f"--engine {best['engine']} --keep-failed writes it as NAME.failed.onnx" in refusal["fix"])
    assert Path(record["kept_failed"]).exists()


def test_the_refusal_words_name_the_best_engine_with_its_decisions_figures():
    from ortprep.steps.quantize.choose import best_words, with_engines

    best = {"engine": "nncf", "cosine": 0.99477, "latency_ratio": 1.42, "judged": ["ort", "nncf", "aimet"],
            "decisions": [{"output": "probs", "kind": "ctc", "agreement": 0.875, "sequence_agreement": None}],
            "writes_it": "--engine nncf --keep-failed"}
    words = best_words(best)
    assert words == ("of the engines judged (ort, nncf, aimet), nncf's candidate measured best (lowest cosine 0.9948; "
                     "'probs' whole strings kept 87.5%; 1.42x the float model's latency): --engine nncf --keep-failed "
                     "writes it as NAME.failed.onnx")
    assert with_engines("--auto-exclude", best, "auto") == f"--auto-exclude; {words}"
    assert with_engines("--auto-exclude", best, "ort").endswith("--engine auto tries nncf, aimet too and names the "
                                                                     "engine whose candidate measured best")
    assert with_engines("--auto-exclude", None, "auto") == "--auto-exclude"


def test_auto_does_not_stop_at_an_engine_whose_pass_the_margin_will_refuse():
    """Held to the decision margin (an --auto precision after the first, once other trials failed on
    the same held-back samples), a candidate that passes the gate but falls short of the margin is
    refused in the end: a later engine's candidate that holds the margin is kept over it, and a
    failing one never is (magika's A16W8 under --auto: ORT's and AIMET-ONNX's both passed the gate)."""
    from types import SimpleNamespace

    from ortprep.steps.quantize.choose import holds, replaces
    from ortprep.steps.quantize.trials import Trial

    def trial(name: str, passed: bool, gap: float | None, cosine: float = 0.9999) -> Trial:
        return Trial(name, [], cosine, passed, 100, path=Path(name), margin_gap=gap)

    short, holding, failing = trial("short", True, 0.002), trial("holding", True, 0.0), trial("failing", False, 0.01,
                                                                                                0.99999)
    held = SimpleNamespace(held_to_margin=lambda t: True)
    free = SimpleNamespace(held_to_margin=lambda t: False)
    assert not holds(held, short) and holds(free, short) and holds(held, holding) and not holds(held, failing)
    # held to the margin: the one that holds replaces the short pass, even slower; a failing one does not
    assert replaces(held, holding, 1.5, short, 1.0)
    assert not replaces(held, failing, 0.5, short, 1.0)
    # not held (the first precision, nothing failed before): the short pass holds, and only a faster one replaces it
    assert not replaces(free, holding, 1.5, short, 1.0) and replaces(free, holding, 0.5, short, 1.0)


def test_a_candidate_the_target_ep_did_not_judge_is_never_kept_over_one_it_did():
    """ocr_det, --ep qnn under --auto (session 35): ORT's A16W16 candidate passed on both EPs but short
    of the margin; AIMET-ONNX's passed the CPU EP (cosine 0.999998), its QNN run was spared (it could
    not beat the first baseline by the preprocessing margin), and it was kept and written: load then
    found QNN moving the map. A candidate without the target EP's judgement replaces nothing where
    that EP judges; where no target EP judges, the CPU EP's judgement is the one there is."""
    from types import SimpleNamespace

    from ortprep.steps.quantize.choose import judged_where_it_runs, replaces
    from ortprep.steps.quantize.trials import Trial

    def trial(name: str, ep: dict | None, gap: float = 0.0) -> Trial:
        return Trial(name, [], 0.9999, True, 100, path=Path(name), margin_gap=gap,
                     sides={"judged_on": ["cpu", "qnn"] if ep else ["cpu"], "cpu": {"passed": True}, "ep": ep})

    short = trial("ort", {"passed": True}, gap=0.002)
    unjudged, judged = trial("aimet", None), trial("aimet", {"passed": True})
    on_qnn = SimpleNamespace(held_to_margin=lambda t: True, target=SimpleNamespace(judged=True))
    cpu_only = SimpleNamespace(held_to_margin=lambda t: True, target=None)
    assert not judged_where_it_runs(on_qnn, unjudged) and judged_where_it_runs(on_qnn, judged)
    assert not replaces(on_qnn, unjudged, None, short, None)  # before: kept, never run on QNN
    assert replaces(on_qnn, judged, None, short, None)
    assert replaces(cpu_only, unjudged, None, short, None)
