"""Pipelines: ordered steps over one model. A command line is a one-step pipeline; a model
repository's ``ortprep.toml`` is a longer one. Both are validated the same way, before any step
runs, and both run through :meth:`Pipeline.run` into one :class:`~ortprep.report.RunReport`.

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

The run stops at the first failing step; the steps after it are reported as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.errors import UsageError
from ortprep.findings import Severity
from ortprep.options import relative_path
from ortprep.report import RunReport, StepOutcome
from ortprep.steps import NO_MODEL, REGISTRY, WRITES_MODEL, options_class, step_class

TOP_LEVEL_KEYS = ("model", "output_dir", "fail_on", "steps")
STEP_KEYS = ("run", "name", "fail_on", "output")  # beside the step's own options
FAIL_ON = {"error": Severity.ERROR, "warning": Severity.WARNING, "info": Severity.INFO, "never": None}


def parse_fail_on(value: Any, where: str) -> Severity | None:
    if value not in FAIL_ON:
        raise UsageError(f"{where}: fail_on is {value!r}", hint="use error, warning, info or never")
    return FAIL_ON[value]


def fail_on_name(severity: Severity | None) -> str:
    return "never" if severity is None else severity.label


@dataclass
class PipelineStep:
    """One step of a pipeline: the step (with validated options), its gate and its output."""

    step: Any  # ortprep.steps.base.Step
    fail_on: Severity | None = Severity.ERROR
    output: Path | None = None  # model-writing steps; None: the pipeline's default
    label: str = ""

    @property
    def name(self) -> str:
        return self.step.name


@dataclass
class Pipeline:
    """Steps over one model, validated before any runs."""

    steps: list[PipelineStep]
    model: Path | None
    output_dir: Path | None = None  # where unnamed outputs go (None: each step's default, beside the input)
    config: Path | None = None
    force: bool = False  # a command line's --force: an output may replace the input model
    single_command: bool = False
    progress: Any = None  # callback(stage, done, total) for progress bars
    ignore: frozenset[str] = frozenset()  # finding codes that do not fail a step (a repository config's [ignore])
    _prepared: bool = field(default=False, repr=False)

    # --- building ------------------------------------------------------------------------------

    @classmethod
    def single(cls, name: str, options: Any, model: Path | None, *, output: Path | None = None,
               fail_on: Severity | None = Severity.ERROR, force: bool = False) -> "Pipeline":
        """The one-step pipeline a command line stands for."""
        step = step_class(name)(options)
        pipeline = cls(steps=[PipelineStep(step, fail_on, output, label=name)], model=model, force=force,
                       single_command=True)
        pipeline.validate()
        return pipeline

    @classmethod
    def from_toml(cls, path: Path) -> "Pipeline":
        """Read and validate a pipeline file: unknown keys, bad values and unknown EPs exit 2 here,
        before any step runs or any file is written."""
        from ortprep.repo import is_repo_config, read_raw

        raw, text = read_raw(Path(path))  # ortprep.toml, or [tool.ortprep] of a pyproject.toml
        if is_repo_config(raw):
            raise UsageError(f"{text.path.name} is a repository config ([[models]], [targets]), not a one-model pipeline",
                             hint=f"run it with: ortprep run {text.path}")
        return cls.from_dict(raw, text.path)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path) -> "Pipeline":
        base = path.parent.resolve()
        unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
        if unknown:
            raise UsageError(f"{path.name}: unknown top-level key(s) {', '.join(unknown)}",
                             hint=f"valid keys: {', '.join(TOP_LEVEL_KEYS)}")
        default_fail = parse_fail_on(raw.get("fail_on", "error"), path.name)
        entries = raw.get("steps") or []
        if not isinstance(entries, list) or not entries:
            raise UsageError(f"{path.name}: no steps", hint='add [[steps]] tables, e.g. run = "check"')
        steps = [_step_from_config(entry, index, base, default_fail, path.name) for index, entry in enumerate(entries, 1)]
        needs_model = any(s.name not in NO_MODEL for s in steps)
        if needs_model and "model" not in raw:
            raise UsageError(f"{path.name}: no 'model'", hint='add model = "path/to/model.onnx"')
        model = (base / raw["model"]).resolve() if "model" in raw else None
        output_dir = (base / raw.get("output_dir", "build")).resolve()
        pipeline = cls(steps=steps, model=model, output_dir=output_dir, config=path.resolve())
        pipeline.validate()
        return pipeline

    # --- checks before any work ----------------------------------------------------------------

    def validate(self) -> None:
        """Everything that can be checked without running: the model opens, outputs are writable
        and never the input, each step's environment is there."""
        from ortprep.model import ModelHandle, check_output_path

        if any(s.name not in NO_MODEL for s in self.steps):
            if self.model is None:
                raise UsageError("no model given", hint="usage: ortprep COMMAND MODEL ...")
            ModelHandle.open(self.model)  # a bad model fails before any step, or any folder is made
        for index, entry in enumerate(self.steps):
            if entry.name in WRITES_MODEL:
                dest = self.output_for(index)
                parent_made_later = self.output_dir is not None and dest.parent == self.output_dir
                if not parent_made_later:
                    check_output_path(dest, input_path=self.model, force=self.force)
                elif self.model is not None and dest.resolve() == self.model.resolve():
                    raise UsageError(f"step {index + 1} would write over the model {self.model}", hint="choose another output")

    def output_for(self, index: int, model: Path | None = None) -> Path:
        """Where step ``index`` writes: its own output, the run's output folder, or beside the input."""
        entry = self.steps[index]
        if entry.output is not None:
            return entry.output
        source = model or self.model
        if self.output_dir is not None:
            return self.output_dir / f"{source.stem}.{index + 1}-{entry.name}.onnx"
        return entry.step.default_output(source)

    # --- running -------------------------------------------------------------------------------

    def prepare(self) -> None:
        """The environment checks of every step (e.g. ONNX Runtime installed), before any runs."""
        if not self._prepared:
            for entry in self.steps:
                entry.step.prepare()
            self._prepared = True

    def run(self) -> RunReport:
        """Run the steps in order; the model a step writes feeds the next."""
        from ortprep.model import ModelHandle
        from ortprep.steps.base import StepContext

        self.prepare()
        model = self.model
        report = RunReport(config=str(self.config) if self.config else None, model=str(self.model) if self.model else None,
                           final_model=None, single_command=self.single_command)
        if self.output_dir is not None and any(s.name in WRITES_MODEL for s in self.steps):
            self.output_dir.mkdir(parents=True, exist_ok=True)
        failed = False
        for index, entry in enumerate(self.steps):
            shown = str(model) if model is not None and entry.name not in NO_MODEL else None
            if failed:
                report.steps.append(StepOutcome(entry.label, entry.name, "skipped", shown))
                continue
            if self.progress is not None and not self.single_command:
                self.progress(entry.label, index, len(self.steps))
            handle = ModelHandle.open(model) if entry.name not in NO_MODEL else None
            output = self.output_for(index, model) if entry.name in WRITES_MODEL else None
            entry.step.admit(handle)
            result = entry.step.run(handle, StepContext(output=output, force=self.force, progress=self.progress))
            status = "failed" if result.fails(entry.fail_on, self.ignore) or result.missing else "passed"
            if entry.name in WRITES_MODEL and result.output is None:
                status = "failed"  # nothing to hand to the next step
            report.steps.append(StepOutcome(entry.label, entry.name, status, shown, result))
            if status == "failed":
                failed = True
            elif result.output is not None:
                model = Path(result.output)
        report.final_model = str(model) if model is not None else None
        return report

    # --- writing out ---------------------------------------------------------------------------

    def to_config(self, config_path: Path) -> dict[str, Any]:
        """The pipeline file that runs these steps to the same result, paths relative to its folder."""
        base = Path(config_path).resolve().parent
        document: dict[str, Any] = {}
        if self.model is not None:
            document["model"] = relative_path(self.model, base)
        steps = []
        for index, entry in enumerate(self.steps):
            table: dict[str, Any] = {"run": entry.name}
            if entry.label and entry.label != entry.name:
                table["name"] = entry.label
            if entry.fail_on != Severity.ERROR:
                table["fail_on"] = fail_on_name(entry.fail_on)
            if entry.name in WRITES_MODEL and self.model is not None:
                table["output"] = relative_path(self.output_for(index), base)
            table.update(entry.step.options.to_config(base))
            steps.append(table)
        document["steps"] = steps
        return document


def _step_from_config(entry: Any, index: int, base: Path, default_fail: Severity | None, file_name: str) -> PipelineStep:
    where = f"{file_name}: step {index}"
    if not isinstance(entry, dict) or "run" not in entry:
        raise UsageError(f"{where} has no 'run'", hint="run = one of " + ", ".join(REGISTRY))
    run = entry["run"]
    if run not in REGISTRY:
        raise UsageError(f"{where}: unknown step {run!r}", hint="use one of: " + ", ".join(REGISTRY))
    where = f"{where} ({run})"
    values = {k: v for k, v in entry.items() if k not in STEP_KEYS}
    options = options_class(run).from_values(values, where=where, base=base)
    if "output" in entry and run not in WRITES_MODEL:
        raise UsageError(f"{where}: 'output' is only for steps that write a model", hint="remove it")
    output = (base / entry["output"]).resolve() if "output" in entry else None
    fail_on = parse_fail_on(entry.get("fail_on", fail_on_name(default_fail)), where)
    step = step_class(run)(options)
    return PipelineStep(step, fail_on, output, label=entry.get("name") or f"{index}. {run}")


def dump_toml(document: dict[str, Any]) -> str:
    """TOML for a pipeline document (strings, numbers, booleans, lists and small tables)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in document.items() if key != "steps"]
    for table in document.get("steps", []):
        lines += ["", "[[steps]]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    bare = key.replace("-", "").replace("_", "").isalnum()
    return key if bare and key else _toml_value(key)


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def run_pipeline(config: Path | str, progress=None) -> RunReport:
    """Read, validate and run a pipeline file; returns its RunReport."""
    pipeline = Pipeline.from_toml(Path(config))
    pipeline.progress = progress
    return pipeline.run()
