"""The Typer application: global options and command registration. The error boundary every
command is wrapped in lives in ortprep.cli.boundary."""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer

from ortprep.cli.boundary import Terminated
from ortprep.cli.words import WordsGroup
from ortprep.version import __version__

app = typer.Typer(
    name="ortprep",
    help="Prepare ONNX models for ONNX Runtime execution providers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=WordsGroup,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"ortprep {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _global(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More log output on stderr.")] = 0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Prepare ONNX models for ONNX Runtime execution providers."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="ortprep: %(levelname)s: %(message)s")


def _list_eps(kwargs: dict[str, Any]) -> bool:
    """check --list-eps answers without a model."""
    from ortprep.cli.output import emit
    from ortprep.render.console import render_eps
    from ortprep.steps.check import list_eps

    if kwargs.pop("list_eps", False):
        emit(list_eps(), as_json=kwargs["json_output"], human=render_eps)
        return True
    return False


def _register() -> None:
    import inspect

    from ortprep.cli import package as package_cmd
    from ortprep.cli import run as run_cmd
    from ortprep.cli.commands import build_command
    from ortprep.steps import REGISTRY

    list_eps = inspect.Parameter("list_eps", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--list-eps", help="List the EPs and their tables' sources, and exit."))
    for name in REGISTRY:
        if name == "check":
            app.command(name)(build_command(name, extra=[list_eps], before=_list_eps))
        elif name == "load":
            app.command(name)(build_command(name, extra=[package_cmd.PACKAGE_PARAMETER],
                                            before=package_cmd.load_package_hook))
        else:
            app.command(name)(build_command(name))
    run_cmd.register(app)
    package_cmd.register(app)


_register()


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


def main() -> None:
    """Console-script entry point."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    app()
