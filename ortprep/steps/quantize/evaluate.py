"""Quantize's evaluation: the float and the quantized model run on the same samples, on the CPU EP
and, where it runs here, on the target EP (ep_gate.py), and ortprep.fidelity judges the outputs
(judge_quantized; the EP's run also against the CPU EP's run of the same model: ep_apart); the
gate holds on the held-back samples, then with the calibration samples (confirm). Latency is timed
in turns. Every model run of quantize's gate starts here, in a child process."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.fidelity.decisions import Decision, infer_decisions
from ortprep.fidelity.ep_match import first_apart, judge_ep_samples
from ortprep.fidelity.evaluation import CONFIRM_EP_SAMPLES, Confirmation, Evaluation, Judgement
from ortprep.fidelity.gate import EXACT_GATE, VerifyResult, judge_run
from ortprep.fidelity.quantized import Degenerate, flat_outputs, judge_quantized
from ortprep.runtime.budget import float_run, timed, without_hold
from ortprep.runtime.isolated import RunOutcome, run_isolated, time_isolated
from ortprep.runtime.tolerance import computes_tf32
from ortprep.steps.quantize.ep_early import early_rule, note_ep_cosines, worst_first
from ortprep.steps.quantize.trials import margin_aim
from ortprep.transforms.verify import run_model

if TYPE_CHECKING:
    from ortprep.steps.quantize.ep_gate import GateTarget

LATENCY_RUNS = 10


def _run_model(model: Path, feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]]) -> RunOutcome:
    """Run ``model`` on ``feeds`` in a child process (untimed: paired_latency times)."""
    with timed("cpu"):
        return run_isolated(model, feeds)


def _float_run(model: Path, feeds: list[dict[str, np.ndarray]], outputs: list[str] | None = None) -> RunOutcome:
    """The float model's run on ``feeds`` on the CPU EP, once per step for a file's content
    (budget.float_run: --auto's attempts prepare the same source anew each)."""
    with timed("cpu"):
        return float_run(model, feeds, outputs, lambda: run_isolated(model, feeds, outputs=outputs))


def opset_upgrade_verified(original: ModelProto, upgraded: ModelProto, feeds: dict[str, np.ndarray]) -> VerifyResult:
    """Whether ``upgraded`` (an opset conversion of ``original``) computes the same outputs on
    ``feeds``: both run in child processes (ortprep.transforms.verify), judged by the exact gate."""
    return judge_run(run_model(original, feeds), run_model(upgraded, feeds), EXACT_GATE)


# The float model's outputs kept for margins: at most this many samples, and this many bytes.
MARGIN_SAMPLES, MARGIN_BYTES = 64, 128 * 2**20


def margin_outputs(
    float_model: Path,
    feeds: Callable[[], list[dict[str, np.ndarray]]] | None,
    decisions: dict[str, Decision],
    reference: list[dict[str, np.ndarray]],
) -> list[dict[str, np.ndarray]]:
    """The float model's decided outputs on the samples ``feeds()`` reads (capped at MARGIN_SAMPLES
    and MARGIN_BYTES), for their margins; nothing when no output has a gated decision (then no
    sample is read) or the run fails."""
    names = [name for name, d in decisions.items() if d.gated and d.reads_margins]
    if feeds is None or not names or not reference:
        return []
    feeds = feeds()
    if not feeds:
        return []
    per_sample = sum(np.asarray(reference[0][name]).nbytes for name in names if name in reference[0])
    count = min(len(feeds), MARGIN_SAMPLES, max(1, MARGIN_BYTES // max(per_sample, 1)))
    run = _float_run(float_model, feeds[:count], outputs=names)
    if not run.ok:
        return []
    return [{name: sample[name] for name in names if name in sample} for sample in run.samples]


def paired_latency(float_model: Path, quant_model: Path, feed: dict[str, np.ndarray]) -> tuple[float, float] | None:
    """(float ms, quantized ms): the medians of 2 x LATENCY_RUNS runs of each, timed in turns of
    one run (float, quantized, then quantized, float, ...) in one worker, so that both meet the same
    load (TimeModels), each in a session that exposes nothing more (why in turns:
    docs/decisions/fidelity-quantize-gate.md). None where a run fails."""
    medians = timed_medians([float_model, quant_model], feed)
    return None if medians is None else (medians[0], medians[1])


def timed_medians(models: list[Path], feed: dict[str, np.ndarray]) -> list[float] | None:
    """Each model's median time (ms) over 2 x LATENCY_RUNS runs, one run of each in turn in one
    worker (TimeModels); None where a run fails."""
    with timed("cpu"):
        times = time_isolated(models, feed, runs=2 * LATENCY_RUNS)
    return None if times is None else [statistics.median(t) for t in times]


def measure_latency(
    evaluation: Evaluation, float_model: Path, quant_model: Path, feeds: list[dict[str, np.ndarray]]
) -> None:
    """Time ``quant_model`` against the float model (paired_latency) where its evaluation did not,
    and set the evaluation's latency figures."""
    if evaluation.quant_latency_ms is not None or not feeds:
        return
    paired = paired_latency(float_model, quant_model, feeds[0])
    if paired is not None:
        evaluation.float_latency_ms, evaluation.quant_latency_ms = paired
        evaluation.latency_ratio = round(paired[1] / paired[0], 3) if paired[0] else None


def evaluate(
    float_model: Path,
    quant_model: Path,
    feeds: list[dict[str, np.ndarray]],
    min_cosine: float,
    cache: dict[str, RunOutcome] | None = None,
    bounds: dict | None = None,
    target: GateTarget | None = None,
    metrics: dict[str, str] | None = None,
    margin_feeds: Callable[[], list[dict[str, np.ndarray]]] | None = None,
    ep_after_cpu_fails: bool = True,
    latency_runs: int = LATENCY_RUNS,
    confirm_feeds: Callable[[], list[dict[str, np.ndarray]]] | None = None,
    ep_spared: Callable[[Judgement], str | None] | None = None,
    early_misses: bool = False,
    misses_at_bar: bool = False,
) -> Evaluation:
    """Run both models on ``feeds`` on the CPU EP and compare; where ``target`` judges on its EP,
    run the quantized model there too and compare its outputs with the float model's on the CPU
    EP. The gate holds on the worse of the two. ``cache`` keeps the float model's run between
    trials (only the quantized model changes). An output that the samples leave flat (constant,
    near zero) is judged by absolute error against its range or scale, not by cosine.
    ``margin_feeds``: reads more samples (the calibration samples) the float model runs on once, so that
    its decisions' margins on them join the expected agreement (fidelity/decisions/).
    ``ep_after_cpu_fails`` False: where the CPU EP already fails the gate, the target EP is not run
    (the gate holds on both, so it cannot pass; a search's trials save the EP's time).
    ``latency_runs`` 0: the quantized model's latency is not timed (a search trial; the result
    chosen is timed afterwards: measure_latency).
    ``confirm_feeds``: reads the samples the model was calibrated on; where the held-back samples
    pass on every side judged, the same gate is held on these too, on the CPU EP (:func:`confirm`;
    the target EP's side waits for the result a search chooses: :func:`confirm_on_target`), and
    failing there fails the evaluation.
    ``ep_spared(cpu)``: why the EP's run cannot change what the caller does with this candidate
    (None: run it), said in ``ep_skipped``. The EP's run stops where its first samples pass
    clearly (by the search's margin: ep_early.py), and with ``early_misses`` (nothing compares this
    evaluation's figures with another's) where they miss clearly; with ``misses_at_bar`` (nothing
    but its verdict counts: a baseline no search follows) where one sample misses the bar, the
    samples the EP did worst on in this step run first (ep_early.worst_first)."""
    cache = {} if cache is None else cache
    if "evaluation" not in cache:
        cache["evaluation"] = _float_run(float_model, feeds)  # timed with the candidate (paired_latency)
    reference = cache["evaluation"]
    candidate = _run_model(quant_model, feeds)  # timed below, in turns with the float model
    record = target.record() if target is not None else None
    if not reference.ok or not candidate.ok:
        which = "float" if not reference.ok else "quantized"
        message = reference.message if not reference.ok else candidate.message
        return Evaluation(None, None, None, None, None, None, False, error=f"the {which} model failed: {message}",
                          target=record, min_cosine=min_cosine)
    flat = flat_outputs(reference.samples, bounds)
    cache["flat"], cache["feeds"], cache["metrics"] = flat, feeds, metrics  # for confirm_on_target
    cache["held_back_cpu"] = (str(quant_model), candidate.samples)
    if "decisions" not in cache:  # what the application reads from each output (--metric overrides)
        graph = onnx.load(str(float_model), load_external_data=False)
        cache["decisions"] = infer_decisions(graph, reference.samples, metrics)
    decisions = cache["decisions"]
    if "margins" not in cache:
        cache["margins"] = margin_outputs(float_model, margin_feeds, decisions, reference.samples)
    more = cache["margins"]
    cpu = judge_quantized("cpu", reference.samples, candidate.samples, min_cosine, flat, decisions, more)
    on_ep = None
    ep_skipped = None
    spared = ep_spared(cpu) if ep_spared is not None and target is not None and target.judged else None
    if target is not None and target.judged and not cpu.passed and not ep_after_cpu_fails:
        ep_skipped = "the CPU EP already fails the gate"
    elif spared is not None:
        ep_skipped = spared
    elif target is not None and target.judged:
        # the EP's first samples may decide its verdict (ep_early.py): the rest are then not run
        order = worst_first(feeds) if misses_at_bar else list(range(len(feeds)))
        refs, cands = [reference.samples[i] for i in order], [candidate.samples[i] for i in order]
        early = early_rule(refs, cands, min_cosine, flat, decisions, cpu.passed,
                           apart=lambda ep: ep_apart(quant_model, target.ep, cands[:len(ep)], ep, metrics,
                                                     target.provider_options), more=more,
                           misses=early_misses or misses_at_bar, pass_bar=margin_aim(min_cosine),
                           miss_line=min_cosine if misses_at_bar else None,
                           tolerances=lambda ep: ep_tolerances(quant_model, target, cands[0], ep[0], metrics))
        run = target.run(quant_model, [feeds[i] for i in order], early=early)
        placement = {"nodes_total": run.nodes_total, "nodes_on_ep": run.nodes_on_ep} if run.nodes_total else None
        in_order = run.ok and len(run.samples) == len(feeds)
        if in_order:  # every sample ran: back in the samples' own order
            run.samples = [run.samples[order.index(i)] for i in range(len(feeds))]
            refs, cands = reference.samples, candidate.samples
        if run.ok:
            # (the first samples, where --ep-seconds left some out: run.limited)
            on_ep = judge_quantized(target.ep, refs[: len(run.samples)], run.samples, min_cosine, flat, decisions, more)
            note_ep_cosines([feeds[i] for i in (range(len(feeds)) if in_order else order)], on_ep.sample_cosines)
            on_ep.placement, on_ep.limited, on_ep.early = placement, run.limited, run.early
            # apart is said wherever both runs are there, so that null means "within load's rule" (an
            # EP whose output is all zeros failed the gate, and apart was null as if it agreed); it
            # decides the EP's side only where both sides pass the gate
            on_ep.apart = ep_apart(quant_model, target.ep, cands, run.samples, metrics, target.provider_options)
            if on_ep.passed and cpu.passed:
                on_ep.passed = on_ep.apart is None
            # for confirm_on_target (the latest trial's only; the held-back samples' first ones)
            cache["ep_held_back"] = (str(quant_model), run.samples) if in_order or order == sorted(order) else None
        else:
            on_ep = Judgement(target.ep, None, None, None, None, False, error=run.message, placement=placement)
    confirmation = None
    if confirm_feeds is not None and cpu.passed and (on_ep is None or on_ep.passed):
        confirmation = confirm(float_model, quant_model, confirm_feeds, min_cosine, cache, flat, decisions,
                               reference.samples, candidate.samples)
    float_ms = quant_ms = None
    passed = cpu.passed and (on_ep is None or on_ep.passed) and (confirmation is None or confirmation.passed)
    # a candidate a target EP judged and refused is not timed on this CPU: nothing chooses by it there
    # (the result an attempt ends with is timed after its search: measure_latency)
    timed_here = passed or target is None or not target.judged
    if latency_runs and feeds and timed_here:
        # both in turns, in the same minute (the reference run above is not timed)
        paired = paired_latency(float_model, quant_model, feeds[0])
        if paired is not None:
            float_ms, quant_ms = paired
    return Evaluation(
        cosine=cpu.cosine,
        max_abs_diff=cpu.max_abs_diff,
        top1_agreement=cpu.top1_agreement,
        latency_ratio=round(quant_ms / float_ms, 3) if float_ms and quant_ms else None,
        float_latency_ms=float_ms,
        quant_latency_ms=quant_ms,
        passed=passed,
        outputs=cpu.outputs,
        spread=cpu.spread,
        degenerate=[(name, found.what) for name, found in flat.items()],
        sample_cosines=cpu.sample_cosines,
        norm_ratio=cpu.norm_ratio,
        cpu_passed=cpu.passed,
        on_ep=on_ep,
        target=record,
        min_cosine=min_cosine,
        ep_skipped=ep_skipped,
        confirmation=confirmation,
    )


def confirm_on_target(evaluation: Evaluation, quant_model: Path,
                      feeds: Callable[[], list[dict[str, np.ndarray]]], target: GateTarget, cache: dict) -> None:
    """The confirmation's side on the target EP, for a result whose held-back samples pass on every
    side and whose calibration samples pass with them on the CPU EP (a search's trials judge
    those; the EP's runs of the calibration samples wait for the result chosen: on QNN's HTP
    simulator they take seconds a sample). Sets ``evaluation.confirmation.on_ep`` and, where it
    fails, the verdict."""
    confirmation = evaluation.confirmation
    if (confirmation is None or not confirmation.passed or confirmation.on_ep is not None or evaluation.on_ep is None
            or not evaluation.passed):
        return
    reference, held_back = cache.get("confirmation"), cache.get("evaluation")
    held_on_ep = cache.get("ep_held_back")
    samples = feeds()
    if not samples or reference is None or not reference.ok or held_back is None or not held_back.ok:
        return
    if held_on_ep is None or held_on_ep[0] != str(quant_model):  # a later trial ran on the EP since
        run = target.run(quant_model, cache["feeds"])
        if not run.ok:
            return
        held_on_ep = (str(quant_model), run.samples)
    count = min(len(samples), CONFIRM_EP_SAMPLES)
    held = held_on_ep[1]  # each side's first samples where --ep-seconds left some out
    with without_hold():  # it passed the held-back samples everywhere: FP16's probe's time is its (--step-seconds)
        run = target.run(quant_model, samples[:count], early=_confirmation_rule(quant_model, target, cache, held,
                                                                                count, evaluation.min_cosine or 0.99))
    confirmation.on_ep = (
        judge_quantized(
            target.ep,
            held_back.samples[: len(held)] + reference.samples[: len(run.samples)],
            held + run.samples,
            evaluation.min_cosine or 0.99,
            cache.get("flat", {}),
            cache.get("decisions", {}),
        )
        if run.ok
        else Judgement(target.ep, None, None, None, None, False, error=run.message)
    )
    if run.ok and run.limited:
        confirmation.on_ep.limited = run.limited
    # and, as on the held-back samples, computed as the CPU EP computes the same model (compile --eval
    # judges these very samples by that rule)
    on_cpu, calib_cpu = cache.get("held_back_cpu"), cache.get("confirmation_cpu")
    if (run.ok and confirmation.on_ep.passed and on_cpu is not None and calib_cpu is not None
            and on_cpu[0] == calib_cpu[0] == str(quant_model)):
        confirmation.on_ep.apart = ep_apart(
            quant_model,
            target.ep,
            on_cpu[1][: len(held)] + calib_cpu[1][: len(run.samples)],
            held + run.samples,
            cache.get("metrics"),
            target.provider_options,
        )
        confirmation.on_ep.passed = confirmation.on_ep.apart is None
    evaluation.passed = evaluation.passed and confirmation.on_ep.passed


def _confirmation_rule(quant_model: Path, target: GateTarget, cache: dict, held: list, count: int,
                       min_cosine: float) -> Callable[[list], str | None] | None:
    """The early rule (ep_early.py) for the EP's run of the calibration samples, judged together
    with the held-back ones the EP ran, as :func:`confirm_on_target` judges them; None where the
    CPU EP's run of this model on them is not at hand."""
    on_cpu, calib_cpu = cache.get("held_back_cpu"), cache.get("confirmation_cpu")
    reference, held_back = cache.get("confirmation"), cache.get("evaluation")
    if (on_cpu is None or calib_cpu is None or on_cpu[0] != str(quant_model) or calib_cpu[0] != str(quant_model)
            or reference is None or held_back is None):
        return None
    floats = held_back.samples[:len(held)] + reference.samples[:count]
    cpus = on_cpu[1][:len(held)] + calib_cpu[1][:count]
    metrics = cache.get("metrics")
    rule = early_rule(floats, cpus, min_cosine, cache.get("flat", {}), cache.get("decisions", {}), True,
                      pass_bar=margin_aim(min_cosine),
                      apart=lambda ep: ep_apart(quant_model, target.ep, cpus[:len(ep)], ep, metrics,
                                                target.provider_options),
                      tolerances=lambda ep: ep_tolerances(quant_model, target, cpus[0], ep[0], metrics))
    return lambda ep: rule(list(held) + list(ep))


def confirm(float_model: Path, quant_model: Path, feeds: Callable[[], list[dict[str, np.ndarray]]], min_cosine: float,
            cache: dict, flat: dict[str, Degenerate], decisions: dict[str, Decision],
            held_back: list[dict[str, np.ndarray]], held_back_cpu: list[dict[str, np.ndarray]]) -> Confirmation | None:
    """The gate (:func:`judge_quantized`) over the held-back samples (``held_back``: the float model's
    outputs; ``held_back_cpu``: the quantized model's) and the calibration samples ``feeds()``
    reads, together, on the CPU EP (the EP's side: :func:`confirm_on_target`).
    The float model's run on the calibration samples is kept in ``cache`` between trials. None
    when there are no such samples or the float model does not run on them."""
    samples = feeds()
    if not samples:
        return None
    if "confirmation" not in cache:
        cache["confirmation"] = _float_run(float_model, samples)
    reference = cache["confirmation"]
    if not reference.ok:
        return None
    candidate = _run_model(quant_model, samples)
    if not candidate.ok:
        return Confirmation(len(samples), Judgement("cpu", None, None, None, None, False, error=candidate.message),
                            held_back=len(held_back))
    cpu = judge_quantized(
        "cpu", held_back + reference.samples, held_back_cpu + candidate.samples, min_cosine, flat, decisions
    )
    cache["confirmation_cpu"] = (str(quant_model), candidate.samples)  # for confirm_on_target's ep_apart
    return Confirmation(len(samples), cpu, held_back=len(held_back))


def ep_apart(model: Path, ep: str, on_cpu: list[dict[str, np.ndarray]], on_ep: list[dict[str, np.ndarray]],
             metrics: dict[str, str] | None = None, provider_options: dict[str, str] | None = None) -> dict | None:
    """The EP's outputs of ``model`` held to the rule load and compile hold them to
    (fidelity.ep_match.judge_ep_samples: the same decisions pooled over the samples, as compile
    --eval pools them), sample by sample: the first output beyond it, or None. Close to the float
    model is not enough: an EP can pass the gate against the float model while it computes the
    quantized model otherwise than the CPU EP does (docs/decisions/fidelity-quantize-gate.md)."""
    proto = onnx.load(str(model), load_external_data=False)
    count = min(len(on_cpu), len(on_ep))
    judged, _ = judge_ep_samples(proto, ep, on_cpu[:count], [{k: np.asarray(v) for k, v in s.items()}
                                                            for s in on_ep[:count]],
                                 metrics, computes_tf32(ep, provider_options))
    return first_apart(judged, on_cpu, metrics)


def ep_tolerances(model: Path, target: GateTarget, on_cpu: dict[str, np.ndarray], on_ep: dict[str, np.ndarray],
                  metrics: dict[str, str] | None) -> dict[str, float]:
    """Load's elementwise tolerance for each output of ``model`` on the target EP (judge_ep_outputs
    on one sample), for the early rule's bound on the samples left."""
    from ortprep.fidelity.ep_match import judge_ep_outputs

    proto = onnx.load(str(model), load_external_data=False)
    judged = judge_ep_outputs(proto, target.ep, on_cpu, {k: np.asarray(v) for k, v in on_ep.items()}, metrics,
                              computes_tf32(target.ep, target.provider_options))
    return {o["name"]: float(o["tolerance"]) for o in judged if o.get("tolerance") is not None}


def measure_on_target(evaluation: Evaluation, target: GateTarget, float_model: Path, quant_model: Path,
                      feeds: list[dict[str, np.ndarray]]) -> None:
    """Time the float and the quantized model on the target EP, where its time is the device's
    (``target.timed``: not the CPU EP, not a simulator), and set ``evaluation.ep_latency``: the
    CPU's time says nothing of a GPU's (docs/decisions/fidelity-quantize-gate.md)."""
    if not feeds or not target.timed:  # (the CPU EP as the target is never judged as an EP: not timed)
        return
    float_ms = target.latency(float_model, feeds[0], LATENCY_RUNS)
    quant_ms = target.latency(quant_model, feeds[0], LATENCY_RUNS)
    if float_ms and quant_ms:
        f, q = statistics.median(float_ms), statistics.median(quant_ms)
        evaluation.ep_latency = {"ep": target.ep, "float_ms": round(f, 4), "quant_ms": round(q, 4),
                                 "ratio": round(q / f, 3) if f > 0 else None}


def target_latency_ratio(verify: dict) -> float | None:
    """The latency ratio that counts: the target EP's where it was timed, else this CPU's."""
    timed = verify.get("ep_latency") or {}
    return timed.get("ratio") if timed else verify.get("latency_ratio")
