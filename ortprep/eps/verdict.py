"""What a rule says of one node on one EP: the support level, why, the source of the fact, the
finding code where it does not (fully) run there, and findings that come with it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortprep.eps.tables import SupportLevel
from ortprep.findings import Finding, Severity

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class NodeVerdict:
    level: SupportLevel
    reason: str
    src: str | None
    code: str | None = None  # finding code when the node does not (fully) run on the EP
    extra: list[Finding] = field(default_factory=list)
    severity: Severity | None = None  # of the fallback finding, when the rule knows it better
    dml: dict | None = None  # the DML registration facts of the matched kernel
