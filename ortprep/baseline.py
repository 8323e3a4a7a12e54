"""Between repository reports: merging shards, regressions against a baseline, and diffs (which
nodes moved between the EP and the CPU, and why). All of it reads records, never a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortprep.errors import UsageError
from ortprep.report import RUN_SCHEMA, placement_of, repository_document, step_report


def merge(documents: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One document from the shards' documents; a pair reported twice is an error."""
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    config = None
    for name, document in documents:
        if document.get("schema") != RUN_SCHEMA or document.get("kind") != "repository":
            raise UsageError(f"{name} is not a repository run report ({RUN_SCHEMA}, kind repository)",
                             hint="merge the --report files of `ortprep run` shards")
        config = config or document.get("config")
        for run in document["runs"]:
            key = (run["model"], run["target"])
            if key in runs:
                raise UsageError(f"{name}: {run['model']} x {run['target']} is in two reports",
                                 hint="merge reports of different shards of one run")
            runs[key] = run
    return repository_document(config, list(runs.values()), merged_from=[name for name, _ in documents])


def _accuracy(run: dict[str, Any]) -> dict[str, float]:
    found = {}
    for step in run.get("steps", []):
        report = step.get("report") or {}
        cosine = (report.get("verify") or {}).get("cosine")
        if cosine is not None:
            found[step["name"]] = cosine
    return found


def _sizes(run: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: s["report"]["size_after"] for s in run.get("steps", [])
            if s.get("report") and s["report"].get("size_after") is not None}


def _latency(run: dict[str, Any]) -> dict[str, float]:
    found = {}
    for step in run.get("steps", []):
        for result in (step.get("report") or {}).get("results", []) if step["run"] == "load" else []:
            median = (
                (result.get("latency_ms") or {}).get("median") if isinstance(result.get("latency_ms"), dict) else None
            )
            if median is not None:
                found[f"{step['name']} {result['ep']}"] = median
    return found


def _reasons(run: dict[str, Any]) -> dict[str, str]:
    """Node name -> why it is where it is, from the check's findings for this target."""
    check = step_report(run.get("steps", []), "check")
    reasons = {}
    for finding in (check or {}).get("findings", []):
        if finding.get("node") and finding.get("target") in (None, run["ep"]):
            reasons.setdefault(finding["node"], f"{finding['code']}: {finding['message']}")
    return reasons


def compare(old: dict[str, Any], new: dict[str, Any], tolerance: float = 0.001) -> list[dict[str, Any]]:
    """Regressions from ``old`` to ``new`` per model x target: coverage dropped, nodes moved to
    the CPU, more partitions, accuracy worse by more than ``tolerance``, a written model grown,
    latency worse by more than 10%."""
    before = {(r["model"], r["target"]): r for r in old.get("runs", [])}
    found = []
    for run in new.get("runs", []):
        key = (run["model"], run["target"])
        if key not in before:
            continue
        earlier = before[key]
        a, b = placement_of(earlier), placement_of(run)

        def add(kind: str, detail: str, **extra: Any) -> None:
            found.append({"model": run["model"], "target": run["target"], "kind": kind, "detail": detail, **extra})

        if a and b:
            if (b.get("node_share") or 0) < (a.get("node_share") or 0) - 1e-9:
                add("coverage", f"nodes on {run['ep']}: {a['node_share']:.1%} -> {b['node_share']:.1%}")
            if (b.get("mac_share") or 0) < (a.get("mac_share") or 0) - 1e-9:
                add("coverage", f"MACs on {run['ep']}: {a['mac_share']:.1%} -> {b['mac_share']:.1%}")
            moved = sorted(set(b.get("fallback_nodes", [])) - set(a.get("fallback_nodes", [])))
            if moved:
                reasons = _reasons(run)
                add("fallback", f"{len(moved)} node(s) moved from {run['ep']} to the CPU: " + ", ".join(moved[:10]),
                    nodes=[{"node": n, "reason": reasons.get(n, "")} for n in moved])
            if b.get("partitions", 0) > a.get("partitions", 0):
                add("partitions", f"EP partitions {a['partitions']} -> {b['partitions']}")
        for step, cosine in _accuracy(earlier).items():
            now = _accuracy(run).get(step)
            if now is not None and now < cosine - tolerance:
                add("accuracy", f"{step}: lowest cosine {cosine:.5f} -> {now:.5f}")
        for step, size in _sizes(earlier).items():
            now = _sizes(run).get(step)
            if now is not None and now > size:
                add("size", f"{step}: {size} -> {now} bytes")
        for where, ms in _latency(earlier).items():
            now = _latency(run).get(where)
            if now is not None and now > ms * 1.10:
                add("latency", f"{where}: {ms:.3f} -> {now:.3f} ms")
    return found


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Everything that moved between two reports (both directions), with the regressions."""
    before = {(r["model"], r["target"]): r for r in old.get("runs", [])}
    moves = []
    for run in new.get("runs", []):
        earlier = before.get((run["model"], run["target"]))
        a, b = (placement_of(earlier) if earlier else None), placement_of(run)
        if not a or not b:
            continue
        to_cpu = sorted(set(b.get("fallback_nodes", [])) - set(a.get("fallback_nodes", [])))
        to_ep = sorted(set(a.get("fallback_nodes", [])) - set(b.get("fallback_nodes", [])))
        reasons_new, reasons_old = _reasons(run), _reasons(earlier)
        for node in to_cpu:
            moves.append({"model": run["model"], "target": run["target"], "node": node, "from": run["ep"], "to": "cpu",
                          "reason": reasons_new.get(node, "")})
        for node in to_ep:
            moves.append({"model": run["model"], "target": run["target"], "node": node, "from": "cpu", "to": run["ep"],
                          "reason": f"no longer: {reasons_old.get(node, '')}".rstrip(": ")})
    return {"schema": "ortprep.diff/1", "moves": moves, "regressions": compare(old, new)}


def read_report(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"report not found: {path}", hint="write one with: ortprep run --report FILE")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a JSON report: {exc}", hint="pass a file written by --report") from None
    if document.get("schema") != RUN_SCHEMA or document.get("kind") != "repository":
        raise UsageError(
            f"{path} is not a repository run report", hint="pass a file written by: ortprep run --report FILE"
        )
    return document
