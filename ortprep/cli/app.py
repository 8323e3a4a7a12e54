"""The Typer application: global options, the error boundary, and command registration.

Exceptions become one line on stderr and an exit code, through ERROR_TABLE (most specific
first). A traceback is shown only with ORTPREP_DEBUG=1.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from ortprep.version import __version__
from ortprep.errors import ExitCode, OrtprepError

F = TypeVar("F", bound=Callable[..., Any])


def _ortprep_error(exc: BaseException) -> tuple[str, ExitCode]:
    assert isinstance(exc, OrtprepError)
    return exc.one_line(), exc.exit_code


def _memory_error(exc: BaseException) -> tuple[str, ExitCode]:
    return "out of memory; try a smaller model, fewer samples, or a machine with more memory", ExitCode.ENVIRONMENT


def _internal_error(exc: BaseException) -> tuple[str, ExitCode]:
    detail = " ".join(str(exc).split())
    return (
        f"internal error ({type(exc).__name__}{': ' + detail if detail else ''}); "
        "rerun with ORTPREP_DEBUG=1 for the traceback and report it",
        ExitCode.INTERNAL,
    )


# Ordered: the first matching type decides the message and the exit code.
ERROR_TABLE: list[tuple[type[BaseException], Callable[[BaseException], tuple[str, ExitCode]]]] = [
    (OrtprepError, _ortprep_error),
    (MemoryError, _memory_error),
    (Exception, _internal_error),
]


def _error_document(exc: BaseException, message: str, code: ExitCode) -> None:
    """With --json, stdout still carries one JSON document: the failure as a finding."""
    from ortprep.findings import Finding
    from ortprep.render.json import dumps

    finding = Finding.of("RUN001", message, fix="see the message; ORTPREP_DEBUG=1 shows the traceback of an internal error")
    sys.stdout.write(dumps({"schema": "ortprep.error/1", "exit_code": int(code), "error_type": type(exc).__name__,
                            "findings": [finding.to_record()]}))


def debug_enabled() -> bool:
    return os.environ.get("ORTPREP_DEBUG", "") not in ("", "0")


def error_boundary(command: F) -> F:
    """Wrap a command: map exceptions to one stderr line and an exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            sys.stderr.write("ortprep: interrupted; nothing was written\n")
            raise typer.Exit(130) from None
        except Terminated:
            sys.stderr.write("ortprep: terminated; nothing was written\n")
            raise typer.Exit(143) from None
        except Exception as exc:  # noqa: BLE001 - this is the boundary
            for exc_type, describe in ERROR_TABLE:
                if isinstance(exc, exc_type):
                    message, code = describe(exc)
                    break
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            sys.stderr.write(f"ortprep: error: {message}\n")
            if kwargs.get("json_output"):
                _error_document(exc, message, code)
            raise typer.Exit(int(code)) from None

    return wrapper  # type: ignore[return-value]


app = typer.Typer(
    name="ortprep",
    help="Prepare ONNX models for ONNX Runtime execution providers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
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

    from ortprep.cli import run as run_cmd
    from ortprep.cli.commands import build_command
    from ortprep.steps import REGISTRY

    list_eps = inspect.Parameter("list_eps", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--list-eps", help="List the EPs and their tables' sources, and exit."))
    for name in REGISTRY:
        if name == "check":
            app.command(name)(build_command(name, extra=[list_eps], before=_list_eps))
        else:
            app.command(name)(build_command(name))
    run_cmd.register(app)


_register()


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so that temp files and child processes are cleaned up
    on the way out as they are for Ctrl-C (not an Exception: library code must not swallow it)."""


def _on_sigterm(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


def main() -> None:
    """Console-script entry point."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    app()
