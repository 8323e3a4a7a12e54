"""Proven verdicts (`check --prove`): where an EP runs here, the session a user's application
would create is built on a worker, and its outcome is the verdict: the EP's own placement next
to the tables' prediction, or, when the session cannot be created, "none" with the EP's words.

A QNN session is built for the target's device (--device, else ortprep's stated default: see
eps/devices.py), which the report names: the outcome depends on it. A session that is not created
is reduced to the nodes that cause it (steps/reduce.py).
"""

from __future__ import annotations

import os
from typing import Any

from ortprep.analysis import ModelAnalysis
from ortprep.eps.registry import EpSpec, resolve_ep
from ortprep.findings import Finding
from ortprep.options import CheckOptions
from ortprep.report import StepResult
from ortprep.runtime.kernels import support_table
from ortprep.runtime.targets import ep_runtime, session_options
from ortprep.steps.reduce import reduce_failure

def compare_prediction(analysis: ModelAnalysis, spec: EpSpec, predicted: dict[str, Any], assignment: dict[str, str],
                       subgraphs: list[list]) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A target's predicted record (check) next to a real session's assignment for the same file:
    (the comparison, the differing nodes as (node, op type, what differs))."""
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
        differing.append((node, op_of[node], f"node '{node}' ({op_of[node]}) ran on the CPU, but check predicted it on "
                          f"{spec.name}" if on_cpu else f"node '{node}' ({op_of[node]}) ran on {ep}, but check predicted "
                          "a CPU fallback"))
    on_ep = sum(1 for ep in assignment.values() if ep == spec.provider)
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


def prove_targets(analysis: ModelAnalysis, result: StepResult, options: CheckOptions) -> None:
    """Build each target's real session where its EP runs here and make its outcome the verdict
    (``results[].proof``, ``results[].predicted_verdict``); findings PRV001-PRV003. ``analysis`` is
    the one check predicted from."""
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
        qnn = spec.provider == "QNNExecutionProvider"

        def session(provider_options: dict[str, str]):
            return call(Prove(model=os.path.abspath(handle.path), provider=spec.provider, provider_options=provider_options,
                              plugin=target.plugin, verbose_record=qnn),
                        python=target.python, timeout=options.timeout)

        reply = session(chosen)
        proof: dict[str, Any] = {"status": "created" if reply.ok else reply.status, "provider_options": chosen}
        record["proof"] = proof
        if not reply.ok:
            proof["message"] = reply.message
            record["verdict"] = "none"
            fix = f"ortprep load MODEL --ep {label} shows the same failure with its log"
            culprit_text = ""
            if reply.status == "failed":
                def fails(path: str) -> tuple[bool, str]:
                    probe = call(Prove(model=path, provider=spec.provider, provider_options=chosen, plugin=target.plugin),
                                 python=target.python, timeout=options.timeout)
                    return probe.status == "failed", probe.message

                culprit = reduce_failure(handle, fails)
                if culprit is not None:
                    proof["culprit"] = culprit
                    if culprit["nodes"]:
                        culprit_text = "; the smallest run of nodes that fails alone: " + ", ".join(
                            f"{n['name']} ({n['op_type']} {', '.join(n['inputs'])}"
                            + (f", strides {n['attributes']['strides']}" if "strides" in n["attributes"] else "") + ")"
                            for n in culprit["nodes"][:5]) + f" ({culprit['probes']} probe sessions, {culprit['seconds']} s)"
            result.add(Finding.of("PRV002", f"{label}: the real session is not created ({reply.message}); check "
                                  f"predicted '{record['predicted_verdict']}'{culprit_text}", ep=label, target=label, fix=fix))
            continue
        default = reply.placement.get("default", {})
        assignment, subgraphs = default.get("assignment", {}), default.get("subgraphs", [])
        comparison, differing = compare_prediction(analysis, spec, record, assignment, subgraphs)
        proof.update(nodes_total=len(assignment), nodes_on_ep=sum(1 for ep in assignment.values() if ep == spec.provider),
                     fallback_nodes=sorted(node for node, ep in assignment.items() if ep != spec.provider),
                     comparison=comparison)
        record["verdict"] = comparison["actual_verdict"]
        # The tables' findings that the real session contradicts go: a node they sent to the CPU that
        # the EP took, and the coverage finding of a target the EP takes whole. PRV001 names them.
        on_ep = {node for node, ep in assignment.items() if ep == spec.provider}
        result.findings = [f for f in result.findings if f.target != label or not (
            (f.code.startswith("EP") and f.node in on_ep)
            or (f.code in ("EP006", "EP007") and comparison["actual_verdict"] == "full"))]
        if differing or comparison["actual_verdict"] != comparison["predicted_verdict"]:
            shown = ", ".join(node for node, _, _ in differing[:5]) + (", ..." if len(differing) > 5 else "")
            result.add(Finding.of(
                "PRV001", f"{label}: the real session's verdict is '{comparison['actual_verdict']}' (check predicted "
                f"'{comparison['predicted_verdict']}'); {len(differing)} node(s) placed otherwise"
                + (f": {shown}" if shown else ""), ep=label, target=label,
                fix="the proven verdict counts; please report the model so the tables learn it"))
