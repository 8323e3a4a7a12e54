"""Reports: what each step found and measured, what one pipeline run did (a ``RunReport``: one
model, optionally for one target of a repository), and what a repository run did (a
``RepositoryReport``: a list of RunReports). Every renderer (console, JSON, JUnit, Markdown, HTML,
GitHub annotations) reads them through ``to_records()``; the helpers at the end read records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortprep.errors import ExitCode
from ortprep.findings import Finding, Severity

RUN_SCHEMA = "ortprep.run/2"


@dataclass
class StepResult:
    """The outcome of one step: its data (step-specific, JSON-ready), findings, written files,
    the model it hands to the next step, and what the environment lacked."""

    step: str
    schema: str
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    output: Path | None = None  # the model this step wrote, for the next step
    missing: list[str] = field(default_factory=list)  # what was asked and is not installed (exit 3)

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def worst(self, ignore: frozenset[str] | set[str] = frozenset()) -> Severity | None:
        return max((f.severity for f in self.findings if f.code not in ignore), default=None)

    def fails(self, fail_on: Severity | None, ignore: frozenset[str] | set[str] = frozenset()) -> bool:
        """True when a finding (whose code is not ignored) is at or above ``fail_on`` (``None``
        never fails)."""
        worst = self.worst(ignore)
        return fail_on is not None and worst is not None and worst >= fail_on

    def to_record(self) -> dict[str, Any]:
        """The JSON document of this step: schema first, then data, then findings (each once)."""
        record: dict[str, Any] = {"schema": self.schema}
        record.update(self.data)
        record["findings"] = [f.to_record() for f in self.findings]
        return record


@dataclass
class StepOutcome:
    """One step of a run: its label, what it ran on, its status and its result."""

    label: str
    run: str
    status: str  # passed | failed | skipped
    model: str | None
    result: StepResult | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.label,
            "run": self.run,
            "status": self.status,
            "model": self.model,
            "report": self.result.to_record() if self.result is not None else None,
        }


@dataclass
class RunReport:
    """What a pipeline did: one outcome per step, in order. A command line is a one-step run; a
    repository run makes one per model x target, which also carries the target, its gates and the
    error that stopped it before any step (if one did)."""

    config: str | None
    model: str | None
    final_model: str | None
    steps: list[StepOutcome] = field(default_factory=list)
    single_command: bool = False  # built from one command line: its document is the step's own
    target: str | None = None  # repository runs: the target's name, its EP, the model as the config names it
    ep: str | None = None
    model_label: str | None = None
    gates: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return (self.error is None and all(step.status == "passed" for step in self.steps)
                and all(gate["passed"] for gate in self.gates))

    @property
    def missing(self) -> list[str]:
        return [item for step in self.steps if step.result is not None for item in step.result.missing]

    def exit_code(self) -> ExitCode:
        """3 when something asked for is not installed, 1 when a gate failed, else 0."""
        return exit_code([self])

    def to_records(self) -> dict[str, Any]:
        """The run document (schema ``ortprep.run/2``)."""
        return {
            "schema": RUN_SCHEMA,
            "config": self.config,
            "model": self.model,
            "final_model": self.final_model,
            "passed": self.passed,
            "steps": [step.to_record() for step in self.steps],
        }

    def pair_record(self) -> dict[str, Any]:
        """One model x target of a repository document (its ``runs`` entries)."""
        return {"model": self.model_label or self.model, "model_path": self.model, "target": self.target, "ep": self.ep,
                "passed": self.passed, "steps": [step.to_record() for step in self.steps], "gates": self.gates,
                "error": self.error, "final_model": self.final_model, "missing": self.missing}

    def document(self) -> dict[str, Any]:
        """What ``--json`` prints: a command's own step document, or the run document."""
        if self.single_command and len(self.steps) == 1 and self.steps[0].result is not None:
            return self.steps[0].result.to_record()
        return self.to_records()


def exit_code(runs: list[RunReport] | list[dict[str, Any]], regressions: bool = False) -> ExitCode:
    """The one exit rule of every run: 1 when something failed for a reason other than a missing
    package (a step, a gate, a baseline regression), else 3 when something asked for is not
    installed, else 0. Takes RunReports or their records."""
    def state(run) -> tuple[bool, bool]:
        return (
            (run.passed, bool(run.missing)) if isinstance(run, RunReport) else (run["passed"], bool(run.get("missing")))
        )

    states = [state(run) for run in runs]
    if regressions or any(not passed and not missing for passed, missing in states):
        return ExitCode.GATE_FAILED
    if any(missing for _passed, missing in states):
        return ExitCode.ENVIRONMENT
    return ExitCode.OK


@dataclass
class RepositoryReport:
    """A repository run: one RunReport per model x target (of a shard, or merged from shards),
    and the regressions against a baseline."""

    config: str | None
    runs: list[RunReport] = field(default_factory=list)
    shard: tuple[int, int] | None = None
    regressions: list[dict[str, Any]] = field(default_factory=list)

    def to_records(self) -> dict[str, Any]:
        """The repository document (schema ``ortprep.run/2``, kind repository)."""
        document = repository_document(self.config, [run.pair_record() for run in self.runs], self.shard)
        document["regressions"] = self.regressions
        document["passed"] = document["passed"] and not self.regressions
        return document

    def exit_code(self) -> ExitCode:
        return exit_code(self.runs, bool(self.regressions))


def repository_document(config: str | None, runs: list[dict[str, Any]], shard: tuple[int, int] | None = None,
                        merged_from: list[str] | None = None) -> dict[str, Any]:
    """The repository document from pair records (a run's, or those merged from shards)."""
    runs = sorted(runs, key=lambda r: (r["model"], r["target"]))
    failed = [r for r in runs if not r["passed"]]
    return {
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


# --- reading records (renderers, gates and baselines share these) -----------------------------


def step_report(steps: list[dict[str, Any]], run: str) -> dict[str, Any] | None:
    """The report of the first step of kind ``run`` that produced one."""
    return next((s["report"] for s in steps if s["run"] == run and s.get("report")), None)


def placement_of(run: dict[str, Any]) -> dict[str, Any] | None:
    """The check result of a pair record's target (its placement), or None when no check ran."""
    check = step_report(run.get("steps", []), "check")
    return next((r for r in (check or {}).get("results", []) if r.get("ep") == run["ep"]), None)


def proven_placement(result: dict[str, Any]) -> dict[str, Any]:
    """The figures a target's row and answer show: the real session's where check --prove built
    it (its nodes on the EP, partitions and CPU nodes; the tensor copies are check's count and are
    shown only where the session's partitions and verdict are check's), else check's prediction."""
    proof = result.get("proof") or {}
    comparison = proof.get("comparison") or {}
    if proof.get("status") == "created" and proof.get("nodes_total") is not None and comparison:
        partitions = comparison.get("actual_partitions")
        return {"proven": True, "on_ep": proof["nodes_on_ep"], "nodes": proof["nodes_total"],
                "share": proof["nodes_on_ep"] / proof["nodes_total"] if proof["nodes_total"] else None,
                "partitions": partitions, "fallbacks": len(proof.get("fallback_nodes") or []),
                "copies": result["copies"] if partitions == result["partitions"]
                and comparison.get("actual_verdict") == comparison.get("predicted_verdict") else None}
    return {
        "proven": False,
        "on_ep": result["supported_nodes"],
        "nodes": result["nodes"],
        "share": result["node_share"],
        "partitions": result["partitions"],
        "fallbacks": len(result["fallback_nodes"]),
        "copies": result["copies"],
    }
