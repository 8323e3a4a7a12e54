"""The trials of quantize's search: quantize with some nodes kept in float (or off the target EP,
or at 16 bits), each into a folder of its own, and evaluate on the held-back samples.

:class:`Trials` runs the quantizer's child and the gate for each; the search's selection logic
(:mod:`.strategy`), its remedies and its moves all go through it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import onnx

from ortprep.options import QuantizeOptions
from ortprep.runtime.budget import step_left, step_spent, step_times, timed
from ortprep.steps.base import ProgressCallback
from ortprep.steps.quantize.calibrate import DataPlan
from ortprep.steps.quantize.engines import Engine, EngineRun, Exclusion, engine
from ortprep.steps.quantize.ep_gate import GateTarget
from ortprep.steps.quantize.evaluate import LATENCY_RUNS, evaluate
from ortprep.fidelity.evaluation import Evaluation, outputs_margin_gap
from ortprep.steps.quantize.off_target import move_off_ep
from ortprep.steps.quantize.trials import FLOAT_MODEL, PREPROCESS_MARGIN, Trial
from ortprep.transforms.qdq.encodings import floor_weight_scales, fp16_activation_matmuls, widen_activation_encodings
from ortprep.transforms.qdq.saturation import cut_to_readers
from ortprep.transforms.qdq.facts import quantization_stats
from ortprep.transforms.verify import model_bytes

# An engine call other than ORT's own quantizer gets twice --search-seconds, and at least this long:
# a crash or a hang is then a failed candidate, not a step that never ends (ORT's keeps its own deadline)
ENGINE_MIN_SECONDS = 120.0
ENGINE_LEAST_SECONDS = 30.0  # what the step's own bound leaves an engine call at least
STEP_SPENT = "not run: the step's own time (--step-seconds) was spent"  # a trial's error


def margin_samples(plan: DataPlan) -> list:
    """The calibration samples (real data only: seeded noise says nothing of where real decisions
    sit), for the float model's margins in the expected agreement; at most MARGIN_SAMPLES of them
    and about MARGIN_BYTES."""
    calibration = plan.calibration
    samples: list = []
    if calibration is not None and calibration.kind != "random" and plan.calib_indices:
        from ortprep.steps.quantize.evaluate import MARGIN_BYTES, MARGIN_SAMPLES

        held = 0
        for sample in calibration.samples(plan.calib_indices[:MARGIN_SAMPLES]):
            held += sum(v.nbytes for v in sample.values())
            if held > MARGIN_BYTES and samples:
                break
            samples.append(sample)
    return samples


class Trials:
    """Quantize with some nodes kept in float, into a folder of its own, and evaluate."""

    def __init__(self, workdir: Path, options: QuantizeOptions, settings: dict, plan: DataPlan, eval_feeds: list,
                 big: bool, bounds: dict, progress: ProgressCallback | None, target: GateTarget | None = None,
                 spare_failing_baseline: bool = False, earlier: tuple[int, int] = (0, 0)) -> None:
        """``earlier``: (failed, judged) trials of --auto's earlier attempts on the same held-back
        samples (a later precision kept is chosen after them: held_to_margin)."""
        self.workdir, self.options, self.settings, self.plan = workdir, options, settings, plan
        self.target = target  # where the gate is judged besides the CPU EP
        self.eval_feeds, self.big, self.bounds, self.progress = eval_feeds, big, bounds, progress
        self.count = 0
        # trials judged on the held-back samples, and of those the ones that failed the gate there (an
        # evaluation that errored is not a verdict on them); a result kept after one failed was
        # chosen by those samples (held_to_margin)
        self.failed, self.judged = earlier
        self.failed_before: dict[Path, int] = {}  # a trial's model -> the trials that failed before it was judged
        self.fixed: list[str] = list(options.exclude_nodes)  # kept float in every trial
        self.off: list[str] = []  # kept off the target EP in every trial (keep_off_ep_move)
        self.evaluations: dict[Path, Evaluation] = {}
        self.caches: dict[Path, dict] = {}
        self.failure: str | None = None
        # a trial's model -> the graph outputs whose 16-bit encoding was widened
        self.widened: dict[Path, list[str]] = {}
        self.widened_count: dict[Path, int] = {}  # a trial's model -> how many activations' 16-bit encodings were
        self.floored: dict[Path, list[dict]] = {}  # a trial's model -> weights whose scales were raised for QNN's HTP
        # a trial's model -> activations whose encodings were cut to their readers' knees (qdq.saturation)
        self.cut: dict[Path, list[str]] = {}
        self.fp16_matmuls: dict[Path, list[str]] = {}  # a trial's model -> MatMuls of two 16-bit activations, in FP16
        self._margin_feeds: list | None = None
        self.started = time.monotonic()  # the search's time bound counts from here (the step's first trial)
        # The target EP runs the baselines (both sides reported, where they part
        # named; not an --auto attempt's that the CPU EP fails while later precisions remain), then
        # a trial only once the CPU EP passes it, until a trial passes on the CPU EP
        # and fails on the EP: from then on every trial runs there too (the EP's own error is what
        # the search works on). A trial failing on the CPU EP fails the gate either way.
        self.ep_in_loop = False
        self.sources: dict = {}  # each result's float model (its trial's source)
        # An --auto attempt with later precisions to try: its baseline runs on the EP only where the
        # CPU EP passes it. A baseline that fails there cannot pass, and on a slow EP its run costs what
        # a later precision's trials need (docs/decisions/reduce-quantize-search.md).
        self.spare_failing_baseline = spare_failing_baseline
        # the engine every trial quantizes with (outcome.choose_engine may change it after the baselines)
        self.engine: Engine = engine("ort" if options.engine_name() == "auto" else options.engine_name())
        self.engine_runs: dict[Path, EngineRun] = {}  # a trial's model -> its engine call
        self.engine_seconds: float = 0.0  # every engine call of the step, together
        self.last_run: EngineRun | None = None
        self.first_baseline: Evaluation | None = None  # the first source's baseline (_spared)
        self.spare_later_sources = True  # False while an engine's candidate is judged (choose.py)

    def _spared(self, cpu) -> str | None:
        """A later source's baseline that cannot be chosen over the first one whatever the target EP
        says (outcome.quantize_and_search: it must beat a passing first by PREPROCESS_MARGIN, and
        the EP only lowers it) is not run there (docs/decisions/speed-ep-verdict.md)."""
        first = self.first_baseline
        if (not self.spare_later_sources or first is None or not first.passed or first.gate_cosine is None
                or cpu.cosine is None or cpu.cosine > first.gate_cosine + PREPROCESS_MARGIN):
            return None
        return "not needed: the first source's baseline passes, and this one's cosine cannot beat it"

    def counts(self) -> dict:
        """The trials judged on the held-back samples and those that failed there (verify.trials)."""
        return {"judged": self.judged, "failed": self.failed}

    def held_to_margin(self, trial: Trial) -> bool:
        """Whether ``trial``, kept, was chosen by the held-back samples: judged after another trial
        failed there (this step's, or an earlier --auto attempt's). Such a result holds the decision
        margin (evaluate.hold_to_margin); one whose baseline passes was not chosen, and is not."""
        return trial.path is not None and self.failed_before.get(trial.path, 0) > 0

    def margin_feeds(self) -> list:
        """The calibration samples for the float model's margins (margin_samples), read once."""
        if self._margin_feeds is None:
            self._margin_feeds = margin_samples(self.plan)
        return self._margin_feeds

    def attempt(self, source: Path, kept: list[str], label: str, off: list[str] | None = None,
                wide: list[str] | None = None, *, baseline: bool = False) -> Trial:
        """``wide``: activations given 16 bits (Search.widen); ``baseline``: the step's first
        trial on a source (judged on the target EP and timed; never taken for the float model)."""
        trial = self._attempt(source, kept, label, off, list(wide or []), baseline)
        trial.wide = list(wide or [])
        return trial

    def _attempt(self, source: Path, kept: list[str], label: str, off: list[str] | None, wide: list[str],
                 baseline: bool) -> Trial:
        started = time.monotonic()
        try:
            return self._quantize_and_judge(source, kept, label, off, wide, baseline)
        finally:
            times = step_times()
            if times is not None:  # the next trial's cost, for --step-seconds (budget.step_spent)
                times.trial_seconds = max(times.trial_seconds, time.monotonic() - started)

    def _quantize_and_judge(self, source: Path, kept: list[str], label: str, off: list[str] | None, wide: list[str],
                            baseline: bool) -> Trial:
        off = list(self.off if off is None else off)
        if self.count > 0 and step_spent("later trials and baselines", trial=True):
            # the attempt's first trial always runs (its verdict is the attempt's); no later one starts
            # once --step-seconds is spent: a trial not judged cannot pass, and its time is the verdict's
            self.count += 1
            return Trial(label, list(kept), None, False, 0, None, STEP_SPENT, off=off)
        self.count += 1
        folder = self.workdir / f"trial{self.count}"
        folder.mkdir()
        output = folder / "quantized.onnx"
        timeout = max(ENGINE_MIN_SECONDS, 2 * self.options.search_seconds)
        left = step_left()  # and within the step's own bound (--step-seconds; ORT's quantizer keeps its own)
        if left is not None:
            timeout = min(timeout, max(ENGINE_LEAST_SECONDS, left))
        with timed("quantizer"):
            run = self.engine.quantize(self.workdir, source, output, self.options.mode, self.settings,
                                       self.plan.calibration, self.plan.calib_indices,
                                       Exclusion(tuple(kept), tuple(self.options.exclude_ops), tuple(wide)), self.big,
                                       self.progress, timeout=timeout)
        self.engine_seconds += run.seconds
        self.engine_runs[output] = self.last_run = run
        ok, error = run.ok, run.error or ""
        if not ok:
            self.failure = self.failure or error
            return Trial(label, list(kept), None, False, 0, None, error, off=off)
        if self.options.mode == "static" and self.settings["activation_type"] in ("uint16", "int16"):
            # headroom for inputs past the calibration samples' range, inside the model as at its
            # outputs (qdq.encodings.widen_activation_encodings)
            tensors, outputs = widen_activation_encodings(output, float_model=source)
            self.widened[output] = outputs
            self.widened_count[output] = len(tensors)
        if self.options.mode == "static":
            # after the widening (which would spend steps past a HardSwish's -3 again), before the
            # floor (which reads the output scales this narrows)
            symmetric = bool((self.settings.get("extra_options") or {}).get("ActivationSymmetric"))
            self.cut[output] = cut_to_readers(output, symmetric=symmetric)
        if self.options.mode == "static" and self.settings.get("preset") == "qnn":
            # after the widening: it changes the output scales the multipliers divide by (eps.htp.HTP_MIN_MULTIPLIER)
            self.floored[output] = floor_weight_scales(output)
            if self.settings["activation_type"] in ("uint16", "int16"):
                # the HTP's 16-bit MatMul of two activations is far less precise than FP16 (eps/htp.py)
                self.fp16_matmuls[output] = fp16_activation_matmuls(output)
        if off:
            error = move_off_ep(output, off)
            if error is not None:
                return Trial(label, list(kept), None, False, 0, None, error, off=off)
        if (not baseline and set(kept) - set(self.fixed)
                and quantization_stats(onnx.load(str(output), load_external_data=False))["quantized_ops"] == 0):
            # a search trial whose kept nodes leave nothing quantized is the float model: it passes
            # trivially, and a search that took it would end at "nothing was quantized" instead of at
            # its verdict; not evaluated (no EP time), no figure: neither a pass nor progress
            return Trial(label, list(kept), None, False, model_bytes(output), output, FLOAT_MODEL, off=off)
        return self.judge(source, output, label, kept, off, baseline=baseline)

    def edited(self, base: Trial, edit: Callable[[onnx.ModelProto], None]) -> Path:
        """A copy of ``base``'s file with its graph edited (no weights read: the copy sits beside
        it, so its external data resolves); ``judge`` evaluates it as a trial."""
        output = base.path.with_name(base.path.stem + f".variant{self.count}.onnx")
        self.count += 1
        graph = onnx.load(str(base.path), load_external_data=False)
        edit(graph)
        onnx.save(graph, str(output))
        return output

    def judge(self, source: Path, output: Path, label: str, kept: list[str], off: list[str], *,
              baseline: bool = False) -> Trial:
        """Evaluate ``output`` (quantized from ``source``) on the held-back samples."""
        evaluation = None
        if self.target is not None:
            self.target.candidate = label  # the progress bar's name for the EP's runs
        if self.eval_feeds:
            if self.progress is not None:
                self.progress("evaluating", 0, 1)
            evaluation = evaluate(source, output, self.eval_feeds, self.options.min_cosine,
                                  self.caches.setdefault(source, {}), self.bounds, self.target, self.options.metrics,
                                  self.margin_feeds, ep_after_cpu_fails=False,
                                  latency_runs=LATENCY_RUNS if baseline else 0,
                                  confirm_feeds=self.margin_feeds, ep_spared=self._spared if baseline else None,
                                  # a baseline no search follows: only its verdict counts, and one sample
                                  # below the bar on the EP settles it (docs/decisions/speed-ep-verdict.md)
                                  misses_at_bar=baseline and not self.options.auto_exclude)
            if baseline and self.first_baseline is None:
                self.first_baseline = evaluation
            self.ep_in_loop = self.ep_in_loop or evaluation.ep_only
            self.failed_before[output] = self.failed
            self.judged += 1
            on_ep = evaluation.on_ep
            if evaluation.error is None and (on_ep is None or on_ep.error is None) and not evaluation.passed:
                self.failed += 1
            if self.progress is not None:
                self.progress("evaluating", 1, 1)
            self.evaluations[output] = evaluation
            self.sources[output] = source  # the float model it was compared (and is timed) with
        if evaluation is None:
            return Trial(label, list(kept), None, True, model_bytes(output), output, off=off)
        on_ep = evaluation.on_ep
        error = evaluation.error or (f"on {on_ep.ep}: {on_ep.error}" if on_ep is not None and on_ep.error else None)
        cpu = {"ep": "cpu", "cosine": evaluation.cosine, "norm_ratio": evaluation.norm_ratio,
               "passed": evaluation.cpu_verdict,
               "margin_gap": None if evaluation.error is not None else outputs_margin_gap(evaluation.outputs),
               "outputs": [{"name": o["name"], "cosine": o["cosine"], "norm_ratio": o.get("norm_ratio")}
                           for o in evaluation.outputs[:16]], "error": evaluation.error}
        sides = {"judged_on": evaluation.judged_on, "cpu": cpu, "ep": on_ep.summary() if on_ep is not None else None}
        return Trial(label, list(kept), evaluation.gate_cosine, evaluation.passed, model_bytes(output), output, error,
                     norm_ratio=evaluation.gate_norm_ratio, sides=sides, shortfall=evaluation.shortfall, off=off,
                     margin_gap=evaluation.margin_gap)
