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

from ortprep import __version__
from ortprep.errors import ExitCode, OrtprepError

F = TypeVar("F", bound=Callable[..., Any])


def _ortprep_error(exc: BaseException) -> tuple[str, ExitCode]:
    assert isinstance(exc, OrtprepError)
    return exc.one_line(), exc.exit_code


def _memory_error(exc: BaseException) -> tuple[str, ExitCode]:
    return "out of memory; try a smaller model, fewer samples, or a machine with more memory", ExitCode.ENVIRONMENT


def _internal_error(exc: BaseException) -> tuple[str, ExitCode]:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"internal error ({type(exc).__name__}{': ' + detail[:200] if detail else ''}); "
        "rerun with ORTPREP_DEBUG=1 for the traceback and report it",
        ExitCode.INTERNAL,
    )


# Ordered: the first matching type decides the message and the exit code.
ERROR_TABLE: list[tuple[type[BaseException], Callable[[BaseException], tuple[str, ExitCode]]]] = [
    (OrtprepError, _ortprep_error),
    (MemoryError, _memory_error),
    (Exception, _internal_error),
]


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
            sys.stderr.write("ortprep: interrupted\n")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - this is the boundary
            for exc_type, describe in ERROR_TABLE:
                if isinstance(exc, exc_type):
                    message, code = describe(exc)
                    break
            if debug_enabled():
                traceback.print_exc(file=sys.stderr)
            sys.stderr.write(f"ortprep: error: {message}\n")
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


def _register() -> None:
    from ortprep.cli import check as check_cmd
    from ortprep.cli import convert as convert_cmd
    from ortprep.cli import doctor as doctor_cmd
    from ortprep.cli import inspect as inspect_cmd
    from ortprep.cli import load as load_cmd
    from ortprep.cli import quantize as quantize_cmd
    from ortprep.cli import run as run_cmd
    from ortprep.cli import simplify as simplify_cmd

    inspect_cmd.register(app)
    check_cmd.register(app)
    convert_cmd.register(app)
    simplify_cmd.register(app)
    quantize_cmd.register(app)
    load_cmd.register(app)
    doctor_cmd.register(app)
    run_cmd.register(app)


_register()


def main() -> None:
    """Console-script entry point."""
    app()
