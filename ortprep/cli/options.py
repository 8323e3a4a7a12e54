"""Options shared by several commands, as Annotated types."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ortprep.findings import Severity


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"
    never = "never"

    def severity(self) -> Severity | None:
        return None if self is FailOn.never else Severity.parse(self.value)


ModelArg = Annotated[Path, typer.Argument(help="The ONNX model file.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON (the only thing on stdout).")]
FailOnOpt = Annotated[
    FailOn,
    typer.Option("--fail-on", help="Exit 1 when a finding is at or above this severity.", case_sensitive=False),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option("--report", help="Also write the JSON report to this file (atomically).", show_default=False),
]

# Options shared by the commands that write a model (convert, simplify, optimize).
OutputOpt = Annotated[
    Path | None,
    typer.Option("-o", "--output", help="Output model (default: beside the input, with a suffix).", show_default=False),
]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--shape", help="Shape of an input for the verification run: NAME=DIMS (repeatable).", show_default=False),
]
InputsOpt = Annotated[
    Path | None,
    typer.Option("--inputs", help="Verify on these inputs (.npz, one array per input).", show_default=False),
]
VerifyOpt = Annotated[bool, typer.Option("--verify/--no-verify", help="Run original and result in ORT and compare.")]
KeepFailedOpt = Annotated[bool, typer.Option("--keep-failed", help="Write the output even when verification fails.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Allow the output to overwrite the input model.")]
