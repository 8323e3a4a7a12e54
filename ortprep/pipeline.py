"""The CI pipeline: a TOML file in a model repository names the model and the steps; each step
is the same library call its command makes, and the model a step writes feeds the next.

    model = "models/net.onnx"
    output_dir = "build"          # optional; default build/ beside this file
    fail_on = "error"             # optional; each step may override it

    [[steps]]
    run = "check"
    eps = ["dml", "dml-npu"]

    [[steps]]
    run = "convert"
    fp16 = true
    ep = "dml-npu"
    fix_dims = { batch = 1 }

Everything is validated before any step runs; the run stops at the first failing step.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.errors import UsageError
from ortprep.findings import Severity
from ortprep.model import ModelHandle
from ortprep.report import StepReport

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SCHEMA = "ortprep.run/1"
TOP_LEVEL_KEYS = {"model", "output_dir", "fail_on", "steps"}
FAIL_ON = {"error": Severity.ERROR, "warning": Severity.WARNING, "info": Severity.INFO, "never": None}
PATH_KEYS = {"inputs", "calib", "eval", "custom_op_library"}  # resolved against the config's folder


def _options_class(step: str):
    from ortprep.steps.convert import ConvertOptions
    from ortprep.steps.load import LoadOptions
    from ortprep.steps.optimize import OptimizeOptions
    from ortprep.steps.quantize import QuantizeOptions
    from ortprep.steps.simplify import SimplifyOptions

    return {
        "convert": ConvertOptions,
        "simplify": SimplifyOptions,
        "optimize": OptimizeOptions,
        "quantize": QuantizeOptions,
        "load": LoadOptions,
    }.get(step)


STEP_KEYS = {"inspect": {"hash_data"}, "check": {"eps"}}
WRITES_MODEL = ("convert", "simplify", "optimize", "quantize")
# Options a config may not set: they belong to the command line, or would let a step overwrite its input.
RESERVED = {"force", "image"}


@dataclass
class StepConfig:
    run: str
    options: dict[str, Any]
    fail_on: Severity | None
    output: Path | None = None
    label: str = ""


@dataclass
class PipelineConfig:
    path: Path
    model: Path
    output_dir: Path
    steps: list[StepConfig] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> "PipelineConfig":
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"pipeline config not found: {path}", hint="write an ortprep.toml (see docs/pipeline.md)")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path} is not valid TOML: {exc}", hint="fix the syntax") from exc
        return cls.from_dict(raw, path)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path) -> "PipelineConfig":
        base = path.parent.resolve()
        unknown = set(raw) - TOP_LEVEL_KEYS
        if unknown:
            raise UsageError(f"{path.name}: unknown top-level key(s) {', '.join(sorted(unknown))}",
                             hint=f"valid keys: {', '.join(sorted(TOP_LEVEL_KEYS))}")
        if "model" not in raw:
            raise UsageError(f"{path.name}: no 'model'", hint='add model = "path/to/model.onnx"')
        default_fail = _fail_on(raw.get("fail_on", "error"), f"{path.name}: fail_on")
        steps_raw = raw.get("steps") or []
        if not isinstance(steps_raw, list) or not steps_raw:
            raise UsageError(f"{path.name}: no steps", hint='add [[steps]] tables, e.g. run = "check"')
        config = cls(path=path, model=(base / raw["model"]).resolve(), output_dir=(base / raw.get("output_dir", "build")).resolve())
        for index, entry in enumerate(steps_raw, start=1):
            config.steps.append(_step(entry, index, base, default_fail, path.name))
        return config


def _fail_on(value: Any, where: str) -> Severity | None:
    if value not in FAIL_ON:
        raise UsageError(f"{where} is {value!r}", hint="use error, warning, info or never")
    return FAIL_ON[value]


def _step(entry: dict[str, Any], index: int, base: Path, default_fail: Severity | None, file_name: str) -> StepConfig:
    where = f"{file_name}: step {index}"
    if not isinstance(entry, dict) or "run" not in entry:
        raise UsageError(f"{where} has no 'run'", hint="run = one of inspect, check, convert, simplify, optimize, quantize, load")
    run = entry["run"]
    options_class = _options_class(run)
    allowed = STEP_KEYS.get(run) if options_class is None else {f.name for f in dataclasses.fields(options_class)} - RESERVED
    if allowed is None:
        raise UsageError(f"{where}: unknown step {run!r}", hint="use inspect, check, convert, simplify, optimize, quantize or load")
    options = {k: v for k, v in entry.items() if k not in ("run", "fail_on", "output", "name")}
    unknown = set(options) - allowed
    if unknown:
        raise UsageError(f"{where} ({run}): unknown option(s) {', '.join(sorted(unknown))}",
                         hint=f"valid options: {', '.join(sorted(allowed))}")
    for key in PATH_KEYS & set(options):
        if options[key] != "random":
            options[key] = (base / options[key]).resolve()
    if run == "check":
        from ortprep.eps.registry import resolve_target

        if not options.get("eps"):
            raise UsageError(f"{where} (check): no eps", hint='add eps = ["dml"]')
        for target in options["eps"]:
            resolve_target(target)
    if options_class is not None:
        try:
            options_class(**options)  # type errors surface here, before anything runs
        except TypeError as exc:
            raise UsageError(f"{where} ({run}): {exc}", hint="see docs/pipeline.md") from exc
    output = (base / entry["output"]).resolve() if "output" in entry else None
    return StepConfig(run=run, options=options, fail_on=_fail_on(entry.get("fail_on", _name_of(default_fail)), f"{where}: fail_on"),
                      output=output, label=entry.get("name") or f"{index}. {run}")


def _name_of(severity: Severity | None) -> str:
    return "never" if severity is None else severity.label


def _run_step(step: StepConfig, model: Path, output: Path) -> StepReport:
    from ortprep.steps.check import check_model
    from ortprep.steps.convert import convert_model
    from ortprep.steps.inspect import inspect_model
    from ortprep.steps.load import load_model
    from ortprep.steps.optimize import optimize_model
    from ortprep.steps.quantize import quantize_model
    from ortprep.steps.simplify import simplify_model

    handle = ModelHandle.open(model)
    options = dict(step.options)
    if step.run == "inspect":
        return inspect_model(handle, **options)
    if step.run == "check":
        return check_model(handle, options["eps"])
    options_class = _options_class(step.run)
    settings = options_class(**options)
    if step.run == "load":
        return load_model(handle, settings)
    settings.force = True  # outputs live in output_dir and are rewritten on every run
    runner = {"convert": convert_model, "simplify": simplify_model, "optimize": optimize_model}
    if step.run == "quantize":
        return quantize_model(handle, output, settings)
    return runner[step.run](handle, output, settings)[0]


def run_pipeline(config: PipelineConfig, progress=None) -> dict[str, Any]:
    """Run the steps in order; returns the run record (schema ortprep.run/1)."""
    model = config.model
    ModelHandle.open(model)  # a bad model fails before any step, or any folder is made
    config.output_dir.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    failed = False
    for index, step in enumerate(config.steps):
        if failed:
            steps.append({"name": step.label, "run": step.run, "status": "skipped", "model": str(model), "report": None})
            continue
        if progress is not None:
            progress(step.label, index, len(config.steps))
        output = step.output or config.output_dir / f"{model.stem}.{index + 1}-{step.run}.onnx"
        report = _run_step(step, model, output)
        record = report.to_record()
        status = "failed" if report.fails(step.fail_on) else "passed"
        written = record.get("output")
        if step.run in WRITES_MODEL and not written:
            status = "failed"  # nothing to hand to the next step
        steps.append({"name": step.label, "run": step.run, "status": status, "model": str(model), "report": record})
        if status == "failed":
            failed = True
        elif step.run in WRITES_MODEL:
            model = Path(written)
    return {
        "schema": SCHEMA,
        "config": str(config.path),
        "model": str(config.model),
        "final_model": str(model),
        "passed": not failed,
        "steps": steps,
    }
