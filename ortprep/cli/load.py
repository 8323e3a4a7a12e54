"""ortprep load MODEL [--ep EP ...]"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import FailOn, FailOnOpt, InputsOpt, JsonOpt, ModelArg, ReportOpt, ShapeOpt
from ortprep.cli.output import check_report_path, emit, progress_for, write_report
from ortprep.errors import ExitCode, UsageError


def _provider_options(items: list[str] | None) -> dict[str, dict[str, str]]:
    from ortprep.eps.registry import resolve_ep

    result: dict[str, dict[str, str]] = {}
    for item in items or []:
        ep, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not sep or not eq or not key:
            raise UsageError(f"bad --provider-option '{item}'", hint="write it as EP:KEY=VALUE, e.g. cuda:device_id=0")
        result.setdefault(resolve_ep(ep).provider, {})[key] = value
    return result


@error_boundary
def load_command(
    model: ModelArg,
    ep: Annotated[list[str] | None, typer.Option("--ep", help="EP to test (repeatable); default: every available one.", show_default=False)] = None,
    inputs: InputsOpt = None,
    shape: ShapeOpt = None,
    runs: Annotated[int, typer.Option("--runs", help="Timed runs after the warm-up.", min=1)] = 10,
    provider_option: Annotated[list[str] | None, typer.Option("--provider-option", help="EP:KEY=VALUE (repeatable).", show_default=False)] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per EP before it counts as hung.")] = 300.0,
    no_fallback: Annotated[bool, typer.Option("--no-fallback", help="Fail when any node falls back to the CPU.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="ORT's profiler: the ten ops taking the most time, per EP.")] = False,
    custom_op_library: Annotated[Path | None, typer.Option("--custom-op-library", help="Register this custom-op library in every session.", show_default=False)] = None,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    fail_on: FailOnOpt = FailOn.error,
) -> None:
    """Load and run the model on each available EP: fallbacks, crashes, output match, latency."""
    import sys

    from ortprep.model import ModelHandle
    from ortprep.render.console import render_load
    from ortprep.runtime.feeds import parse_assignments, parse_dims
    from ortprep.steps.load import LoadOptions, load_model

    options = LoadOptions(
        eps=list(ep or []),
        inputs=inputs,
        shapes={k: parse_dims(v) for k, v in parse_assignments(shape, "--shape").items()},
        runs=runs,
        provider_options=_provider_options(provider_option),
        timeout=timeout,
        no_fallback=no_fallback,
        profile=profile,
        custom_op_library=custom_op_library,
    )
    report_path = check_report_path(report, model)
    handle = ModelHandle.open(model)
    with progress_for("loading on each EP", quiet=json_output):
        step = load_model(handle, options)
    record = step.to_record()
    write_report(report_path, record)
    emit(record, as_json=json_output, human=render_load)
    unavailable = [r for r in record["results"] if r["status"] == "unavailable"]
    if unavailable:
        for result in unavailable:
            sys.stderr.write(f"ortprep: error: {result['message']}\n")
        raise typer.Exit(int(ExitCode.ENVIRONMENT))
    if step.fails(fail_on.severity()):
        raise typer.Exit(int(ExitCode.GATE_FAILED))


def register(app: typer.Typer) -> None:
    app.command("load")(load_command)
