"""ortprep run / init / diff / merge: the CI gate of a model repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ortprep.cli.boundary import error_boundary
from ortprep.cli.options import JsonOpt, ReportOpt

JunitOpt = Annotated[Path | None, typer.Option("--junit", help="Also write a JUnit XML report here.",
                                               show_default=False, metavar="FILE")]
MarkdownOpt = Annotated[Path | None, typer.Option(
    "--markdown", help="Also write a Markdown summary here (appended to $GITHUB_STEP_SUMMARY when that is set).",
    show_default=False, metavar="FILE")]
HtmlOpt = Annotated[Path | None, typer.Option("--html", help="Also write one self-contained HTML page per model here.",
                                              show_default=False, metavar="DIR")]


@error_boundary
def run_command(
    config: Annotated[Path, typer.Argument(help="ortprep.toml, a pyproject.toml with [tool.ortprep], or their folder.",
                                           show_default=False, metavar="CONFIG")] = Path("."),
    jobs: Annotated[int, typer.Option("-j", "--jobs", help="Models run in parallel (worker processes).", min=1,
                                      metavar="N")] = 1,
    shard: Annotated[str | None, typer.Option("--shard",
                                              help="Run only shard K of N of the model x target pairs (K/N).",
                                              show_default=False, metavar="K/N")] = None,
    baseline: Annotated[Path | None, typer.Option("--baseline", help="Fail on regressions against this stored report.",
                                                  show_default=False, metavar="FILE")] = None,
    tolerance: Annotated[float, typer.Option("--tolerance",
                                             help="Accuracy regressions smaller than this are ignored.",
                                             metavar="X")] = 0.001,
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    junit: JunitOpt = None,
    markdown: MarkdownOpt = None,
    html: HtmlOpt = None,
) -> None:
    """Run every model x target x step of a config; exit 1 when a step, a gate or the baseline fails."""
    from ortprep.baseline import read_report
    from ortprep.cli.output import execute
    from ortprep.config import is_repo_config, parse_repository, read_raw
    from ortprep.pipeline import Pipeline, parse_shard, run_repository

    raw, text = read_raw(config)
    if not is_repo_config(raw):
        if jobs != 1 or shard or baseline or html:
            from ortprep.errors import UsageError

            raise UsageError("-j, --shard, --baseline and --html need a repository config ([[models]], [targets])",
                             hint="see docs/pipeline.md, or write one with: ortprep init")
        code = execute(Pipeline.from_dict(raw, text.path), as_json=json_output, report=report, junit=junit,
                       markdown=markdown)
        if code:
            raise typer.Exit(code)
        return
    parsed = parse_repository(raw, text)
    old = read_report(baseline) if baseline else None
    from ortprep.cli.output import progress_bar

    with progress_bar(quiet=json_output) as progress:
        result = run_repository(parsed, jobs=jobs, shard=parse_shard(shard), baseline=old, tolerance=tolerance,
                                progress=progress, draw_graph=html is not None)
    raise typer.Exit(finish(result.to_records(), json_output=json_output, report=report, junit=junit, markdown=markdown,
                            html=html))


def finish(document: dict[str, Any], *, json_output: bool, report: Path | None, junit: Path | None,
           markdown: Path | None, html: Path | None) -> int:
    """Write the report files, print the summary (or the JSON), annotate GitHub Actions; the exit code."""
    from ortprep.cli.output import dumps, emit
    from ortprep.model import atomic_write_bytes
    from ortprep.render.repo import (
        annotations,
        render_repo_console,
        render_repo_junit,
        render_repo_markdown,
    )

    if report is not None:
        atomic_write_bytes(report, dumps(document).encode("utf-8"))
    if junit is not None:
        atomic_write_bytes(junit, render_repo_junit(document).encode("utf-8"))
    text = render_repo_markdown(document)
    if markdown is not None:
        atomic_write_bytes(markdown, text.encode("utf-8"))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as out:
            out.write(text)
    if html is not None:
        from ortprep.render.html import repo_pages

        html.mkdir(parents=True, exist_ok=True)
        from ortprep.pipeline import with_graphs

        for name, page in repo_pages(with_graphs(document)).items():  # shards run without --html too
            atomic_write_bytes(html / name, page.encode("utf-8"))
    emit(document, as_json=json_output, human=lambda record, console: render_repo_console(record, console))
    if os.environ.get("GITHUB_ACTIONS") == "true" and not json_output:
        for line in annotations(document):
            sys.stdout.write(line + "\n")
    from ortprep.report import exit_code

    return int(exit_code(document["runs"], bool(document.get("regressions"))))


@error_boundary
def init_command(
    folder: Annotated[Path, typer.Argument(help="The repository to scan for .onnx files.", metavar="DIR")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing ortprep.toml.")] = False,
) -> None:
    """Write a starter ortprep.toml for the models found, with targets this machine can run."""
    from ortprep.errors import UsageError
    from ortprep.starter import starter_config

    path = folder / "ortprep.toml"
    if path.exists() and not force:
        raise UsageError(f"{path} exists", hint="pass --force to replace it")
    from ortprep.model import atomic_write_bytes

    atomic_write_bytes(path, starter_config(folder).encode("utf-8"))
    sys.stderr.write(f"ortprep: wrote {path}; run it with: ortprep run {folder}\n")


@error_boundary
def diff_command(
    old: Annotated[Path, typer.Argument(help="The earlier report (ortprep run --report).", metavar="OLD")],
    new: Annotated[Path, typer.Argument(help="The later report.", metavar="NEW")],
    json_output: JsonOpt = False,
) -> None:
    """Which nodes moved between the EP and the CPU, and why; and every regression. Exit 1 on regressions."""
    from ortprep.baseline import diff, read_report
    from ortprep.cli.output import emit
    from ortprep.render.repo import render_diff_console

    document = diff(read_report(old), read_report(new))
    emit(document, as_json=json_output, human=render_diff_console)
    raise typer.Exit(1 if document["regressions"] else 0)


@error_boundary
def merge_command(
    reports: Annotated[list[Path], typer.Argument(help="The shards' reports (ortprep run --shard K/N --report FILE).",
                                                       metavar="REPORT...")],
    json_output: JsonOpt = False,
    report: ReportOpt = None,
    junit: JunitOpt = None,
    markdown: MarkdownOpt = None,
    html: HtmlOpt = None,
) -> None:
    """Combine shard reports into one JSON, JUnit, Markdown and HTML; exit 1 when any pair failed."""
    from ortprep.baseline import merge, read_report

    document = merge([(str(p), read_report(p)) for p in reports])
    raise typer.Exit(finish(document, json_output=json_output, report=report, junit=junit, markdown=markdown,
                            html=html))


@error_boundary
def hook_command(
    files: Annotated[list[Path], typer.Argument(help="Changed .onnx files (pre-commit passes them).",
                                                     metavar="MODEL...")],
    config: Annotated[Path, typer.Option("--config", help="The repository's config (or its folder).",
                                                metavar="CONFIG")] = Path("."),
) -> None:
    """For pre-commit: run the repository's config on the changed models only; exit 1 when one fails."""
    from ortprep.config import load_repository
    from ortprep.pipeline import run_repository

    parsed = load_repository(config)
    wanted = {Path(f).resolve() for f in files}
    parsed.models = [m for m in parsed.models if m.path in wanted]
    if not parsed.models:
        sys.stderr.write("ortprep: none of the changed files is a model of the config\n")
        raise typer.Exit(0)
    document = run_repository(parsed).to_records()
    raise typer.Exit(finish(document, json_output=False, report=None, junit=None, markdown=None, html=None))


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("init")(init_command)
    app.command("diff")(diff_command)
    app.command("merge")(merge_command)
    app.command("hook")(hook_command)
