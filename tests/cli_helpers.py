from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


def quantize(*args) -> tuple[int, dict, str]:
    """``ortprep quantize ARGS --json``: its exit code, its record ({} when it printed none), its stderr."""
    result = invoke("quantize", *args, "--json")
    return result.exit_code, (result.json() if result.stdout.strip() else {}), result.stderr


def write_samples(folder: Path, name: str, shape: tuple, count: int, seed: int = 0) -> Path:
    """``count`` seeded N(0, 1) samples of input ``name``, one .npz each, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        np.savez(folder / f"sample{index:03d}.npz", **{name: rng.standard_normal(shape).astype(np.float32)})
    return folder
