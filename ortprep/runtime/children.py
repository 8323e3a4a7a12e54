"""The one place that starts child processes. ORT runs, the quantizer and per-EP loads each go
through :func:`run_child`, so a crash or a hang in native code becomes a status, never ortprep's
own death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ChildResult:
    returncode: int | None  # None: killed after the timeout
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def how_it_died(self) -> str:
        if self.returncode is None:
            return "timeout"
        if self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return f"exit code {self.returncode}"


def run_child(
    module: str,
    request: Path,
    *,
    timeout: float,
    cwd: Path | None = None,
    poll: Callable[[], None] | None = None,
    stderr_file: Path | None = None,
    python: str | None = None,
) -> ChildResult:
    """Run ``python -m module request`` and wait at most ``timeout`` seconds. ``poll`` is called
    about ten times a second while it runs (e.g. to feed a progress bar). stderr is kept in a file
    (never a pipe nobody reads while polling). ``python`` runs the child under another interpreter
    (an environment with another ONNX Runtime flavour); ortprep's own package is put on its path."""
    log_path = stderr_file or request.with_suffix(".stderr.txt")
    env = {**os.environ, "PYTHONFAULTHANDLER": "0"}
    if python is not None:
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with open(log_path, "w", encoding="utf-8") as err:
        child = subprocess.Popen(
            [python or sys.executable, "-m", module, str(request)], cwd=cwd, stdout=subprocess.DEVNULL, stderr=err,
            env=env,
        )
        started = time.monotonic()
        try:
            while child.poll() is None:
                if time.monotonic() - started > timeout:
                    child.kill()
                    child.wait()
                    return ChildResult(None, log_path.read_text(encoding="utf-8", errors="replace"))
                if poll is not None:
                    poll()
                time.sleep(0.05)
        except BaseException:
            # Interrupted (Ctrl-C) or failed while waiting: leave no orphan behind.
            child.kill()
            child.wait()
            raise
    return ChildResult(child.returncode, log_path.read_text(encoding="utf-8", errors="replace"))
