"""The ladder of ``quantize --auto``: which precisions to try after the one asked for, in order,
and the flags that ask for each directly. Data about the options only: no model is quantized here
(:mod:`.auto` runs the attempts). Why these EPs and steps: docs/decisions/reduce-quantize-ladder.md.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError
from ortprep.model import ModelHandle
from ortprep.options import QuantizeOptions
from ortprep.steps.quantize.presets import resolve_settings

DYNAMIC_EPS = ("cpu", "cuda")  # EPs with kernels for dynamic quantization's integer ops
# EPs that run QDQ models with 16-bit (int16, symmetric) weights on their accelerator
# (docs/decisions/reduce-quantize-ladder.md).
WIDE_WEIGHT_EPS = ("qnn",)
# EPs that run per-channel (symmetric int8) weights (docs/decisions/reduce-quantize-ladder.md).
PER_CHANNEL_EPS = ("qnn",)


# --eval's samples calibrate the static attempts after a dynamic one only where there are at least
# this many: one of two is held back for their gate; from one sample none is, and the gate would
# judge seeded noise
EVAL_AS_CALIB_MIN = 2


def real_data(data: str | Path | None) -> bool:
    """Samples given (not none, not 'random')."""
    return data is not None and str(data) != "random"


def eval_sample_count(handle: ModelHandle, options: QuantizeOptions) -> int | None:
    """How many of --eval's samples a static attempt after a dynamic one would calibrate on (at most
    --samples), where it would (dynamic, --eval real, no real --calib); None otherwise, or where the
    samples cannot be read (the attempts report that themselves)."""
    from ortprep.runtime.calibration import discover
    from ortprep.runtime.feeds import input_specs

    if options.mode != "dynamic" or real_data(options.calib) or not real_data(options.eval):
        return None
    try:
        found = discover(str(options.eval), input_specs(handle.proto), image=options.image())
    except OrtprepError:
        return None
    return min(found.count, options.samples) if options.samples else found.count


def auto_order(options: QuantizeOptions, eval_samples: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(label, option changes) for each attempt, the options' own first. ``eval_samples``: how many
    samples --eval holds (eval_sample_count), for the static attempts after a dynamic one without
    --calib."""
    first = resolve_settings(options)
    order: list[tuple[str, dict[str, Any]]] = [(attempt_label(options.mode, first["activation_type"],
                                                              first["weight_type"]), {})]
    has_data = real_data(options.calib)
    if options.mode == "weight-only":
        # weights only: the other precisions quantize activations too, another kind of result; int4
        # steps up to int8 (docs/decisions/reduce-quantize-ladder.md)
        if (options.weight_only or "int4") == "int4":
            order.append((attempt_label("weight-only", "float", "int8"), {"weight_only": "int8"}))
        return order
    if options.mode == "static":
        if first["activation_type"] != "uint16":
            order.append((attempt_label("static", "uint16", "int8"),
                          {"activation_type": "uint16", "weight_type": "int8"}))
        if options.ep in PER_CHANNEL_EPS and not first["per_channel"] and first["weight_type"] in ("int8", "uint8"):
            order.append((attempt_label("static", first["activation_type"], "int8", per_channel=True),
                          {"activation_type": first["activation_type"], "weight_type": "int8", "per_channel": True}))
        if options.ep in WIDE_WEIGHT_EPS and first["weight_type"] not in ("int16", "uint16"):
            order.append((attempt_label("static", "uint16", "int16"),
                          {"activation_type": "uint16", "weight_type": "int16",
                                                                "per_channel": False}))
        if options.ep in DYNAMIC_EPS:
            order.append((attempt_label("dynamic", "uint8", "int8"), {"mode": "dynamic", "activation_type": None,
                                                               "weight_type": None}))
    elif has_data or (real_data(options.eval) and (eval_samples or 0) >= EVAL_AS_CALIB_MIN):
        # dynamic quantization reads --calib and --eval alike, as evaluation samples; a static attempt
        # calibrates on them. Given as --eval alone, they become its --calib, so that its gate holds
        # back a share of them as static calibration's does (judged on the samples it calibrated on,
        # a static result would look better than it is)
        static = {"mode": "static"} if has_data else {"mode": "static", "calib": options.eval, "eval": None}
        settings = resolve_settings(dataclasses.replace(options, mode="static"))
        order.append((attempt_label("static", settings["activation_type"], settings["weight_type"]), dict(static)))
        if settings["activation_type"] != "uint16":
            order.append((attempt_label("static", "uint16", "int8"), {**static, "activation_type": "uint16",
                                                               "weight_type": "int8"}))
        if options.ep in PER_CHANNEL_EPS and not settings["per_channel"] and settings["weight_type"] in ("int8",
                                                                                                         "uint8"):
            order.append((attempt_label("static", settings["activation_type"], "int8", per_channel=True),
                          {**static, "activation_type": settings["activation_type"], "weight_type": "int8",
                           "per_channel": True}))
        if options.ep in WIDE_WEIGHT_EPS and settings["weight_type"] not in ("int16", "uint16"):
            order.append((attempt_label("static", "uint16", "int16"), {**static, "activation_type": "uint16",
                                                                "weight_type": "int16", "per_channel": False}))
    return order


def attempt_label(mode: str | None, activations: str | None, weights: str | None, per_channel: bool = False) -> str:
    if mode == "weight-only":
        return f"weight-only {weights} (MatMulNBits, float activations)"
    if mode == "dynamic":
        return "dynamic int8 (weights int8, activations quantized at run time)"
    return f"static {activations} activations, {weights} weights" + (" per channel" if per_channel else "")


def attempt_flags(changes: dict[str, Any]) -> str:
    parts = []
    if changes.get("weight_only"):
        parts.append(f"--weight-only {changes['weight_only']}")
    if changes.get("mode"):
        parts.append(f"--{changes['mode']}")
    for key in ("activation_type", "weight_type"):
        if changes.get(key):
            parts.append(f"--{key.replace('_', '-')} {changes[key]}")
    if changes.get("per_channel") is not None:
        parts.append("--per-channel" if changes["per_channel"] else "--per-tensor")
    if changes.get("calib") is not None:
        parts.append(f"--calib {shlex.quote(str(changes['calib']))}")
    return " ".join(parts)
