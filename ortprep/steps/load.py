"""load: the runtime's word. Each EP runs the model in a worker process (one per interpreter): does it load,
does all of it run on that EP, what went where, do the outputs match the CPU's, how fast."""

from __future__ import annotations

import contextvars
import logging
import os
import re
import statistics
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ortprep.analysis import ModelAnalysis
from ortprep.graphops import has_unnamed_nodes
from ortprep.eps.registry import EPS, EpSpec, resolve_ep, spec_for_provider
from ortprep.errors import EnvironmentMissingError, UsageError
from ortprep.findings import Finding, Severity
from ortprep.fidelity.decisions import dfl_hint
from ortprep.model import ModelHandle
from ortprep.options import LoadOptions
from ortprep.prediction import check_target, predicted_ep_nodes
from ortprep.report import StepResult
from ortprep.fidelity.compare import compare_arrays
from ortprep.runtime.feeds import choose_feeds, input_specs
from ortprep.runtime.isolated import run_isolated
from ortprep.runtime.requests.sessions import EP_CREATE_FALLBACK, EP_RUN_FALLBACK
from ortprep.runtime.shapes import symbolic_infer
from ortprep.runtime.providers import (
    INSTALL_HINT,
    probe_runtime,
)
from ortprep.runtime.targets import EpRuntime, ep_runtime, session_options, simulated, target_device
from ortprep.fidelity.ep_match import judge_ep_outputs
from ortprep.fidelity.tolerances import NORM_TOLERANCE, TF32_COMPUTE
from ortprep.runtime.tolerance import computes_tf32
from ortprep.runtime.worker import workers_scope
from ortprep.steps.base import Step, StepContext
from ortprep.prove import optimizers
from ortprep.prove.proof import compare_prediction
from ortprep.prove.share import share_fix, share_shortfall

log = logging.getLogger(__name__)

SCHEMA = "ortprep.load/2"
# Output tolerance against the CPU EP, relative to the output's scale (at least 1).


def run_ep(model: Path, target: EpRuntime, feeds: dict[str, np.ndarray], options: LoadOptions, workdir: Path,
           label_unnamed: bool = False, label: str | None = None, optimization: str | None = None,
           disabled: tuple[str, ...] | None = None, strict: bool = True) -> dict[str, Any]:
    """One EP in a worker process (a Placement request); returns its answer as a dict, with the
    outputs (or a crash/timeout). ``label_unnamed``: the model has unnamed nodes (SessionSpec);
    ``label``: the run's folder under ``workdir`` (default: the EP's name); ``optimization`` and
    ``disabled``: the session's level and the ORT optimizers it leaves out (default: the options',
    for every EP but the CPU EP, whose run is the reference); ``strict``: also the session with CPU
    fallback disabled."""
    from ortprep.runtime.requests import Placement
    from ortprep.runtime.worker import call

    folder = workdir / (label or target.spec.name)
    folder.mkdir()
    reference = target.spec.provider == "CPUExecutionProvider"
    if optimization is None:
        optimization = "default" if reference else options.optimization
    if disabled is None:
        disabled = () if reference else tuple(options.disabled_optimizers)
    request = Placement(
        model=os.path.abspath(model),
        provider=target.spec.provider,
        feeds=feeds,
        provider_options=session_options(target, options.provider_options, options.device),
        plugin=target.plugin,
        custom_op_library=str(options.custom_op_library) if options.custom_op_library else None,
        runs=0 if simulated(target.spec.name) else options.runs,
        profile=options.profile,
        workdir=str(folder),
        levels=["default", "off"] if options.placement_off else ["default"],
        optimization=optimization,
        disabled_optimizers=list(disabled),
        strict_session=strict,
        verbose_record=target.spec.provider == "QNNExecutionProvider",
        label_unnamed=label_unnamed,
    )
    reply = call(request, python=target.python, timeout=options.timeout)
    if reply.status == "timeout":
        return {"status": "timeout", "message": f"no answer within {options.timeout:g} s (hung in ORT or the EP)"}
    if reply.status == "crashed":
        return {"status": "crashed", "message": f"the process running {target.spec.name} died ({reply.died})"
                                                 + (f": {reply.stderr_tail}" if reply.stderr_tail else "")}
    status = {key: value for key, value in reply.__dict__.items() if key not in ("status", "message", "verbose_log")}
    status["ok"] = reply.ok
    if not reply.ok:
        status["error"] = reply.message
        status.pop("outputs", None)
    status["rejections"] = ep_rejections("ORTPREP-VERBOSE-BEGIN\n" + reply.verbose_log) if reply.verbose_log else {}
    return status


_REJECTION = re.compile(r"Validation FAILED for \d+ nodes in OrtNodeUnit \((?P<unit>[^)]*)\)\s*:\s*"
                        r"(?P<nodes>(?:\s*Operator type: \S+ Node name: .*? Node index: \d+\s*)+)"
                        r"\s*REASON : (?P<reason>[^\n]*)")
_NODE = re.compile(r"Operator type: (?P<op>\S+) Node name: (?P<name>.*?) Node index: \d+")


def ep_rejections(log_text: str) -> dict[str, dict[str, str]]:
    """Per-node rejections an EP wrote to its verbose log (QNN: "Validation FAILED ... REASON"),
    from the recorded session only: node name -> {"op_type", "reason"}."""
    begin, end = log_text.find("ORTPREP-VERBOSE-BEGIN"), log_text.find("ORTPREP-VERBOSE-END")
    if begin < 0:
        return {}
    text = log_text[begin: end if end > begin else None]
    found: dict[str, dict[str, str]] = {}
    for match in _REJECTION.finditer(text):
        for node in _NODE.finditer(match.group("nodes")):
            found.setdefault(node.group("name"), {"op_type": node.group("op"), "reason": match.group("reason").strip()})
    return found


def _compare(reference: dict[str, np.ndarray] | None, outputs: dict[str, np.ndarray], proto, ep: str,
             metrics: dict[str, str] | None = None, provider_options: dict[str, str] | None = None
             ) -> tuple[bool | None, float | None, list[dict[str, Any]]]:
    """Do the EP's outputs match the CPU EP's? One rule with compile (fidelity/ep_match.py): a share
    of the output's scale by the precision the EP computes in (its provider options can set it:
    CUDA's use_tf32), a quantized model's own steps, and the output's norm within NORM_TOLERANCE."""
    if reference is None:
        return None, None, []
    judged = judge_ep_outputs(proto, ep, reference, outputs, metrics, computes_tf32(ep, provider_options))
    worst = max((j["max_abs_diff"] for j in judged if j["max_abs_diff"] is not None), default=None)
    return all(j["within_tolerance"] for j in judged), worst, judged


def compare_with_check(analysis: ModelAnalysis, spec: EpSpec, assignment: dict[str, str],
                       subgraphs: list[list], device=None) -> tuple[dict[str, Any], list[Finding]]:
    """check's prediction next to what the EP claimed for the same file: node-level agreement over
    the nodes both know, partitions on both sides, verdicts, and the op types where they differ."""
    predicted, _ = check_target(analysis, (spec,), device=device)
    comparison, differing = compare_prediction(analysis, spec, predicted, assignment, subgraphs,
                                               predicted_ep_nodes(analysis, predicted))
    findings = [Finding.of("LOD001", what, node=node, op_type=op_type, ep=spec.name,
                           fix="a gap in ortprep's table or rules for this EP: please report it with the model")
                for node, op_type, what in differing]
    return comparison, findings


def load_on_eps(handle: ModelHandle, options: LoadOptions) -> StepResult:
    """Run the model on each requested (or every available) EP and report per EP (on the
    pipeline's workers; called alone, on workers of its own for all of its runs)."""
    with workers_scope():
        return _load_on_eps(handle, options)


def _load_on_eps(handle: ModelHandle, options: LoadOptions) -> StepResult:
    if handle.path is None:
        raise UsageError("load needs a model file")
    local = probe_runtime()
    if not local.ok:
        raise EnvironmentMissingError(f"ONNX Runtime does not start here: {local.error}", hint=INSTALL_HINT)
    if options.eps:
        specs = [resolve_ep(name) for name in options.eps]
    else:
        specs = [s for s in EPS if local.runs(s.name) and spec_for_provider(s.provider) is s or
                 (s.provider not in local.providers and local.devices_for(s.name))]
        specs += [resolve_ep(name) for name in options.runtimes if resolve_ep(name) not in specs]
    targets = [ep_runtime(spec, options.runtimes) for spec in specs]
    cpu = ep_runtime(resolve_ep("cpu"), options.runtimes)
    inputs = input_specs(handle.proto)
    choice = choose_feeds(inputs, proto=handle.proto, inputs=options.inputs, shapes=options.shapes,
                          runs=lambda feeds: run_isolated(handle.path, feeds, timeout=options.timeout))
    feeds, guess_failed = choice.feeds, choice.runs is False
    report = StepResult(step="load", schema=SCHEMA)
    for unknown in [n for n in options.disabled_optimizers if n not in optimizers.BASIC_OPTIMIZERS]:
        report.add(Finding.of("LOD013", f"--disable-optimizer {unknown}: not one of the basic level's optimizer names "
                              "ortprep knows; ORT ignores a name it does not know (no error), so where it does not "
                              "know this one the session is ORT's default", fix="spell it as ORT names it "
                              "(ConvAddFusion, GeluFusion, ConstantFolding, EliminateUnsqueeze, ...: "
                              "prove/optimizers.py lists the basic level's)"))
    results = []
    with tempfile.TemporaryDirectory(prefix="ortprep-load-") as tmp:
        workdir = Path(tmp)

        stop = threading.Event()

        unnamed = has_unnamed_nodes(handle.graph)

        def run_all() -> dict[str, dict]:
            raw = {"cpu": run_ep(handle.path, cpu, feeds, options, workdir, unnamed)}
            for target in targets:
                if stop.is_set():
                    break
                if target.available and target.spec.name not in raw:
                    raw[target.spec.name] = run_ep(handle.path, target, feeds, options, workdir, unnamed)
            return raw

        # The workers build sessions and run while this process analyses the graph for the
        # comparison with check: the waiting thread spends its time in select(), so the analysis
        # is off the critical path (bench/suite/bench_worker.py measures it).
        with workers_scope(prestart=False) as pool:
            waiting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortprep-load")
            try:
                pending = waiting.submit(contextvars.copy_context().run, run_all)  # the pipeline's workers
                analysis = (ModelAnalysis(handle, symbolic_infer=symbolic_infer)
                            if any(t.available for t in targets) else None)
                raw = pending.result()
            except BaseException as exc:
                stop.set()  # no further EP
                if not isinstance(exc, Exception):
                    pool.interrupt()  # Ctrl-C, SIGTERM: the EP running now ends at once, and so does the step
                raise
            finally:
                waiting.shutdown(wait=True)
        reference = raw["cpu"].get("outputs") if raw["cpu"].get("ok") else None
        float_outputs = _float_reference(options, feeds, report)
        for target in targets:
            name = target.spec.name
            if not target.available:
                where = f"the environment of {target.python}" if target.python else "this environment"
                why = target.probe.error or f"{target.spec.provider} is neither built into ONNX Runtime " \
                      f"{target.probe.version} nor offered by a plugin package with a device for {name}"
                message = f"{name}: not available in {where} ({why}); {target.spec.install_hint}"
                results.append({"ep": name, "provider": target.spec.provider, "status": "unavailable",
                                "message": message})
                report.add(Finding.of("LOD002", f"{name}: {target.spec.provider} is not available here", ep=name,
                                      fix=target.spec.install_hint))
                report.missing.append(message)
                continue
            record = _result(analysis, target, raw[name], reference, options, report,
                             guessed_inputs=_shapes_of(feeds) if guess_failed else None)
            if record.get("outputs_match") is False and computes_tf32(name, record.get("provider_options")):
                record["tf32_off"] = _without_tf32(handle, target, feeds, options, workdir, unnamed, reference, report)
            elif record.get("outputs_match") is False and _optimizations_asked(options):
                record["ort_optimizations"] = _without_optimizations(handle, target, feeds, options, workdir, unnamed,
                                                                     reference, record, report)
            if float_outputs is not None and raw[name].get("ok"):
                record["three_way"] = three_way(float_outputs, reference, raw[name]["outputs"])
            results.append(record)
    available = [s.name for s in EPS if local.runs(s.name)]
    report.data = {"model": str(handle.path), "available": available, "inputs": choice.record(), "results": results}
    return report


def _without_tf32(handle: ModelHandle, target: EpRuntime, feeds: dict[str, np.ndarray], options: LoadOptions,
                  workdir: Path, unnamed: bool, reference: dict[str, np.ndarray], report: StepResult) -> dict[str, Any]:
    """An EP whose outputs differ from the CPU EP's while it computes float32 products in TF32 (its
    default): the same session once more with TF32 off, judged by the same rule at float32's
    precision. Outputs that then match put the difference down to TF32, and the option that gets
    past it is printed (LOD010)."""
    name = target.spec.name
    option = TF32_COMPUTE[name]
    provider_options = {**options.provider_options, name: {**options.provider_options.get(name, {}), option: "0"}}
    again = run_ep(handle.path, target, feeds, replace(options, provider_options=provider_options, runs=1,
                                                       placement_off=False, profile=False), workdir,
                   unnamed, label=f"{name}-{option}-0")
    if not again.get("ok"):
        return {"option": f"{option}=0", "ran": False, "error": again.get("error") or again.get("message")}
    assignment = (again.get("placement", {}).get("default") or {}).get("assignment") or {}
    if not any(ep == target.spec.provider for ep in assignment.values()):
        return {"option": f"{option}=0", "ran": False, "error": f"the session with {option}=0 took no node on {name}"}
    match, max_abs, _ = _compare(reference, again["outputs"], handle.proto, name, options.metrics,
                                 session_options(target, provider_options, options.device))
    record = {"option": f"{option}=0", "ran": True, "outputs_match": match, "max_abs_diff": max_abs}
    if match:
        report.add(Finding.of(
            "LOD010", f"{name}: with {option}=0 the outputs match the CPU EP's by load's rule (max abs diff "
            f"{max_abs:.3g}): the difference is TF32's precision, which {name} uses for float32 MatMul/Gemm and "
            "convolutions by default on GPUs since Ampere", ep=name,
            fix=f"where the application needs float32's precision, create its session with {option}=0 "
                f"(--provider-option {name}:{option}=0 here); or judge by what the application reads (--metric)"))
    return record


def _optimizations_asked(options: LoadOptions) -> bool:
    """Whether the EP sessions ran at ORT's defaults, so that leaving optimizations out is a question
    worth asking (a session the user shaped already answers its own)."""
    return options.optimization == "default" and not options.disabled_optimizers


def _without_optimizations(handle: ModelHandle, target: EpRuntime, feeds: dict[str, np.ndarray],
                           options: LoadOptions, workdir: Path, unnamed: bool, reference: dict[str, np.ndarray],
                           record: dict[str, Any], report: StepResult) -> dict[str, Any]:
    """An EP whose outputs differ from the CPU EP's at ORT's default optimization level: the same
    session with the optimizations off, then without the basic level's optimizers in halves
    (prove/optimizers.py), each judged by load's rule. What matches is printed (LOD012)."""
    name = target.spec.name
    once = replace(options, runs=1, placement_off=False, profile=False)
    provider_options = record.get("provider_options")

    def judge(level: str, disabled: tuple[str, ...]) -> tuple[bool | None, float | None]:
        label = f"{name}-optimizations-{next(count)}"
        again = run_ep(handle.path, target, feeds, once, workdir, unnamed, label=label, optimization=level,
                       disabled=disabled, strict=False)  # the user's session alone: its outputs are asked
        assignment = (again.get("placement", {}).get("default") or {}).get("assignment") or {}
        if not again.get("ok") or not any(ep == target.spec.provider for ep in assignment.values()):
            return None, None  # a failed session, or one the EP took nothing of, tells nothing about the EP
        match, max_abs, _ = _compare(reference, again["outputs"], handle.proto, name, options.metrics,
                                     provider_options)
        return match, max_abs

    count = iter(range(1, optimizers.MAX_SESSIONS + 1))
    result = optimizers.find_optimizers(judge)
    words = optimizers.described(name, result, record.get("max_abs_diff"))
    if words is not None:
        report.add(Finding.of("LOD012", words[0], ep=name, fix=words[1]))
    return result


def _shapes_of(feeds: dict[str, np.ndarray]) -> dict[str, list[int]]:
    return {name: list(value.shape) for name, value in feeds.items()}


def _result(analysis: ModelAnalysis, target: EpRuntime, status: dict, reference, options: LoadOptions,
            report: StepResult, guessed_inputs: dict[str, list[int]] | None = None) -> dict[str, Any]:
    spec, name, provider = target.spec, target.spec.name, target.spec.provider
    record: dict[str, Any] = {"ep": name, "provider": provider, "runtime": target.python or "this environment",
                              "package": target.plugin["package"] if target.plugin else None}
    device = target_device(target, options.provider_options, options.device)
    if device is not None:
        record["device"] = device.record()
    record["provider_options"] = session_options(target, options.provider_options, options.device)
    if not _optimizations_asked(options) and provider != "CPUExecutionProvider":
        # the session the user described, not ORT's default (the CPU EP's run is the reference, at ORT's default)
        record["ort_session"] = {"optimization": options.optimization,
                                 "disabled_optimizers": list(options.disabled_optimizers)}
    if status.get("status") in ("crashed", "timeout"):
        record.update(status=status["status"], message=status["message"])
        report.add(Finding.of("LOD003", f"{name}: {status['message']}", ep=name,
                              fix="run ortprep check MODEL --ep " + name
                              + " and ortprep doctor; the other EPs were still tested"))
        return record
    placement = status.get("placement", {})
    default = placement.get("default", {})
    if not status.get("ok") and guessed_inputs is not None and status.get("stage") == "run":
        shown = " ".join(f"{name}={','.join(map(str, dims))}" for name, dims in guessed_inputs.items())
        record.update(status="inputs_guessed",
                      message=f"inputs guessed ({shown}) and the model does not run with them: "
                      f"{status.get('error')}; pass --shape NAME=DIMS or --inputs FILE.npz")
        report.add(Finding.of("LOD009", f"{name}: the model's inputs have dynamic dims and no guess ran ({shown}); "
                              "the model is not shown to fail", ep=name,
                              fix="pass the sizes it expects: ortprep load MODEL --shape NAME=DIMS "
                              "(or --inputs FILE.npz)"))
        return record
    if not status.get("ok"):
        record.update(status="failed", message=status.get("error") or status.get("strict", {}).get("error", "failed"))
        stage = "the run" if status.get("stage") == "run" else "session creation"
        ep_failed = any(word in record["message"] for word in ("ExecutionProvider", "EP_FAIL"))  # not the inputs
        after = (f"; {EP_RUN_FALLBACK}" if stage == "the run" and provider != "CPUExecutionProvider"
                 and default.get("assignment") and ep_failed else
                 f"; {EP_CREATE_FALLBACK}" if stage != "the run" and provider != "CPUExecutionProvider" else "")
        libraries = spec.device == "gpu" and any(word in record["message"] for word in ("librar", ".so", ".dll"))
        report.add(Finding.of("LOD004", f"{name}: {stage} failed: {record['message']}{after}", ep=name,
                              fix="check the inputs (--inputs, --shape NAME=DIMS)" if stage == "the run"
                              else "ortprep doctor checks the CUDA/cuDNN/TensorRT libraries" if libraries
                              else f"ortprep check MODEL --ep {name} explains unsupported parts"))
        if default.get("assignment") and provider != "CPUExecutionProvider":
            # The session was created, so the EP's placement is known even though the run failed.
            assignment = default["assignment"]
            record.update(nodes_total=len(assignment),
                          nodes_on_ep=sum(1 for ep in assignment.values() if ep == provider),
                          subgraphs=default.get("subgraphs"))
            record["check_comparison"], findings = compare_with_check(analysis, spec, assignment,
                                                                      default.get("subgraphs", []), device)
            for finding in findings:
                report.add(finding)
        elif provider != "CPUExecutionProvider":
            # No session, so no placement: the comparison still says what check had predicted, so a
            # wrong prediction ("full", and the session is not even created) is never hidden.
            predicted, _ = check_target(analysis, (spec,), device=device)
            record["check_comparison"] = {"nodes_compared": 0, "node_agreement": None,
                                          "predicted_partitions": predicted["partitions"], "actual_partitions": 0,
                                          "predicted_verdict": predicted["verdict"], "actual_verdict": "none",
                                          "differing_op_types": {}, "predicted_on_ep_absent": [],
                                          "session": "not created"}
        return record
    assignment = default.get("assignment", {})
    on_ep = [n for n, ep in assignment.items() if ep == provider]
    fallback = sorted(n for n, ep in assignment.items() if ep != provider)
    strict_ok = status["strict"]["ok"]
    match, max_abs, judged = (None, None, []) if provider == "CPUExecutionProvider" else \
        _compare(reference, status["outputs"], analysis.handle.proto, name, options.metrics, record["provider_options"])
    latencies = status.get("latency_ms", [])
    record.update(
        status="ok" if strict_ok is not False and not fallback else "fallback",
        message="" if strict_ok is not False else f"with CPU fallback disabled: {status['strict'].get('error', '')}",
        nodes_total=len(assignment) or None,
        nodes_on_ep=len(on_ep) if assignment else None,
        fallback_nodes=fallback,
        subgraphs=default.get("subgraphs"),
        placement_off=_placement_summary(placement.get("off"), provider),
        outputs_match=match,
        max_abs_diff=max_abs,
        outputs=judged or None,
        nonfinite_outputs=status.get("nonfinite", []),
        latency_ms=({"median": statistics.median(latencies), "p90": float(np.percentile(latencies, 90))}
                    if latencies else None),
    )
    not_timed = simulated(name)
    if not_timed:
        record["latency_not_timed"] = not_timed  # one run gave the outputs; no timed runs
    if status.get("profile") is not None:  # profiled runs only (the JSON has no key otherwise)
        record["profile"] = status["profile"]
    if record["status"] == "fallback":
        listed = f" ({', '.join(fallback[:5])}{', ...' if len(fallback) > 5 else ''})" if fallback else ""
        silent = not on_ep and spec.device == "gpu"
        report.add(Finding.of("LOD005", f"{name}: {len(fallback)} node(s) fell back to the CPU{listed}"
                              + ("; the EP took no node at all, which is what a GPU EP does when a library it needs "
                                 "does not load" if silent else ""), ep=name,
                              fix="ortprep doctor checks the CUDA/cuDNN/TensorRT libraries" if silent
                              else f"ortprep check MODEL --ep {name} lists what to change",
                              severity=Severity.ERROR if options.no_fallback else Severity.WARNING))
    if assignment and provider != "CPUExecutionProvider":
        record["node_share"] = round(len(on_ep) / len(assignment), 4)
        # an EP asked for by name that runs none of the model (or less than --min-share) fails: the
        # session runs anyway, on the CPU EP, which is the silent fallback an application meets
        asked = name in {resolve_ep(label).name for label in options.eps}
        short = share_shortfall(name, len(on_ep), len(assignment), fallback, options.min_share) \
            if asked or options.min_share is not None else None
        if short is not None:
            report.add(Finding.of("LOD011", short, ep=name, fix=share_fix(name)))
    ep_vs_cpu = _pair(reference, status["outputs"]) if match is not None else None
    if ep_vs_cpu is not None:
        record["norm_ratio"] = ep_vs_cpu["norm_ratio"]
        record["cosine"] = ep_vs_cpu["cosine"]
    if match is False:
        ratio, cosine = (ep_vs_cpu or {}).get("norm_ratio"), (ep_vs_cpu or {}).get("cosine")
        scaled = ratio is not None and cosine is not None and cosine > 0.999 and abs(ratio - 1.0) > NORM_TOLERANCE
        shown = f"max abs diff {max_abs:.4g}" + (f", cosine {cosine:.5f}, norm ratio {ratio:.4f}"
                                                  if ratio is not None else "")
        failing = [j for j in judged if not j["within_tolerance"]]
        if failing and failing[0]["tolerance"] is not None:
            first = failing[0]
            shown += f"; allowed {first['tolerance']:.4g} on '{first['name']}': {first['tolerance_rule']}"
        report.add(Finding.of(
            "LOD006", f"{name}: outputs differ from the CPU EP's beyond tolerance ({shown})"
            + ("; the direction is right and the size is not: the output is scaled as a whole" if scaled else ""),
            ep=name,
            fix=("an op with a fixed output encoding on the EP (QNN: Sigmoid, Tanh, Softmax) before a graph-output "
                 "DequantizeLinear whose scale is calibrated; quantize with the EP's encodings, or keep that op in "
                 "float (ortprep quantize MODEL --exclude-nodes NAME)") if scaled
            else "compare per output with --json; check precision settings of the EP"
            + (dfl_hint(failing[0]["name"], tuple(np.shape(reference[failing[0]["name"]])), options.metrics)
               if failing and failing[0]["name"] in (reference or {}) else "")))
    if record["nonfinite_outputs"]:
        report.add(Finding.of("LOD007", f"{name}: NaN or Inf in outputs {', '.join(record['nonfinite_outputs'])}",
                              ep=name,
                              fix="check the inputs (--inputs) and FP16 overflow (ortprep convert --fp16 reports it)"))
    rejected = status.get("rejections", {})
    if rejected:
        record["rejected_nodes"] = rejected
        for node, why in sorted(rejected.items()):
            report.add(Finding.of("LOD008", f"{name} rejected node '{node}' ({why['op_type']}): {why['reason']}",
                                  node=node, op_type=why["op_type"], ep=name,
                                  fix=_rejection_fix(why["reason"], name)))
    if assignment and provider != "CPUExecutionProvider":
        comparison, findings = compare_with_check(analysis, spec, assignment, default.get("subgraphs", []), device)
        record["check_comparison"] = comparison
        for finding in findings:
            report.add(finding)
    return record


def _float_reference(options: LoadOptions, feeds: dict[str, np.ndarray], report: StepResult) -> dict | None:
    """The float model's outputs on the CPU EP, for the three-way comparison."""
    if options.reference is None:
        return None
    feeds = reference_feeds(Path(options.reference), feeds)
    outcome = run_isolated(Path(options.reference), feeds)
    if not outcome.ok:
        report.add(Finding.of("LOD004", f"the reference model does not run on the CPU EP ({outcome.message})",
                              fix="pass the float model the tested one came from, with the same inputs"))
        return None
    return outcome.outputs


def reference_feeds(reference: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` as the float model the tested one came from takes them: a float input of another
    width (an FP16 model with float16 inputs, made by convert --fp16-io) cast to the reference's
    float type; anything else as it is (a reference that takes other inputs then says so)."""
    import onnx

    try:
        wanted = {spec.name: spec.dtype for spec in input_specs(onnx.load(str(reference), load_external_data=False))}
    except Exception:  # noqa: BLE001 - an unreadable reference is reported by its run
        return feeds
    return {name: value.astype(wanted[name]) if wanted.get(name) is not None and value.dtype.kind == "f"
            and wanted[name].kind == "f" and value.dtype != wanted[name] else value for name, value in feeds.items()}


def _pair(reference: dict | None, candidate: dict | None) -> dict[str, Any] | None:
    """Lowest cosine and largest abs difference over the outputs both have."""
    if not reference or not candidate:
        return None
    diffs = [compare_arrays(name, value, candidate[name]) for name, value in reference.items()
             if name in candidate and value.dtype.kind == "f"]
    diffs = [d for d in diffs if d.shape_match and d.max_abs_diff is not None]
    if not diffs:
        return None
    cosines = [d.cosine for d in diffs if d.cosine is not None]
    ratios = [d.norm_ratio for d in diffs if d.norm_ratio is not None]
    return {"cosine": min(cosines) if cosines else None, "max_abs_diff": max(d.max_abs_diff for d in diffs),
            "norm_ratio": max(ratios, key=lambda r: abs(r - 1.0)) if ratios else None}


def three_way(float_cpu: dict, model_cpu: dict | None, model_ep: dict) -> dict[str, Any]:
    """Float on CPU, this model on CPU, this model on the EP: what quantization costs, what the EP
    adds, and the two together."""
    return {"quantization": _pair(float_cpu, model_cpu), "ep": _pair(model_cpu, model_ep),
            "total": _pair(float_cpu, model_ep)}


def _placement_summary(level: dict | None, provider: str) -> dict[str, Any] | None:
    if not level:
        return None
    if "error" in level:
        return {"error": level["error"]}
    assignment = level.get("assignment", {})
    return {"nodes_total": len(assignment), "nodes_on_ep": sum(1 for ep in assignment.values() if ep == provider),
            "subgraphs": level.get("subgraphs")}


def _rejection_fix(reason: str, ep: str) -> str:
    if "shape" in reason.lower():
        return "make every shape static: ortprep convert MODEL --fix-shape INPUT=DIMS (or --fix-dim NAME=SIZE)"
    return f"replace the op or accept the CPU fallback; ortprep check MODEL --ep {ep} lists the alternatives"


class LoadStep(Step):
    name = "load"
    Options = LoadOptions
    memory_factor = 1.0
    progress_label = "loading on each EP"
    needs_ort = "always"

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return load_on_eps(model, self.options)
