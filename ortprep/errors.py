"""Typed errors raised by the library, and the exit codes the CLI maps them to.

Library code raises these; only ``ortprep.cli`` turns them into a message and an exit code.
Every message says what is wrong, where, and what to do next, on one line.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes CI jobs can rely on (documented in docs/cli.md)."""

    OK = 0
    GATE_FAILED = 1
    BAD_INPUT = 2
    ENVIRONMENT = 3
    INTERNAL = 4


class OrtprepError(Exception):
    """Base class of every error ortprep raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message and the hint, joined into the single line a user sees."""
        if self.hint:
            return f"{self.message}; {self.hint}"
        return self.message


class UsageError(OrtprepError):
    """Bad arguments or a bad configuration."""

    exit_code = ExitCode.BAD_INPUT


class ModelReadError(OrtprepError):
    """A model (or its external data) that cannot be read or is not safe to read."""

    exit_code = ExitCode.BAD_INPUT


class UnsafeExternalDataError(ModelReadError):
    """An external-data location that leaves the model's folder."""


class OutputPathError(UsageError):
    """An output path that cannot or must not be written."""


class EnvironmentMissingError(OrtprepError):
    """The environment lacks what was asked: ONNX Runtime, an EP, an optional package."""

    exit_code = ExitCode.ENVIRONMENT
