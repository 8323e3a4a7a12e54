from __future__ import annotations

import json
from dataclasses import dataclass

from typer.testing import CliRunner

from ortprep.cli.app import app


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


def invoke(*args: str, env: dict | None = None) -> CliResult:
    """Run the CLI in-process through Typer's CliRunner, stdout and stderr kept apart."""
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)
