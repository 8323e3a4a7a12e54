"""Config files, read and validated completely before anything runs.

Two shapes share one reader (``ortprep.toml``, or ``[tool.ortprep]`` of a pyproject.toml):

- a one-model pipeline: ``model =`` and ``[[steps]]`` (see ortprep.pipeline);
- a model repository: ``[[models]]`` globs x ``[targets.NAME]`` x ``[[steps]]``, with placement
  gates and ``[ignore]``:

    output_dir = "build/ortprep"

    [[models]]
    path = "models/*.onnx"              # a glob, relative to this file
    shapes = { x = [1, 3, 224, 224] }   # optional: sizes of symbolic inputs
    data = "data/calib"                 # optional: calibration / evaluation data

    [targets.npu]
    ep = "qnn"
    min_node_share = 0.95               # gates: see docs/pipeline.md

    [[steps]]
    run = "check"

    [ignore]
    CHK004 = "why this finding does not matter here"

Every error names the file, the line and the key, and exits 2: every model glob, every target,
and every step with its options for every target and [[models]] table is checked here, so a bad
step in the third target stops the run before any model is touched.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.eps.registry import resolve_ep
from ortprep.errors import UsageError
from ortprep.findings import CATALOGUE, Severity
from ortprep.steps import NO_MODEL, REGISTRY, WRITES_MODEL, options_class, step_class

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TOP_LEVEL_KEYS = ("model", "output_dir", "fail_on", "steps")
STEP_KEYS = ("run", "name", "fail_on", "output")  # beside the step's own options
FAIL_ON = {"error": Severity.ERROR, "warning": Severity.WARNING, "info": Severity.INFO, "never": None}


def parse_fail_on(value: Any, where: str) -> Severity | None:
    if value not in FAIL_ON:
        raise UsageError(f"{where}: fail_on is {value!r}", hint="use error, warning, info or never")
    return FAIL_ON[value]


def fail_on_name(severity: Severity | None) -> str:
    return "never" if severity is None else severity.label


REPO_KEYS = ("models", "targets", "steps", "output_dir", "fail_on", "ignore")
MODEL_KEYS = ("path", "shapes", "data")
GATES = {
    # key: (type, meaning); the value a model x target must meet
    "min_node_share": (float, "least share of the model's nodes on the EP (check)"),
    "min_mac_share": (float, "least share of the multiply-accumulates on the EP (check)"),
    "max_partitions": (int, "most EP partitions (check)"),
    "max_fallback_nodes": (int, "most nodes that fall back to the CPU (check)"),
    "no_cpu_island": (bool, "no CPU node between two nodes on the EP (check)"),
    "load_must_pass": (bool, "the model must load and run on the EP where this runner has it (load)"),
    "min_cosine": (float, "accuracy gate of convert and quantize steps (their min_cosine)"),
}
TARGET_KEYS = ("ep", "runtime", "prove", "device", *GATES)  # prove: check steps build the real session (check --prove);
# device: the device the target is for (QNN: the SoC, --device)


@dataclass
class StepEntry:
    """One step of a pipeline: the step (with validated options), its gate and its output."""

    step: Any  # ortprep.steps.base.Step
    fail_on: Severity | None = Severity.ERROR
    output: Path | None = None  # model-writing steps; None: the pipeline's default
    label: str = ""

    @property
    def name(self) -> str:
        return self.step.name


def relative_to(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` where it lies under it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


# --- where a key is written ----------------------------------------------------------------------


class ConfigText:
    """The config's text, to say on which line a key is (tomllib keeps no positions)."""

    def __init__(self, path: Path, text: str, prefix: str = "") -> None:
        self.path, self.lines, self.prefix = path, text.splitlines(), prefix

    def line_of(self, table: str, key: str | None = None, occurrence: int = 0) -> int | None:
        """1-based line of ``key`` in ``[table]`` (the ``occurrence``-th ``[[table]]``), or of the
        table header when ``key`` is None."""
        wanted = ".".join(p for p in (self.prefix, table) if p)
        current, seen, header_line = "", -1, None
        for number, line in enumerate(self.lines, 1):
            stripped = line.strip()
            header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", stripped)
            if header:
                current = header.group(1)
                if current == wanted:
                    seen += 1
                    header_line = number if seen == occurrence else header_line
                continue
            if (key is not None and current == wanted and seen == occurrence
                    and re.match(rf"^\"?{re.escape(key)}\"?\s*=", stripped)):
                return number
            if key is not None and not wanted and not current and re.match(rf"^{re.escape(key)}\s*=", stripped):
                return number
        if key is not None and table and "." in table:  # an inline table: find "name = {" under the parent
            parent, _, child = table.rpartition(".")
            return self.line_of(parent, child, occurrence) or header_line
        return header_line if key is None or header_line else None

    def error(self, problem: str, table: str, key: str | None = None, hint: str = "",
              occurrence: int = 0) -> UsageError:
        line = self.line_of(table, key, occurrence)
        where = f"{self.path.name}:{line}" if line else self.path.name
        name = ".".join(p for p in (table, key) if p)
        return UsageError(f"{where}: {name}: {problem}", hint=hint or "see docs/pipeline.md")


# --- reading --------------------------------------------------------------------------------


def read_raw(path: Path) -> tuple[dict[str, Any], ConfigText]:
    """The config's table: ortprep.toml itself, or [tool.ortprep] of a pyproject.toml."""
    path = Path(path)
    if path.is_dir():
        for name in ("ortprep.toml", "pyproject.toml"):
            if (path / name).is_file():
                path = path / name
                break
    if not path.is_file():
        raise UsageError(f"config not found: {path}", hint="write one with: ortprep init")
    try:
        text = path.read_text(encoding="utf-8")
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path.name}: not valid TOML: {exc}", hint="fix the syntax") from exc
    if path.name == "pyproject.toml":
        raw = raw.get("tool", {}).get("ortprep")
        if raw is None:
            raise UsageError(f"{path}: no [tool.ortprep] table", hint="add one, or write ortprep.toml: ortprep init")
        return raw, ConfigText(path, text, prefix="tool.ortprep")
    return raw, ConfigText(path, text)


def is_repo_config(raw: dict[str, Any]) -> bool:
    return "models" in raw or "targets" in raw


# --- a one-model pipeline ------------------------------------------------------------------


def parse_pipeline(raw: dict[str, Any], path: Path) -> tuple[list[StepEntry], Path | None, Path]:
    """A one-model pipeline's table: (its steps, the model, the output folder), validated."""
    base = path.parent.resolve()
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:
        near = sorted({key for key in REPO_KEYS if any(u.rstrip("s") == key.rstrip("s") for u in unknown)}
                      - set(TOP_LEVEL_KEYS))
        raise UsageError(f"{path.name}: unknown top-level key(s) {', '.join(unknown)}",
                         hint=f"valid keys: {', '.join(TOP_LEVEL_KEYS)} for one model's pipeline"
                              + (f"; a repository config has {', '.join(near)} (spelled so)" if near else
                                 f", or {', '.join(k for k in REPO_KEYS if k not in TOP_LEVEL_KEYS)} for a repository"))
    default_fail = parse_fail_on(raw.get("fail_on", "error"), path.name)
    entries = raw.get("steps") or []
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path.name}: no steps", hint='add [[steps]] tables, e.g. run = "check"')
    steps = [step_from_config(entry, index, base, default_fail, path.name) for index, entry in enumerate(entries, 1)]
    needs_model = any(s.name not in NO_MODEL for s in steps)
    if needs_model and "model" not in raw:
        raise UsageError(f"{path.name}: no 'model'", hint='add model = "path/to/model.onnx"')
    model = (base / raw["model"]).resolve() if "model" in raw else None
    return steps, model, (base / raw.get("output_dir", "build")).resolve()


def step_from_config(entry: Any, index: int, base: Path, default_fail: Severity | None, file_name: str) -> StepEntry:
    where = f"{file_name}: step {index}" if file_name else f"step {index}"
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
    return StepEntry(step, fail_on, output, label=entry.get("name") or f"{index}. {run}")


# --- a repository ---------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    ep: str
    runtime: Path | None = None
    gates: dict[str, Any] = field(default_factory=dict)
    prove: bool = False  # check steps prove their verdict on the real session (check --prove)
    device: str | None = None  # the device it is for (QNN's SoC: --device)


@dataclass
class ModelEntry:
    path: Path
    shapes: dict[str, list[int]] = field(default_factory=dict)
    data: Path | None = None
    table: int = 0  # which [[models]] table matched it


@dataclass
class RepoConfig:
    path: Path
    models: list[ModelEntry]
    targets: list[Target]
    steps: list[dict[str, Any]]  # step tables as written (validated)
    output_dir: Path
    fail_on: str = "error"
    ignore: dict[str, str] = field(default_factory=dict)

    def pairs(self) -> list[tuple[ModelEntry, Target]]:
        """Every model x target, in a fixed order (by path relative to the config, then target)."""
        return sorted(((m, t) for m in self.models for t in self.targets),
                      key=lambda pair: (relative_to(pair[0].path, self.path.parent), pair[1].name))


def parse_repository(raw: dict[str, Any], text: ConfigText, *, targets_only: bool = False) -> RepoConfig:
    """Validate a repository config before any work: unknown keys, wrong types, globs that match
    nothing, unknown EPs and finding codes each stop here with the file, line and key.
    ``targets_only``: the reader uses the [targets] alone (package), so a config without
    [[models]] or [[steps]] is complete for it; what it does hold is still validated."""
    base = text.path.parent.resolve()
    for key in raw:
        if key not in REPO_KEYS:
            raise text.error("unknown key", "", key,
                             hint=f"valid keys: {', '.join(REPO_KEYS)} (or model = for one model)")
    models = _list_of_tables(raw, "models", text)
    if not models and not targets_only:
        raise text.error("no models", "models", hint='add [[models]] with path = "models/*.onnx"')
    entries: list[ModelEntry] = []
    for index, table in enumerate(models):
        for key in table:
            if key not in MODEL_KEYS:
                raise text.error("unknown key", "models", key, hint=f"valid keys: {', '.join(MODEL_KEYS)}",
                                 occurrence=index)
        pattern = table.get("path")
        if not isinstance(pattern, str) or not pattern:
            raise text.error("needs a path (a glob, relative to the config)", "models", "path", occurrence=index)
        found = sorted(Path(p).resolve() for p in glob.glob(str(base / pattern), recursive=True) if Path(p).is_file())
        if not found:
            raise text.error(f"'{pattern}' matches no file", "models", "path", occurrence=index,
                             hint=f"globs are relative to {base}")
        shapes = table.get("shapes", {})
        if not isinstance(shapes, dict) or not all(isinstance(v, list) and all(isinstance(d, int) and d > 0 for d in v)
                                                   for v in shapes.values()):
            raise text.error("must be a table of input name -> list of positive integers", "models", "shapes",
                             occurrence=index, hint="shapes = { x = [1, 3, 224, 224] }")
        data = table.get("data")
        if data is not None and not isinstance(data, str):
            raise text.error(f"must be a path, not {type(data).__name__}", "models", "data", occurrence=index)
        for path in found:
            entries.append(ModelEntry(path, dict(shapes), (base / data).resolve() if data else None, index))
    targets_raw = raw.get("targets")
    if isinstance(targets_raw, list) and targets_raw:
        raise text.error("must be named tables, not a list", "targets",
                         hint='write each target as [targets.NAME] with ep = "...", e.g. [targets.cpu] (not '
                              '[[targets]])')
    if not isinstance(targets_raw, dict) or not targets_raw:
        raise text.error("no targets", "targets", hint='add [targets.cpu] with ep = "cpu"')
    targets = []
    for name, table in targets_raw.items():
        where = f"targets.{name}"
        if not isinstance(table, dict):
            raise text.error("must be a table", "targets", name)
        for key, value in table.items():
            if key not in TARGET_KEYS:
                raise text.error("unknown key", where, key, hint=f"valid keys: {', '.join(TARGET_KEYS)}")
            if key in GATES:
                kind = GATES[key][0]
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                good = (isinstance(value, bool) if kind is bool
                        else number and (kind is float or float(value).is_integer()))
                if not good:
                    expected = 'true or false' if kind is bool else 'a number' if kind is float else 'an integer'
                    raise text.error(f"must be {expected}, not {value!r}", where, key)
                if key.endswith("_share") and not 0 <= value <= 1:
                    raise text.error(f"must be between 0 and 1, not {value}", where, key)
        if not isinstance(table.get("ep"), str):
            raise text.error("needs ep = \"NAME\" (an EP name or alias)", where, "ep")
        try:
            ep = resolve_ep(table["ep"]).name
        except UsageError as exc:
            raise text.error(str(exc), where, "ep") from None
        runtime = table.get("runtime")
        if runtime is not None and not isinstance(runtime, str):
            raise text.error("must be the path of a Python", where, "runtime")
        if not isinstance(table.get("prove", False), bool):
            raise text.error(f"must be true or false, not {table['prove']!r}", where, "prove")
        device = table.get("device")
        if device is not None:
            from ortprep.eps.devices import resolve_device

            if not isinstance(device, str):
                raise text.error("must be a device name, e.g. \"x-elite\" or \"soc_model=57\"", where, "device")
            try:
                resolve_device(ep, device)
            except UsageError as exc:
                raise text.error(exc.message, where, "device", hint=exc.hint) from None
        targets.append(Target(name, ep, (base / runtime).resolve() if runtime else None,
                              {k: v for k, v in table.items() if k in GATES}, bool(table.get("prove", False)), device))
    steps = _list_of_tables(raw, "steps", text)
    if not steps and not targets_only:
        raise text.error("no steps", "steps", hint='add [[steps]] with run = "check"')
    # Every step for every model table and every target, before anything runs: a bad option that
    # only shows with the third target's EP (or one model table's shapes) stops here, exit 2.
    tables = [(index, table) for index, table in enumerate(models)]
    for index, step in enumerate(steps):
        for target in targets:
            for table_index, table in tables:
                entry = next(e for e in entries if e.table == table_index)
                try:
                    step_from_config(for_target(step, target, entry), index + 1, base, FAIL_ON["error"], "")
                except UsageError as exc:
                    line = text.line_of("steps", None, index)
                    model_table = f", [[models]] {table_index + 1}" if len(tables) > 1 else ""
                    context = f" (target {target.name}{model_table})"
                    raise UsageError(f"{text.path.name}:{line}: {exc.args[0]}{context}",
                                     hint=getattr(exc, "hint", "")) from None
    ignore = raw.get("ignore", {})
    if not isinstance(ignore, dict):
        raise text.error("must be a table of finding code -> reason", "ignore")
    for code, reason in ignore.items():
        if code not in CATALOGUE:
            raise text.error("unknown finding code", "ignore", code, hint="codes are listed in docs/cli.md")
        if not isinstance(reason, str) or len(reason.strip()) < 3:
            raise text.error("needs a written reason", "ignore", code, hint=f'{code} = "why it does not matter here"')
    fail_on = raw.get("fail_on", "error")
    if fail_on not in FAIL_ON:
        parse_fail_on(fail_on, f"{text.path.name}:{text.line_of('', 'fail_on')}")
    output_dir = raw.get("output_dir", "build/ortprep")
    if not isinstance(output_dir, str):
        raise text.error("must be a path", "", "output_dir")
    return RepoConfig(text.path.resolve(), entries, targets, steps, (base / output_dir).resolve(), fail_on,
                      dict(ignore))


def _list_of_tables(raw: dict[str, Any], key: str, text: ConfigText) -> list[dict[str, Any]]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise text.error(f"must be a list of tables ([[{key}]]), not {type(value).__name__}", "", key)
    return value


def load_repository(path: Path | str) -> RepoConfig:
    raw, text = read_raw(Path(path))
    if not is_repo_config(raw):
        raise UsageError(f"{text.path.name} is a one-model pipeline (model = ...), not a repository config",
                         hint="run it with: ortprep run " + str(text.path))
    return parse_repository(raw, text)


def for_target(step: dict[str, Any], target: Target, model: ModelEntry) -> dict[str, Any]:
    """A step table with the target and the model's settings filled in where the step has them
    and the config did not set them."""
    table = dict(step)
    run = table.get("run")
    try:
        fields = set(options_class(run).__dataclass_fields__)
    except (KeyError, TypeError, AttributeError, UsageError):
        return table  # an unknown step: step_from_config says so, with its number
    if "eps" in fields and "eps" not in table:
        table["eps"] = [target.ep]
    if "ep" in fields and "ep" not in table:
        table["ep"] = target.ep
    if "runtimes" in fields and target.runtime is not None and "runtimes" not in table:
        table["runtimes"] = {target.ep: str(target.runtime)}
    if "prove" in fields and target.prove and "prove" not in table:
        table["prove"] = True
    if "device" in fields and target.device is not None and "device" not in table:
        table["device"] = target.device
    if "min_cosine" in fields and "min_cosine" in target.gates and "min_cosine" not in table:
        table["min_cosine"] = target.gates["min_cosine"]
    if "shapes" in fields and model.shapes and "shapes" not in table:
        table["shapes"] = model.shapes
    if run == "quantize" and model.data is not None and "calib" not in table:
        table["calib"] = str(model.data)
    return table


# --- writing --------------------------------------------------------------------------------


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


def find_models(folder: Path) -> list[Path]:
    skip = {".git", ".venv", "build", "node_modules", "__pycache__"}
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith(".venv"))
        found += [Path(root) / f for f in sorted(files) if fnmatch.fnmatch(f, "*.onnx")]
    return found
