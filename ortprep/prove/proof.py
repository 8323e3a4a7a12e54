"""Proven verdicts (`check --prove`): where an EP runs here, the session a user's application
would create is built on a worker, and its outcome is the verdict: the EP's own placement next
to the tables' prediction, or, when the session cannot be created, "none" with the EP's words.

A QNN session is built for the target's device (--device, else ortprep's stated default: see
eps/devices.py), which the report names: the outcome depends on it. A session that is not created
is reduced to the nodes that cause it (:mod:`ortprep.prove.culprits`) and a fix is measured
(:mod:`ortprep.prove.fixes`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortprep.analysis import ModelAnalysis
from ortprep.graphops import has_unnamed_nodes
from ortprep.eps.registry import EpSpec, resolve_ep
from ortprep.findings import Finding
from ortprep.options import CheckOptions
from ortprep.report import StepResult
from ortprep.runtime.kernels import support_table
from ortprep.runtime.requests.sessions import EP_RUN_FALLBACK
from ortprep.runtime.targets import ep_runtime, session_options
from ortprep.prove.culprits import reduce_failure
from ortprep.prove.fixes import find_fix

# (stage, done, total), as a step's progress callback
ProgressCallback = Callable[[str, int, int], None]

# Per-node findings, besides EP0xx, that predict a CPU fallback: where the real session put the
# node on the EP they are contradicted and go (docs/decisions/reduce-prove-bounds.md).
NODE_FALLBACK_CODES = ("QNN002",)


def compare_prediction(analysis: ModelAnalysis, spec: EpSpec, predicted: dict[str, Any], assignment: dict[str, str],
                       subgraphs: list[list], predicted_on_ep: set[str] | None = None
                       ) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A target's predicted record (check) next to a real session's assignment for the same file:
    (the comparison, the differing nodes as (node, op type, what differs)). ``predicted_on_ep``:
    the nodes check placed on the EP (steps/check.py: predicted_ep_nodes), to name those the
    session's graph no longer holds."""
    predicted_fallback = set(predicted["fallback_nodes"])
    op_of = {node.name: node.op_type for node in analysis.all_nodes()}
    compared = agree = 0
    differing_ops: dict[str, int] = {}
    differing = []
    for node, ep in sorted(assignment.items()):
        if node not in op_of:
            continue  # a node the optimizer made; check never saw it
        compared += 1
        on_cpu = ep == "CPUExecutionProvider" and spec.provider != "CPUExecutionProvider"
        if on_cpu == (node in predicted_fallback):
            agree += 1
            continue
        differing_ops[op_of[node]] = differing_ops.get(op_of[node], 0) + 1
        what = (f"node '{node}' ({op_of[node]}) ran on the CPU, but check predicted it on {spec.name}" if on_cpu
                else f"node '{node}' ({op_of[node]}) ran on {ep}, but check predicted a CPU fallback")
        differing.append((node, op_of[node], what))
    on_ep = sum(1 for ep in assignment.values() if ep == spec.provider)
    # nodes check placed on the EP that the session's graph no longer holds: ORT's optimizer removed
    # or fused them before the EP was asked (a Shape of a dynamic input, folded constants), so a
    # verdict can differ with no node placed otherwise
    absent = sorted(name for name in (predicted_on_ep or ()) if name not in assignment) if assignment else []
    actual_verdict = "none" if on_ep == 0 else "full" if on_ep == len(assignment) else "partial"
    if support_table(spec.name).granularity == "kernel":
        # A kernel EP (CUDA, DirectML, XNNPACK) lists each node as its own subgraph in the record; its
        # partitions are the groups its nodes form, counted the way check counts them.
        actual_partitions = _kernel_partitions(analysis, assignment, spec.provider)
    else:
        actual_partitions = sum(1 for ep, _ in subgraphs if ep == spec.provider)
    comparison = {
        "nodes_compared": compared,
        "node_agreement": round(agree / compared, 4) if compared else None,
        "predicted_partitions": predicted["partitions"],
        "actual_partitions": actual_partitions,
        "predicted_verdict": predicted["verdict"],
        "actual_verdict": actual_verdict,
        "differing_op_types": dict(sorted(differing_ops.items(), key=lambda kv: -kv[1])),
        "predicted_on_ep_absent": absent,
    }
    return comparison, differing


def _kernel_partitions(analysis: ModelAnalysis, assignment: dict[str, str], provider: str) -> int:
    from ortprep.eps.partition import CPU, FOLDED, partition_graph

    total = 0
    for graph in analysis.graphs:
        placed = [FOLDED if node.name not in assignment else (0 if assignment[node.name] == provider else CPU)
                  for node in graph.nodes]
        total += partition_graph(graph.graph, placed).partitions
    return total


def prove_targets(analysis: ModelAnalysis, result: StepResult, options: CheckOptions,
                  progress: ProgressCallback | None = None,
                  ep_nodes: Callable[[dict[str, Any]], set[str]] | None = None) -> None:
    """Build each target's real session where its EP runs here and make its outcome the verdict
    (``results[].proof``, ``results[].predicted_verdict``); findings PRV001-PRV003. ``analysis`` is
    the one check predicted from. A session that is not created is reduced to its culprit nodes and
    a fix is measured (``proof.culprit``, ``proof.fix``), reported through ``progress``."""
    from ortprep.runtime.requests import Prove
    from ortprep.runtime.worker import call

    handle = analysis.handle
    for record in result.data["results"]:
        label = record["ep"]
        record["predicted_verdict"] = record["verdict"]
        if "," in label:
            record["proof"] = {"status": "not proven", "message": "a priority list of several EPs; prove each EP alone"}
            continue
        spec = resolve_ep(label)
        target = ep_runtime(spec, options.runtimes)
        if not target.available:
            where = f"the environment of {target.python}" if target.python else "this environment"
            record["proof"] = {"status": "unavailable", "message": f"{spec.provider} does not run in {where}"}
            result.add(Finding.of("PRV003", f"{label}: the EP does not run here, so the verdict stays a prediction",
                                  ep=label, target=label, fix=spec.install_hint))
            continue
        chosen = session_options(target, options.provider_options, options.device)
        # what a printed fix names: this model, and the EP's own environment where it is not this one
        model_arg = shlex.quote(str(handle.path))
        runtime_arg = f" --runtime {label}={shlex.quote(str(target.python))}" if target.python else ""

        reply = call(Prove(model=os.path.abspath(handle.path), provider=spec.provider, provider_options=chosen,
                           plugin=target.plugin, verbose_record=spec.provider == "QNNExecutionProvider", run_once=True,
                           label_unnamed=has_unnamed_nodes(handle.graph)),
                     python=target.python, timeout=options.timeout)
        proof: dict[str, Any] = {"status": "created" if reply.ok else reply.status, "provider_options": chosen,
                                 "run": reply.placement.get("run")}
        record["proof"] = proof
        if not reply.ok and reply.stage == "run":
            # created, then the EP failed to run it: the application is not on the EP either
            proof.update(status="run failed", message=reply.message)
            record["verdict"] = "none"
            culprit_text, found = _reduce_and_fix(handle, spec, target, label, chosen, proof, options, progress,
                                                  run_once=True)
            fix = found or (f"ortprep load {model_arg} --ep {label}{runtime_arg} --inputs SAMPLE.npz shows the same "
                            f"failure; keep the failing part off the EP (ortprep convert {model_arg} --keep-off-ep "
                            "NODE) or try another device or precision")
            result.add(Finding.of("PRV002", f"{label}: the real session is created, and its first run fails on the EP "
                                  f"({reply.message}); check predicted '{record['predicted_verdict']}'; "
                                  f"{EP_RUN_FALLBACK}{culprit_text}", ep=label, target=label, fix=fix))
            continue
        if not reply.ok:
            proof["message"] = reply.message
            record["verdict"] = "none"
            fix = f"ortprep load {model_arg} --ep {label}{runtime_arg} shows the same failure with its log"
            culprit_text = ""
            if reply.status == "failed":
                culprit_text, found = _reduce_and_fix(handle, spec, target, label, chosen, proof, options, progress)
                if found:
                    fix = found
            result.add(Finding.of("PRV002", f"{label}: the real session is not created ({reply.message}); check "
                                  f"predicted '{record['predicted_verdict']}'{culprit_text}", ep=label, target=label,
                                  fix=fix))
            continue
        default = reply.placement.get("default", {})
        assignment, subgraphs = default.get("assignment", {}), default.get("subgraphs", [])
        comparison, differing = compare_prediction(analysis, spec, record, assignment, subgraphs,
                                                   ep_nodes(record) if ep_nodes else None)
        proof.update(nodes_total=len(assignment),
                     nodes_on_ep=sum(1 for ep in assignment.values() if ep == spec.provider),
                     fallback_nodes=sorted(node for node, ep in assignment.items() if ep != spec.provider),
                     comparison=comparison)
        record["verdict"] = comparison["actual_verdict"]
        # The tables' findings that the real session contradicts go: a node they sent to the CPU that
        # the EP took, and the coverage finding of a target the EP takes whole. PRV001 names them.
        on_ep = {node for node, ep in assignment.items() if ep == spec.provider}
        result.findings = [f for f in result.findings if f.target != label or not (
            ((f.code.startswith("EP") or f.code in NODE_FALLBACK_CODES) and f.node in on_ep)
            or (f.code in ("EP006", "EP007") and comparison["actual_verdict"] == "full"))]
        if differing or comparison["actual_verdict"] != comparison["predicted_verdict"]:
            shown = ", ".join(node for node, _, _ in differing[:5]) + (", ..." if len(differing) > 5 else "")
            absent = comparison["predicted_on_ep_absent"]
            gone = ""
            if absent and not differing and comparison["actual_verdict"] != comparison["predicted_verdict"]:
                gone = (f"; {len(absent)} node(s) check placed on {label} are not in the session's graph (ORT's "
                        f"optimizer removed or fused them first): " + ", ".join(absent[:5])
                        + (", ..." if len(absent) > 5 else ""))
            result.add(Finding.of(
                "PRV001", f"{label}: the real session's verdict is '{comparison['actual_verdict']}' (check predicted "
                f"'{comparison['predicted_verdict']}'); {len(differing)} node(s) placed otherwise"
                + (f": {shown}" if shown else "") + gone, ep=label, target=label,
                fix="the proven verdict counts; please report the model so the tables learn it"))


def session_caller(spec: EpSpec, target, timeout: float, run_once: bool = False):
    """``session(model_path, provider_options)``: the session a user's application creates for
    ``spec`` (in ``target``'s environment, on a worker, no run), answered as (created?, the EP's
    message, ORT's assignment {node: EP} when created): what the culprit search and the fix
    search build their sessions with."""
    from ortprep.runtime.requests import Prove
    from ortprep.runtime.worker import call

    def session(path: str, provider_options: dict[str, str]):
        reply = call(Prove(model=os.path.abspath(path), provider=spec.provider, provider_options=provider_options,
                           plugin=target.plugin, run_once=run_once), python=target.python, timeout=timeout)
        return reply.ok, reply.message, reply.placement.get("default", {}).get("assignment") if reply.ok else None

    return session


def _reduce_and_fix(handle, spec: EpSpec, target, label: str, chosen: dict[str, str], proof: dict[str, Any],
                    options: CheckOptions, progress: ProgressCallback | None, run_once: bool = False
                    ) -> tuple[str, str | None]:
    """The failing session reduced to its culprit sets (prove/culprits.py, bounded), then the fix
    measured: provider options first, then the culprits kept off the EP (``convert
    --keep-off-ep``). Fills ``proof.culprit`` and ``proof.fix``; returns (the text PRV002 adds,
    the command that works or None)."""
    import tempfile

    # a run failure is reduced and fixed by sessions that are run once too (made-up inputs)
    session = session_caller(spec, target, options.timeout, run_once=run_once)

    def fails(path: str) -> tuple[bool, str]:
        created, message, _ = session(path, chosen)
        return not created, message

    def stage(name: str):
        return None if progress is None else (lambda done, total: progress(f"{label}: {name}", done, total))

    culprit = reduce_failure(handle, fails, message=proof["message"], progress=stage("reducing the failing session"))
    proof["culprit"] = culprit
    if not culprit["culprits"]:
        why = culprit.get("reason") or culprit.get("stopped") or "no culprit found"
        return (f"; no smaller part of the graph was found that fails alone ({why}; {culprit['probes']} probe "
                f"sessions, {culprit['seconds']} s)"), None
    shown = "; ".join(", ".join(_node_text(node) for node in culprit["nodes"] if node["name"] in group["nodes"])
                      for group in culprit["culprits"][:3])
    more = f" and {len(culprit['culprits']) - 3} more" if len(culprit["culprits"]) > 3 else ""
    text = (f"; {len(culprit['culprits'])} node set(s) fail alone: {shown}{more} ({culprit['probes']} probe sessions, "
            f"{culprit['seconds']} s)")
    # A device the user named stays: another SoC is no fix for their phone. ortprep's default is
    # a guess, so a SoC on which the session works is worth saying.
    named = options.device is not None or any(key in options.provider_options.get(spec.name, {})
                                             for key in ("soc_model", "htp_arch"))
    args = (["--device", options.device] if options.device else []) + [
        f"--provider-option={label}:{key}={value}"
        for key, value in options.provider_options.get(spec.name, {}).items()]
    args += [f"--runtime={name}={python}" for name, python in options.runtimes.items()]
    with tempfile.TemporaryDirectory(prefix="ortprep-fix-") as workdir:
        fix = find_fix(handle, culprit, session, provider=spec.provider, provider_options=chosen, ep_label=label,
                       workdir=workdir, command_args=args, keep_device=named, progress=stage("measuring a fix"),
                       timeout=options.timeout)
    if fix.get("kind") == "graph":
        # the measured rewrite was a temporary file: the command makes it again, verified
        output = Path(handle.path).with_name(f"{Path(handle.path).stem}.off-ep.onnx")
        fix["command"] = shlex.join(["ortprep", "convert", str(handle.path),
                                     *[f"--keep-off-ep={name}" for name in fix["kept_off"]], "-o", str(output)])
        fix["then"] = shlex.join(["ortprep", "check", str(output), "--ep", label, "--prove", *args])
        fix.pop("model", None)
    proof["fix"] = fix
    if fix.get("kind") is None:
        return text + f"; no fix found ({fix.get('reason')})", None
    what = (f"provider option {', '.join(f'{k}={v}' for k, v in fix['options'].items())}"
            if fix["kind"] == "provider_option" else f"keeping {', '.join(fix['kept_off'])} off the EP")
    return text + f"; measured fix: {what} makes the session work ({fix['sessions']} sessions, {fix['seconds']} s)", \
        fix["command"] + (f"; then {fix['then']}" if fix.get("then") else "")


def _node_text(node: dict[str, Any]) -> str:
    attributes = node.get("attributes", {})
    extra = "".join(f", {key} {attributes[key]}" for key in ("strides", "group", "axes") if key in attributes)
    return f"{node['name']} ({node['op_type']} {', '.join(node.get('inputs', []))}{extra})"
