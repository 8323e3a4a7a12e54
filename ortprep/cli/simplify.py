"""ortprep simplify MODEL and ortprep optimize MODEL"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import (
    FailOn,
    FailOnOpt,
    ForceOpt,
    InputsOpt,
    JsonOpt,
    KeepFailedOpt,
    ModelArg,
    OutputOpt,
    ReportOpt,
    ShapeOpt,
    VerifyOpt,
)
from ortprep.cli.output import run_transform


class Level(str, Enum):
    basic = "basic"
    extended = "extended"
    all = "all"


def _shapes(shape):
    from ortprep.runtime.feeds import parse_assignments, parse_dims

    return {k: parse_dims(v) for k, v in parse_assignments(shape, "--shape").items()}


@error_boundary
def simplify_command(
    model: ModelArg,
    output: OutputOpt = None,
    onnxsim: Annotated[bool, typer.Option("--onnxsim/--no-onnxsim", help="Use onnxsim (constant folding, shape inference).")] = True,
    skip_pass: Annotated[list[str] | None, typer.Option("--skip-pass", help="onnxoptimizer pass to leave out (repeatable).", show_default=False)] = None,
    shape: ShapeOpt = None,
    inputs: InputsOpt = None,
    verify: VerifyOpt = True,
    keep_failed: KeepFailedOpt = False,
    force: ForceOpt = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """Constant folding and graph clean-up (onnxsim + onnxoptimizer), verified with a tight tolerance."""
    from ortprep.steps.simplify import SimplifyOptions, simplify_model

    options = SimplifyOptions(
        verify=verify, shapes=_shapes(shape), inputs=inputs, keep_failed=keep_failed, force=force,
        use_onnxsim=onnxsim, skip_passes=list(skip_pass or []),
    )
    run_transform(lambda handle: simplify_model(handle, output, options)[0], model, verify=verify, report=report,
                  json_output=json_output, fail_on=fail_on, label="simplifying")


@error_boundary
def optimize_command(
    model: ModelArg,
    output: OutputOpt = None,
    level: Annotated[Level, typer.Option("--level", help="ORT graph optimization level.", case_sensitive=False)] = Level.extended,
    shape: ShapeOpt = None,
    inputs: InputsOpt = None,
    verify: VerifyOpt = True,
    keep_failed: KeepFailedOpt = False,
    force: ForceOpt = False,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """ONNX Runtime offline graph optimization, written beside the output and verified."""
    from ortprep.runtime.providers import require_ort
    from ortprep.steps.optimize import OptimizeOptions, optimize_model

    require_ort()
    options = OptimizeOptions(
        verify=verify, shapes=_shapes(shape), inputs=inputs, keep_failed=keep_failed, force=force, level=level.value
    )
    run_transform(lambda handle: optimize_model(handle, output, options)[0], model, verify=verify, report=report,
                  json_output=json_output, fail_on=fail_on, label="optimizing")


def register(app: typer.Typer) -> None:
    app.command("simplify")(simplify_command)
    app.command("optimize")(optimize_command)
