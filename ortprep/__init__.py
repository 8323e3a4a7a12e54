"""ortprep: prepare ONNX models for ONNX Runtime execution providers.

The library is usable without the CLI::

    import ortprep
    handle = ortprep.load_model("model.onnx")        # graph only, no weight bytes read
    report = ortprep.inspect(handle)                 # StepReport
    opsets = report.to_record()["opsets"]
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ortprep.model import ModelHandle
    from ortprep.report import StepReport

__all__ = ["__version__", "load_model", "inspect", "check", "convert", "simplify", "optimize", "quantize", "test_load", "doctor"]


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


def _handle(model):
    from ortprep.model import ModelHandle

    return model if isinstance(model, ModelHandle) else ModelHandle.open(model)


def convert(model, output=None, **options) -> "StepReport":
    """Transform and verify (see ``ortprep.steps.convert.ConvertOptions`` for the options), e.g.
    ``ortprep.convert("m.onnx", "m.fp16.onnx", fp16=True, ep="cuda")``."""
    from ortprep.steps.convert import ConvertOptions, convert_model

    return convert_model(_handle(model), output, ConvertOptions(**options))[0]


def simplify(model, output=None, **options) -> "StepReport":
    """onnxsim + onnxoptimizer, verified (options: ``ortprep.steps.simplify.SimplifyOptions``)."""
    from ortprep.steps.simplify import SimplifyOptions, simplify_model

    return simplify_model(_handle(model), output, SimplifyOptions(**options))[0]


def optimize(model, output=None, **options) -> "StepReport":
    """ORT offline optimization, verified (options: ``ortprep.steps.optimize.OptimizeOptions``)."""
    from ortprep.steps.optimize import OptimizeOptions, optimize_model

    return optimize_model(_handle(model), output, OptimizeOptions(**options))[0]


def quantize(model, output=None, **options) -> "StepReport":
    """Quantize with a verdict, e.g. ``ortprep.quantize("m.onnx", mode="static", calib="data/")``
    (options: ``ortprep.steps.quantize.QuantizeOptions``)."""
    from ortprep.steps.quantize import QuantizeOptions, quantize_model

    return quantize_model(_handle(model), output, QuantizeOptions(**options))


def test_load(model, **options) -> "StepReport":
    """Load and run on each available EP (options: ``ortprep.steps.load.LoadOptions``)."""
    from ortprep.steps.load import LoadOptions, load_model as run_load

    return run_load(_handle(model), LoadOptions(**options))


test_load.__test__ = False  # not a pytest test, despite the name


def doctor(scan_path=None) -> "StepReport":
    """The machine's ORT setup, or (with ``scan_path``) pitfalls in the code under it."""
    from ortprep.steps.doctor import doctor as run_doctor, scan

    return scan(scan_path) if scan_path is not None else run_doctor()
