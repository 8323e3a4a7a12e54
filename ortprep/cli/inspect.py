"""ortprep inspect MODEL"""

from __future__ import annotations

from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import FailOn, FailOnOpt, JsonOpt, ModelArg, ReportOpt
from ortprep.cli.output import check_report_path, emit, write_report
from ortprep.errors import ExitCode


@error_boundary
def inspect_command(
    model: ModelArg,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    hash_data: Annotated[
        bool, typer.Option("--hash-data", help="Also sha256 the external-data files (reads them).")
    ] = False,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """Describe a model: opsets, I/O, ops, weights, external data. Reads no weight bytes."""
    from ortprep.model import ModelHandle
    from ortprep.render.console import render_inspect
    from ortprep.steps.inspect import inspect_model

    report_path = check_report_path(report, model)
    step = inspect_model(ModelHandle.open(model), hash_data=hash_data)
    record = step.to_record()
    write_report(report_path, record)
    emit(record, as_json=json_output, human=render_inspect)
    if step.fails(fail_on.severity()):
        raise typer.Exit(int(ExitCode.GATE_FAILED))


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect_command)
