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
