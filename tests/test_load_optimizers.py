"""load names the ORT graph optimization that makes an EP compute otherwise (LOD012), and judges
the session an application shapes (--optimization, --disable-optimizer; LOD013 for a name ORT
would ignore). The search itself on stated outcomes; the whole of it on QNN's HTP simulator."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import models
from cli_helpers import invoke
from ep_marks import needs_qnn, on_x86
from ortprep.prove import optimizers
from ortprep.prove.optimizers import BASIC_OPTIMIZERS, MAX_SESSIONS, described, find_optimizers


def culprit_judge(*needed: str, off: bool = True):
    """A judge under which the outputs match with the optimizations off (``off``) or with every one
    of ``needed`` left out; the sessions it was asked for, in order."""
    asked: list[tuple[str, tuple[str, ...]]] = []

    def judge(level, disabled):
        asked.append((level, disabled))
        matched = off if level == "off" else all(name in disabled for name in needed)
        return matched, 0.01 if matched else 5.0

    return judge, asked


@pytest.mark.parametrize("name", ["ConvAddFusion", "EliminateIdentity", "TransposeOptimizer", "GeluFusion"])
def test_one_optimizer_is_named_within_the_bound(name):
    judge, asked = culprit_judge(name)
    result = find_optimizers(judge)
    assert result["off_matches"] is True
    assert result["optimizers"] == [name]
    assert len(asked) <= MAX_SESSIONS
    assert asked[0] == ("off", ())
    assert asked[-1] == ("default", (name,))  # the answer is the last session measured


def test_two_optimizers_needed_together_stay_a_measured_set():
    judge, _ = culprit_judge("ConvAddFusion", "GeluFusion")  # in different halves
    result = find_optimizers(judge)
    assert set(result["optimizers"]) >= {"ConvAddFusion", "GeluFusion"}
    assert any(t["matched"] and t["disabled"] == result["optimizers"] for t in result["trials"])
    assert described("qnn", result, 5.0)[0].startswith("qnn: ORT's graph optimizations change")


def test_nothing_is_named_where_off_does_not_match_either():
    judge, asked = culprit_judge("ConvAddFusion", off=False)
    result = find_optimizers(judge)
    assert result["off_matches"] is False and result["optimizers"] is None
    assert asked == [("off", ())]
    assert described("qnn", result, 5.0) is None


def test_beyond_the_basic_level_the_fix_is_the_level():
    judge, asked = culprit_judge("ConvActivationFusion")  # a level-2 transformer: not in the list
    result = find_optimizers(judge)
    assert result["off_matches"] is True and result["optimizers"] is None
    assert len(asked) == 2
    what, fix = described("qnn", result, 5.0)
    assert "with them off" in what and "max abs diff 0.01, 5 at ORT's default" in what
    assert "ORT_DISABLE_ALL" in fix and "--optimization off" in fix


def test_a_failed_session_matches_nothing():
    def judge(level, disabled):
        return (None, None) if level == "off" else (True, 0.0)

    result = find_optimizers(judge)
    assert result["off_matches"] is False and len(result["trials"]) == 1


def test_the_named_fix_is_runnable_words():
    judge, _ = culprit_judge("ConvBNFusion")
    what, fix = described("qnn", find_optimizers(judge), 63932.0)
    assert what == ("qnn: ORT's graph optimization ConvBNFusion changes what qnn computes: with it left out, the "
                    "outputs match the CPU EP's by load's rule (max abs diff 0.01, 6.39e+04 at ORT's default)")
    assert "disabled_optimizers=['ConvBNFusion']" in fix
    assert fix.endswith("ortprep load MODEL --ep qnn --disable-optimizer ConvBNFusion judges that session")


def test_the_list_has_no_repeats_and_ort_s_own_names():
    assert len(set(BASIC_OPTIMIZERS)) == len(BASIC_OPTIMIZERS) == 30
    # the rules' names, where they are not their classes' (onnxruntime's optimizer headers)
    assert {"EliminateUnsqueeze", "Pad_Fusion", "MatMul_BatchNormalization_Fusion"} <= set(BASIC_OPTIMIZERS)
    assert not {"UnsqueezeElimination", "PadFusion", "MatmulBNFusion"} & set(BASIC_OPTIMIZERS)


def test_the_search_stops_at_its_seconds():
    judge, asked = culprit_judge("ConvAddFusion")
    result = find_optimizers(judge, seconds=0.0)
    assert asked == [("off", ())]  # the first session always runs; no later one starts
    assert result["off_matches"] is True and result["optimizers"] is None and result["stopped"]
    assert optimizers.NAMED_AT_MOST < len(BASIC_OPTIMIZERS)


@pytest.fixture(params=[False, True], ids=["conv", "matmul"])
def folded(tmp_path, request):
    model, x = models.conv_bn_beyond_fp16(matmul=request.param)
    path = tmp_path / "conv_bn.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "x.npz", x=x)
    # the fusion that folds it, as ORT names it (not always its class's name)
    return path, tmp_path / "x.npz", "MatMul_BatchNormalization_Fusion" if request.param else "ConvBNFusion"


def _load(*args) -> tuple[int, dict]:
    result = invoke("load", *args, "--json")
    return result.exit_code, json.loads(result.stdout)


@on_x86
@needs_qnn
def test_qnn_names_the_bn_fusion_and_judges_the_session_without_it(folded):
    path, inputs, fusion = folded
    before = path.read_bytes()
    code, report = _load(path, "--ep", "qnn", "--inputs", inputs)
    assert code == 1
    codes = [f["code"] for f in report["findings"]]
    assert "LOD006" in codes and "LOD012" in codes
    record = report["results"][0]
    searched = record["ort_optimizations"]
    assert searched["off_matches"] is True and searched["optimizers"] == [fusion]
    assert len(searched["trials"]) <= MAX_SESSIONS
    told = next(f for f in report["findings"] if f["code"] == "LOD012")
    assert fusion in told["message"] and f"--disable-optimizer {fusion}" in told["fix"]
    assert path.read_bytes() == before

    # the session the fix describes: load judges it, and it holds
    code, report = _load(path, "--ep", "qnn", "--inputs", inputs, "--disable-optimizer", fusion)
    assert code == 0, report["findings"]
    assert not [f for f in report["findings"] if f["code"] == "LOD013"]  # a name ORT knows
    record = report["results"][0]
    assert record["outputs_match"] is True
    assert record["ort_session"] == {"optimization": "default", "disabled_optimizers": [fusion]}
    assert "ort_optimizations" not in record  # a session the user shaped is not searched again

    code, report = _load(path, "--ep", "qnn", "--inputs", inputs, "--optimization", "off")
    assert code == 0 and report["results"][0]["ort_session"]["optimization"] == "off"


@on_x86
@needs_qnn
def test_a_name_ort_would_ignore_is_said(folded):
    path, inputs, _ = folded
    code, report = _load(path, "--ep", "qnn", "--inputs", inputs, "--disable-optimizer", "ConvBnFusion")
    assert code == 1  # ORT ignored the misspelt name: the fold stayed, and so did the difference
    told = [f for f in report["findings"] if f["code"] == "LOD013"]
    assert len(told) == 1 and "ConvBnFusion" in told[0]["message"]
    assert told[0]["severity"] == "warning"
