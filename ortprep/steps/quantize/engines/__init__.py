"""The quantize engines, by name: :func:`engine` imports ``engines.<name>`` when first asked and
returns its ``ENGINE``; a module that is not there is an engine that is not available (with why).
:data:`AUTO_ORDER` is the order ``--engine auto`` tries them in: ORT's quantizer first (the fastest,
and what ortprep always ran), then NNCF, then AIMET-ONNX, as measured on the development half of the
journey's corpus (docs/decisions/choose-engine-order.md); :data:`SPEED_ORDER`, the order once a
candidate passed but runs slower than the float model (choose.choose_engine)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ortprep.steps.quantize.engines.base import ENGINE_CHOICES, ENGINE_NAMES, Engine, EngineRun, Exclusion

AUTO_ORDER = ("ort", "nncf", "aimet")
# where a candidate passed but runs slower than the float model, the others in this order: AIMET-ONNX's
# files ran fastest, NNCF's slowest, on the development half (docs/decisions/choose-engine-order.md)
SPEED_ORDER = ("ort", "aimet", "nncf")


class Missing:
    """An engine whose module this ortprep does not have."""

    python = None

    def __init__(self, name: str, why: str) -> None:
        self.name, self.why = name, why

    def available(self) -> str | None:
        return self.why

    def supports(self, mode: str, settings: dict[str, Any], exclusion: Exclusion) -> str | None:
        return None

    def quantize(self, workdir: Path, model: Path, output: Path, *args, **kwargs) -> EngineRun:
        return EngineRun(self.name, False, error=f"{self.name}: {self.why}")


_ENGINES: dict[str, Engine] = {}


def engine(name: str) -> Engine:
    """The engine called ``name`` (one of ENGINE_NAMES)."""
    if name not in ENGINE_NAMES:
        raise ValueError(f"no quantize engine '{name}' (one of {', '.join(ENGINE_NAMES)})")
    if name not in _ENGINES:
        module = f"{__name__}.{name}"
        try:
            _ENGINES[name] = importlib.import_module(module).ENGINE
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            _ENGINES[name] = Missing(name, f"this ortprep has no {name} engine (no module {module}); use --engine ort")
    return _ENGINES[name]


def chosen(name: str) -> list[str]:
    """The engines a run may try, in order: ``auto``'s order, or the one named."""
    return list(AUTO_ORDER) if name == "auto" else [name]


__all__ = ["AUTO_ORDER", "ENGINE_CHOICES", "ENGINE_NAMES", "SPEED_ORDER", "Engine", "EngineRun", "Exclusion", "chosen",
           "engine"]
