"""ortprep doctor [--scan PATH]"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import FailOn, FailOnOpt, JsonOpt
from ortprep.cli.output import emit
from ortprep.errors import ExitCode, UsageError


@error_boundary
def doctor_command(
    scan: Annotated[Path | None, typer.Option("--scan", help="Read the Python and requirements files under PATH for ORT pitfalls (never runs them).", show_default=False)] = None,
    json_output: JsonOpt = False,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """This machine's ONNX Runtime setup: packages, EPs, GPU libraries, CPU int8 support, pitfalls."""
    from ortprep.render.console import render_doctor
    from ortprep.steps.doctor import doctor, scan as scan_path

    if scan is not None and not scan.exists():
        raise UsageError(f"nothing to scan at {scan}", hint="pass a folder or a .py file")
    step = scan_path(scan) if scan is not None else doctor()
    emit(step.to_record(), as_json=json_output, human=render_doctor)
    if step.fails(fail_on.severity()):
        raise typer.Exit(int(ExitCode.GATE_FAILED))


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
