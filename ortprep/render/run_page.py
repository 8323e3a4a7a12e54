"""The report page of a repository run (``ortprep run --html DIR``: DIR/index.html).

Models x targets as a matrix: in each cell the verdict and node share of ``check``, the status of
``load`` and the accuracy measured (load's cosine against the CPU EP, quantize's cosine against
the float model), the pair passed or failed; each model links to its placement page. For each
quantized model, a sensitivity chart: the quantization noise of each tensor the quantize search
ranked (``search.ranked``), the tensors whose nodes were kept in float marked, and the list of
nodes kept in float with the reason. Inline SVG, no script: a pure function of the records.
"""

from __future__ import annotations

import html
from typing import Any

from ortprep.report import placement_of, step_report

BAR_W, BAR_H, LABEL_W = 360, 14, 300

STYLE = """
body{margin:0;font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2433;background:#f6f7f9}
header{padding:10px 16px;background:#1d2433;color:#fff}
header h1{font-size:17px;margin:0 0 2px}
header p{margin:0;font-size:13px;color:#cbd5e1}
section{margin:14px 16px;padding:10px 14px;background:#fff;border:1px solid #d8dce3;border-radius:4px}
h2{font-size:15px;margin:4px 0 10px}
table.matrix{border-collapse:collapse;font-size:13px}
.matrix th,.matrix td{border:1px solid #d8dce3;padding:5px 8px;text-align:left;vertical-align:top}
.matrix th{background:#eef1f5}
.matrix td.pass{background:#ecfdf3}.matrix td.fail{background:#fef2f2}.matrix td.none{color:#9ca3af}
.matrix .verdict{font-weight:600}
.matrix small{color:#475569;display:block}
.bar{fill:#60a5fa}.bar.kept{fill:#f59e0b}
svg.chart text{font-size:11px;fill:#1d2433}
svg.chart text.value{fill:#475569}
ul.kept{font-size:13px}
"""


def _fmt(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _cell(run: dict[str, Any]) -> str:
    steps = run.get("steps", [])
    lines = []
    result = placement_of(run)
    if result is not None:
        share = f"{result['node_share']:.1%}" if result.get("node_share") is not None else "-"
        lines.append(
            f'<span class="verdict">{html.escape(str(result.get("verdict")))}</span> {share} of nodes on the EP'
        )
    load = next(
        (r for r in (step_report(steps, "load") or {}).get("results", []) if r.get("ep") == run.get("ep")), None
    )
    if load is not None:
        cosine = f", cosine {_fmt(load.get('cosine'), 5)}" if load.get("cosine") is not None else ""
        lines.append(f"<small>load: {html.escape(str(load.get('status')))}{cosine}</small>")
    quantize = step_report(steps, "quantize")
    if quantize is not None:
        verify = quantize.get("verify") or {}
        lines.append(
            f"<small>quantize: cosine {_fmt(verify.get('cosine'), 5)}, "
            f"{'passed' if verify.get('passed') else 'failed' if verify.get('passed') is False else 'not verified'}"
            "</small>"
        )
    if run.get("error"):
        lines.append(f"<small>{html.escape(run['error'][:200])}</small>")
    failed = [s["name"] for s in steps if s.get("status") == "failed"] + [
        f"gate {g['gate']}" for g in run.get("gates", []) if not g["passed"]
    ]
    lines.append(
        f"<small>{'pass' if run['passed'] else 'FAIL: ' + html.escape(', '.join(failed) or 'see the report')}</small>"
    )
    css = "pass" if run["passed"] else "fail"
    return (
        f'<td class="{css}" data-model="{html.escape(run["model"])}" data-target="{html.escape(str(run["target"]))}">'
        + "".join(lines)
        + "</td>"
    )


def sensitivity(model: str, target: str, record: dict[str, Any]) -> str:
    """A quantize record's chart: one bar per ranked tensor (its noise), kept-in-float ones marked;
    then the nodes kept in float and why."""
    ranked = ((record.get("search") or {}).get("ranked") or [])[:40]
    kept = record.get("excluded_nodes") or []
    kept_names = {entry["name"] for entry in kept}
    verify = record.get("verify") or {}
    parts = [
        f'<section class="sensitivity" data-model="{html.escape(model)}" data-target="{html.escape(target)}">'
        f"<h2>Quantization sensitivity: {html.escape(model)} on {html.escape(target)}</h2>"
        f"<p>cosine against the float model {_fmt(verify.get('cosine'), 5)}, norm ratio "
        f"{_fmt(verify.get('norm_ratio'))}; "
        f"{record.get('quantized_ops', 0)} ops quantized, {len(kept)} nodes kept in float</p>"
    ]
    if ranked:
        top = max((entry.get("noise") or 0) for entry in ranked) or 1
        height = len(ranked) * (BAR_H + 4) + 24
        rows = []
        for index, entry in enumerate(ranked):
            y = 20 + index * (BAR_H + 4)
            noise = entry.get("noise") or 0
            is_kept = bool(set(entry.get("nodes") or []) & kept_names)
            label = str(entry.get("tensor"))
            rows.append(
                f'<g class="tensor{" kept" if is_kept else ""}" data-tensor="{html.escape(label)}">'
                f"<title>{html.escape(label)}: noise {noise} (nodes: "
                f"{html.escape(', '.join(entry.get('nodes') or []))})</title>"
                f'<text x="{LABEL_W - 6}" y="{y + BAR_H - 3}" text-anchor="end">{html.escape(label[-44:])}</text>'
                f'<rect class="bar{" kept" if is_kept else ""}" x="{LABEL_W}" y="{y}" '
                f'width="{max(1.0, BAR_W * noise / top):.1f}" height="{BAR_H}"/>'
                f'<text class="value" x="{LABEL_W + max(1.0, BAR_W * noise / top) + 4:.1f}" y="{y + BAR_H - 3}">'
                f"{noise}{' kept in float' if is_kept else ''}</text></g>"
            )
        parts.append(
            f'<svg class="chart" width="{LABEL_W + BAR_W + 140}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
            f'<text x="{LABEL_W}" y="12">per-tensor quantization noise (RMS error over median magnitude), worst first'
            f"</text>{''.join(rows)}</svg>"
        )
    else:
        parts.append(
            "<p>No per-tensor figures: the search that ranks tensors runs with <code>--auto-exclude</code>.</p>"
        )
    if kept:
        items = "".join(f"<li><code>{html.escape(entry['name'])}</code>"
                        f"{' (' + html.escape(entry['op_type']) + ')' if entry.get('op_type') else ''}: "
                        f"{html.escape(str(entry.get('reason')))}</li>" for entry in kept[:200])
        parts.append(f'<h2>Kept in float ({len(kept)})</h2><ul class="kept">{items}</ul>')
    parts.append("</section>")
    return "".join(parts)


def page_name(model: str) -> str:
    """The file name of a model's placement page in a repository run's folder."""
    return model.replace("/", "__").removesuffix(".onnx") + ".html"


def run_page(document: dict[str, Any], pages: set[str] | dict[str, str]) -> str:
    """The report page of a repository document; ``pages`` are the placement pages written
    beside it (file names)."""
    runs = document["runs"]
    models = sorted({run["model"] for run in runs})
    targets = sorted({str(run["target"]) for run in runs})
    by_pair = {(run["model"], str(run["target"])): run for run in runs}
    header = "".join(f"<th>{html.escape(t)}</th>" for t in targets)
    rows = []
    for model in models:
        name = page_name(model)
        link = (f'<a href="{html.escape(name)}">{html.escape(model)}</a>' if name in pages else html.escape(model))
        cells = "".join(
            _cell(by_pair[(model, t)]) if (model, t) in by_pair else '<td class="none">-</td>' for t in targets
        )
        rows.append(f"<tr><th>{link}</th>{cells}</tr>")
    charts = [sensitivity(run["model"], str(run["target"]), record) for run in runs
              if (record := step_report(run.get("steps", []), "quantize")) is not None]
    summary = document.get("summary") or {}
    verdict = "passed" if document.get("passed") else "failed"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>ortprep run: {verdict}</title>'
        f"<style>{STYLE}</style></head><body><header><h1>ortprep run: {verdict}</h1>"
        f"<p>{summary.get('passed', 0)} of {summary.get('pairs', 0)} model x target passed"
        f"{' (shard ' + html.escape(str(document['shard'])) + ')' if document.get('shard') else ''}; "
        f"{html.escape(str(document.get('config') or ''))}</p></header>"
        '<section><h2>Models x targets</h2><table '
        f'class="matrix"><tr><th>model</th>{header}</tr>{"".join(rows)}</table>'
        f"<p><small>each model links to its placement page</small></p></section>" + "".join(charts) + "</body></html>"
    )
