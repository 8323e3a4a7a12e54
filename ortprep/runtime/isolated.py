"""Run a model in ONNX Runtime in a child process, so a crash or a hang in ORT cannot take
ortprep down with it."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortprep.runtime.children import run_child
from ortprep.runtime.providers import require_ort

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300.0
# Lines Python's fatal-error handler adds after a crash; they say nothing about the cause.
_PYTHON_NOISE = ("Fatal Python error", "Extension modules", "Current thread", "Thread 0x", "  File ", "Python runtime state")


@dataclass
class RunOutcome:
    status: str  # "ok", "failed" (ORT raised), "crashed" (signal), "timeout"
    message: str = ""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # of the first (or only) sample
    stage: str | None = None  # where it stopped: import, session, run
    providers: list[str] = field(default_factory=list)
    samples: list[dict[str, np.ndarray]] = field(default_factory=list)  # outputs per sample
    latency_ms: list[float] = field(default_factory=list)
    # output name -> (low, high) where the graph bounds it (a Sigmoid, Softmax or Tanh makes it)
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_isolated(
    model: Path,
    feeds: dict[str, np.ndarray] | list[dict[str, np.ndarray]],
    *,
    providers: list[str] | None = None,
    outputs: list[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    optimization: str = "default",
    optimized_model: Path | None = None,
    optimized_data: str | None = None,
    latency_runs: int = 0,
) -> RunOutcome:
    """Create a session for ``model`` and run it on ``feeds`` in a child process. With
    ``optimized_model``, only create the session, letting ORT write its optimized graph there."""
    require_ort()
    feeds_list = feeds if isinstance(feeds, list) else [feeds]
    with tempfile.TemporaryDirectory(prefix="ortprep-run-") as tmp:
        folder = Path(tmp)
        inputs_list = []
        for index, sample in enumerate(feeds_list):
            np.savez(folder / f"inputs{index}.npz", **sample)
            inputs_list.append(str(folder / f"inputs{index}.npz"))
        request = {
            "model": str(model),
            "providers": providers or ["CPUExecutionProvider"],
            "inputs_list": inputs_list,
            "latency_runs": latency_runs,
            "results": str(folder / "results.npz"),
            "status": str(folder / "status.json"),
            "outputs": outputs,
            "optimization": optimization,
            "optimized_model": str(optimized_model) if optimized_model else None,
            "optimized_data": optimized_data,
        }
        (folder / "request.json").write_text(json.dumps(request), encoding="utf-8")
        child = run_child("ortprep.runtime.worker", folder / "request.json", timeout=timeout)
        if child.timed_out:
            return RunOutcome("timeout", f"no answer within {timeout:.0f} s")
        status_path = folder / "status.json"
        if child.returncode != 0 or not status_path.exists():
            stderr_tail = " ".join(
                line for line in child.stderr.strip().splitlines()[-6:] if line.strip() and not line.startswith(_PYTHON_NOISE)
            )
            return RunOutcome("crashed", f"ONNX Runtime's process died ({child.how_it_died()}){': ' + stderr_tail if stderr_tail else ''}")
        status = json.loads(status_path.read_text(encoding="utf-8"))
        if not status.get("ok"):
            return RunOutcome("failed", status.get("error", "unknown error"), stage=status.get("stage"))
        if optimized_model is not None:
            return RunOutcome("ok", stage="session", providers=status.get("providers", []))
        names = status["output_names"]
        with np.load(folder / "results.npz", allow_pickle=False) as data:
            samples = [
                {name: data[f"s{s}_o{i}"] for i, name in enumerate(names)} for s in range(status["samples"])
            ]
        return RunOutcome(
            "ok",
            outputs=samples[0] if samples else {},
            stage="run",
            providers=status.get("providers", []),
            samples=samples,
            latency_ms=status.get("latency_ms", []),
        )
