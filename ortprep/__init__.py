"""ortprep: prepare ONNX models for ONNX Runtime execution providers.

The library is usable without the CLI::

    import ortprep
    handle = ortprep.load_model("model.onnx")        # graph only, no weight bytes read
    result = ortprep.inspect(handle)                 # StepResult
    opsets = result.to_record()["opsets"]

    result = ortprep.convert("m.onnx", "m.fp16.onnx", fp16=True, ep="cuda")
    run = ortprep.run_pipeline("ortprep.toml")       # RunReport, or a repository's run document
    made = ortprep.package("m.onnx", "m.pkg", ["cpu", "cuda", "qnn"], calib="samples/")
"""

from __future__ import annotations

from ortprep.version import __version__

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortprep.report import RunReport

if TYPE_CHECKING:  # pragma: no cover
    from ortprep.model import ModelHandle
    from ortprep.report import StepResult

__all__ = [
    "__version__", "load_model", "run_step", "inspect", "check", "convert", "simplify", "optimize", "quantize",
    "test_load", "doctor", "run_pipeline", "package", "load_package",
]


def load_model(path, *, load_weights: bool = False) -> "ModelHandle":
    """Open an ONNX model safely; see :meth:`ortprep.model.ModelHandle.open`."""
    from ortprep.model import ModelHandle

    return ModelHandle.open(path, load_weights=load_weights)


def run_step(name: str, model=None, output=None, *, force: bool = False, **options: Any) -> "StepResult":
    """Run one step by name on a model (a path or a ModelHandle). ``options`` are the step's
    config keys (``ortprep.options``), validated exactly as the command line and config are."""
    from ortprep.model import ModelHandle
    from ortprep.pipeline import write_page
    from ortprep.runtime.worker import workers_scope
    from ortprep.steps import options_class, step_class
    from ortprep.steps.base import StepContext

    settings = options_class(name).from_values(options, where=name)
    step = step_class(name)(settings)
    step.prepare()
    handle = model if isinstance(model, ModelHandle) or model is None else ModelHandle.open(model)
    step.admit(handle)
    with workers_scope(prestart=step.needs_ort != "never"):  # one worker (and its sessions) for the step
        result = step.run(handle, StepContext(output=Path(output) if output else None, force=force))
    write_page(step, result)
    return result


def inspect(model, *, hash_data: bool = False) -> "StepResult":
    """Inspect a model (a path or a ModelHandle) without reading its weights."""
    return run_step("inspect", model, hash_data=hash_data)


def check(model, eps: list[str]) -> "StepResult":
    """Check a model against EP targets (names, or comma lists for one session), without reading
    its weights."""
    return run_step("check", model, eps=eps)


def convert(model, output=None, **options: Any) -> "StepResult":
    """Transform and verify, e.g. ``ortprep.convert("m.onnx", "m.fp16.onnx", fp16=True, ep="cuda")``."""
    return run_step("convert", model, output, **options)


def simplify(model, output=None, **options: Any) -> "StepResult":
    """onnxsim + onnxoptimizer, verified."""
    return run_step("simplify", model, output, **options)


def optimize(model, output=None, **options: Any) -> "StepResult":
    """ORT offline optimization, verified."""
    return run_step("optimize", model, output, **options)


def quantize(model, output=None, **options: Any) -> "StepResult":
    """Quantize with a verdict, e.g. ``ortprep.quantize("m.onnx", mode="static", calib="data/")``."""
    return run_step("quantize", model, output, **options)


def test_load(model, **options: Any) -> "StepResult":
    """Load and run on each available EP."""
    return run_step("load", model, **options)


test_load.__test__ = False  # not a pytest test, despite the name


def doctor(scan_path=None) -> "StepResult":
    """The machine's ORT setup, or (with ``scan_path``) pitfalls in the code under it."""
    return run_step("doctor", None, scan=scan_path)


def run_pipeline(config, *, jobs: int = 1, shard: str | None = None, baseline=None) -> "RunReport | dict":
    """Read, validate and run a config (``ortprep.toml``, a pyproject.toml with [tool.ortprep], or
    their folder). A one-model pipeline returns its RunReport; a repository config ([[models]],
    [targets]) returns the run document that ``ortprep run --json`` prints (``ortprep.run/2``,
    kind repository), with ``jobs``, ``shard`` ("K/N") and ``baseline`` (a report's path) as the
    command line takes them."""
    from ortprep.pipeline import run_pipeline as run

    result = run(Path(config), jobs=jobs, shard=shard, baseline=baseline)
    return result if isinstance(result, RunReport) else result.to_records()


def package(model, destination, targets: list[str], *, config=None, device: str | None = None,
            runtimes: dict[str, str] | None = None, **options: Any):
    """Write a model package (``ortprep package``): ``targets`` as the command line takes them
    ("EP" or "NAME=EP"), ``config`` an ortprep.toml whose [targets] join them, ``options`` the
    fields of :class:`ortprep.packaging.PackageOptions` (calib, inputs, shapes, metrics,
    min_cosine, compile, name, version, force). Returns the PackageReport (``document()``: the
    JSON of ``ortprep package --json``); ``written`` is False after a refusal."""
    from ortprep.packaging import PackageOptions, build_package, targets_from

    chosen = targets_from(targets, config=Path(config) if config else None, device=device,
                          runtimes={k: Path(v) for k, v in (runtimes or {}).items()})
    return build_package(Path(model), Path(destination), PackageOptions(targets=chosen, **options))


def load_package(package_dir, **load_options: Any):
    """``ortprep load --package``: the variant the installed ORT picks for each EP here, run there.
    ``load_options``: load's config keys (eps, inputs, shapes, runtimes, provider_options, ...)."""
    from ortprep.packaging import load_package as load

    return load(Path(package_dir), load_options)


# Lower-level entry points that bench/ (and tools like it) reach for: re-exported here so that they
# import from ``ortprep`` only, loaded on first use (PEP 562) so that ``import ortprep`` stays light.
# Not yet a stable API: where a module moves, only this table changes.
_LOWER_LEVEL = {
    "ModelHandle": ("ortprep.model", "ModelHandle"),
    "StepResult": ("ortprep.report", "StepResult"),
    "QuantizeOptions": ("ortprep.options", "QuantizeOptions"),
    "read_raw": ("ortprep.config", "read_raw"),
    "Pipeline": ("ortprep.pipeline", "Pipeline"),
    "resolve_ep": ("ortprep.eps.registry", "resolve_ep"),
    "workers_scope": ("ortprep.runtime.worker", "workers_scope"),
    "Placement": ("ortprep.runtime.requests", "Placement"),
    "run_isolated": ("ortprep.runtime.isolated", "run_isolated"),
    "ep_runtime": ("ortprep.runtime.targets", "ep_runtime"),
    "session_options": ("ortprep.runtime.targets", "session_options"),
    # the reduction engine and check --prove's parts
    "Budget": ("ortprep.prove.reduction", "Budget"),
    "session_caller": ("ortprep.prove.proof", "session_caller"),
    "reduce_failure": ("ortprep.prove.culprits", "reduce_failure"),
    "find_fix": ("ortprep.prove.fixes", "find_fix"),
    "gate_target": ("ortprep.steps.quantize.ep_gate", "gate_target"),
    # ortprep's own gate, for the studies that report what it says (the bench judges with bench/referee.py)
    "calibration_split": ("ortprep.runtime.calibration", "split"),
    "held_back_share": ("ortprep.steps.quantize.calibrate", "held_back_share"),
    "infer_decisions": ("ortprep.fidelity.decisions", "infer_decisions"),
    "gate_flat_outputs": ("ortprep.fidelity.quantized", "flat_outputs"),
    "gate_judge": ("ortprep.fidelity.quantized", "judge_quantized"),
}


def __getattr__(name: str):
    if name in _LOWER_LEVEL:
        import importlib

        module, attribute = _LOWER_LEVEL[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ortprep' has no attribute {name!r}")
