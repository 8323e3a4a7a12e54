"""A repository target's gates (min_node_share, max_partitions, no_cpu_island, load_must_pass...)
judged from the records of the steps that measured them: pure, no model is read."""

from __future__ import annotations

from typing import Any

from ortprep.config import Target
from ortprep.report import placement_of


def judge(target: Target, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The target's gates against what the check and load steps measured (their records: this
    reads no model)."""
    gates = []
    result = proven(placement_of({"steps": steps, "ep": target.ep}))
    measured = {
        "min_node_share": ("node_share", lambda value, limit: value is not None and value >= limit),
        "min_mac_share": ("mac_share", lambda value, limit: value is None or value >= limit),
        "max_partitions": ("partitions", lambda value, limit: value <= limit),
        "max_fallback_nodes": ("fallback_nodes", lambda value, limit: len(value) <= limit),
    }
    for gate, (field_name, ok) in measured.items():
        if gate not in target.gates:
            continue
        limit = target.gates[gate]
        if result is None:
            gates.append({"gate": gate, "limit": limit, "value": None, "passed": False, "step": "check",
                          "reason": "no check step for this target ran"})
            continue
        value = result.get(field_name)
        passed = ok(value, limit)
        shown = len(value) if isinstance(value, list) else value
        reason = "" if passed else _gate_reason(gate, shown, limit, result)
        gates.append({"gate": gate, "limit": limit, "value": shown, "passed": passed, "step": "check",
                      "reason": reason})
    if target.gates.get("no_cpu_island"):
        islands = result.get("cpu_islands") if result is not None else None
        gates.append({"gate": "no_cpu_island", "limit": True, "value": islands, "passed": islands == [],
                      "step": "check",
                      "reason": "" if islands == [] else (f"CPU node(s) between EP nodes: {', '.join(islands[:5])}"
                                                          if islands else "no check step for this target ran")})
    if target.gates.get("load_must_pass"):
        load = next((s for s in steps if s["run"] == "load"), None)
        results = ((load or {}).get("report") or {}).get("results", [])
        outcome = next((r for r in results if r.get("ep") == target.ep), None)
        if load is None:
            gates.append({"gate": "load_must_pass", "limit": True, "value": None, "passed": False, "step": "load",
                          "reason": "no load step in the config: add [[steps]] run = \"load\""})
        elif load["status"] == "skipped":
            gates.append({"gate": "load_must_pass", "limit": True, "value": "skipped", "passed": False, "step": "load",
                          "reason": "the load step did not run (an earlier step failed)"})
        elif outcome is None or outcome.get("status") == "unavailable":
            gates.append({"gate": "load_must_pass", "limit": True, "value": "not available here", "passed": True,
                          "step": "load", "reason": f"{target.ep} is not available on this runner: not judged"})
        else:
            passed = outcome.get("status") == "ok"
            gates.append({"gate": "load_must_pass", "limit": True, "value": outcome.get("status"), "passed": passed,
                          "step": "load", "reason": "" if passed else f"load on {target.ep}: {outcome.get('status')}: "
                          f"{(outcome.get('message') or '')[:200]}"})
    return gates


def _gate_reason(gate: str, value: Any, limit: Any, result: dict[str, Any]) -> str:
    fallback = result.get("fallback_nodes") or []
    names = f" (CPU: {', '.join(fallback[:5])}{'...' if len(fallback) > 5 else ''})" if fallback else ""
    text = {"min_node_share": f"{value:.1%} of the nodes on the EP, below {limit:.0%}" if value is not None
            else "no node share",
            "min_mac_share": f"{value:.1%} of the MACs on the EP, below {limit:.0%}" if value is not None
            else "no MAC share",
            "max_partitions": f"{value} EP partitions, more than {limit}",
            "max_fallback_nodes": f"{value} nodes fall back to the CPU, more than {limit}"}[gate]
    return text + names


def proven(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A check result with the real session's numbers in place of the prediction where check
    --prove built it (a target with prove = true): the placement gates judge what ORT did. A
    session that was not created has nothing on the EP."""
    proof = (result or {}).get("proof")
    if not proof or proof.get("status") not in ("created", "failed", "crashed", "timeout"):
        return result
    real = dict(result)
    if proof["status"] != "created":
        real.update(node_share=0.0, mac_share=0.0, partitions=0)
        return real
    total = proof.get("nodes_total") or 0
    real.update(node_share=round(proof["nodes_on_ep"] / total, 4) if total else None,
                partitions=proof["comparison"]["actual_partitions"], fallback_nodes=proof.get("fallback_nodes", []))
    return real

