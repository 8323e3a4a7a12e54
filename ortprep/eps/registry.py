"""Execution providers ortprep knows: names, aliases, ORT provider names, devices, and the facts
about each EP that are not operator tables (install, quantization preset, static-shape rule).

The one EP vocabulary of ortprep: every command, option and config key resolves EP names here.
The facts live in ``data/eps.json``, each with its source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ortprep.errors import UsageError


@dataclass(frozen=True)
class QuantizePreset:
    """How ``quantize --ep NAME`` quantizes by default for this EP."""

    format: str
    activation_type: str
    weight_type: str
    per_channel: bool
    symmetric: bool
    reason: str
    source: str
    dynamic_op_types: tuple[str, ...] | None = None  # None: every op the quantizer knows
    requires_static_shapes: bool = False
    # op type -> activation type -> (scale, zero point) the EP imposes on that op's output
    fixed_output_encodings: dict[str, dict[str, tuple[float, int]]] | None = None


@dataclass(frozen=True)
class StaticShapeRule:
    severity: str  # of a finding about dynamic input dims
    constraint: str  # the constraint id in the EP's table, for the source line
    why: str


@dataclass(frozen=True)
class EpSpec:
    name: str
    provider: str  # ORT's provider name
    device: str  # "cpu", "gpu" or "npu": where the EP's kernels run
    description: str
    aliases: tuple[str, ...] = ()
    install_hint: str = "install an ONNX Runtime build with it"
    static_shapes: StaticShapeRule | None = None
    quantize: QuantizePreset | None = None
    fp16_io: bool = False  # the EP's own samples feed float16 inputs/outputs
    session_options: dict[str, str] = field(default_factory=dict, hash=False)  # provider options ortprep sets


@lru_cache(maxsize=1)
def ep_facts() -> dict[str, Any]:
    """The parsed ``data/eps.json``."""
    text = resources.files("ortprep.eps").joinpath("data/eps.json").read_text(encoding="utf-8")
    return json.loads(text)


def source_text(key: str) -> str:
    return ep_facts()["sources"].get(key, key)


def _spec(entry: dict[str, Any]) -> EpSpec:
    install = entry.get("install", {})
    quant = entry.get("quantize")
    shapes = entry.get("static_shapes")
    return EpSpec(
        name=entry["name"],
        provider=entry["provider"],
        device=entry["device"],
        description=entry["description"],
        aliases=tuple(entry.get("aliases", ())),
        install_hint=install.get("hint", EpSpec.install_hint),
        static_shapes=StaticShapeRule(**shapes) if shapes else None,
        quantize=QuantizePreset(
            format=quant["format"], activation_type=quant["activation_type"], weight_type=quant["weight_type"],
            per_channel=quant["per_channel"], symmetric=quant["symmetric"], reason=quant["reason"],
            source=source_text(quant["source"]),
            dynamic_op_types=tuple(quant["dynamic_op_types"]) if quant.get("dynamic_op_types") else None,
            requires_static_shapes=quant.get("requires_static_shapes", False),
            fixed_output_encodings={op: {kind: (float(pair[0]), int(pair[1])) for kind, pair in types.items()}
                                    for op, types in quant.get("fixed_output_encodings", {}).items() if op != "source"}
            or None,
        ) if quant else None,
        fp16_io=bool(entry.get("fp16_io", {}).get("value", False)),
        session_options=dict(entry.get("session_options", {}).get("value", {})),
    )


EPS: tuple[EpSpec, ...] = tuple(_spec(entry) for entry in ep_facts()["eps"])

_BY_NAME = {spec.name: spec for spec in EPS} | {alias: spec for spec in EPS for alias in spec.aliases}


def valid_names() -> list[str]:
    return [spec.name for spec in EPS] + [alias for spec in EPS for alias in spec.aliases]


def resolve_ep(name: str) -> EpSpec:
    """EpSpec for a name, an alias or an ORT provider name (case-insensitive); UsageError listing
    the valid names otherwise."""
    key = name.strip().lower()
    spec = _BY_NAME.get(key) or next((s for s in EPS if s.provider.lower() == key), None)
    if spec is None:
        raise UsageError(
            f"unknown execution provider '{name}'",
            hint="use one of: " + ", ".join(valid_names()),
        )
    return spec


def resolve_target(text: str) -> tuple[EpSpec, ...]:
    """'openvino-cpu,dml' -> the priority list of one session (CPU is always implied last)."""
    names = [part for part in text.split(",") if part.strip()]
    if not names:
        raise UsageError("empty EP value", hint="use one of: " + ", ".join(valid_names()))
    return tuple(resolve_ep(name) for name in names)


def spec_for_provider(provider: str) -> EpSpec | None:
    """The first EP ortprep knows under an ORT provider name."""
    return next((spec for spec in EPS if spec.provider == provider), None)


def gpu_libraries(system: str, cuda_major: int = 12) -> list[tuple[str, str, str]]:
    """(key, file name, label) of the libraries the CUDA and TensorRT EPs load, for 'linux' or
    'windows', for an onnxruntime-gpu built with CUDA ``cuda_major``."""
    return [
        (key, name.format(cuda=cuda_major), label) for key, name, label in ep_facts()["gpu_libraries"].get(system, [])
    ]
