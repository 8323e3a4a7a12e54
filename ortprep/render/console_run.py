"""Which renderer draws each step's record, and a pipeline's summary: pure functions of the report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ortprep.render.console import add_column, render_causes, render_check, render_doctor, render_inspect, render_load
from ortprep.render.console_writes import render_compile, render_quantize, render_transform


STEP_RENDERERS = {
    "inspect": render_inspect,
    "check": render_check,
    "convert": render_transform,
    "simplify": render_transform,
    "optimize": render_transform,
    "quantize": render_quantize,
    "load": render_load,
    "doctor": render_doctor,
    "compile": render_compile,
}


def render_step(run: str, record: dict[str, Any], console: Console) -> None:
    STEP_RENDERERS[run](record, console)


def render_run_report(records: dict[str, Any], console: Console, *, single: bool = False) -> None:
    """A command's own report, or a pipeline's summary table and each step's findings."""
    if single and len(records["steps"]) == 1 and records["steps"][0]["report"] is not None:
        step = records["steps"][0]
        render_step(step["run"], step["report"], console)
        return
    render_run(records, console)


def render_run(record: dict[str, Any], console: Console) -> None:
    verdict = "[green]passed[/]" if record["passed"] else "[red]failed[/]"
    console.print(f"[bold]{escape(str(record['config']))}[/]: {verdict}")
    table = Table(title="Pipeline")
    for column in ("step", "result", "errors", "warnings", "model"):
        add_column(table, column)
    for step in record["steps"]:
        findings = step["report"]["findings"] if step["report"] else []
        style = {"passed": "green", "failed": "red", "skipped": "dim"}[step["status"]]
        table.add_row(
            escape(step["name"]), f"[{style}]{step['status']}[/]",
            str(sum(1 for f in findings if f["severity"] == "error")),
            str(sum(1 for f in findings if f["severity"] == "warning")),
            escape((step["model"] or "-").rsplit("/", 1)[-1]),
        )
    console.print(table)
    for step in record["steps"]:
        if step["report"] and step["report"]["findings"]:
            console.print(f"\n[bold]{escape(step['name'])}[/]")
            render_causes(step["report"]["findings"], console)
