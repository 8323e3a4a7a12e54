"""One output sink: the report goes to stdout (human or JSON); everything else to stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from ortprep.render.json import dumps


def stdout_console() -> Console:
    return Console(file=sys.stdout, soft_wrap=True)


def stderr_console() -> Console:
    return Console(file=sys.stderr)


def emit(
    record: dict[str, Any],
    *,
    as_json: bool,
    human: Callable[[dict[str, Any], Console], None],
) -> None:
    if as_json:
        sys.stdout.write(dumps(record))
    else:
        human(record, stdout_console())


def interactive(quiet: bool) -> bool:
    """Progress display only on a terminal, never in CI or with --json."""
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


@contextlib.contextmanager
def progress_for(label: str, *, quiet: bool) -> Iterator[None]:
    """A spinner on stderr while long work runs (terminal only)."""
    if not interactive(quiet):
        yield
        return
    with stderr_console().status(f"ortprep: {label}..."):
        yield


@contextlib.contextmanager
def progress_bar(*, quiet: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A Rich progress bar on stderr fed by ``callback(stage, done, total)``; None when quiet."""
    if not interactive(quiet):
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("ortprep: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr_console(), transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def callback(stage: str, done: int, total: int) -> None:
            # "EP qnn: A16W8 baseline, sample 3/8": one bar per stage (before the colon), its text
            # saying what runs now
            key = stage.split(":", 1)[0]
            if key not in tasks:
                tasks[key] = bar.add_task(stage, total=total)
            bar.update(tasks[key], completed=done, total=total, description=stage)

        yield callback


def check_report_paths(paths: list[Path | None], model: Path | None) -> None:
    from ortprep.model import check_output_path

    for path in paths:
        if path is not None:
            check_output_path(path, input_path=model, force=False)


def execute(pipeline, *, as_json: bool, report: Path | None = None, junit: Path | None = None,
            markdown: Path | None = None) -> int:
    """Run a pipeline with a progress display, write the report files, print the report; returns
    the exit code."""
    from ortprep.model import atomic_write_bytes
    from ortprep.render.console_run import render_run_report
    from ortprep.render.junit import render_junit
    from ortprep.render.markdown import render_markdown

    pages = [getattr(entry.step.options, "html", None) for entry in pipeline.steps]
    check_report_paths([report, junit, markdown, *pages], pipeline.model)
    pipeline.prepare()
    single = pipeline.steps[0].step if pipeline.single_command else None
    if single is not None and not single.reports_progress:
        with progress_for(single.progress_label or f"running {single.name}",
                          quiet=as_json or single.progress_label is None):
            run_report = pipeline.run()
    else:
        with progress_bar(quiet=as_json) as progress:
            pipeline.progress = progress
            run_report = pipeline.run()
    document = run_report.document()
    if report is not None:
        atomic_write_bytes(report, dumps(document).encode("utf-8"))
    records = run_report.to_records()
    if junit is not None:
        atomic_write_bytes(junit, render_junit(records).encode("utf-8"))
    if markdown is not None:
        atomic_write_bytes(markdown, render_markdown(records).encode("utf-8"))
    emit(document, as_json=as_json,
         human=lambda _record, console: render_run_report(records, console, single=run_report.single_command))
    for message in run_report.missing:
        sys.stderr.write(f"ortprep: error: {message}\n")
    return int(run_report.exit_code())
