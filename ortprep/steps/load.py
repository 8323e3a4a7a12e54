"""load: the runtime's word. Each EP runs the model in its own child process: does it load,
does all of it run on that EP, what went where, do the outputs match the CPU's, how fast."""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ortprep.analysis import ModelAnalysis
from ortprep.eps.registry import EpSpec, resolve_ep, spec_for_provider
from ortprep.errors import UsageError
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle
from ortprep.report import StepResult
from ortprep.runtime.children import run_child
from ortprep.runtime.compare import compare_arrays
from ortprep.runtime.feeds import input_specs, load_feeds, random_feeds
from ortprep.runtime.providers import require_ort
from ortprep.steps.base import Step, StepContext
from ortprep.steps.options import LoadOptions

log = logging.getLogger(__name__)

SCHEMA = "ortprep.load/1"
# Output tolerance against the CPU EP, relative to the output's scale (at least 1).
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3, "float64": 1e-6}


def available_providers() -> list[str]:
    ort = require_ort()
    return [p for p in ort.get_available_providers() if p != "AzureExecutionProvider"]


def _provider_options(options: LoadOptions, provider: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, values in options.provider_options.items():
        if resolve_ep(name).provider == provider:
            merged.update(values)
    return merged


def run_ep(model: Path, provider: str, feeds_path: Path, options: LoadOptions, workdir: Path) -> dict[str, Any]:
    """One EP in a child process; returns the child's status plus outputs (or a crash/timeout)."""
    folder = workdir / provider
    folder.mkdir()
    request = {
        "model": str(model),
        "provider": provider,
        "provider_options": _provider_options(options, provider),
        "custom_op_library": str(options.custom_op_library) if options.custom_op_library else None,
        "inputs": str(feeds_path),
        "results": str(folder / "results.npz"),
        "status": str(folder / "status.json"),
        "runs": options.runs,
        "profile": options.profile,
        "workdir": str(folder),
    }
    (folder / "request.json").write_text(json.dumps(request), encoding="utf-8")
    child = run_child("ortprep.runtime.load_worker", folder / "request.json", timeout=options.timeout)
    if child.timed_out:
        return {"status": "timeout", "message": f"no answer within {options.timeout:g} s (hung in ORT or the EP)"}
    status_path = folder / "status.json"
    if child.returncode != 0 or not status_path.exists():
        return {"status": "crashed", "message": f"the process running {provider} died ({child.how_it_died()})"}
    status = json.loads(status_path.read_text(encoding="utf-8"))
    if status.get("ok"):
        with np.load(folder / "results.npz", allow_pickle=False) as data:
            status["outputs"] = {name: data[f"o{i}"] for i, name in enumerate(status["output_names"])}
    return status


def _compare(reference: dict[str, np.ndarray] | None, outputs: dict[str, np.ndarray]) -> tuple[bool | None, float | None]:
    if reference is None:
        return None, None
    worst, match = 0.0, True
    for name, value in reference.items():
        other = outputs.get(name)
        if other is None:
            return False, None
        diff = compare_arrays(name, value, other)
        if not diff.shape_match or diff.max_abs_diff is None:
            return False, None
        scale = max(1.0, float(np.abs(value).max())) if value.size and value.dtype.kind == "f" else 1.0
        tolerance = TOLERANCE.get(str(other.dtype), 1e-3) if value.dtype.kind == "f" else 0.0
        worst = max(worst, diff.max_abs_diff)
        if diff.nonfinite or diff.max_abs_diff > tolerance * scale:
            match = False
    return match, worst


def _prediction_findings(analysis: ModelAnalysis, spec: EpSpec, assignment: dict[str, str]) -> list[Finding]:
    """Where ORT's placement disagrees with what `check` predicted for this EP."""
    from ortprep.steps.check import check_target

    record, _ = check_target(analysis, (spec,))
    predicted_fallback = set(record["fallback_nodes"])
    findings = []
    for node, ep in sorted(assignment.items()):
        on_cpu = ep == "CPUExecutionProvider" and spec.provider != "CPUExecutionProvider"
        if on_cpu and node not in predicted_fallback:
            findings.append(Finding.of(
                "LOD001", f"node '{node}' ran on the CPU, but check predicted it on {spec.name}", node=node, ep=spec.name,
                fix="a gap in ortprep's table or rules for this EP: please report it with the model",
            ))
        elif not on_cpu and node in predicted_fallback:
            findings.append(Finding.of(
                "LOD001", f"node '{node}' ran on {ep}, but check predicted a CPU fallback", node=node, ep=spec.name,
                fix="a gap in ortprep's table or rules for this EP: please report it with the model",
            ))
    return findings


def load_on_eps(handle: ModelHandle, options: LoadOptions) -> StepResult:
    """Run the model on each requested (or every available) EP and report per EP."""
    if handle.path is None:
        raise UsageError("load needs a model file")
    available = available_providers()
    if options.eps:
        wanted = []
        for name in options.eps:
            provider = resolve_ep(name).provider
            if provider not in wanted:
                wanted.append(provider)
    else:
        wanted = list(available)
    specs = input_specs(handle.proto)
    feeds = load_feeds(options.inputs, specs) if options.inputs else random_feeds(specs, seed=0, shapes=options.shapes)
    report = StepResult(step="load", schema=SCHEMA)
    results = []
    with tempfile.TemporaryDirectory(prefix="ortprep-load-") as tmp:
        workdir = Path(tmp)
        feeds_path = workdir / "inputs.npz"
        np.savez(feeds_path, **feeds)
        cpu = "CPUExecutionProvider"
        raw: dict[str, dict] = {}
        order = ([cpu] if cpu in available else []) + [p for p in wanted if p != cpu]
        for provider in order:
            if provider in available:
                raw[provider] = run_ep(handle.path, provider, feeds_path, options, workdir)
        reference = raw.get(cpu, {}).get("outputs") if raw.get(cpu, {}).get("ok") else None
        analysis: ModelAnalysis | None = None
        for provider in wanted:
            spec = spec_for_provider(provider)
            name = spec.name if spec else provider
            if provider not in available:
                hint = spec.install_hint if spec else "install an ONNX Runtime build with it"
                message = f"{provider} is not available in this ONNX Runtime ({', '.join(available)}); {hint}"
                results.append({"ep": name, "provider": provider, "status": "unavailable", "message": message})
                report.add(Finding.of("LOD002", f"{name}: {provider} is not available here", ep=name, fix=hint))
                report.missing.append(message)
                continue
            if analysis is None:
                analysis = ModelAnalysis(handle)  # shared by every EP's comparison with check
            results.append(_result(analysis, name, spec, provider, raw[provider], reference, options, report))
    report.data = {"model": str(handle.path), "available": available, "results": results}
    return report


def _result(analysis, name, spec, provider, status, reference, options, report) -> dict[str, Any]:
    record: dict[str, Any] = {"ep": name, "provider": provider}
    if status.get("status") in ("crashed", "timeout"):
        record.update(status=status["status"], message=status["message"])
        report.add(Finding.of("LOD003", f"{name}: {status['message']}", ep=name,
                              fix="run ortprep check MODEL --ep " + name + " and ortprep doctor; the other EPs were still tested"))
        return record
    if not status.get("ok"):
        record.update(status="failed", message=status.get("error") or status.get("strict", {}).get("error", "failed"))
        report.add(Finding.of("LOD004", f"{name}: session creation or the run failed: {record['message']}", ep=name,
                              fix=f"ortprep check MODEL --ep {name} explains unsupported parts"))
        return record
    assignment = status.get("assignment", {})
    on_ep = [n for n, ep in assignment.items() if ep == provider]
    fallback = sorted(n for n, ep in assignment.items() if ep != provider)
    strict_ok = status["strict"]["ok"]
    match, max_abs = (None, None) if provider == "CPUExecutionProvider" else _compare(reference, status["outputs"])
    latencies = status.get("latency_ms", [])
    record.update(
        status="ok" if strict_ok and not fallback else "fallback",
        message="" if strict_ok else f"with CPU fallback disabled: {status['strict'].get('error', '')}",
        nodes_total=len(assignment) or None,
        nodes_on_ep=len(on_ep) if assignment else None,
        fallback_nodes=fallback,
        outputs_match=match,
        max_abs_diff=max_abs,
        nonfinite_outputs=status.get("nonfinite", []),
        latency_ms={"median": statistics.median(latencies), "p90": float(np.percentile(latencies, 90))} if latencies else None,
    )
    if "profile" in status:
        record["profile"] = status["profile"]
    if record["status"] == "fallback":
        listed = f" ({', '.join(fallback[:5])}{', ...' if len(fallback) > 5 else ''})" if fallback else ""
        report.add(Finding.of("LOD005", f"{name}: {len(fallback)} node(s) fell back to the CPU{listed}", ep=name,
                              fix=f"ortprep check MODEL --ep {name} lists what to change",
                              severity=Severity.ERROR if options.no_fallback else Severity.WARNING))
    if match is False:
        report.add(Finding.of("LOD006", f"{name}: outputs differ from the CPU EP's beyond tolerance (max abs diff {max_abs})", ep=name,
                              fix="compare per output with --json; check precision settings of the EP"))
    if record["nonfinite_outputs"]:
        report.add(Finding.of("LOD007", f"{name}: NaN or Inf in outputs {', '.join(record['nonfinite_outputs'])}", ep=name,
                              fix="check the inputs (--inputs) and FP16 overflow (ortprep convert --fp16 reports it)"))
    if spec is not None and assignment:
        for finding in _prediction_findings(analysis, spec, assignment):
            report.add(finding)
    return record


class LoadStep(Step):
    name = "load"
    Options = LoadOptions
    progress_label = "loading on each EP"
    needs_ort = "always"

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return load_on_eps(model, self.options)
