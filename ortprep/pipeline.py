"""Pipelines: ordered steps over one model. A command line is a one-step pipeline; a config's
``[[steps]]`` a longer one; a model repository (``[[models]]`` x ``[targets]``) a list of them, one
per model x target, each returning its :class:`~ortprep.report.RunReport` through the same
:meth:`Pipeline.run`. Configs are read and validated completely by :mod:`ortprep.config` before
any step runs.

    model = "models/net.onnx"
    output_dir = "build"          # optional; default build/ beside this file
    fail_on = "error"             # optional; each step may override it

    [[steps]]
    run = "check"
    eps = ["dml", "dml-npu"]

The run stops at the first failing step; the steps after it are reported as skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.config import (
    FAIL_ON,
    ModelEntry,
    RepoConfig,
    StepEntry,
    Target,
    fail_on_name,
    for_target,
    is_repo_config,
    parse_pipeline,
    parse_repository,
    read_raw,
    relative_to,
    step_from_config,
)
from ortprep.errors import OrtprepError, UsageError
from ortprep.findings import Severity
from ortprep.options import relative_path
from ortprep.report import RepositoryReport, RunReport, StepOutcome
from ortprep.runtime.protocol import Reply, Request
from ortprep.steps import NO_MODEL, WRITES_MODEL, step_class

PAIR_TIMEOUT = 6 * 3600.0  # seconds one model x target may take on a worker before it counts as hung


@dataclass
class Pipeline:
    """Steps over one model, validated before any runs."""

    steps: list[StepEntry]
    model: Path | None
    output_dir: Path | None = None  # where unnamed outputs go (None: each step's default, beside the input)
    config: Path | None = None
    force: bool = False  # a command line's --force: an output may replace the input model
    single_command: bool = False
    progress: Any = None  # callback(stage, done, total) for progress bars
    ignore: frozenset[str] = frozenset()  # finding codes that do not fail a step (a repository config's [ignore])
    _prepared: bool = field(default=False, repr=False)
    # the model validate() opened, handed to the first step that reads it (opening a large graph
    # is slow: docs/decisions/seams-large-graph-costs.md)
    _opened: Any = field(default=None, repr=False)

    # --- building ------------------------------------------------------------------------------

    @classmethod
    def single(cls, name: str, options: Any, model: Path | None, *, output: Path | None = None,
               fail_on: Severity | None = Severity.ERROR, force: bool = False) -> "Pipeline":
        """The one-step pipeline a command line stands for."""
        step = step_class(name)(options)
        pipeline = cls(steps=[StepEntry(step, fail_on, output, label=name)], model=model, force=force,
                       single_command=True)
        pipeline.validate()
        return pipeline

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: Path) -> "Pipeline":
        steps, model, output_dir = parse_pipeline(raw, path)
        pipeline = cls(steps=steps, model=model, output_dir=output_dir, config=path.resolve())
        pipeline.validate()
        return pipeline

    @classmethod
    def for_pair(cls, config: RepoConfig, model: ModelEntry, target: Target, *, draw_graph: bool = False) -> "Pipeline":
        """The pipeline of one model x target of a repository config: its steps with the target and
        the model's settings filled in, writing under output_dir/MODEL/TARGET."""
        base = config.path.parent
        steps = []
        for index, table in enumerate(config.steps):
            filled = for_target(table, target, model)
            if draw_graph and filled.get("run") == "check":
                filled["graph"] = True
            steps.append(step_from_config(filled, index + 1, base, FAIL_ON[config.fail_on], config.path.name))
        folder = config.output_dir / _slug(relative_to(model.path, base)) / target.name
        return cls(steps=steps, model=model.path, output_dir=folder, config=config.path,
                   ignore=frozenset(config.ignore))

    # --- checks before any work ----------------------------------------------------------------

    def validate(self) -> None:
        """Everything that can be checked without running: the model opens, outputs are writable
        and never the input, each step's environment is there."""
        from ortprep.model import ModelHandle, check_output_path

        if any(s.name not in NO_MODEL for s in self.steps):
            if self.model is None:
                raise UsageError("no model given", hint="usage: ortprep COMMAND MODEL ...")
            self._opened = ModelHandle.open(self.model)  # a bad model fails before any step, or any folder is made
        for index, entry in enumerate(self.steps):
            if entry.name in WRITES_MODEL:
                dest = self.output_for(index)
                parent_made_later = self.output_dir is not None and dest.parent == self.output_dir
                if not parent_made_later:
                    check_output_path(dest, input_path=self.model, force=self.force)
                elif self.model is not None and dest.resolve() == self.model.resolve():
                    raise UsageError(f"step {index + 1} would write over the model {self.model}",
                                     hint="choose another output")

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
        from ortprep.runtime.worker import workers_scope

        # One worker per interpreter, and its sessions, for the whole run; started at once only when
        # a step will need ONNX Runtime (inspect alone never starts one).
        with workers_scope(prestart=any(entry.step.needs_ort != "never" for entry in self.steps)):
            self.prepare()
            model = self.model
            report = RunReport(config=str(self.config) if self.config else None,
                               model=str(self.model) if self.model else None,
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
                opened, self._opened = self._opened, None  # only the first step may take it
                handle = None
                if entry.name not in NO_MODEL:
                    handle = opened if opened is not None and opened.path == Path(os.path.abspath(model)) \
                        else ModelHandle.open(model)
                output = self.output_for(index, model) if entry.name in WRITES_MODEL else None
                entry.step.admit(handle)
                result = entry.step.run(handle, StepContext(output=output, force=self.force, progress=self.progress))
                status = "failed" if result.fails(entry.fail_on, self.ignore) or result.missing else "passed"
                if entry.name in WRITES_MODEL and result.output is None:
                    status = "failed"  # nothing to hand to the next step
                write_page(entry.step, result)
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


def write_page(step, result) -> None:
    """The placement page a check step with ``html`` asked for, drawn from its record (the
    command line, a config and the Python API all get it here)."""
    page = getattr(step.options, "html", None)
    if page is None or "graph" not in result.data:
        return
    from ortprep.model import atomic_write_bytes
    from ortprep.render.html import check_page

    atomic_write_bytes(page, check_page(result.to_record()).encode("utf-8"))
    result.artifacts.append(str(page))


def with_graphs(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of a repository document in which every check record holds what the HTML pages draw:
    records of shards run without --html get the graph and partitions from their model file (its
    graph only, no weights), where the file is still there."""
    import copy

    import onnx

    from ortprep.eps.partition import graph_view, partition_groups
    from ortprep.report import step_report

    document = copy.deepcopy(document)
    graphs: dict[str, Any] = {}
    for run in document.get("runs", []):
        check = step_report(run.get("steps", []), "check")
        path = run.get("model_path")
        if check is None or "graph" in check or not path or not Path(path).is_file():
            continue
        if path not in graphs:
            graphs[path] = onnx.load(path, load_external_data=False).graph
        graph = graphs[path]
        check["graph"] = graph_view(graph)
        for result in check.get("results", []):
            result.setdefault("partition_groups", partition_groups(graph, result.get("fallback_nodes") or []))
    return document


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.removesuffix(".onnx")).strip("_") or "model"


# --- a repository: one pipeline per model x target ------------------------------------------------


def run_pair(config: RepoConfig, model: ModelEntry, target: Target, *, draw_graph: bool = False) -> RunReport:
    """One model x target: its pipeline's RunReport, with the target's gates judged on it. A
    failure that stops the pair before its steps (an unreadable model) is its ``error``; it never
    ends the other pairs."""
    from ortprep.gates import judge

    label = relative_to(model.path, config.path.parent)
    try:
        pipeline = Pipeline.for_pair(config, model, target, draw_graph=draw_graph)
        pipeline.validate()
        report = pipeline.run()
    except OrtprepError as exc:
        report = RunReport(config=str(config.path), model=str(model.path), final_model=None)
        report.error = f"{exc.args[0]}" + (f" ({exc.hint})" if getattr(exc, "hint", None) else "")
    except Exception as exc:  # noqa: BLE001 - one pair's bug must not end the others; recorded
        report = RunReport(config=str(config.path), model=str(model.path), final_model=None)
        report.error = f"internal error: {type(exc).__name__}: {exc}"
    report.target, report.ep, report.model_label = target.name, target.ep, label
    if report.error is None:
        report.gates = judge(target, [step.to_record() for step in report.steps])
    return report


@dataclass
class PairReply(Reply):
    report: RunReport | None = None


@dataclass
class RunPair(Request):
    """One model x target, run in a worker process (``run -j N``: N workers of this interpreter)."""

    config: RepoConfig
    model: ModelEntry
    target: Target
    draw_graph: bool = False
    reply_type = PairReply

    def handle(self, state) -> PairReply:
        from ortprep.runtime.worker import WorkerPool, workers_scope

        # This worker serves pair after pair: its own ORT workers (and their start) are kept across them.
        pool = state.extras.setdefault("pair_workers", WorkerPool())
        with workers_scope(pool):
            return PairReply(report=run_pair(self.config, self.model, self.target, draw_graph=self.draw_graph))


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


def pair_id(model: Path, target: str, config: Path) -> str:
    return f"{relative_to(model, config.parent)}::{target}"


def run_repository(config: RepoConfig, *, jobs: int = 1, shard: tuple[int, int] | None = None,
                   baseline: dict[str, Any] | None = None, tolerance: float = 0.001, progress=None,
                   draw_graph: bool = False) -> RepositoryReport:
    """Every model x target of ``config`` (those of ``shard``), each its own pipeline; with
    ``jobs`` > 1 they run on that many workers (ortprep.runtime), a crash ending only its pair."""
    pairs = [(m, t) for m, t in config.pairs() if in_shard(pair_id(m.path, t.name, config.path), shard)]
    reports: list[RunReport] = []
    if jobs <= 1 or len(pairs) <= 1:
        from ortprep.runtime.worker import workers_scope

        with workers_scope():  # one worker per interpreter for every pair, started once
            for index, (model, target) in enumerate(pairs):
                if progress is not None:
                    progress("models", index, len(pairs))
                reports.append(run_pair(config, model, target, draw_graph=draw_graph))
    else:
        reports = _run_on_workers(config, pairs, jobs, progress, draw_graph)
    result = RepositoryReport(config=str(config.path), runs=reports, shard=shard)
    if baseline is not None:
        from ortprep.baseline import compare

        result.regressions = compare(baseline, result.to_records(), tolerance)
    return result


def _run_on_workers(config: RepoConfig, pairs: list[tuple[ModelEntry, Target]], jobs: int, progress,
                    draw_graph: bool) -> list[RunReport]:
    from ortprep.runtime.worker import WorkerPool

    requests = [RunPair(config, model, target, draw_graph) for model, target in pairs]
    done = [0]

    def on_done(_index: int, _reply: Reply) -> None:
        done[0] += 1
        if progress is not None:
            progress("models", done[0], len(pairs))

    with WorkerPool() as pool:  # N workers of this interpreter: a crash or hang ends only its pair
        replies = pool.run_many(requests, jobs, on_done, timeout=PAIR_TIMEOUT)
    reports = []
    for (model, target), reply in zip(pairs, replies):
        report = getattr(reply, "report", None)
        if report is None:  # the worker died or hung: the pair's error, the others go on
            report = RunReport(config=str(config.path), model=str(model.path), final_model=None,
                               target=target.name, ep=target.ep,
                               model_label=relative_to(model.path, config.path.parent))
            report.error = f"the worker running it {reply.status}: {reply.message}"
        reports.append(report)
    return reports


def run_pipeline(config: Path | str, *, jobs: int = 1, shard: str | None = None, baseline: Path | str | None = None,
                 progress=None) -> RunReport | RepositoryReport:
    """Read, validate and run a config: a one-model pipeline's RunReport, or a repository's
    RepositoryReport (a RunReport per model x target)."""
    raw, text = read_raw(Path(config))
    if not is_repo_config(raw):
        pipeline = Pipeline.from_dict(raw, text.path)
        pipeline.progress = progress
        return pipeline.run()
    from ortprep.baseline import read_report

    old = read_report(Path(baseline)) if baseline else None
    return run_repository(parse_repository(raw, text), jobs=jobs, shard=parse_shard(shard), baseline=old,
                          progress=progress)
