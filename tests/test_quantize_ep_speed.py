"""quantize's verdict on a slow target EP (QNN's HTP simulator), faster (issue 51, point 3;
docs/decisions/speed-ep-verdict.md): each (file, sample) runs there once per step, the first
samples decide where the rest cannot change the verdict, a candidate the CPU EP fails never
reaches the EP, and the report says where the time went."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import models
from cli_helpers import invoke
from ortprep.fidelity.decisions.decision import Decision
from ortprep.steps.quantize.ep_early import PASS_MIN_SAMPLES, early_rule
from ep_marks import needs_qnn



def tiny_classifier(folder: Path, count: int = 40) -> tuple[Path, Path]:
    """A 3-Conv classifier (about 5 KB) and ``count`` image samples: a run on the simulator takes
    milliseconds."""
    path = folder / "m.onnx"
    onnx.save(models.conv_classifier(width=8), str(path))
    data = folder / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for index in range(count):
        np.savez(data / f"{index:02d}.npz", x=rng.random((1, 3, 32, 32), dtype=np.float32))
    return path, data


def qnn_target(data: Path):
    from ortprep.options import QuantizeOptions
    from ortprep.report import StepResult
    from ortprep.steps.quantize.ep_gate import gate_target

    target = gate_target(QuantizeOptions(mode="static", ep="qnn", calib=data),
                         StepResult(step="quantize", schema="scratch"))
    assert target.judged
    return target


def feeds(count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.random((1, 3, 32, 32), dtype=np.float32)} for _ in range(count)]


# --- the cache --------------------------------------------------------------------------------------

@needs_qnn
def test_a_file_judged_again_on_the_same_samples_runs_nothing_more_on_the_ep(tmp_path):
    from ortprep.runtime.budget import timing_step
    from ortprep.runtime.worker import workers_scope

    model, data = tiny_classifier(tmp_path, count=4)
    target = qnn_target(data)
    samples = feeds(6)
    with workers_scope() as pool, timing_step() as times:
        first = target.run(model, samples)
        built = sum(pool.sessions_created(python=target.runtime.python).values())
        again = target.run(model, samples)
        copy = tmp_path / "copy" / "m.onnx"  # the same content elsewhere: the same outputs
        copy.parent.mkdir()
        shutil.copy(model, copy)
        elsewhere = target.run(copy, samples[:3])
        assert sum(pool.sessions_created(python=target.runtime.python).values()) == built == 1
    assert first.ok and again.ok and elsewhere.ok
    assert (times.ep_runs, times.ep_cached) == (6, 9)
    for ran, cached in zip(first.samples, again.samples):
        np.testing.assert_array_equal(ran["logits"], cached["logits"])
    assert again.nodes_total == first.nodes_total and again.nodes_on_ep == first.nodes_on_ep
    # a file whose content changed is another model: run again
    onnx.save(models.conv_classifier(width=16), str(copy))
    with workers_scope(), timing_step() as later:
        later.outputs, later.models = times.outputs, times.models
        assert target.run(copy, samples[:2]).ok
    assert (later.ep_runs, later.ep_cached) == (2, 0)


@needs_qnn
def test_the_ep_runs_only_the_samples_its_early_rule_leaves_undecided_and_names_them(tmp_path):
    from ortprep.runtime.budget import timing_step

    model, data = tiny_classifier(tmp_path, count=4)
    target = qnn_target(data)
    target.candidate = "baseline (as given)"
    seen: list[tuple[str, int, int]] = []
    with timing_step(progress=lambda stage, done, total: seen.append((stage, done, total))) as times:
        run = target.run(model, feeds(6), early=lambda samples: "pass" if len(samples) >= 3 else None)
    assert run.ok and len(run.samples) == 3 and run.limited is None
    assert run.early == {"verdict": "pass", "samples": 3, "offered": 6}
    assert (times.ep_runs, times.ep_skipped, times.early["pass"]) == (3, 3, 1)
    assert seen == [(f"EP qnn: A16W8 baseline (as given), sample {i + 1}/6", i, 6) for i in range(3)]


# --- the early rule ---------------------------------------------------------------------------------

def _logits(count: int, gap: float, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Class scores whose top class leads the next by ``gap`` (plus a random spread)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        row = rng.standard_normal((1, 10))
        row[0, rng.integers(10)] = row.max() + gap
        out.append({"logits": row.astype(np.float32)})
    return out


def _moved(samples: list[dict], size: float, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{k: (v + size * rng.standard_normal(v.shape)).astype(np.float32) for k, v in s.items()} for s in samples]


TOP1 = {"logits": Decision("top1", gated=True)}


def test_a_clear_pass_stops_after_the_first_samples_and_a_borderline_one_runs_them_all():
    reference = _logits(8, gap=3.0)
    on_cpu = _moved(reference, 0.002, seed=1)
    on_ep = _moved(on_cpu, 0.001, seed=2)
    decide = early_rule(reference, on_cpu, 0.99, {}, TOP1, cpu_passed=True)
    assert [decide(on_ep[:k]) for k in range(1, PASS_MIN_SAMPLES)] == [None] * (PASS_MIN_SAMPLES - 1)
    assert decide(on_ep[:PASS_MIN_SAMPLES]) == "pass"
    # borderline: the CPU EP's own worst sample just clears the bar, so the EP's spread may not
    cosines = [float(np.dot(r["logits"].ravel(), c["logits"].ravel())
                     / np.linalg.norm(r["logits"]) / np.linalg.norm(c["logits"])) for r, c in zip(reference, on_cpu)]
    tight = early_rule(reference, on_cpu, min(cosines) - 1e-7, {}, TOP1, cpu_passed=True)
    assert all(tight(on_ep[:k]) is None for k in range(1, 8))
    # a top class barely ahead on a sample left: the EP's spread could flip it
    close = _logits(8, gap=0.0, seed=3)
    close[-1]["logits"][0, :2] = [5.0, 5.0001]
    near = early_rule(close, close, 0.99, {}, TOP1, cpu_passed=True)
    assert near(_moved(close, 0.001, seed=4)[:PASS_MIN_SAMPLES]) is None
    # the CPU EP failed: no pass to declare
    assert early_rule(reference, on_cpu, 0.99, {}, TOP1, cpu_passed=False)(on_ep[:6]) is None


def test_a_clear_miss_stops_at_the_first_sample_that_shows_it():
    reference = _logits(8, gap=3.0)
    on_ep = _moved(reference, 0.001, seed=2)
    on_ep[1] = {"logits": -reference[1]["logits"]}  # cosine -1 on the second sample
    decide = early_rule(reference, reference, 0.99, {}, TOP1, cpu_passed=True)
    assert decide(on_ep[:1]) is None and decide(on_ep[:2]) == "miss"
    # just below the bar is not a clear miss: the judgement on every sample says so
    first = reference[0]["logits"].ravel()
    below = (first + 0.2 * np.abs(first).max() * np.eye(1, 10, 9).ravel()).astype(np.float32)
    assert 0.98 < float(first @ below / np.linalg.norm(first) / np.linalg.norm(below)) < 0.99
    assert decide([{"logits": below.reshape(1, 10)}]) is None


def test_a_miss_at_the_bar_is_one_where_asked_and_the_worst_samples_run_first():
    reference = _logits(8, gap=3.0)
    first = reference[0]["logits"].ravel()
    below = (first + 0.2 * np.abs(first).max() * np.eye(1, 10, 9).ravel()).astype(np.float32)
    assert 0.98 < float(first @ below / np.linalg.norm(first) / np.linalg.norm(below)) < 0.99
    exact = early_rule(reference, reference, 0.99, {}, TOP1, cpu_passed=True, miss_line=0.99)
    assert exact([{"logits": below.reshape(1, 10)}]) == "miss"  # below the bar on one sample: the gate fails
    assert exact(reference[:1]) is None
    from ortprep.runtime.budget import timing_step
    from ortprep.steps.quantize.ep_early import note_ep_cosines, worst_first

    samples = feeds(4)
    assert worst_first(samples) == [0, 1, 2, 3]
    with timing_step():
        assert worst_first(samples) == [0, 1, 2, 3]  # nothing run on the EP yet
        note_ep_cosines(samples[1:3], [0.999, 0.95])  # (samples 1 and 2)
        note_ep_cosines(samples[1:2], [0.9999])  # a later file did better there: the worst stays
        assert worst_first(samples) == [2, 1, 0, 3]


@needs_qnn
def test_a_verdict_that_counts_alone_stops_on_the_ep_at_its_first_sample_below_the_bar(tmp_path):
    """A gate nothing reaches (cosine 1.0): the EP's run stops at the first sample with
    misses_at_bar (a baseline no search follows), where it ran every sample before."""
    from ortprep.runtime.budget import timing_step
    from ortprep.steps.quantize.evaluate import evaluate

    model, data = tiny_classifier(tmp_path, count=8)
    invoke("quantize", model, "--static", "--calib", data, "--keep-failed", "-o", tmp_path / "q.onnx")
    quantized = tmp_path / "q.onnx" if (tmp_path / "q.onnx").exists() else tmp_path / "q.failed.onnx"
    target, samples = qnn_target(data), feeds(6)
    runs = []
    for at_bar in (False, True):
        with timing_step() as times:
            judged = evaluate(model, quantized, samples, 1.0, target=target, ep_after_cpu_fails=True,
                              latency_runs=0, misses_at_bar=at_bar)
        assert judged.on_ep is not None and judged.on_ep.passed is False and not judged.passed
        runs.append((times.ep_runs, times.early["miss"], judged.on_ep.spread["samples"]))
    assert runs == [(6, 0, 6), (1, 1, 1)]


# --- end to end -------------------------------------------------------------------------------------

@needs_qnn
def test_quantize_on_qnn_reports_its_time_and_stops_a_clear_pass_early(tmp_path):
    model, data = tiny_classifier(tmp_path)
    result = invoke("quantize", model, "--static", "--ep", "qnn", "--calib", data, "-o", tmp_path / "q.onnx",
                    "--json")
    record = result.json()
    assert result.exit_code == 0 and record["verify"]["judged_on"] == ["cpu", "qnn"]
    timing = record["timing"]
    assert set(timing) >= {"total_s", "quantizer_s", "cpu_eval_s", "ep_s", "fp16_probe_s", "other_s", "ep_runs",
                           "ep_requests", "ep_cached", "ep_skipped_early", "ep_early"}
    parts = timing["quantizer_s"] + timing["cpu_eval_s"] + timing["ep_s"] + timing["other_s"]
    assert 0 < timing["quantizer_s"] < timing["total_s"] and timing["ep_s"] > 0 and timing["cpu_eval_s"] > 0
    assert parts == pytest.approx(timing["total_s"], abs=0.1) and timing["fp16_probe_s"] == 0
    # 8 held-back samples: the baselines pass clearly before the last of them
    assert timing["ep_early"]["pass"] >= 1 and timing["ep_skipped_early"] >= 1
    assert PASS_MIN_SAMPLES <= record["verify"]["ep"]["spread"]["samples"] < 8
    assert timing["ep_runs"] == timing["ep_requests"]
    # one baseline's 8 held-back samples and the result's 24 calibration samples were offered to the
    # EP: the second source's baseline (as given) could not beat the first's and was not run there
    assert timing["ep_runs"] + timing["ep_skipped_early"] + timing["ep_cached"] == 8 + 24


@needs_qnn
def test_candidates_the_cpu_ep_fails_never_reach_the_ep_auto_and_fp16_included(tmp_path):
    """A gate nothing reaches (cosine 1.0 exactly): every --auto precision fails on the CPU EP, and
    so does FP16's probe; none of them is run on the simulator."""
    model, data = tiny_classifier(tmp_path)
    result = invoke("quantize", model, "--static", "--ep", "qnn", "--calib", data, "--auto", "--min-cosine", "1.0",
                    "-o", tmp_path / "q.onnx", "--json")
    record = result.json()
    assert result.exit_code == 1 and record["output"] is None
    tried = record["auto"]["tried"]
    assert len(tried) >= 2 and all(t["judged_on"] == ["cpu"] for t in tried)
    probe = record["auto"]["fp16"]
    assert probe["measured"] and probe["judged_on"] == ["cpu"] and probe["gate_passed"] is False
    timing = record["timing"]
    assert timing["ep_runs"] == 0 and timing["ep_s"] == 0 and timing["fp16_probe_s"] > 0


# --- the step's own bound (--step-seconds) ----------------------------------------------------------

def test_the_step_bound_stops_ep_judgements_that_its_time_left_cannot_hold():
    from ortprep.runtime.budget import (STEP_RESERVE, EpClock, hold_step, step_left, step_spent, timing_step,
                                        without_hold)

    clock = EpClock(None)
    assert clock.starts() and step_left() is None  # outside a step: no bound
    with timing_step(seconds=STEP_RESERVE + 100.0) as times:
        assert 99.0 < step_left() <= 100.0 and clock.left() == pytest.approx(step_left(), abs=0.5)
        assert EpClock(30.0).left() == pytest.approx(30.0)  # --ep-total-seconds, where it is the smaller
        times.sample_seconds = 40.0  # two samples (LEAST_SAMPLES) fit in what is left
        assert clock.starts() and not clock.exhausted
        times.sample_seconds = 60.0  # they do not: refused, by the step's bound
        assert not clock.starts() and (clock.refused, clock.stopped_by) == (1, "--step-seconds")
        assert clock.spent_words("on qnn") == f"the step's own time ({STEP_RESERVE + 100.0:g} s, --step-seconds)"
        hold_step(100.0)  # --auto keeps FP16's probe its time: nothing is left to the attempts
        assert clock.exhausted and step_spent("a later engine") and times.stopped == ["a later engine"]
        with without_hold():  # but a confirmation of a candidate that passed its held-back samples may use it
            assert not clock.exhausted
        assert clock.exhausted
        hold_step(0.0)
        assert not step_spent("FP16's probe")
        times.trial_seconds = 150.0  # a trial as long as the longest so far would not fit
        assert step_spent("the search's later trials", trial=True) and not step_spent("FP16's probe")
    assert times.record()["step_stopped"] == ["a later engine", "the search's later trials"]


@needs_qnn
def test_a_step_whose_own_time_is_spent_ends_with_a_refusal_that_says_so(tmp_path):
    """--step-seconds at its reserve: no judgement fits on the simulator, so no --auto precision can
    pass there, FP16's probe is not measured, and the step ends at once with that verdict."""
    from ortprep.runtime.budget import STEP_RESERVE

    model, data = tiny_classifier(tmp_path)
    result = invoke("quantize", model, "--static", "--ep", "qnn", "--calib", data, "--auto", "--step-seconds",
                    str(STEP_RESERVE + 1), "-o", tmp_path / "q.onnx", "--json")
    record = result.json()
    assert result.exit_code == 1 and record["output"] is None and not (tmp_path / "q.onnx").exists()
    timing = record["timing"]
    assert timing["ep_runs"] == 0 and timing["step_seconds"] == STEP_RESERVE + 1
    assert "FP16's probe" in timing["step_stopped"] and not record["auto"]["fp16"]["measured"]
    # the precisions after the first are not tried, and the first one's second source is not quantized
    tried = record["auto"]["tried"]
    assert len(tried) >= 2 and all(t["error"].startswith("not tried: the step's own time") for t in tried[1:])
    assert "later trials and baselines" in timing["step_stopped"]
    time = record["gate_target"]["time"]
    assert time["refused"] >= 1 and time["stopped_by"] == "--step-seconds"
    messages = [f["message"] for f in record["findings"] if f["code"] == "QNT023"]
    assert messages and "--step-seconds" in messages[0]


def test_the_float_models_run_is_made_once_a_step_for_its_content(tmp_path):
    """--auto's attempts prepare the same float model anew, at paths of their own: its outputs on
    the same samples are run once in the step."""
    from ortprep.runtime.budget import timing_step
    from ortprep.steps.quantize.evaluate import evaluate

    model, data = tiny_classifier(tmp_path, count=8)
    invoke("quantize", model, "--static", "--calib", data, "--keep-failed", "-o", tmp_path / "q.onnx")
    quantized = tmp_path / "q.onnx" if (tmp_path / "q.onnx").exists() else tmp_path / "q.failed.onnx"
    copy = tmp_path / "again" / "m.onnx"
    copy.parent.mkdir()
    shutil.copy(model, copy)
    samples = feeds(4)
    with timing_step() as times:
        first = evaluate(model, quantized, samples, 0.9, {}, latency_runs=0)
        second = evaluate(copy, quantized, samples, 0.9, {}, latency_runs=0)
        assert len(times.float_runs) == 1
        evaluate(copy, quantized, samples[:3], 0.9, {}, latency_runs=0)  # other samples: run
        assert len(times.float_runs) == 2
    assert first.cosine == second.cosine and first.passed == second.passed
