"""convert's `rewrite` record: what --rewrite-for did, check's placement before and after, and the
real session's where the EP runs here (the proof), with the findings they call for (CNV018, CNV019)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ortprep.eps.registry import resolve_ep
from ortprep.findings import Finding
from ortprep.report import StepResult
from ortprep.transforms.decompose.apply import RewriteOutcome
from ortprep.transforms.decompose.placement import real_placement

SHOWN = 5


def rewrite_record(outcome: RewriteOutcome, original: Path | None, written: Path | None,
                   report: StepResult, runtimes: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record, with ``proof``: the real sessions of ``original`` and ``written`` on the EP (in
    the environment ``runtimes`` names for it, else this one; status ``proven``), or why there is
    none (``unavailable``, ``not run``)."""
    record = outcome.record()
    ep = outcome.ep
    if outcome.left:
        shown = ", ".join(f"{item['node']} ({item['op']}: {item['why']})" for item in outcome.left[:SHOWN])
        more = f", and {len(outcome.left) - SHOWN} more" if len(outcome.left) > SHOWN else ""
        report.add(Finding.of(
            "CNV018", f"--rewrite-for {ep}: {len(outcome.left)} node(s) {ep} does not take stay as they were: "
            f"{shown}{more}", ep=ep,
            fix=f"they fall back to the CPU; ortprep check MODEL --ep {ep} lists them"))
    if not outcome.rewritten:
        record["proof"] = {"status": "not run", "message": "no node was rewritten"}
        return record
    if written is None or original is None:
        record["proof"] = {"status": "not run", "message": "nothing was written" if written is None
                           else "the original is not a file"}
        return record
    spec = resolve_ep(ep)
    before = real_placement(original, spec, runtimes)
    if before["status"] == "unavailable":
        record["proof"] = before
        return record
    after = real_placement(written, spec, runtimes)
    record["proof"] = {"status": "proven" if before["status"] == after["status"] == "created" else "failed",
                       "before": before, "after": after}
    if before["status"] == "created" and after["status"] != "created":
        report.add(Finding.of(
            "CNV019", f"--rewrite-for {ep}: the real {ep} session of the rewritten model is not created "
            f"({after.get('message')}), the original's is", ep=ep,
            fix="keep the original; please report the model so the tables learn what the EP takes"))
    elif after["status"] == "created":
        prefixes = tuple(f"{item['node']}." for item in outcome.rewritten)
        stayed = [name for name in after["cpu_nodes"] if name.startswith(prefixes)]
        if stayed:
            report.add(Finding.of(
                "CNV019", f"--rewrite-for {ep}: the real {ep} session leaves {len(stayed)} node(s) the rewrite "
                f"made on the CPU, though {ep}'s table takes their ops: {', '.join(stayed[:SHOWN])}"
                + (", ..." if len(stayed) > SHOWN else ""), ep=ep,
                fix=f"ortprep load {shlex.quote(str(written))} --ep {ep} shows why; please report the model so "
                    "the tables learn it"))
    return record
