"""A model repository's CI gate: every model x target x step of one config, with placement gates,
baselines, shards and merged reports.

    # ortprep.toml (or [tool.ortprep] in pyproject.toml)
    output_dir = "build/ortprep"

    [[models]]
    path = "models/*.onnx"              # a glob, relative to this file
    shapes = { x = [1, 3, 224, 224] }   # optional: sizes of symbolic inputs
    data = "data/calib"                 # optional: calibration / evaluation data

    [targets.npu]
    ep = "qnn"
    min_node_share = 0.95               # gates: see docs/pipeline.md
    max_partitions = 1

    [[steps]]
    run = "check"

    [ignore]
    CHK004 = "why this finding does not matter here"

A config with ``model =`` (one model, no targets) is a plain pipeline (ortprep.pipeline).
Each model x target pair runs as its own pipeline, in this process or (with ``jobs`` > 1) in a
worker process: one pair's failure is recorded, never the end of the others.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError, UsageError
from ortprep.findings import CATALOGUE
from ortprep.report import RUN_SCHEMA

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

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
TARGET_KEYS = ("ep", "runtime", *GATES)


# --- where a key is written ------------------------------------------------------------------


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
            if key is not None and current == wanted and seen == occurrence and re.match(rf"^\"?{re.escape(key)}\"?\s*=", stripped):
                return number
            if key is not None and not wanted and not current and re.match(rf"^{re.escape(key)}\s*=", stripped):
                return number
        if key is not None and table and "." in table:  # an inline table: find "name = {" under the parent
            parent, _, child = table.rpartition(".")
            return self.line_of(parent, child, occurrence) or header_line
        return header_line if key is None or header_line else None

    def error(self, problem: str, table: str, key: str | None = None, hint: str = "", occurrence: int = 0) -> UsageError:
        line = self.line_of(table, key, occurrence)
        where = f"{self.path.name}:{line}" if line else self.path.name
        name = ".".join(p for p in (table, key) if p)
        return UsageError(f"{where}: {name}: {problem}", hint=hint or "see docs/pipeline.md")


# --- the config ---------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    ep: str
    runtime: Path | None = None
    gates: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelEntry:
    path: Path
    shapes: dict[str, list[int]] = field(default_factory=dict)
    data: Path | None = None


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
                      key=lambda pair: (_relative(pair[0].path, self.path.parent), pair[1].name))


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


def parse(raw: dict[str, Any], text: ConfigText) -> RepoConfig:
    """Validate a repository config before any work: unknown keys, wrong types, globs that match
    nothing, unknown EPs and finding codes each stop here with the file, line and key."""
    from ortprep.eps.registry import resolve_ep
    from ortprep.pipeline import FAIL_ON, _step_from_config, parse_fail_on

    base = text.path.parent.resolve()
    for key in raw:
        if key not in REPO_KEYS:
            raise text.error("unknown key", "", key, hint=f"valid keys: {', '.join(REPO_KEYS)} (or model = for one model)")
    models = _list_of_tables(raw, "models", text)
    if not models:
        raise text.error("no models", "models", hint='add [[models]] with path = "models/*.onnx"')
    entries: list[ModelEntry] = []
    for index, table in enumerate(models):
        for key in table:
            if key not in MODEL_KEYS:
                raise text.error("unknown key", "models", key, hint=f"valid keys: {', '.join(MODEL_KEYS)}", occurrence=index)
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
            entries.append(ModelEntry(path, dict(shapes), (base / data).resolve() if data else None))
    targets_raw = raw.get("targets")
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
                good = isinstance(value, bool) if kind is bool else (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                                    and (kind is float or float(value).is_integer()))
                if not good:
                    raise text.error(f"must be {'true or false' if kind is bool else 'a number' if kind is float else 'an integer'}, "
                                     f"not {value!r}", where, key)
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
        targets.append(Target(name, ep, (base / runtime).resolve() if runtime else None,
                              {k: v for k, v in table.items() if k in GATES}))
    steps = _list_of_tables(raw, "steps", text)
    if not steps:
        raise text.error("no steps", "steps", hint='add [[steps]] with run = "check"')
    for index, step in enumerate(steps):
        try:
            _step_from_config(_for_target(step, targets[0], entries[0]), index + 1, base, FAIL_ON["error"], text.path.name)
        except UsageError as exc:
            line = text.line_of("steps", None, index)
            raise UsageError(f"{text.path.name}:{line}: {exc.args[0]}", hint=getattr(exc, "hint", "")) from None
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
    return RepoConfig(text.path.resolve(), entries, targets, steps, (base / output_dir).resolve(), fail_on, dict(ignore))


def _list_of_tables(raw: dict[str, Any], key: str, text: ConfigText) -> list[dict[str, Any]]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise text.error(f"must be a list of tables ([[{key}]]), not {type(value).__name__}", "", key)
    return value


def load(path: Path | str) -> RepoConfig:
    raw, text = read_raw(Path(path))
    if not is_repo_config(raw):
        raise UsageError(f"{text.path.name} is a one-model pipeline (model = ...), not a repository config",
                         hint="run it with: ortprep run " + str(text.path))
    return parse(raw, text)


# --- one model x target ---------------------------------------------------------------------------


def _for_target(step: dict[str, Any], target: Target, model: ModelEntry) -> dict[str, Any]:
    """A step table with the target and the model's settings filled in where the step has them
    and the config did not set them."""
    from ortprep.steps import options_class

    table = dict(step)
    run = table.get("run")
    try:
        fields = set(options_class(run).__dataclass_fields__)
    except (KeyError, TypeError, AttributeError):
        return table
    if "eps" in fields and "eps" not in table:
        table["eps"] = [target.ep]
    if "ep" in fields and "ep" not in table:
        table["ep"] = target.ep
    if "runtimes" in fields and target.runtime is not None and "runtimes" not in table:
        table["runtimes"] = {target.ep: str(target.runtime)}
    if "min_cosine" in fields and "min_cosine" in target.gates and "min_cosine" not in table:
        table["min_cosine"] = target.gates["min_cosine"]
    if "shapes" in fields and model.shapes and "shapes" not in table:
        table["shapes"] = model.shapes
    if run == "quantize" and model.data is not None and "calib" not in table:
        table["calib"] = str(model.data)
    return table


def pair_id(model: Path, target: str, config: Path) -> str:
    return f"{_relative(model, config.parent)}::{target}"


def _relative(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def run_pair(config: RepoConfig, model: ModelEntry, target: Target) -> dict[str, Any]:
    """Run the steps on one model for one target and judge the gates: a JSON-ready record."""
    from ortprep.pipeline import FAIL_ON, Pipeline, _step_from_config

    record: dict[str, Any] = {"model": _relative(model.path, config.path.parent), "model_path": str(model.path),
                              "target": target.name, "ep": target.ep, "passed": False, "steps": [], "gates": [],
                              "error": None}
    try:
        base = config.path.parent
        folder = config.output_dir / _slug(record["model"]) / target.name
        steps = [_step_from_config(_for_target(s, target, model), i + 1, base, FAIL_ON[config.fail_on], config.path.name)
                 for i, s in enumerate(config.steps)]
        pipeline = Pipeline(steps=steps, model=model.path, output_dir=folder, config=config.path,
                            ignore=frozenset(config.ignore))
        pipeline.validate()
        report = pipeline.run()
        record["steps"] = [s.to_record() for s in report.steps]
        record["final_model"] = report.final_model
        record["gates"] = judge(target, record["steps"], model.path)
        record["passed"] = report.passed and all(g["passed"] for g in record["gates"])
        record["missing"] = report.missing
    except OrtprepError as exc:
        record["error"] = f"{exc.args[0]}" + (f" ({exc.hint})" if getattr(exc, "hint", None) else "")
    except Exception as exc:  # noqa: BLE001 - one pair's bug must not end the others; recorded
        record["error"] = f"internal error: {type(exc).__name__}: {exc}"
    return record


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.removesuffix(".onnx")).strip("_") or "model"


def judge(target: Target, steps: list[dict[str, Any]], model: Path) -> list[dict[str, Any]]:
    """The target's gates against what the check and load steps measured."""
    gates = []
    result = placement_of({"steps": steps, "ep": target.ep})
    measured = {
        "min_node_share": ("node_share", lambda value, limit: value is not None and value >= limit),
        "min_mac_share": ("mac_share", lambda value, limit: value is None or value >= limit),
        "max_partitions": ("partitions", lambda value, limit: value <= limit),
        "max_fallback_nodes": ("fallback_nodes", lambda value, limit: len(value) <= limit),
    }
    for gate, (field_name, ok) in measured.items():
        if gate not in target.gates:
            continue
        limit = target.gates[gate]
        if result is None:
            gates.append({"gate": gate, "limit": limit, "value": None, "passed": False, "step": "check",
                          "reason": "no check step for this target ran"})
            continue
        value = result.get(field_name)
        passed = ok(value, limit)
        shown = len(value) if isinstance(value, list) else value
        reason = "" if passed else _gate_reason(gate, shown, limit, result)
        gates.append({"gate": gate, "limit": limit, "value": shown, "passed": passed, "step": "check", "reason": reason})
    if target.gates.get("no_cpu_island"):
        islands = cpu_islands(model, result.get("fallback_nodes", [])) if result is not None else None
        gates.append({"gate": "no_cpu_island", "limit": True, "value": islands, "passed": islands == [],
                      "step": "check",
                      "reason": "" if islands == [] else (f"CPU node(s) between EP nodes: {', '.join(islands[:5])}"
                                                          if islands else "no check step for this target ran")})
    if target.gates.get("load_must_pass"):
        load = next((s for s in steps if s["run"] == "load"), None)
        outcome = next((r for r in ((load or {}).get("report") or {}).get("results", []) if r.get("ep") == target.ep), None)
        if load is None:
            gates.append({"gate": "load_must_pass", "limit": True, "value": None, "passed": False, "step": "load",
                          "reason": "no load step in the config: add [[steps]] run = \"load\""})
        elif load["status"] == "skipped":
            gates.append({"gate": "load_must_pass", "limit": True, "value": "skipped", "passed": False, "step": "load",
                          "reason": "the load step did not run (an earlier step failed)"})
        elif outcome is None or outcome.get("status") == "unavailable":
            gates.append({"gate": "load_must_pass", "limit": True, "value": "not available here", "passed": True,
                          "step": "load", "reason": f"{target.ep} is not available on this runner: not judged"})
        else:
            passed = outcome.get("status") == "ok"
            gates.append({"gate": "load_must_pass", "limit": True, "value": outcome.get("status"), "passed": passed,
                          "step": "load", "reason": "" if passed else f"load on {target.ep}: {outcome.get('status')}: "
                          f"{(outcome.get('message') or '')[:200]}"})
    return gates


def _gate_reason(gate: str, value: Any, limit: Any, result: dict[str, Any]) -> str:
    fallback = result.get("fallback_nodes") or []
    names = f" (CPU: {', '.join(fallback[:5])}{'...' if len(fallback) > 5 else ''})" if fallback else ""
    text = {"min_node_share": f"{value:.1%} of the nodes on the EP, below {limit:.0%}" if value is not None else "no node share",
            "min_mac_share": f"{value:.1%} of the MACs on the EP, below {limit:.0%}" if value is not None else "no MAC share",
            "max_partitions": f"{value} EP partitions, more than {limit}",
            "max_fallback_nodes": f"{value} nodes fall back to the CPU, more than {limit}"}[gate]
    return text + names


def cpu_islands(model: Path, fallback: list[str]) -> list[str]:
    """Fallback nodes with a node on the EP both before and after them (a round trip EP -> CPU -> EP).
    Reads the graph only (no weights)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    names = [n.name or f"{n.op_type}#{i}" for i, n in enumerate(graph.node)]
    on_cpu = set(fallback)
    producers = {out: i for i, n in enumerate(graph.node) for out in n.output}
    parents = [[producers[x] for x in n.input if x in producers] for n in graph.node]
    children: list[list[int]] = [[] for _ in graph.node]
    for child, ps in enumerate(parents):
        for parent in ps:
            children[parent].append(child)

    def reaches_ep(start: int, links: list[list[int]]) -> bool:
        stack, seen = list(links[start]), set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if names[node] not in on_cpu and graph.node[node].op_type != "Constant":
                return True
            stack.extend(links[node])
        return False

    return [names[i] for i in range(len(graph.node)) if names[i] in on_cpu and reaches_ep(i, parents) and reaches_ep(i, children)]


# --- the whole run --------------------------------------------------------------------------------


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise UsageError(f"--shard {text!r}: expected K/N with 1 <= K <= N", hint="e.g. --shard 1/4")
    return int(match.group(1)), int(match.group(2))


def in_shard(pair: str, shard: tuple[int, int] | None) -> bool:
    """Deterministic: a pair belongs to shard K of N by a hash of its model path and target."""
    if shard is None:
        return True
    digest = int(hashlib.sha256(pair.encode("utf-8")).hexdigest()[:8], 16)
    return digest % shard[1] == shard[0] - 1


def _run_pair_job(args: tuple[RepoConfig, ModelEntry, Target]) -> dict[str, Any]:
    return run_pair(*args)


def run_repo(config: RepoConfig, *, jobs: int = 1, shard: tuple[int, int] | None = None,
             baseline: dict[str, Any] | None = None, tolerance: float = 0.001, progress=None) -> dict[str, Any]:
    """Run every model x target of ``config`` (those of ``shard``); returns the run document."""
    pairs = [(m, t) for m, t in config.pairs() if in_shard(pair_id(m.path, t.name, config.path), shard)]
    runs: list[dict[str, Any]] = []
    if jobs <= 1 or len(pairs) <= 1:
        for index, (model, target) in enumerate(pairs):
            if progress is not None:
                progress("models", index, len(pairs))
            runs.append(run_pair(config, model, target))
    else:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # no inherited locks or ORT state
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            for index, record in enumerate(pool.map(_run_pair_job, [(config, m, t) for m, t in pairs])):
                if progress is not None:
                    progress("models", index + 1, len(pairs))
                runs.append(record)
    document = build_document(str(config.path), runs, shard)
    if baseline is not None:
        document["regressions"] = compare(baseline, document, tolerance)
        document["passed"] = document["passed"] and not document["regressions"]
    return document


def build_document(config: str | None, runs: list[dict[str, Any]], shard: tuple[int, int] | None = None,
                   merged_from: list[str] | None = None) -> dict[str, Any]:
    runs = sorted(runs, key=lambda r: (r["model"], r["target"]))
    failed = [r for r in runs if not r["passed"]]
    document = {
        "schema": RUN_SCHEMA,
        "kind": "repository",
        "config": config,
        "model": None,
        "final_model": None,
        "passed": not failed,
        "shard": f"{shard[0]}/{shard[1]}" if shard else None,
        "merged_from": merged_from,
        "summary": {"pairs": len(runs), "passed": len(runs) - len(failed), "failed": len(failed),
                    "errors": sum(1 for r in runs if r.get("error"))},
        "runs": runs,
        "steps": [],
        "regressions": [],
    }
    return document


def merge(documents: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One document from the shards' documents; a pair reported twice is an error."""
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    config = None
    for name, document in documents:
        if document.get("schema") != RUN_SCHEMA or document.get("kind") != "repository":
            raise UsageError(f"{name} is not a repository run report ({RUN_SCHEMA}, kind repository)",
                             hint="merge the --report files of `ortprep run` shards")
        config = config or document.get("config")
        for run in document["runs"]:
            key = (run["model"], run["target"])
            if key in runs:
                raise UsageError(f"{name}: {run['model']} x {run['target']} is in two reports",
                                 hint="merge reports of different shards of one run")
            runs[key] = run
    return build_document(config, list(runs.values()), merged_from=[name for name, _ in documents])


# --- baselines and diffs --------------------------------------------------------------------------


def step_report(steps: list[dict[str, Any]], run: str) -> dict[str, Any] | None:
    """The report of the first step of kind ``run`` that produced one."""
    return next((s["report"] for s in steps if s["run"] == run and s.get("report")), None)


def placement_of(run: dict[str, Any]) -> dict[str, Any] | None:
    """The check result of a run's target (its placement), or None when no check ran."""
    check = step_report(run.get("steps", []), "check")
    return next((r for r in (check or {}).get("results", []) if r.get("ep") == run["ep"]), None)


def _accuracy(run: dict[str, Any]) -> dict[str, float]:
    found = {}
    for step in run.get("steps", []):
        report = step.get("report") or {}
        cosine = (report.get("verify") or {}).get("cosine")
        if cosine is not None:
            found[step["name"]] = cosine
    return found


def _sizes(run: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: s["report"]["size_after"] for s in run.get("steps", [])
            if s.get("report") and s["report"].get("size_after") is not None}


def _latency(run: dict[str, Any]) -> dict[str, float]:
    found = {}
    for step in run.get("steps", []):
        for result in (step.get("report") or {}).get("results", []) if step["run"] == "load" else []:
            median = (result.get("latency_ms") or {}).get("median") if isinstance(result.get("latency_ms"), dict) else None
            if median is not None:
                found[f"{step['name']} {result['ep']}"] = median
    return found


def _reasons(run: dict[str, Any]) -> dict[str, str]:
    """Node name -> why it is where it is, from the check's findings for this target."""
    check = step_report(run.get("steps", []), "check")
    reasons = {}
    for finding in (check or {}).get("findings", []):
        if finding.get("node") and finding.get("target") in (None, run["ep"]):
            reasons.setdefault(finding["node"], f"{finding['code']}: {finding['message']}")
    return reasons


def compare(old: dict[str, Any], new: dict[str, Any], tolerance: float = 0.001) -> list[dict[str, Any]]:
    """Regressions from ``old`` to ``new`` per model x target: coverage dropped, nodes moved to
    the CPU, more partitions, accuracy worse by more than ``tolerance``, a written model grown,
    latency worse by more than 10%."""
    before = {(r["model"], r["target"]): r for r in old.get("runs", [])}
    found = []
    for run in new.get("runs", []):
        key = (run["model"], run["target"])
        if key not in before:
            continue
        earlier = before[key]
        a, b = placement_of(earlier), placement_of(run)

        def add(kind: str, detail: str, **extra: Any) -> None:
            found.append({"model": run["model"], "target": run["target"], "kind": kind, "detail": detail, **extra})

        if a and b:
            if (b.get("node_share") or 0) < (a.get("node_share") or 0) - 1e-9:
                add("coverage", f"nodes on {run['ep']}: {a['node_share']:.1%} -> {b['node_share']:.1%}")
            if (b.get("mac_share") or 0) < (a.get("mac_share") or 0) - 1e-9:
                add("coverage", f"MACs on {run['ep']}: {a['mac_share']:.1%} -> {b['mac_share']:.1%}")
            moved = sorted(set(b.get("fallback_nodes", [])) - set(a.get("fallback_nodes", [])))
            if moved:
                reasons = _reasons(run)
                add("fallback", f"{len(moved)} node(s) moved from {run['ep']} to the CPU: " + ", ".join(moved[:10]),
                    nodes=[{"node": n, "reason": reasons.get(n, "")} for n in moved])
            if b.get("partitions", 0) > a.get("partitions", 0):
                add("partitions", f"EP partitions {a['partitions']} -> {b['partitions']}")
        for step, cosine in _accuracy(earlier).items():
            now = _accuracy(run).get(step)
            if now is not None and now < cosine - tolerance:
                add("accuracy", f"{step}: lowest cosine {cosine:.5f} -> {now:.5f}")
        for step, size in _sizes(earlier).items():
            now = _sizes(run).get(step)
            if now is not None and now > size:
                add("size", f"{step}: {size} -> {now} bytes")
        for where, ms in _latency(earlier).items():
            now = _latency(run).get(where)
            if now is not None and now > ms * 1.10:
                add("latency", f"{where}: {ms:.3f} -> {now:.3f} ms")
    return found


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Everything that moved between two reports (both directions), with the regressions."""
    before = {(r["model"], r["target"]): r for r in old.get("runs", [])}
    moves = []
    for run in new.get("runs", []):
        earlier = before.get((run["model"], run["target"]))
        a, b = (placement_of(earlier) if earlier else None), placement_of(run)
        if not a or not b:
            continue
        to_cpu = sorted(set(b.get("fallback_nodes", [])) - set(a.get("fallback_nodes", [])))
        to_ep = sorted(set(a.get("fallback_nodes", [])) - set(b.get("fallback_nodes", [])))
        reasons_new, reasons_old = _reasons(run), _reasons(earlier)
        for node in to_cpu:
            moves.append({"model": run["model"], "target": run["target"], "node": node, "from": run["ep"], "to": "cpu",
                          "reason": reasons_new.get(node, "")})
        for node in to_ep:
            moves.append({"model": run["model"], "target": run["target"], "node": node, "from": "cpu", "to": run["ep"],
                          "reason": f"no longer: {reasons_old.get(node, '')}".rstrip(": ")})
    return {"schema": "ortprep.diff/1", "moves": moves, "regressions": compare(old, new)}


def read_report(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"report not found: {path}", hint="write one with: ortprep run --report FILE")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a JSON report: {exc}", hint="pass a file written by --report") from None
    if document.get("schema") != RUN_SCHEMA or document.get("kind") != "repository":
        raise UsageError(f"{path} is not a repository run report", hint="pass a file written by: ortprep run --report FILE")
    return document


# --- init -----------------------------------------------------------------------------------------


def find_models(folder: Path) -> list[Path]:
    skip = {".git", ".venv", "build", "node_modules", "__pycache__"}
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith(".venv"))
        found += [Path(root) / f for f in sorted(files) if fnmatch.fnmatch(f, "*.onnx")]
    return found
