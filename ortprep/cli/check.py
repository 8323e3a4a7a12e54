"""ortprep check MODEL --ep EP [--ep EP ...]"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import FailOn, FailOnOpt, JsonOpt, ReportOpt
from ortprep.cli.output import check_report_path, emit, write_report
from ortprep.errors import ExitCode, UsageError


@error_boundary
def check_command(
    model: Annotated[Path | None, typer.Argument(help="The ONNX model file.", show_default=False)] = None,
    ep: Annotated[
        list[str] | None,
        typer.Option(
            "--ep",
            help="Target EP (repeat for separate targets; a comma list is one session's priority list, "
            "e.g. openvino-cpu,dml).",
            show_default=False,
        ),
    ] = None,
    list_eps: Annotated[bool, typer.Option("--list-eps", help="List the EPs and their tables' sources.")] = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """Check every node against an EP's support tables and rules: partitions, fallbacks, fixes."""
    from ortprep.render.console import render_check, render_eps
    from ortprep.steps.check import check_model, list_eps as list_eps_data

    if list_eps:
        emit(list_eps_data(), as_json=json_output, human=render_eps)
        return
    if model is None:
        raise UsageError("no model given", hint="usage: ortprep check MODEL --ep EP (or ortprep check --list-eps)")
    if not ep:
        raise UsageError("no --ep given", hint="name a target, e.g. --ep dml; ortprep check --list-eps lists them")
    from ortprep.eps.registry import resolve_target
    from ortprep.model import ModelHandle

    for target in ep:
        resolve_target(target)  # bad names fail before the model is read
    report_path = check_report_path(report, model)
    step = check_model(ModelHandle.open(model), ep)
    record = step.to_record()
    write_report(report_path, record)
    emit(record, as_json=json_output, human=render_check)
    if step.fails(fail_on.severity()):
        raise typer.Exit(int(ExitCode.GATE_FAILED))


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)
