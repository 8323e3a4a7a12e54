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


def check_report_path(report_path: Path | None, model_path: Path) -> Path | None:
    """Validate --report before any work: never the model itself, even with --force."""
    if report_path is None:
        return None
    from ortprep.model import check_output_path

    return check_output_path(report_path, input_path=model_path, force=False)


def write_report(report_path: Path | None, record: dict[str, Any]) -> None:
    if report_path is not None:
        from ortprep.model import atomic_write_bytes

        atomic_write_bytes(report_path, dumps(record).encode("utf-8"))


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


def run_transform(
    step_function: Callable[[Any], Any],
    model: Path,
    *,
    verify: bool,
    report: Path | None,
    json_output: bool,
    fail_on,
    label: str,
) -> None:
    """Shared tail of convert/simplify/optimize: open, run with a spinner, render, gate."""
    import typer

    from ortprep.errors import ExitCode
    from ortprep.model import ModelHandle
    from ortprep.render.console import render_transform
    from ortprep.runtime.providers import require_ort

    report_path = check_report_path(report, model)
    if verify:
        require_ort()
    handle = ModelHandle.open(model)
    with progress_for(label, quiet=json_output):
        step = step_function(handle)
    record = step.to_record()
    write_report(report_path, record)
    emit(record, as_json=json_output, human=render_transform)
    if step.fails(fail_on.severity()):
        raise typer.Exit(int(ExitCode.GATE_FAILED))


@contextlib.contextmanager
def progress_bar(*, quiet: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A Rich progress bar on stderr fed by ``callback(stage, done, total)``; None when quiet."""
    if not interactive(quiet):
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("ortprep: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr_console(), transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def callback(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield callback
