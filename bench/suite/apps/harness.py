"""The side of the application benchmark that runs inside the apps' own environment
(bench/out/apps-venv): it imports an application, swaps a model file for another, records the
tensors the application feeds its models, and writes the application's answers.

    APPS_PYTHON -m bench.suite.apps.harness prepare APP --out DIR       (from the repository root)
    APPS_PYTHON -m bench.suite.apps.harness answer APP --split eval --out FILE [--swap KEY=PATH ...]

The swap replaces ``onnxruntime.InferenceSession`` before the application is imported, with a
subclass that opens PATH wherever the application asks for the model file it ships (KEY names it;
each app module maps keys to files) and otherwise does exactly what the application asked: its
own session options, providers and feeds. Nothing in site-packages is edited.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnxruntime

_ORIGINAL_SESSION = onnxruntime.InferenceSession
SWAPS: dict[str, str] = {}  # real path of a shipped model -> the file to open instead
KEYS: dict[str, str] = {}  # real path of a shipped model -> its key
OPENED: list[dict] = []  # every session the application created: key, path asked, path opened
RECORDING: dict[str, list[dict[str, np.ndarray]]] | None = None
RECORD_CAP = 24  # calibration samples per model, spread evenly over the calls the app made
RECORD_MAX = 2000

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32,
                "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
                "tensor(double)": np.float64, "tensor(bool)": np.bool_}


class SwappedSession(_ORIGINAL_SESSION):
    """An InferenceSession that opens the swapped file for a shipped model, and records feeds."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
        self._app_model_key = None
        if isinstance(path_or_bytes, (str, os.PathLike)):
            real = os.path.realpath(path_or_bytes)
            self._app_model_key = KEYS.get(real)
            opened = SWAPS.get(real, str(path_or_bytes))
            OPENED.append({"key": self._app_model_key, "asked": str(path_or_bytes), "opened": opened})
            path_or_bytes = opened
        super().__init__(path_or_bytes, sess_options, providers, provider_options, **kwargs)

    def run(self, output_names, input_feed, run_options=None):
        if RECORDING is not None and self._app_model_key is not None:
            kept = RECORDING.setdefault(self._app_model_key, [])
            if len(kept) < RECORD_MAX:
                types = {i.name: _NUMPY_TYPES.get(i.type) for i in self.get_inputs()}
                # some applications pass lists (magika): record what ORT receives, as arrays
                kept.append({name: np.ascontiguousarray(np.asarray(value, dtype=types.get(name)))
                             for name, value in input_feed.items()})
        return super().run(output_names, input_feed, run_options)


def install(app_module, swaps: dict[str, str]) -> None:
    """Route the application's sessions through SwappedSession; must run before the app is imported."""
    for key, shipped in app_module.shipped_models().items():
        real = os.path.realpath(shipped)
        KEYS[real] = key
        if key in swaps:
            SWAPS[real] = os.path.realpath(swaps[key])
    onnxruntime.InferenceSession = SwappedSession
    onnxruntime.capi.onnxruntime_inference_collection.InferenceSession = SwappedSession


def prepare(app_module, out: Path) -> dict:
    """Copy the shipped models, and record the application's own feeds on the calibration inputs."""
    global RECORDING
    install(app_module, {})
    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    for key, shipped in app_module.shipped_models().items():
        shutil.copyfile(shipped, models / f"{key}.onnx")
    RECORDING = {}
    app = app_module.build()
    calibration = app_module.inputs("calib")
    for item in calibration:
        app_module.answer(app, item)
    shapes = {}
    for key, every in RECORDING.items():
        picked = sorted({int(round(i)) for i in np.linspace(0, len(every) - 1, min(RECORD_CAP, len(every)))})
        feeds = [every[i] for i in picked]
        folder = out / "calib" / key
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for index, feed in enumerate(feeds):
            np.savez(folder / f"{index:03d}.npz", **feed)
        shapes[key] = sorted({json.dumps({k: list(v.shape) for k, v in feed.items()}) for feed in feeds})
    return {"calibration_inputs": len(calibration), "calls": {k: len(v) for k, v in RECORDING.items()},
            "samples": {k: min(RECORD_CAP, len(v)) for k, v in RECORDING.items()},
            "distinct_shapes": {k: len(v) for k, v in shapes.items()}, "shapes": shapes}


def answers(app_module, split: str, swaps: dict[str, str]) -> dict:
    """The application's answer for every input of ``split``, with the swapped models in place."""
    install(app_module, swaps)
    started = time.perf_counter()
    try:
        app = app_module.build()
    except Exception as error:  # the application refuses the model: every answer is an error
        return {"build_error": _one_line(error), "answers": [], "opened": OPENED, "seconds": 0.0}
    results = []
    for item in app_module.inputs(split):
        try:
            results.append(app_module.answer(app, item))
        except Exception as error:
            results.append({"error": _one_line(error)})
    missing = [
        key for key in swaps if not any(o["key"] == key and o["opened"] == os.path.realpath(swaps[key]) for o in OPENED)
    ]
    return {
        "answers": results,
        "opened": OPENED,
        "not_opened": missing,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _one_line(error: BaseException) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    if os.environ.get("APPS_DEBUG"):
        traceback.print_exc()
    return text[:300]


def versions(app_module) -> dict:
    import importlib.metadata

    found = {"onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
             "python": sys.version.split()[0]}
    for package in app_module.PACKAGES:
        found[package] = importlib.metadata.version(package)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["prepare", "answer", "versions"])
    parser.add_argument("app")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split", choices=["dev", "eval"], default="eval")
    parser.add_argument("--swap", action="append", default=[], help="KEY=PATH")
    args = parser.parse_args()
    app_module = importlib.import_module(f"bench.suite.apps.app_{args.app}")
    if args.command == "prepare":
        record = prepare(app_module, args.out)
    elif args.command == "versions":
        record = versions(app_module)
    else:
        record = answers(app_module, args.split, dict(s.split("=", 1) for s in args.swap))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    target = args.out / "prepare.json" if args.command == "prepare" else args.out
    target.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
