"""The AIMET-ONNX engine: Qualcomm's post-training quantizer (cross-layer equalization, SeqMSE,
AdaRound, QNN's HTP configuration) writing a QDQ model that ORT loads.

AIMET needs torch (about 2 GB with its dependencies), so it lives in an environment of its own and
runs in a worker of that interpreter (``runtime/requests/aimet_quantize.py``); nothing here imports
it. Which interpreter: ``$ORTPREP_AIMET_PYTHON`` when set, else ``.venv-aimet/bin/python`` in the
checkout that holds ortprep (what ``make install`` creates; docs/install.md). A crash, a hang or an
exception in AIMET is a failed run with one line, never ortprep's. The defaults (CLE on, SeqMSE and
AdaRound off) and their cost: docs/decisions/aimet-engine.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortprep.runtime.calibration import CalibrationSet
from ortprep.runtime.requests.aimet_quantize import BITS, AimetQuantize
from ortprep.runtime.worker import PACKAGE_ROOT, Interrupted, call
from ortprep.steps.quantize.engines.base import EngineRun, Exclusion

PYTHON_VARIABLE = "ORTPREP_AIMET_PYTHON"
VENV = ".venv-aimet"
# what runs unless settings["aimet"] says otherwise: CLE (it carries the classifiers of issue 51's
# table, for about a second); SeqMSE and AdaRound are asked for by name: SeqMSE took 140-200 s on
# a 53-conv classifier that CLE alone quantizes in 4 s (docs/decisions/aimet-engine.md)
DEFAULT_ALGORITHMS = {"cle": True, "seq_mse": False, "seq_mse_samples": 0, "seq_mse_candidates": 20,
                      "adaround_iterations": 0, "quant_scheme": "min_max"}
# QNN's preset takes AIMET's HTP configuration (v73: Snapdragon 8 Gen 2, the QNN EP's usual target)
HTP_CONFIG = "htp_v73"
DEFAULT_TIMEOUT = 900.0
# a one-line error keeps at most this many characters of AIMET's message
MESSAGE_CHARS = 300


def aimet_python() -> Path:
    """The interpreter that runs AIMET: ``$ORTPREP_AIMET_PYTHON``, else the checkout's ``.venv-aimet``.
    Not resolved: a venv's python is a link, and following it would leave the venv."""
    chosen = os.environ.get(PYTHON_VARIABLE)
    return Path(chosen) if chosen else Path(PACKAGE_ROOT) / VENV / "bin" / "python"


def aimet_version(python: Path) -> str | None:
    """aimet-onnx's version in ``python``'s environment, read from its metadata (no import)."""
    for info in sorted(python.parent.parent.glob("lib/python*/site-packages/aimet_onnx-*.dist-info")):
        return info.name.removeprefix("aimet_onnx-").removesuffix(".dist-info")
    return None


class AimetEngine:
    """AIMET-ONNX behind the Engine protocol (engines/base.py). Settings it reads: activation_type,
    weight_type, per_channel, preset ("qnn" selects the HTP configuration), format, extra_options'
    ActivationSymmetric, and ``settings["aimet"]`` (cle, seq_mse, seq_mse_samples, seq_mse_candidates,
    adaround_iterations, quant_scheme, config) over DEFAULT_ALGORITHMS."""

    name = "aimet"

    @property
    def python(self) -> str:
        return str(aimet_python())

    def available(self) -> str | None:
        python = aimet_python()
        if python.is_file() and os.access(python, os.X_OK):
            return None
        if os.environ.get(PYTHON_VARIABLE):
            return (f"{PYTHON_VARIABLE}={python} is not an interpreter: point it to the python of an "
                    "environment with aimet-onnx")
        return (f"no AIMET environment ({python} is missing): run `make install`, or set {PYTHON_VARIABLE} to "
                "the python of an environment with aimet-onnx and a CPU torch")

    def supports(self, mode: str, settings: dict[str, Any], exclusion: Exclusion) -> str | None:
        if mode != "static":
            return f"AIMET-ONNX quantizes statically only (not {mode})"
        if (settings.get("format") or "qdq") != "qdq":
            return "AIMET-ONNX writes QDQ models only"
        for key in ("activation_type", "weight_type"):
            if settings.get(key, "int8") not in BITS:
                return f"AIMET-ONNX's {key.replace('_', ' ')} is one of {', '.join(BITS)}, not {settings.get(key)}"
        return None

    def settings(self, settings: dict[str, Any], big: bool) -> dict[str, Any]:
        """The request's settings: ortprep's types and layout, AIMET's configuration and algorithms."""
        chosen = {**DEFAULT_ALGORITHMS, **(settings.get("aimet") or {})}
        return {
            "activation_type": settings.get("activation_type", "uint8"),
            "weight_type": settings.get("weight_type", "int8"),
            "per_channel": bool(settings.get("per_channel", True)),
            "config": chosen.get("config") or (HTP_CONFIG if settings.get("preset") == "qnn" else "default"),
            "quant_scheme": chosen["quant_scheme"],
            "cle": bool(chosen["cle"]),
            "seq_mse": bool(chosen["seq_mse"]),
            "seq_mse_samples": int(chosen["seq_mse_samples"] or 0),
            "seq_mse_candidates": int(chosen["seq_mse_candidates"] or 20),
            "adaround_iterations": int(chosen["adaround_iterations"] or 0),
            "extra_options": {"ActivationSymmetric": bool((settings.get("extra_options") or {})
                                                          .get("ActivationSymmetric"))},
            "external_data": bool(big),
        }

    def quantize(self, workdir: Path, model: Path, output: Path, mode: str, settings: dict[str, Any],
                 calibration: CalibrationSet | None, indices: list[int], exclusion: Exclusion, big: bool,
                 progress=None, timeout: float | None = None) -> EngineRun:
        python = aimet_python()
        version = aimet_version(python) or "?"

        def failed(line: str, **detail) -> EngineRun:
            text = " ".join(line.split())
            if len(text) > MESSAGE_CHARS:
                text = text[: MESSAGE_CHARS - 3] + "..."
            return EngineRun(engine=self.name, ok=False, error=f"aimet {version}: {text}",
                             detail={"version": version, **detail})

        refused = self.available() or self.supports(mode, settings, exclusion)
        if refused:
            return failed(refused)
        if calibration is None or not indices:
            return failed("static quantization needs calibration samples")
        Path(workdir).mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="aimet-", dir=workdir)  # AIMET's sim writes model copies here
        progress_file, poll = _progress(progress, scratch)
        request = AimetQuantize(
            workdir=scratch, model=str(Path(model).resolve()), output=str(Path(output).resolve()),
            calibration=calibration.to_json(), indices=list(indices), settings=self.settings(settings, big),
            exclude_nodes=list(exclusion.nodes), exclude_ops=list(exclusion.op_types),
            wide_tensors=list(exclusion.wide_tensors), progress=progress_file)
        try:
            reply = call(request, python=str(python), timeout=timeout or DEFAULT_TIMEOUT, poll=poll)
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - the worker could not start: a failed candidate
            return failed(f"the AIMET worker did not start: {type(exc).__name__}: {exc}")
        finally:
            if poll is not None:
                poll()  # the last "done total" the worker wrote
            shutil.rmtree(scratch, ignore_errors=True)
        version = getattr(reply, "version", None) or version
        detail = {"version": version, "peak_rss": getattr(reply, "peak_rss", None),
                  "import_seconds": getattr(reply, "import_seconds", 0.0), **(getattr(reply, "applied", None) or {})}
        if reply.ok and Path(output).is_file():
            return EngineRun(engine=self.name, ok=True, output=Path(output), seconds=reply.engine_seconds,
                             detail=detail)
        _remove_partial(Path(output))
        if reply.status == "timeout":
            return failed(f"timed out ({reply.message})", **detail)
        if reply.status == "crashed":
            return failed(reply.message, **detail)
        kind = getattr(reply, "error_type", None)
        return failed(f"{kind}: {reply.message}" if kind else reply.message or "failed", **detail,
                      traceback=getattr(reply, "traceback", None))


def _progress(progress, scratch: str) -> tuple[str | None, Callable[[], None] | None]:
    """(the file the worker writes "done total" to, the poll that hands it to ``progress``): a path
    is passed on as it is, a callable(done, total) is called as the file changes."""
    if progress is None:
        return None, None
    if isinstance(progress, (str, os.PathLike)):
        return str(progress), None
    path = os.path.join(scratch, "progress.txt")
    seen = [""]

    def poll() -> None:
        with contextlib.suppress(OSError, ValueError):
            with open(path, encoding="utf-8") as source:
                text = source.read().strip()
            if text and text != seen[0]:
                seen[0] = text
                done, total = (int(part) for part in text.split())
                progress(done, total)

    return path, poll


def _remove_partial(output: Path) -> None:
    """A failed run writes nothing: the partial file the worker may have left goes."""
    with contextlib.suppress(OSError):
        (output.parent / f".{output.name}.partial").unlink()


ENGINE = AimetEngine()
