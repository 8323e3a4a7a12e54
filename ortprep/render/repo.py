"""Renderers of a repository run (ortprep.run/2, kind repository): console summary, JUnit with
one testcase per model x step x target, Markdown for a pull request, GitHub annotations, diffs."""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ortprep.render.console import add_column
from ortprep.report import placement_of as _placement


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def failures(run: dict[str, Any]) -> list[dict[str, str]]:
    """What failed in one model x target: {"step", "reason", "fix"} for each step or gate."""
    found = []
    if run.get("error"):
        found.append({"step": "(setup)", "reason": run["error"], "fix": ""})
    for step in run.get("steps", []):
        if step["status"] != "failed":
            continue
        findings = (step.get("report") or {}).get("findings", [])
        worst = [f for f in findings if f["severity"] == "error"] or findings
        reason = f"{worst[0]['code']} {worst[0]['message']}" if worst else "the step failed"
        found.append({"step": step["name"], "reason": reason, "fix": (worst[0].get("fix") or "") if worst else ""})
    for gate in run.get("gates", []):
        if not gate["passed"]:
            found.append(
                {
                    "step": f"gate {gate['gate']} ({gate['step']})",
                    "reason": gate["reason"],
                    "fix": "move the nodes named back onto the EP (ortprep check MODEL --ep EP shows why they fall "
                    "back), or relax the gate in the config",
                }
            )
    for regression in run.get("regressions", []):
        found.append({"step": f"baseline ({regression['kind']})", "reason": regression["detail"], "fix": ""})
    return found


def _with_regressions(document: dict[str, Any]) -> list[dict[str, Any]]:
    runs = [dict(r) for r in document["runs"]]
    for run in runs:
        run["regressions"] = [g for g in document.get("regressions", [])
                              if g["model"] == run["model"] and g["target"] == run["target"]]
    return runs


def render_repo_console(document: dict[str, Any], console: Console) -> None:
    summary = document["summary"]
    title = f"ortprep run: {summary['passed']}/{summary['pairs']} model x target passed"
    if document.get("shard"):
        title += f" (shard {document['shard']})"
    table = Table(title=title)
    for column in ("model", "target", "steps", "gates", "result"):
        add_column(table, column)
    for run in _with_regressions(document):
        steps = " ".join(f"{s['run']}:{'ok' if s['status'] == 'passed' else s['status']}" for s in run.get("steps", []))
        gates = ", ".join(f"{g['gate']}{'' if g['passed'] else ' FAIL'}" for g in run.get("gates", [])) or "-"
        result = "[green]pass[/]" if run["passed"] and not run["regressions"] else "[red]FAIL[/]"
        table.add_row(
            escape(run["model"]), run["target"], escape(steps or (run.get("error") or "")[:60]), escape(gates), result
        )
    console.print(table)
    for run in _with_regressions(document):
        for failure in failures(run):
            console.print(f"[red]FAIL[/] {escape(run['model'])} on {run['target']}: {escape(failure['step'])}: "
                          f"{escape(failure['reason'])}", highlight=False)
            if failure["fix"]:
                console.print(f"       fix: {escape(failure['fix'])}", highlight=False)


def render_repo_junit(document: dict[str, Any]) -> str:
    """One testsuite per model x target, one testcase per step (gates judged on the step they
    read: a failing placement gate fails the check testcase), plus one for the baseline."""
    runs = _with_regressions(document)
    root = ElementTree.Element("testsuites", name="ortprep")
    total = failed = 0
    for run in runs:
        suite = ElementTree.SubElement(root, "testsuite", name=f"{run['model']} [{run['target']}]")
        cases = []
        for step in run.get("steps", []):
            reasons = []
            if step["status"] == "failed":
                findings = (step.get("report") or {}).get("findings", [])
                worst = [f for f in findings if f["severity"] == "error"] or findings
                reasons.append(f"{worst[0]['code']} {worst[0]['message']}" if worst else "the step failed")
            reasons += [f"gate {g['gate']}: {g['reason']}" for g in run.get("gates", [])
                        if not g["passed"] and g["step"] == step["run"]]
            cases.append((step["name"], step["run"], step["status"], reasons))
        if run.get("error"):
            cases.append(("setup", "setup", "failed", [run["error"]]))
        if run["regressions"]:
            cases.append(("baseline", "baseline", "failed", [g["detail"] for g in run["regressions"]]))
        for name, kind, status, reasons in cases:
            total += 1
            case = ElementTree.SubElement(suite, "testcase", classname=f"ortprep.{run['target']}.{kind}",
                                          name=f"{run['model']} :: {name} :: {run['target']}")
            if reasons:
                failed += 1
                failure = ElementTree.SubElement(case, "failure", message=reasons[0][:500])
                failure.text = "\n".join(reasons)
            elif status == "skipped":
                ElementTree.SubElement(case, "skipped", message="an earlier step failed")
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c[3])))
    root.set("tests", str(total))
    root.set("failures", str(failed))
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def render_repo_markdown(document: dict[str, Any]) -> str:
    summary = document["summary"]
    runs = _with_regressions(document)
    verdict = "passed" if document["passed"] else "failed"
    lines = [f"## ortprep: {verdict} ({summary['passed']} of {summary['pairs']} model x target passed)", ""]
    bad = [(run, f) for run in runs for f in failures(run)]
    if bad:
        lines += ["| model | target | where | reason | fix |", "|---|---|---|---|---|"]
        for run, failure in bad:
            lines.append(
                f"| `{_cell(run['model'])}` | {run['target']} | {_cell(failure['step'])} | {_cell(failure['reason'])} "
                f"| {_cell(failure['fix'])} |"
            )
        lines.append("")
    lines += [
        "<details><summary>every model x target</summary>",
        "",
        "| model | target | result | nodes on EP | partitions |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        placement = _placement(run)
        share = f"{placement['node_share']:.1%}" if placement and placement.get("node_share") is not None else "-"
        parts = placement.get("partitions", "-") if placement else "-"
        lines.append(
            f"| `{_cell(run['model'])}` | {run['target']} | "
            f"{'pass' if run['passed'] and not run['regressions'] else 'FAIL'} "
            f"| {share} | {parts} |"
        )
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _escape_command(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_command(text).replace(":", "%3A").replace(",", "%2C")


def annotations(document: dict[str, Any]) -> list[str]:
    """GitHub Actions workflow commands: one ::error per failure, on the model file."""
    lines = []
    for run in _with_regressions(document):
        for failure in failures(run):
            title = _escape_property(f"ortprep {run['target']}: {failure['step']}")
            lines.append(
                f"::error file={_escape_property(run['model'])},title={title}::{_escape_command(failure['reason'])}"
            )
    return lines


def render_diff_console(document: dict[str, Any], console: Console) -> None:
    moves = document["moves"]
    if not moves:
        console.print("no node moved between an EP and the CPU")
    else:
        table = Table(title=f"{len(moves)} node(s) moved")
        for column in ("model", "target", "node", "from -> to", "why"):
            add_column(table, column)
        for move in moves:
            table.add_row(
                escape(move["model"]),
                move["target"],
                escape(move["node"]),
                f"{move['from']} -> {move['to']}",
                escape(move["reason"]),
            )
        console.print(table)
    for regression in document["regressions"]:
        console.print(
            f"[red]regression[/] {escape(regression['model'])} on {regression['target']} ({regression['kind']}): "
            f"{escape(regression['detail'])}",
            highlight=False,
        )
