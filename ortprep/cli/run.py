"""ortprep run ortprep.toml: the pipeline a model repository's CI runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ortprep.cli.app import error_boundary
from ortprep.cli.options import JsonOpt, ReportOpt


@error_boundary
def run_command(
    config: Annotated[Path, typer.Argument(help="The pipeline file (TOML).", show_default=False)] = Path("ortprep.toml"),
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write a JUnit XML report here.", show_default=False)] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Also write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).", show_default=False)] = None,
) -> None:
    """Run the steps of a pipeline file; exit 1 when a step fails its gate."""
    from ortprep.cli.output import execute
    from ortprep.pipeline import Pipeline

    code = execute(Pipeline.from_toml(config), as_json=json_output, report=report, junit=junit, markdown=markdown)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
