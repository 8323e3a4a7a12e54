"""The cosine floor held on unseen inputs: an output judged by cosine alone passes only where the
spread of its samples' cosines expects 99% of inputs of their kind to keep the floor
(ortprep/fidelity/cosine_tail.py; docs/decisions/gate-cosine-tail.md)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import onnx
from onnx import TensorProto, helper, numpy_helper

from cli_helpers import quantize
from ortprep.fidelity.cosine_tail import MIN_SAMPLES, expected_share, t_cdf
from ortprep.fidelity.decisions import parse_metric
from ortprep.fidelity.decisions.evidence import _erfinv
from ortprep.fidelity.evaluation import Evaluation, Judgement, hold_to_margin
from ortprep.fidelity.quantized import judge_quantized
from ortprep.fidelity.words import shortfall_text


def _normal_quantiles(count: int) -> np.ndarray:
    """Evenly spaced quantiles of the standard normal (the evidence rule's inverse error function)."""
    return np.array([math.sqrt(2.0) * _erfinv(2.0 * (index + 0.5) / count - 1.0) for index in range(count)])


def _cosines(median_distance: float, spread: float, count: int = 24) -> list[float]:
    """Cosines whose distances from 1 are log-normal, as a quantized embedding's are."""
    return list(1.0 - median_distance * np.exp(spread * _normal_quantiles(count)))


def _pair(cosine: float, rng: np.random.Generator, size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """A float output and a candidate at exactly ``cosine`` to it, of the same norm."""
    reference = rng.normal(size=size)
    other = rng.normal(size=size)
    other -= reference * (other @ reference) / (reference @ reference)
    other *= np.linalg.norm(reference) / np.linalg.norm(other)
    candidate = cosine * reference + math.sqrt(max(0.0, 1 - cosine * cosine)) * other
    return reference[None].astype(np.float32), candidate[None].astype(np.float32)


def _samples(cosines: list[float]) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(5)
    pairs = [_pair(c, rng) for c in cosines]
    return [{"emb": r} for r, _ in pairs], [{"emb": c} for _, c in pairs]


def test_t_cdf_matches_its_closed_forms():
    assert t_cdf(2.0, 1) == pytest.approx(0.5 + math.atan(2.0) / math.pi, abs=1e-9)  # Cauchy
    assert t_cdf(-1.0, 2) == pytest.approx(0.5 - 1 / (2 * math.sqrt(3)), abs=1e-9)
    assert t_cdf(1.959964, 100_000) == pytest.approx(0.975, abs=1e-5)  # the normal, in the limit
    assert t_cdf(0.0, 7) == 0.5 and t_cdf(1e9, 3) == pytest.approx(1.0)


def test_samples_close_to_the_floor_expect_unseen_inputs_below_it():
    """openWakeWord's embedding quantized by the search: 24 samples, the lowest 0.9918, median
    0.9976; 4 of 100 fresh inputs fell below 0.99. A spread like that expects under 99%."""
    near = _cosines(0.0024, 0.65)
    assert min(near) >= 0.99
    assert expected_share(near, 0.99) == pytest.approx(0.979, abs=0.003)
    tight = _cosines(0.001, 0.3)
    assert expected_share(tight, 0.99) > 0.9999
    # eight samples say less than 24 of the same spread
    assert expected_share(near[::3], 0.99) < expected_share(near, 0.99)


def test_too_few_samples_or_changed_ones_say_nothing_and_unchanged_ones_do_not_stretch_the_spread():
    assert expected_share(_cosines(0.0024, 0.65, MIN_SAMPLES - 1), 0.99) is None
    assert expected_share([1.0] * 24, 0.99) == 1.0
    # 16 samples left identical, 8 changed alike: the identical ones are a cluster, not a tail
    mixed = [1.0] * 16 + [0.998, 0.9981, 0.9979, 0.998, 0.9982, 0.9978, 0.998, 0.9981]
    assert expected_share(mixed, 0.99) > 0.999
    # 20 identical, 4 changed: too few changed samples to read a spread from
    assert expected_share([1.0] * 20 + [0.995] * 4, 0.99) is None


def test_a_file_whose_samples_all_pass_is_refused_by_its_spread_and_the_words_say_so():
    reference, candidate = _samples(_cosines(0.0024, 0.65))
    judged = judge_quantized("cpu", reference, candidate, 0.99, {})
    output = judged.outputs[0]
    assert output["cosine"] >= 0.99 and abs(output["norm_ratio"] - 1.0) < 1e-3
    assert output["cosine_expected"]["samples"] == 24 and output["cosine_expected"]["share"] < 0.99
    assert output["passed"] is False and judged.passed is False
    words = shortfall_text(judged, 0.99)
    assert words.startswith("output 'emb': each of its 24 samples keeps cosine 0.99 (lowest 0.99")
    assert "expects only 97.9% of unseen inputs to (the gate asks 99%)" in words
    # the same figures with a tighter spread pass
    reference, candidate = _samples(_cosines(0.001, 0.3))
    assert judge_quantized("cpu", reference, candidate, 0.99, {}).passed


def test_a_gated_decision_judges_unseen_inputs_in_its_place():
    """A top-1 output has its margins' expected agreement; the spread rule is for outputs judged by
    cosine alone."""
    reference, candidate = _samples(_cosines(0.0024, 0.65))
    judged = judge_quantized("cpu", reference, candidate, 0.99, {}, {"emb": parse_metric("top1")})
    assert "cosine_expected" not in judged.outputs[0]
    named_cosine = judge_quantized("cpu", reference, candidate, 0.99, {}, {"emb": parse_metric("cosine")})
    assert named_cosine.outputs[0]["cosine_expected"]["share"] < 0.99 and not named_cosine.passed


def test_a_result_chosen_among_trials_is_not_held_twice():
    """The share is read at the floor the attempt judges: a later --auto precision's raised floor is
    its margin already, so hold_to_margin does not hold the share again."""
    reference, candidate = _samples(_cosines(0.002, 0.6))
    judged = judge_quantized("cpu", reference, candidate, 0.99, {})
    assert 0.99 <= judged.outputs[0]["cosine_expected"]["share"] < 0.995 and judged.passed
    evaluation = Evaluation(judged.cosine, None, None, None, None, None, True, outputs=judged.outputs,
                            sample_cosines=judged.sample_cosines)
    assert hold_to_margin(evaluation, trials=4) is None and evaluation.passed


def test_the_words_name_the_spread_when_the_share_is_just_under_the_bar():
    """A share of 98.99% is below 99% and the words say so (a rounded share once read as a pass and
    blamed the norm)."""
    output = {"name": "emb", "cosine": 0.9931, "norm_ratio": 1.0, "passed": False, "judged_by": "cosine",
              "cosine_expected": {"share": 0.98996, "asks": 0.99, "samples": 24}}
    judgement = Judgement("cpu", 0.9931, 1.0, None, None, False, [output])
    assert shortfall_text(judgement, 0.99) == (
        "output 'emb': each of its 24 samples keeps cosine 0.99 (lowest 0.9931), but their spread expects only 98.9% "
        "of unseen inputs to (the gate asks 99%)")


def _matmul(path: Path) -> Path:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(64, 32)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_quantize_refuses_a_file_whose_samples_all_keep_the_floor_too_narrowly(tmp_path):
    """End to end: a MatMul whose inputs span 0.6x to 10x in scale; one 8-bit range for all of them
    leaves the small ones coarse. Every one of 40 samples keeps cosine 0.99, their spread expects
    95% of unseen inputs to: refused, nothing written, and the finding says why."""
    model = _matmul(tmp_path / "mm.onnx")
    rng = np.random.default_rng(0)
    rng.normal(size=(64, 32))  # the weights' draw, as the reviewer's reproduction made them
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, scale in enumerate(np.exp(rng.uniform(np.log(0.6), np.log(10.0), size=40))):
        np.savez(calib / f"s{index:03d}.npz", x=(scale * rng.normal(size=(1, 64))).astype(np.float32))
    out = tmp_path / "q.onnx"
    code, record, _ = quantize(model, "--static", "--calib", calib, "-o", out)
    assert code == 1 and not out.exists() and record["output"] is None
    confirmation = record["verify"]["confirmation"]["cpu"]["outputs"][0]
    assert confirmation["cosine"] >= 0.99 and confirmation["cosine_expected"]["share"] < 0.97
    message = next(f["message"] for f in record["findings"] if f["code"] == "QNT005")
    assert "each of its 40 samples keeps cosine 0.99" in message and "their spread expects only" in message
    assert "though each of them keeps it" in message and "miss inputs" not in message
