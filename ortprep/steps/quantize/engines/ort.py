"""The ``ort`` engine: ONNX Runtime's own quantizer (calibrate.run_quantizer), unchanged, behind
the Engine interface. It runs every mode and every precision ortprep's presets name."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ortprep.runtime.calibration import CalibrationSet
from ortprep.steps.quantize.calibrate import run_quantizer
from ortprep.steps.quantize.engines.base import EngineRun, Exclusion


class OrtEngine:
    """onnxruntime.quantization: what ``quantize`` ran before engines existed."""

    name = "ort"
    python = None

    def available(self) -> str | None:
        return None  # the quantizer ships with onnxruntime, which every ortprep install has

    def supports(self, mode: str, settings: dict[str, Any], exclusion: Exclusion) -> str | None:
        return None

    def quantize(self, workdir: Path, model: Path, output: Path, mode: str, settings: dict[str, Any],
                 calibration: CalibrationSet | None, indices: list[int], exclusion: Exclusion, big: bool,
                 progress=None, timeout: float | None = None) -> EngineRun:
        """``exclusion``: nodes_to_exclude, the op types left out of op_types_to_quantize and the
        search's 16-bit activations (TensorQuantOverrides), as Trials passed them before."""
        if exclusion.wide_tensors:
            settings = {**settings, "wide_tensors": list(exclusion.wide_tensors)}
        started = time.monotonic()
        ok, error = run_quantizer(workdir, model, output, mode, settings, calibration, indices, list(exclusion.nodes),
                                  tuple(exclusion.op_types), big, progress)
        seconds = round(time.monotonic() - started, 3)
        return EngineRun(self.name, ok, output if ok else None, None if ok else error, seconds)


ENGINE = OrtEngine()
