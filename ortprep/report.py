"""Reports: what each step found and measured, and what a whole run did, in one form every
renderer (console, JSON, JUnit, Markdown) reads through ``to_records()``."""

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
    """What a pipeline did: one outcome per step, in order. A command line is a one-step run."""

    config: str | None
    model: str | None
    final_model: str | None
    steps: list[StepOutcome] = field(default_factory=list)
    single_command: bool = False  # built from one command line: its document is the step's own

    @property
    def passed(self) -> bool:
        return all(step.status == "passed" for step in self.steps)

    @property
    def missing(self) -> list[str]:
        return [item for step in self.steps if step.result is not None for item in step.result.missing]

    def exit_code(self) -> ExitCode:
        """3 when something asked for is not installed, 1 when a gate failed, else 0."""
        if self.missing:
            return ExitCode.ENVIRONMENT
        return ExitCode.OK if self.passed else ExitCode.GATE_FAILED

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

    def document(self) -> dict[str, Any]:
        """What ``--json`` prints: a command's own step document, or the run document."""
        if self.single_command and len(self.steps) == 1 and self.steps[0].result is not None:
            return self.steps[0].result.to_record()
        return self.to_records()
