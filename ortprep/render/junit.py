"""JUnit XML for CI systems that show test results: one testcase per pipeline step."""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree


def _finding_lines(findings: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"[{f['severity']}] {f['code']} {f['message']}" + (f"\n    fix: {f['fix']}" if f.get("fix") else "")
        for f in findings
    )


def render_junit(record: dict[str, Any]) -> str:
    steps = record["steps"]
    suite = ElementTree.Element(
        "testsuite",
        name="ortprep",
        tests=str(len(steps)),
        failures=str(sum(1 for s in steps if s["status"] == "failed")),
        skipped=str(sum(1 for s in steps if s["status"] == "skipped")),
    )
    for step in steps:
        case = ElementTree.SubElement(suite, "testcase", classname=f"ortprep.{step['run']}", name=step["name"])
        findings = step["report"]["findings"] if step["report"] else []
        if step["status"] == "failed":
            worst = [f for f in findings if f["severity"] == "error"] or findings
            failure = ElementTree.SubElement(case, "failure", message=worst[0]["message"] if worst else "step failed")
            failure.text = _finding_lines(findings)
        elif step["status"] == "skipped":
            ElementTree.SubElement(case, "skipped", message="an earlier step failed")
        elif findings:
            ElementTree.SubElement(case, "system-out").text = _finding_lines(findings)
    ElementTree.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ElementTree.tostring(suite, encoding="unicode") + "\n"
