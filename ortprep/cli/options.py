"""Options shared by the commands that are not steps (run), and the --fail-on choice."""

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


# what --fail-on takes, shown as the option's value in --help (not Typer's <choice>)
FAIL_ON_METAVAR = "|".join(level.value for level in FailOn)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON (the only thing on stdout).")]
ReportOpt = Annotated[
    Path | None,
    typer.Option("--report", help="Also write the JSON report to this file (atomically).", show_default=False,
                 metavar="FILE"),
]
