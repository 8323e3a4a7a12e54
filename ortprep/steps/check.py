"""check: will this model run on that EP, wholly or with CPU fallbacks, and what must change?

Works from the support tables and rules alone, so it answers for EPs that are not installed.
Reads no weight bytes. The per-target prediction lives in ortprep/prediction.py (load reads it too).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ortprep.analysis import ModelAnalysis
from ortprep.eps.devices import device_table, has_devices, resolve_device
from ortprep.eps.partition import cached_topologies, graph_view, partition_groups
from ortprep.eps.registry import EPS, EpSpec, resolve_target
from ortprep.findings import Finding
from ortprep.model import ModelHandle
from ortprep.options import CheckOptions
from ortprep.prediction import _collector_paused, check_target, predicted_ep_nodes
from ortprep.report import StepResult
from ortprep.runtime.kernels import support_table
from ortprep.runtime.shapes import symbolic_infer
from ortprep.steps.base import Step, StepContext

log = logging.getLogger(__name__)

SCHEMA = "ortprep.check/2"
EPS_SCHEMA = "ortprep.eps/1"


def check_model(handle: ModelHandle, targets: list[str], ort_version: str | None = None,
                analysis: ModelAnalysis | None = None, device: str | None = None,
                provider_options: dict[str, dict[str, str]] | None = None) -> StepResult:
    """Check a model against each target. A target is an EP name, or a comma-separated priority
    list for one session ("openvino-cpu,dml"). ``analysis``: the model's, when the caller has it;
    ``device`` (--device) and ``provider_options`` name the device of targets that have one."""
    resolved = [resolve_target(text) for text in targets]  # UsageError before any work
    with _collector_paused():
        return _check_model(handle, resolved, ort_version, analysis or ModelAnalysis(handle, strict_inference=True,
                                                                              symbolic_infer=symbolic_infer),
                            device, provider_options)


def _check_model(handle: ModelHandle, resolved: list[tuple[EpSpec, ...]], ort_version: str | None,
                 analysis: ModelAnalysis, device: str | None,
                 provider_options: dict[str, dict[str, str]] | None) -> StepResult:
    report = StepResult(step="check", schema=SCHEMA)
    results = []
    shown = str(handle.path) if handle.path else "MODEL"
    static_fix = static_shape_fix(analysis, shown)
    with cached_topologies():  # check reads the graphs, never changes them: their edges are read once
        for target in resolved:
            chosen = resolve_device(target[0].name, device, (provider_options or {}).get(target[0].name)) \
                if len(target) == 1 and has_devices(target[0].name) else None
            record, findings = check_target(analysis, target, ort_version, chosen)
            if any(spec.name in ("dml", "dml-npu") for spec in target):
                outside = {f.node for f in findings if f.code in ("DML001", "DML002") and f.node}
                record["fused_nodes"] = record["supported_nodes"] - len(outside)
            results.append(record)
            for finding in findings:
                report.add(_pasteable(rewrite_fix(finding, analysis, shown), shown, static_fix))
    report.data = {"model": str(handle.path) if handle.path else None, "results": results}
    return report


def static_shape_fix(analysis: ModelAnalysis, model: str) -> str | None:
    """A convert command that makes every dynamic input static, with sizes guessed from the
    dimension names (batch 1, sequence 128) and an image's layout (spatial 640), or None when all
    are static. A dim none of these tells is a placeholder in capitals (its own name, else the
    input's and the axis: STATE_DIM1), since a made-up number there was a wrong fix
    (docs/decisions/seams-static-shape-placeholders.md)."""
    import re

    from ortprep.runtime.feeds import BATCH_LIKE, SEQUENCE_LIKE

    parts = []
    placeholders: list[str] = []
    for name, facts in analysis.graph_inputs():
        if facts.shape is None or all(isinstance(d, int) and d > 0 for d in facts.shape):
            continue
        dims = []
        for index, dim in enumerate(facts.shape):
            if isinstance(dim, int) and dim > 0:
                dims.append(dim)
            elif index == 0 or (isinstance(dim, str) and BATCH_LIKE.search(dim)):
                dims.append(1)
            elif isinstance(dim, str) and SEQUENCE_LIKE.search(dim):
                dims.append(128)
            elif len(facts.shape) == 4 and index >= 2:
                dims.append(640)
            else:
                word = re.sub(r"[^A-Za-z0-9]+", "_", dim).strip("_").upper() if isinstance(dim, str) else ""
                if not word or word[0].isdigit():  # unnamed: the input's name and the axis
                    word = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper() + f"_DIM{index}"
                if not word[0].isalpha():  # an input named '0': a placeholder starts with a letter
                    word = "SIZE_" + word
                dims.append(word)
                if word not in placeholders:
                    placeholders.append(word)
        parts.append(f"--fix-shape {name}={','.join(map(str, dims))}")
    if not parts:
        return None
    stem = model.removesuffix(".onnx")
    told = f"{', '.join(placeholders)}: your size{'s' if len(placeholders) > 1 else ''}; " if placeholders else ""
    return f"ortprep convert {model} {' '.join(parts)} -o {stem}.static.onnx ({told}pick the sizes you deploy with)"


# Fallbacks a decomposition may get past: an op the EP's table lacks (EP001), a Clip QNN takes
# only with constant bounds (QNN010).
REWRITE_CODES = ("EP001", "QNN010")


def rewrite_fix(finding: Finding, analysis: ModelAnalysis, model: str) -> Finding:
    """An EP001 (or QNN010) whose node (of the main graph) has a decomposition into ops the EP's table takes at
    the model's opset: its fix is the convert command that applies it (transforms/decompose)."""
    if finding.code not in REWRITE_CODES or not finding.ep or not finding.node:
        return finding
    from ortprep.transforms.decompose.apply import decomposition_for

    opset = analysis.opsets.get("ai.onnx")
    chosen = decomposition_for(analysis, finding.node, support_table(finding.ep), opset) if opset else None
    if chosen is None:
        return finding
    stem = model.removesuffix(".onnx")
    return dataclasses.replace(finding, fix=(
        f"ortprep convert {model} --rewrite-for {finding.ep} -o {stem}.{finding.ep}.onnx rewrites it as "
        f"{chosen.summary} ({', '.join(chosen.produces)}: ops {finding.ep} takes), verified; or accept the CPU "
        "fallback"))


def _pasteable(finding: Finding, model: str, static_fix: str | None) -> Finding:
    """A fix the user can paste: the real model path, and real inputs and sizes for static shapes."""
    fix = finding.fix
    if fix and finding.code in ("SHP001", "DML001", "QNN002") and static_fix:
        fix = static_fix + ("; then fold constant inputs: ortprep simplify" if finding.code == "DML001" else "")
    elif fix:
        fix = fix.replace("MODEL.", model.removesuffix(".onnx") + ".").replace("MODEL", model)
    return dataclasses.replace(finding, fix=fix)


def list_eps() -> dict[str, Any]:
    """The EPs ortprep knows, each with its table's source and version."""
    entries = []
    for spec in EPS:
        table = support_table(spec.name)
        entries.append(
            {
                "name": spec.name,
                "aliases": list(spec.aliases),
                "provider": spec.provider,
                "device": spec.device,
                "description": spec.description,
                "source": table.summary(),
                "version": table.version(),
                "ops": len(table.entries),
            }
        )
        devices = [row for row in device_table() if row["ep"] == spec.name]
        if devices:
            entries[-1]["devices"] = [{k: v for k, v in row.items() if k != "ep"} for row in devices]
    return {"schema": EPS_SCHEMA, "eps": entries}


def share_gate(result: StepResult, options: CheckOptions, model: str) -> None:
    """PRV004 where a target's EP runs none of the model in the real session (--prove), or less
    than --min-share: of the real session's nodes where it was proven, else of the tables'
    prediction. A session that is not created is PRV002 already."""
    from ortprep.prove.share import share_fix, share_shortfall

    for record in result.data["results"]:
        label, proof = record["ep"], record.get("proof") or {}
        if proof.get("status") == "created":
            short = share_shortfall(label, proof["nodes_on_ep"], proof["nodes_total"], proof["fallback_nodes"],
                                    options.min_share, where="the real session")
        elif options.min_share is not None and proof.get("status") in (None, "unavailable", "not proven"):
            short = share_shortfall(label, record["supported_nodes"], record["nodes"], record["fallback_nodes"],
                                    options.min_share, where="check's prediction from its tables")
        else:
            continue
        if short is not None and label != "cpu":
            result.add(Finding.of("PRV004", short, ep=label, target=label, fix=share_fix(label, model)))


class CheckStep(Step):
    name = "check"
    Options = CheckOptions
    reports_progress = True  # --prove: reducing a failing session and measuring its fix draw a bar

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        with _collector_paused():
            # once: the prediction and the proof both read it; strict inference spares the checker its own
            analysis = ModelAnalysis(model, strict_inference=True, symbolic_infer=symbolic_infer)
        result = check_model(model, self.options.eps, self.options.ort_version, analysis, self.options.device,
                             self.options.provider_options)
        if self.options.prove:
            from ortprep.prove.proof import prove_targets

            prove_targets(analysis, result, self.options, ctx.progress,
                          ep_nodes=lambda record: predicted_ep_nodes(analysis, record))
        share_gate(result, self.options, str(model.path) if model.path else "MODEL")
        if self.options.html is not None or self.options.graph:
            # What the placement page draws, as data: the renderer reads the report, not the model.
            result.data["graph"] = graph_view(model.graph)
            for record in result.data["results"]:
                record["partition_groups"] = partition_groups(model.graph, record["fallback_nodes"])
        return result
