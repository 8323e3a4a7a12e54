"""The quantize engine interface: what turns a prepared float model into a QDQ candidate.

An engine is ONNX Runtime's quantizer (``ort``), NNCF (``nncf``) or AIMET-ONNX (``aimet``). Each runs
in a worker (``runtime/worker.call``, under ``python`` where the engine lives in an environment of its
own), so a crash or a hang is a failed candidate, never ortprep's. The search decides what stays float
(:class:`Exclusion`) and the engine honours it; the gate judges every candidate alike.
docs/decisions/engines-nncf-aimet.md has the design and what each library's API does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ortprep.runtime.calibration import CalibrationSet

ENGINE_NAMES = ("ort", "nncf", "aimet")
ENGINE_CHOICES = ("auto", *ENGINE_NAMES)


@dataclass(frozen=True)
class Exclusion:
    """What the candidate keeps float: node names and op types (ORT's ``nodes_to_exclude`` and the
    op types left out), and activations the search gave 16 bits (``wide_tensors``)."""

    nodes: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    wide_tensors: tuple[str, ...] = ()


@dataclass
class EngineRun:
    """One engine call's outcome: ``ok`` with the candidate at ``output``, or ``error`` (one line:
    the engine, its stage and its message; a crash or a timeout says so). ``seconds``: the engine's
    own time; ``detail``: what it applied (algorithms, versions) for the report."""

    engine: str
    ok: bool
    output: Path | None = None
    error: str | None = None
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    """One quantization engine. ``available`` and ``supports`` import nothing of the engine's library."""

    name: str

    def available(self) -> str | None:
        """None, or why this engine cannot run here (one line, with what to do)."""

    def supports(self, mode: str, settings: dict[str, Any], exclusion: Exclusion) -> str | None:
        """None, or why this engine cannot produce what ``settings`` ask (e.g. 16-bit activations)."""

    def quantize(self, workdir: Path, model: Path, output: Path, mode: str, settings: dict[str, Any],
                 calibration: CalibrationSet | None, indices: list[int], exclusion: Exclusion, big: bool,
                 progress=None, timeout: float | None = None) -> EngineRun:
        """Quantize ``model`` into ``output`` (calibrating on ``indices`` of ``calibration``)."""
