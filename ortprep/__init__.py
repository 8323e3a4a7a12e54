"""ortprep: prepare ONNX models for ONNX Runtime execution providers.

The library is usable without the CLI::

    import ortprep
    handle = ortprep.load_model("model.onnx")        # graph only, no weight bytes read
    report = ortprep.inspect(handle)                 # StepReport
    print(report.to_record()["opsets"])
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ortprep.model import ModelHandle
    from ortprep.report import StepReport

__all__ = ["__version__", "load_model", "inspect", "check"]


def load_model(path, *, load_weights: bool = False) -> "ModelHandle":
    """Open an ONNX model safely; see :meth:`ortprep.model.ModelHandle.open`."""
    from ortprep.model import ModelHandle

    return ModelHandle.open(path, load_weights=load_weights)


def inspect(model, *, hash_data: bool = False) -> "StepReport":
    """Inspect a model (a path or a ModelHandle) without reading its weights."""
    from ortprep.model import ModelHandle
    from ortprep.steps.inspect import inspect_model

    handle = model if isinstance(model, ModelHandle) else ModelHandle.open(model)
    return inspect_model(handle, hash_data=hash_data)


def check(model, eps: list[str]) -> "StepReport":
    """Check a model (a path or a ModelHandle) against EP targets (names, or comma lists for one
    session) without reading its weights."""
    from ortprep.model import ModelHandle
    from ortprep.steps.check import check_model

    handle = model if isinstance(model, ModelHandle) else ModelHandle.open(model)
    return check_model(handle, eps)
