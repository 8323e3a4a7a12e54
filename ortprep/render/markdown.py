"""Markdown summary of a pipeline run (a pull-request comment, $GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from typing import Any

ICON = {"passed": "pass", "failed": "FAIL", "skipped": "skipped"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(record: dict[str, Any]) -> str:
    lines = [
        f"## ortprep: {'passed' if record['passed'] else 'failed'}",
        "",
        f"Model `{record['model']}`" + (f" (config `{record['config']}`)" if record.get("config") else ""),
        "",
        "| step | result | errors | warnings |",
        "|---|---|---:|---:|",
    ]
    for step in record["steps"]:
        findings = step["report"]["findings"] if step["report"] else []
        errors = sum(1 for f in findings if f["severity"] == "error")
        warnings = sum(1 for f in findings if f["severity"] == "warning")
        lines.append(f"| {_cell(step['name'])} | {ICON[step['status']]} | {errors} | {warnings} |")
    for step in record["steps"]:
        findings = [f for f in (step["report"]["findings"] if step["report"] else []) if f["severity"] != "info"]
        if not findings:
            continue
        lines += ["", f"### {step['name']}", ""]
        for finding in findings[:50]:
            fix = f" Fix: {finding['fix']}" if finding.get("fix") else ""
            lines.append(f"- **{finding['severity']} {finding['code']}** {_cell(finding['message'])}.{_cell(fix)}")
        if len(findings) > 50:
            lines.append(f"- ... and {len(findings) - 50} more (see the JSON report)")
    return "\n".join(lines) + "\n"
