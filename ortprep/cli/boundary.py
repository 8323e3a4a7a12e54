"""The error boundary of every command: exceptions become one line on stderr and an exit code,
through ERROR_TABLE (most specific first). A traceback is shown only with ORTPREP_DEBUG=1."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer

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

    finding = Finding.of("RUN001", message,
                         fix="see the message; ORTPREP_DEBUG=1 shows the traceback of an internal error")
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


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so that temp files and child processes are cleaned up
    on the way out as they are for Ctrl-C (not an Exception: library code must not swallow it)."""
