"""ortprep run ortprep.toml: the pipeline a model repository's CI runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import JsonOpt
from ortprep.cli.output import emit, progress_bar
from ortprep.errors import ExitCode


@error_boundary
def run_command(
    config: Annotated[Path, typer.Argument(help="The pipeline file (TOML).", show_default=False)] = Path("ortprep.toml"),
    json_output: JsonOpt = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write a JUnit XML report here.", show_default=False)] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Also write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).", show_default=False)] = None,
) -> None:
    """Run the steps of a pipeline file; exit 1 when a step fails its gate."""
    from ortprep.model import atomic_write_bytes, check_output_path
    from ortprep.pipeline import PipelineConfig, run_pipeline
    from ortprep.render.console import render_run
    from ortprep.render.junit import render_junit
    from ortprep.render.markdown import render_markdown

    pipeline = PipelineConfig.load(config)
    for target in (junit, markdown):
        if target is not None:
            check_output_path(target, input_path=pipeline.model)
    with progress_bar(quiet=json_output) as progress:
        record = run_pipeline(pipeline, progress=progress)
    if junit is not None:
        atomic_write_bytes(junit, render_junit(record).encode("utf-8"))
    if markdown is not None:
        atomic_write_bytes(markdown, render_markdown(record).encode("utf-8"))
    emit(record, as_json=json_output, human=render_run)
    if not record["passed"]:
        raise typer.Exit(int(ExitCode.GATE_FAILED))


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
