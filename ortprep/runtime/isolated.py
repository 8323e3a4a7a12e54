"""Run a model in ONNX Runtime in a worker process (runtime/worker.py), so a crash or a hang in
ORT cannot take ortprep down with it. A thin facade over a :class:`RunModel` request, kept for
the transforms and steps that call it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortprep.runtime.providers import require_ort
from ortprep.runtime.requests import RunModel, TimeModels
from ortprep.runtime.worker import DEFAULT_TIMEOUT, call

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    status: str  # "ok", "failed" (ORT raised), "crashed" (signal), "timeout"
    message: str = ""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # of the first (or only) sample
    stage: str | None = None  # where it stopped: import, session, run
    providers: list[str] = field(default_factory=list)
    samples: list[dict[str, np.ndarray]] = field(default_factory=list)  # outputs per sample
    # output name -> (low, high) where the graph bounds it (a Sigmoid, Softmax or Tanh makes it)
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    # output name -> the decision an application reads from it (ortprep/fidelity/decisions/), set on a
    # reference run by :func:`ortprep.fidelity.gate.expect`; a candidate must keep each gated one
    decisions: dict = field(default_factory=dict)

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
    extra_outputs: list[str] | None = None,
    model_bytes: bytes | None = None,
    once: bool = False,
) -> RunOutcome:
    """Create a session for ``model`` (or reuse the worker's) and run it on ``feeds`` in a worker
    process. With ``optimized_model``, only create the session, letting ORT write its optimized
    graph there. ``extra_outputs``: intermediate tensors to return beside the graph's outputs.
    ``model_bytes``: a serialized model sent as it is (``model`` then only names it). ``once``: a
    session built for this call is not kept in the worker."""
    require_ort()
    request = RunModel(
        model=os.path.abspath(model) if model_bytes is None else str(model),
        model_bytes=model_bytes,
        feeds=feeds if isinstance(feeds, list) else [feeds],
        providers=providers or ["CPUExecutionProvider"],
        outputs=outputs,
        extra_outputs=list(extra_outputs or []),
        optimization=optimization,
        optimized_model=os.path.abspath(optimized_model) if optimized_model else None,
        optimized_data=optimized_data,
        once=once,
    )
    reply = call(request, timeout=timeout)
    if reply.status == "crashed":
        tail = reply.stderr_tail
        return RunOutcome("crashed", f"ONNX Runtime's process died ({reply.died}){': ' + tail if tail else ''}")
    if not reply.ok:
        return RunOutcome(reply.status, reply.message, stage=reply.stage)
    if optimized_model is not None:
        return RunOutcome("ok", stage="session", providers=reply.providers)
    return RunOutcome("ok", outputs=reply.samples[0] if reply.samples else {}, stage="run", providers=reply.providers,
                      samples=reply.samples)


def time_isolated(models: list[Path], feed: dict[str, np.ndarray], *, runs: int,
                  timeout: float | None = None) -> list[list[float]] | None:
    """Each model's times (ms) over ``runs`` rounds of one run of every model in turn, on the CPU
    EP in a worker process (:class:`TimeModels`); None where a session or a run fails. ``timeout``
    (default: DEFAULT_TIMEOUT for each model and each 10 of its runs, what timing them in calls of
    10 runs allowed) bounds the whole request."""
    require_ort()
    if timeout is None:
        timeout = DEFAULT_TIMEOUT * len(models) * max(1, -(-runs // 10))
    reply = call(TimeModels(models=[os.path.abspath(m) for m in models], feed=feed, runs=runs), timeout=timeout)
    if not reply.ok or len(reply.latency_ms) != len(models) or not all(reply.latency_ms):
        return None
    return reply.latency_ms
