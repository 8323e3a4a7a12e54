"""Where quantize's accuracy gate is judged: always on the CPU EP, and also on the target EP where
that EP runs here (in this environment, or under another environment's Python named by
--runtime EP=PYTHON), in the session a user's application creates for it: the EP's options, the
device (QNN: the SoC), CPU fallback allowed.

The CPU EP's run of a QDQ model is not what the EP computes: an EP fuses the Q/DQ pairs into its
own integer kernels, imposes its own encodings (QNN's 16-bit Sigmoid), and computes what stays
float in its own precision (QNN's HTP: float16). So the gate holds on the worse of the two.

Decided once, before any work: ``on_ep`` None judges on the EP where it runs (and says so where
it does not), True requires it (a missing EP stops the step with exit 3, before calibration),
False judges on the CPU EP only (--gate-on-cpu).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ortprep.eps.devices import Device
from ortprep.eps.registry import resolve_ep
from ortprep.errors import EnvironmentMissingError
from ortprep.findings import Finding, Severity
from ortprep.options import QuantizeOptions
from ortprep.prove.reduction import Budget
from ortprep.report import StepResult
from ortprep.runtime.budget import (LEAST_SAMPLES, EpClock, feed_key, model_key, samples_within, step_times,
                                    timed)
from ortprep.runtime.requests import RunOnEp
from ortprep.runtime.targets import EpRuntime, ep_runtime, session_options, simulated, target_device
from ortprep.runtime.worker import call, workers_scope

EP_TIMEOUT = 1800.0  # one model on every held-back sample, on a simulator (QNN's HTP on x86) too


@dataclass
class EpRun:
    """The quantized model's outputs on the target EP, per sample (or why there are none)."""

    ok: bool
    message: str = ""
    samples: list[dict[str, np.ndarray]] = field(default_factory=list)
    nodes_total: int | None = None
    nodes_on_ep: int | None = None
    # where the time bound left samples out: {"samples", "offered", "seconds_per_run", "ep", "bound"}
    limited: dict[str, Any] | None = None
    run_seconds: float | None = None
    # where the first samples decided the verdict (ep_early.py): {"verdict", "samples", "offered"}
    early: dict[str, Any] | None = None


@dataclass
class GateTarget:
    """The EP the gate judges on besides the CPU EP (``runtime`` None: the CPU EP only, and
    ``reason`` says why)."""

    ep: str
    runtime: EpRuntime | None = None
    provider_options: dict[str, str] = field(default_factory=dict)
    device: Device | None = None
    reason: str | None = None
    seconds: float | None = None  # --ep-seconds: the time one judgement may take on the EP (runtime/budget.py)
    clock: EpClock | None = None  # --ep-total-seconds: the step's time on the EP, all judgements together
    candidate: str | None = None  # what the EP runs now, as the progress bar names it ("A16W8 baseline")
    precision: str = ""  # the attempt's precision ("A16W8"), prefixed to ``candidate``
    # False: run reads nothing from the step's cache (first_divergence's second pass on a simulator,
    # whose runs of one file differ, asks for a run of its own)
    cached: bool = True

    @property
    def judged(self) -> bool:
        return self.runtime is not None

    @property
    def judged_on(self) -> list[str]:
        return ["cpu", self.ep] if self.judged else ["cpu"]

    @property
    def timed(self) -> bool:
        """The EP's time here is the device's: judged here, and not a simulator (QNN's HTP on an x86
        machine is one: its time says nothing of a Snapdragon's)."""
        return self.judged and simulated(self.ep) is None

    def latency(self, model: Path, feed: dict[str, np.ndarray], runs: int) -> list[float]:
        """``runs`` timed runs of ``model`` on one sample in the EP's session (after one untimed run);
        [] when the session fails."""
        assert self.runtime is not None
        request = RunOnEp(model=os.path.abspath(model), provider=self.runtime.spec.provider, feeds=[feed],
                          provider_options=self.provider_options, plugin=self.runtime.plugin, latency_runs=runs)
        with timed("ep"):
            reply = self._on_clock(lambda seconds: call(request, python=self.runtime.python, timeout=EP_TIMEOUT))
        return list(reply.latency_ms) if reply is not None and reply.ok else []

    def _on_clock(self, work):
        """``work(seconds)`` (``seconds``: the bound of this judgement) timed on the step's clock;
        None, counted as refused, once the clock is spent."""
        clock = self.clock
        if clock is None:
            return work(self.seconds)
        if not clock.starts():  # spent, or the step's own bound leaves no room for one (budget.EpClock)
            return None
        return clock.timed(lambda: work(clock.bound(self.seconds)))

    def describe(self) -> str:
        """The EP as a message names it: 'qnn (Snapdragon X Elite / X Plus (SC8380XP), soc_model 60)'."""
        if self.device is None:
            return self.ep
        number = self.device.provider_options.get("soc_model")
        return f"{self.ep} ({self.device.title}" + (f", soc_model {number})" if number else ")")

    def record(self) -> dict[str, Any]:
        runtime = self.runtime
        return {"ep": self.ep, "judged": self.judged, "reason": self.reason,
                "runtime": (runtime.python or "this environment") if runtime else None,
                "package": (runtime.plugin or {}).get("package") if runtime else None,
                "provider_options": dict(self.provider_options) if runtime else None,
                "device": self.device.record() if self.device else None,
                "time": self.clock.record("--ep-total-seconds") if self.clock is not None and runtime else None}

    def run(self, model: Path, feeds: list[dict[str, np.ndarray]],
            early: Callable[[list[dict[str, np.ndarray]]], str | None] | None = None) -> EpRun:
        """``model`` on the samples of ``feeds`` in the EP's session, on a worker of the EP's interpreter:
        every sample, or where one run is slow (a simulator), the first that fit in ``seconds``
        (runtime/budget.py; ``limited`` says so), a caller judging the matching first samples.
        ``early(samples so far)``: "pass" or "miss" where the first samples decide the verdict
        (ep_early.py; ``early`` on the result says so), None to run on. Within a step
        (runtime.budget.timing_step) a (file, sample) the EP already ran is not run again."""
        times = step_times()
        key = self._model_key(model) if times is not None else None
        samples_keys = [(key, feed_key(feed)) for feed in feeds] if key is not None else []
        cached: list[dict[str, np.ndarray]] = []
        for sample_key in samples_keys if self.cached else []:
            if sample_key not in times.outputs:
                break
            cached.append(times.outputs[sample_key])
        known = times.models.get(key) if key is not None else None
        verdict = early(cached) if known is not None and early is not None and 0 < len(cached) < len(feeds) else None
        if known is not None and (len(cached) == len(feeds) or verdict is not None):
            times.ep_cached += len(cached)
            run = EpRun(True, samples=cached, nodes_total=known["nodes_total"], nodes_on_ep=known["nodes_on_ep"],
                        run_seconds=known["seconds"])
            if verdict is not None:
                times.ep_skipped += len(feeds) - len(cached)
                times.early[verdict] = times.early.get(verdict, 0) + 1
                run.early = {"verdict": verdict, "samples": len(cached), "offered": len(feeds)}
            return run
        with workers_scope(prestart=False):  # one worker (and its kept session) for every part, in a scope or not
            outcome = self._on_clock(lambda seconds: self._run_parts(model, feeds, seconds,
                                                                     cached if known else [], samples_keys, early))
        if outcome is None:
            return EpRun(False, f"not run on {self.ep}: {self.clock.spent_words('there')} was spent")
        return outcome

    def _run_parts(self, model: Path, feeds: list[dict[str, np.ndarray]], seconds: float | None,
                   cached: list[dict[str, np.ndarray]], keys: list[tuple], early) -> EpRun:
        """The samples not yet run, one request each in a session the worker keeps between them (so
        that ``early`` can stop the run and the progress bar can say which sample runs)."""
        times = step_times()
        samples = list(cached)
        if times is not None:
            times.ep_cached += len(cached)
        known = times.models.get(keys[0][0]) if times is not None and keys else None
        per_sample = known["seconds"] if known else None
        count = len(feeds)
        if per_sample is not None and seconds is not None and len(feeds) > LEAST_SAMPLES:
            count = samples_within(per_sample, len(feeds), seconds)
        nodes = (known["nodes_total"], known["nodes_on_ep"]) if known else (None, None)
        result = EpRun(True)
        while len(samples) < count:
            index = len(samples)
            verdict = early(samples) if early is not None and samples else None
            if verdict is not None:
                if times is not None:
                    times.ep_skipped += count - index
                    times.early[verdict] = times.early.get(verdict, 0) + 1
                result.early = {"verdict": verdict, "samples": index, "offered": len(feeds)}
                break
            if times is not None and times.progress is not None:
                what = " ".join(part for part in (self.precision, self.candidate or "candidate") if part)
                times.progress(f"EP {self.ep}: {what}, sample {index + 1}/{count}", index, count)
            reply = self._run(model, feeds[index:index + 1], keep=index + 1 < count)
            if not reply.ok:
                return reply
            samples.extend(reply.samples)
            if reply.nodes_total is not None:
                nodes = (reply.nodes_total, reply.nodes_on_ep)
            if per_sample is None:
                per_sample = reply.run_seconds
                if seconds is not None and len(feeds) > LEAST_SAMPLES:
                    count = samples_within(per_sample, len(feeds), seconds)
            if times is not None:
                times.ep_runs += 1
                times.sample_seconds = max(times.sample_seconds, reply.run_seconds or 0.0)
                times.keep(keys[index], reply.samples[0])
                times.models.setdefault(keys[0][0], {"nodes_total": nodes[0], "nodes_on_ep": nodes[1],
                                                     "seconds": per_sample})
        result.samples, result.nodes_total, result.nodes_on_ep, result.run_seconds = samples, *nodes, per_sample
        if count < len(feeds) and result.early is None:
            result.limited = {"samples": count, "offered": len(feeds), "ep": self.ep,
                              "seconds_per_run": round(per_sample or 0.0, 2), "bound": seconds}
        return result

    def _model_key(self, model: Path) -> tuple | None:
        return model_key(model, self.runtime.spec.provider if self.runtime else self.ep, self.provider_options)

    def _run(self, model: Path, feeds: list[dict[str, np.ndarray]], keep: bool = False) -> EpRun:
        assert self.runtime is not None
        request = RunOnEp(model=os.path.abspath(model), provider=self.runtime.spec.provider, feeds=feeds,
                          provider_options=self.provider_options, plugin=self.runtime.plugin, keep_session=keep)
        times = step_times()
        if times is not None:
            times.ep_calls += 1
        with timed("ep"):
            reply = call(request, python=self.runtime.python, timeout=EP_TIMEOUT)
        if reply.status == "timeout":
            return EpRun(False, f"no answer from {self.ep} within {EP_TIMEOUT:.0f} s")
        if reply.status == "crashed":
            return EpRun(False, f"the process running {self.ep} died ({reply.died})"
                         + (f": {reply.stderr_tail[-300:]}" if reply.stderr_tail else ""))
        if not reply.ok:
            stage = "the run" if reply.stage == "run" else "session creation"
            return EpRun(False, f"{stage} on {self.ep} failed: {reply.message}")
        return EpRun(True, samples=reply.samples, nodes_total=reply.nodes_total, nodes_on_ep=reply.nodes_on_ep,
                     run_seconds=reply.run_seconds / max(1, len(feeds)) if reply.run_seconds is not None else None)


def gate_target(options: QuantizeOptions, report: StepResult, clock: EpClock | None = None) -> GateTarget:
    """Where the gate is judged for these options; a finding when the EP cannot judge it here, an
    EnvironmentMissingError when --gate-on-ep asked for it. ``clock``: the step's time on the EP
    (--ep-total-seconds), shared by --auto's attempts; a new one where none is given."""
    spec = resolve_ep(options.ep)
    if spec.name == "cpu":
        return GateTarget("cpu", reason="the target is the CPU EP")
    if not options.verify:
        return GateTarget(spec.name, reason="--no-verify: nothing is evaluated")
    if options.on_ep is False:
        return GateTarget(spec.name, reason="--gate-on-cpu")
    runtime = ep_runtime(spec, options.runtimes)
    device = target_device(runtime, options.provider_options, options.device)
    if runtime.available:
        return GateTarget(spec.name, runtime, session_options(runtime, options.provider_options, options.device),
                          device,
                          seconds=options.ep_seconds, clock=clock or EpClock(options.ep_total_seconds),
                          precision=precision_label(options))
    where = f"the environment of {runtime.python}" if runtime.python else "this environment"
    why = runtime.probe.error or (f"{spec.provider} is neither built into ONNX Runtime {runtime.probe.version} nor "
                                  "offered "
                                  f"by a plugin package with a device for {spec.name}")
    how = (f"{spec.install_hint}, or name an environment that has it: --runtime {spec.name}=PYTHON")
    if options.on_ep:
        raise EnvironmentMissingError(f"--gate-on-ep: {spec.name} does not run in {where} ({why}), so the accuracy "
                                      "gate "
                                      "cannot be judged on it",
                                      hint=f"{how}; or --gate-on-cpu to judge on the CPU EP only")
    reason = f"{spec.name} does not run in {where} ({why})"
    report.add(Finding.of(
        "LOD002", f"the accuracy gate was judged on the CPU EP only: {reason}; the quantized model's outputs on "
        f"{spec.name} were not measured, and an EP can compute a QDQ model otherwise than the CPU EP",
        ep=spec.name, severity=Severity.WARNING,
        fix=f"to judge it on {spec.name}: {how}, then quantize again (--gate-on-ep makes a missing EP an error; "
            "--gate-on-cpu silences this)"))
    return GateTarget(spec.name, device=device, reason=reason)


def precision_label(options: QuantizeOptions) -> str:
    """"A16W8", "A8W8 per channel", "dynamic", "FP16": the precision an attempt asks for, as the
    progress bar names it."""
    from ortprep.steps.quantize.presets import resolve_settings

    try:
        settings = resolve_settings(options)
    except Exception:  # noqa: BLE001 - a label only
        return ""
    if options.mode != "static":
        return str(options.mode or "")
    bits = {"uint16": 16, "int16": 16, "uint8": 8, "int8": 8, "int4": 4, "uint4": 4}
    activation = bits.get(str(settings.get("activation_type")), "")
    weight = bits.get(str(settings.get("weight_type")), "")
    if not activation or not weight:
        return "static"
    return f"A{activation}W{weight}" + (" per channel" if settings.get("per_channel") else "")


DIVERGED = 0.99  # a tensor whose cosine between the EP's and the CPU EP's run falls below this has parted
# The same QDQ file on two EPs: integer arithmetic done alike agrees to within a step of rounding;
# a tensor further off than this many of its own steps is computed otherwise (first_divergence).
APART_STEPS = 2.0
# first_divergence: exposure passes over a model on a simulated EP (targets.simulated), the second
# only where the first finds nothing parting; one elsewhere
SIMULATED_PASSES = 2
_RESHAPING = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"}


def first_divergence(target: GateTarget, model: Path, feeds: list[dict[str, np.ndarray]], workdir: Path,
                     *, limit: int = 5, nearest: bool = False) -> list[dict[str, Any]]:
    """Where the EP's run of a QDQ model first parts from the CPU EP's (graph optimizations off,
    the model's own arithmetic): every activation's DequantizeLinear is made an output, both run
    on ``feeds`` (one or two samples), and the first ``limit`` tensors in graph order whose cosine
    falls below DIVERGED are returned with the node that computes them. Only the final outputs
    are seen otherwise; this names the op whose EP kernel computes otherwise. [] when nothing
    parts or a run fails. A reshaping node of float values stands for the node that computed them.
    ``nearest``: where nothing falls below DIVERGED, the tensor farthest from the CPU EP's run (by
    cosine) of those more than APART_STEPS of their own quantization steps off it, marked
    ``where``: a small error that the nodes after it magnify
    (docs/decisions/reduce-quantize-measurements.md)."""
    import onnx

    from ortprep.fidelity.compare import compare_arrays
    from ortprep.runtime.isolated import run_isolated

    proto = onnx.load(str(model), load_external_data=False)
    graph = proto.graph
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer):
        return []  # the weights stay where they are: not worth copying a big model for a diagnosis
    producers = {out: node for node in graph.node for out in node.output}
    constants = {t.name: t for t in graph.initializer}
    existing = {value.name for value in graph.output}
    exposed: list[tuple[str, Any]] = []
    steps: dict[str, float] = {}
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] in constants or node.output[0] in existing:
            continue
        quantize = producers.get(node.input[0])
        quantizes = quantize is not None and quantize.op_type == "QuantizeLinear"
        source = producers.get(quantize.input[0]) if quantizes else None
        if source is None:
            continue
        # a reshaping node of float values passes on its input's error: the node that computed it
        while (source.op_type in _RESHAPING and source.input and source.input[0] in producers
               and producers[source.input[0]].op_type not in ("QuantizeLinear", "DequantizeLinear")):
            source = producers[source.input[0]]
        exposed.append((node.output[0], source))
        scale = constants.get(node.input[1]) if len(node.input) > 1 else None
        if scale is not None and int(np.prod(scale.dims)) == 1:
            steps[node.output[0]] = float(onnx.numpy_helper.to_array(scale).ravel()[0])
    if not exposed:
        return []
    from ortprep.steps.quantize.calibrate import exposure_chunks

    sources = dict(exposed)
    found: list[dict[str, Any]] = []
    farthest: dict[str, Any] | None = None
    # each group is a whole run on the EP: bounded by --ep-seconds as its other runs are (on the HTP
    # simulator the layout detector's 1,493 nodes at 1x3x800x608 took tens of such runs, 45 s each)
    seconds = target.clock.bound(target.seconds) if target.clock is not None else target.seconds
    budget = Budget(seconds=seconds)
    def answer() -> list[dict[str, Any]]:
        if not found and farthest is not None:
            return [{**farthest, "where": "where its run is farthest from the CPU EP's"}]
        return found

    def parted_in(chunk: list[str], cpu: Any, run: Any) -> None:
        nonlocal farthest
        for name in chunk:
            source = sources[name]
            cosines, ratios, gaps = [], [], []
            for ours, theirs in zip(cpu.samples, run.samples):
                if name not in ours or name not in theirs:
                    break
                diff = compare_arrays(name, np.asarray(ours[name]), np.asarray(theirs[name]))
                cosines.append(diff.cosine if diff.cosine is not None else -1.0)
                ratios.append(diff.norm_ratio)
                gaps.append(diff.max_abs_diff or 0.0)
            if not cosines:
                continue
            entry = {"tensor": name, "node": source.name, "op_type": source.op_type, "cosine": min(cosines),
                     "norm_ratio": ratios[cosines.index(min(cosines))]}
            if min(cosines) < DIVERGED:
                found.append(entry)
            elif (nearest and name in steps and max(gaps) > APART_STEPS * steps[name]
                  and (farthest is None or entry["cosine"] < farthest["cosine"])):
                farthest = entry

    # in groups of at most EXPOSED_BYTES a run, in graph order, until ``limit`` tensors have parted.
    # On a simulated EP a pass where nothing parts is made once more (SIMULATED_PASSES): the HTP
    # simulator does not compute a model alike each time (docs/decisions/reduce-quantize-measurements.md).
    # Elsewhere one pass: an EP whose runs do not vary would spend its time (--ep-total-seconds) on the
    # same answer.
    for _ in range(SIMULATED_PASSES if simulated(target.ep) else 1):
        for index, chunk in enumerate(exposure_chunks(model, [name for name, _ in exposed], feeds)):
            if budget.out_of_time():
                return answer()
            del graph.output[len(existing):]
            graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                                for name in chunk)
            path = workdir / f"exposed{index}.onnx"
            onnx.save(proto, str(path))
            cpu = run_isolated(path, feeds, optimization="disable")
            target.cached = False  # a pass of its own: the simulator's runs of one file differ
            try:
                run = target.run(path, feeds)
            finally:
                target.cached = True
            path.unlink(missing_ok=True)
            if not cpu.ok or not run.ok or len(run.samples) != len(cpu.samples):
                return answer()
            parted_in(chunk, cpu, run)
            del cpu, run
            if len(found) >= limit:
                return found[:limit]
        if found:
            return found
    return answer()
