"""Reports: what each step found and measured, in a form every renderer shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortprep.findings import Finding, Severity


@dataclass
class StepReport:
    """The outcome of one step: its data (step-specific, JSON-ready), findings and written files."""

    step: str
    schema: str
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def fails(self, fail_on: Severity | None) -> bool:
        """True when a finding is at or above ``fail_on`` (``None`` never fails)."""
        worst = self.worst()
        return fail_on is not None and worst is not None and worst >= fail_on

    def to_record(self) -> dict[str, Any]:
        """The JSON document of this step: schema first, then data, then findings."""
        record: dict[str, Any] = {"schema": self.schema}
        record.update(self.data)
        record["findings"] = [f.to_record() for f in self.findings]
        return record
