"""Human rendering with Rich: pure functions of a report record."""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ortprep.findings import CATALOGUE
from ortprep.report import proven_placement

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

def add_column(table: Table, header: str, **options) -> None:
    """A column whose header is never cut short on a narrow terminal: at least as wide as its
    longest word, cells folded rather than truncated (80 columns is the width to fit)."""
    longest = max((len(word) for word in header.split()), default=0)
    table.add_column(header, min_width=max(longest, options.pop("min_width", 0)), overflow="fold", **options)



def human_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def format_shape(shape: list | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def render_findings(findings: list[dict[str, Any]], console: Console) -> None:
    """Findings, errors first, each with its fix on the line below."""
    if not findings:
        console.print("No findings.")
        return
    order = {"error": 0, "warning": 1, "info": 2}
    console.print("[bold]Findings[/]")
    for finding in sorted(findings, key=lambda f: (order.get(f["severity"], 3), f["code"])):
        style = SEVERITY_STYLE.get(finding["severity"], "")
        console.print(
            f"  [{style}]{finding['severity']:<7}[/] {finding['code']}  {escape(finding['message'])}", highlight=False
        )
        if finding.get("fix"):
            console.print(f"           fix: {escape(finding['fix'])}", highlight=False)
    counts = Counter(f["severity"] for f in findings)
    console.print(", ".join(f"{counts[s]} {s}" for s in ("error", "warning", "info") if counts[s]))


def render_inspect(record: dict[str, Any], console: Console) -> None:
    model = record["model"]
    console.print(f"[bold]{escape(str(model['path']))}[/]  {human_bytes(model['size'])}")
    producer = record["producer"]
    opsets = ", ".join(f"{domain} {version}" for domain, version in record["opsets"].items())
    console.print(f"IR version {record['ir_version']}; opsets: {opsets or 'none'}")
    if producer["name"] or producer["version"]:
        console.print(escape(f"producer: {producer['name']} {producer['version']}".rstrip()), highlight=False)
    for name, digest in model["sha256"].items():
        console.print(f"sha256 {name}: {digest}")

    io_table = Table(title="Inputs and outputs")
    for column in ("", "name", "type", "dtype", "shape"):
        add_column(io_table, column)
    for direction in ("inputs", "outputs"):
        for value in record[direction]:
            io_table.add_row(
                # names and symbolic dims are the model's text: '[unk__314, 76]' is not Rich markup
                direction[:-1],
                escape(value["name"]),
                value["kind"],
                value["dtype"] or "-",
                escape(format_shape(value["shape"])),
            )
    console.print(io_table)

    nodes = record["nodes"]
    console.print(
        f"nodes: {nodes['total']} ({nodes['top_level']} top level, {nodes['in_subgraphs']} in "
        f"{nodes['subgraphs']} subgraphs); parameters: {record['parameters']:,}"
    )
    ops_table = Table(title="Operators")
    add_column(ops_table, "domain")
    add_column(ops_table, "op")
    add_column(ops_table, "count", justify="right")
    for domain, ops in record["op_histogram"].items():
        for op, count in ops.items():
            ops_table.add_row(escape(domain), escape(op), str(count))
    console.print(ops_table)
    if record["custom_domains"]:
        console.print("custom domains: " + ", ".join(record["custom_domains"]))

    if record["initializers"]:
        weights = Table(title="Initializers")
        add_column(weights, "dtype")
        add_column(weights, "count", justify="right")
        add_column(weights, "size", justify="right")
        for dtype, stats in record["initializers"].items():
            weights.add_row(escape(dtype), str(stats["count"]), human_bytes(stats["bytes"]))
        console.print(weights)
    constants = record["constant_nodes"]
    if constants["count"]:
        console.print(
            f"tensors in Constant nodes and attributes: {constants['count']} ({human_bytes(constants['bytes'])})"
        )
    if record["external_data"]:
        external = Table(title="External data")
        add_column(external, "file")
        add_column(external, "size", justify="right")
        add_column(external, "tensors", justify="right")
        for entry in record["external_data"]:
            external.add_row(escape(entry["location"]), human_bytes(entry["size"]), str(entry["tensors"]))
        console.print(external)
    for key, value in record["metadata"].items():  # the model's own text: '[/data/labels.txt]' is not markup
        console.print(escape(f"metadata {key}: {value}"), highlight=False)
    checker = record["checker"]
    console.print(
        "onnx.checker: " + ("passed" if checker["passed"] else f"[red]failed[/] ({escape(checker['error'] or '')})")
    )
    runtime = record["runtime"]
    ort = runtime["onnxruntime"] or "not installed"
    console.print(
        f"onnx {runtime['onnx']} (opset <= {runtime['onnx_max_opset']}); onnxruntime {ort}"
        + (f" (opset <= {runtime['ort_max_opset']})" if runtime["ort_max_opset"] else "")
    )
    render_findings(record["findings"], console)


def _proof_mark(result: dict) -> str:
    """check --prove: whether the verdict is the real session's, and what the tables had said."""
    proof = result.get("proof")
    if not proof:
        return ""
    if proof["status"] in ("created", "failed", "crashed", "timeout"):
        predicted = result.get("predicted_verdict")
        return " (proven" + (f"; predicted {predicted})" if predicted and predicted != result["verdict"] else ")")
    return " (predicted)"


def device_line(device: dict[str, Any]) -> str:
    """The device a target is for, and how it was chosen (a default is said to be one)."""
    options = ", ".join(f"{k}={v}" for k, v in device["provider_options"].items())
    how = {
        "default": "ortprep's default; name yours with --device",
        "--device": "--device",
        "provider option": "from --provider-option",
    }.get(device["chosen_by"], device["chosen_by"])
    return f"{device['title']} ({options}; {how})"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


VERDICT_STYLE = {"full": "green", "partial": "yellow", "none": "red"}


def answer(result: dict[str, Any], findings: list[dict[str, Any]]) -> str:
    """One line: will the model run on this target, and why not (the real session's placement
    where it was proven)."""
    blocking = sorted({f["code"] for f in findings if f["severity"] == "error"})
    placed = proven_placement(result)
    fallbacks = placed["fallbacks"]
    fused = ""
    if "fused_nodes" in result:
        fused = f"; {result['fused_nodes']} of {result['nodes']} in the fused DirectML graph"
    if result["verdict"] == "none":
        why = ", ".join(blocking) or "no node runs on it"
        return f"no: it runs nowhere on {result['ep']} as it is ({why})"
    where = " in the real session" if placed["proven"] else ""
    if blocking:
        return (f"not as it is: {placed['on_ep']}/{placed['nodes']} nodes {'are on' if placed['proven'] else 'are'} "
                f"{result['ep']}{' ops' if not placed['proven'] else ''}{where}, but "
                f"{len(blocking)} problem(s) block it ({', '.join(blocking)}){fused}")
    if fallbacks:
        copies = f", {placed['copies']} copies per run" if placed["copies"] is not None else ""
        return f"yes, with {fallbacks} CPU fallback(s){where}: {placed['partitions']} partition(s){copies}{fused}"
    return f"yes: every node runs on {result['ep']}{where}{fused}"


def render_check(record: dict[str, Any], console: Console) -> None:
    """A summary table per target, then each target's answer and its findings, one per cause."""
    console.print(f"[bold]{escape(str(record['model']))}[/]")
    summary = Table(title="Execution providers")
    for column in ("EP", "EP takes", "parts", "on CPU", "copies", "MACs on EP", "errors", "verdict"):
        add_column(summary, column, justify="left" if column in ("EP", "verdict") else "right")
    for result in record["results"]:
        style = VERDICT_STYLE.get(result["verdict"], "")
        findings = [f for f in record["findings"] if f.get("target") == result["ep"]]
        placed = proven_placement(result)
        summary.add_row(
            result["ep"],
            f"{placed['on_ep']}/{placed['nodes']} ({_percent(placed['share'])})",
            str(placed["partitions"]),
            str(placed["fallbacks"]),
            "-" if placed["copies"] is None else str(placed["copies"]),
            # the MACs are check's estimate: where the session placed otherwise they are not shown
            _percent(result["mac_share"])
            if not placed["proven"] or result["verdict"] == result.get("predicted_verdict")
            else "-",
            str(len({f["code"] for f in findings if f["severity"] == "error"})),
            f"[{style}]{result['verdict']}[/]" + _proof_mark(result),
        )
    console.print(summary)
    for result in record["results"]:
        findings = [f for f in record["findings"] if f.get("target") == result["ep"]]
        console.print(f"\n[bold]{escape(result['ep'])}[/]: {escape(answer(result, findings))}", highlight=False)
        if result.get("device"):
            console.print(f"  device: {escape(device_line(result['device']))}", highlight=False)
        render_causes(findings, console)


_NODE_PREFIX = re.compile(r"^node '[^']*' \([^)]*\) ")


def render_causes(findings: list[dict[str, Any]], console: Console, examples: int = 3) -> None:
    """One line per cause (code, fix and source alike), with the op types and nodes it covers."""
    if not findings:
        console.print("  No findings.")
        return
    order = {"error": 0, "warning": 1, "info": 2}
    causes: dict[tuple, list[dict[str, Any]]] = {}
    for finding in findings:
        fix = finding.get("fix")
        if fix and finding.get("op_type"):
            fix = fix.replace(finding["op_type"], "{op}")  # a fix that names the op is still one cause
        causes.setdefault((finding["severity"], finding["code"], fix, finding.get("source")), []).append(finding)
    verbose = logging.getLogger().getEffectiveLevel() <= logging.INFO
    nodes: set[str] = set()
    for (severity, code, fix, source), members in sorted(
        causes.items(), key=lambda kv: (order.get(kv[0][0], 3), kv[0][1])
    ):
        style = SEVERITY_STYLE.get(severity, "")
        first = members[0]
        named = [m for m in members if m.get("node")]
        nodes.update(m["node"] for m in named)
        ops = Counter(m.get("op_type") or "?" for m in named)
        if fix and "{op}" in fix:
            fix = fix.replace("{op}", first["op_type"] if len(ops) == 1 else "these ops")
        if len(named) > 1:
            what = ", ".join(f"{op} {n}" if n > 1 else op for op, n in ops.most_common())
            stripped = {_NODE_PREFIX.sub("", m["message"]) for m in named}
            cause = stripped.pop() if len(stripped) == 1 else CATALOGUE[code].title
            text = f"{len(named)} nodes ({what}): {cause}"
            shown = ", ".join(m["node"] for m in named[:examples]) + (
                f", ... ({len(named) - examples} more)" if len(named) > examples else ""
            )
        else:
            text, shown = first["message"], None
        console.print(f"  [{style}]{severity:<7}[/] {code}  {escape(text)}", highlight=False)
        if shown:
            console.print(f"           e.g. {escape(shown)}", highlight=False)
        if fix:
            console.print(f"           fix: {escape(fix)}", highlight=False)
        if source:
            short = source if verbose else source.split(" (")[0].split(": ")[0]
            console.print(f"           source: {escape(short)}", highlight=False, style="dim")
    counts = Counter(severity for (severity, *_rest) in causes)
    words = {"error": "error", "warning": "warning", "info": "note"}
    parts = [f"{counts[s]} {words[s]}{'s' if counts[s] > 1 else ''}" for s in ("error", "warning", "info") if counts[s]]
    console.print(f"  {len(causes)} problem{'s' if len(causes) != 1 else ''}: {', '.join(parts)}"
                  + (f"; {len(nodes)} node{'s' if len(nodes) != 1 else ''} affected" if nodes else ""))


def render_eps(record: dict[str, Any], console: Console) -> None:
    table = Table(title="Execution providers ortprep checks")
    for column in ("name", "aliases", "ORT provider", "device", "ops", "table source"):
        add_column(table, column)
    for ep in record["eps"]:
        table.add_row(
            ep["name"], ", ".join(ep["aliases"]), ep["provider"], ep["device"], str(ep["ops"]), ep["version"]
        )
    console.print(table)
    devices = [(ep["name"], device) for ep in record["eps"] for device in ep.get("devices", [])]
    if devices:
        table = Table(title="Devices (--device; the default marked *)")
        for column in ("EP", "device", "aliases", "SoC", "soc_model", "htp_arch"):
            add_column(table, column)
        for ep, device in devices:
            table.add_row(ep, device["name"] + (" *" if device["default"] else ""), ", ".join(device["aliases"]),
                          device["title"], str(device["soc_model"]), str(device["htp_arch"]))
        console.print(table)


def number(value: float | None, digits: int = 6) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


STATUS_STYLE = {
    "ok": "green",
    "fallback": "yellow",
    "inputs_guessed": "yellow",
    "failed": "red",
    "crashed": "red",
    "timeout": "red",
    "unavailable": "dim",
}


def render_load(record: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]{escape(str(record['model']))}[/]  (available: {', '.join(record['available'])})")
    table = Table(title="Execution providers")
    for column in ("EP", "status", "nodes on EP", "outputs match", "median ms", "p90 ms"):
        add_column(table, column)
    for result in record["results"]:
        latency = result.get("latency_ms") or {}
        on_ep = f"{result['nodes_on_ep']}/{result['nodes_total']}" if result.get("nodes_total") else "-"
        match = {True: "yes", False: "[red]no[/]", None: "-"}[result.get("outputs_match")]
        style = STATUS_STYLE.get(result["status"], "")
        table.add_row(
            result["ep"], f"[{style}]{result['status']}[/]", on_ep, match,
            number(latency.get("median"), 4), number(latency.get("p90"), 4),
        )
    console.print(table)
    for result in record["results"]:
        if result.get("device"):
            # What the application sets to get this session (printed so it can set the same).
            options = ", ".join(
                f"{k}={v}" for k, v in result.get("provider_options", {}).items() if k != "backend_path"
            )
            console.print(
                f"{escape(result['ep'])}: device {escape(device_line(result['device']))}; the session's options: "
                f"{escape(options)}",
                highlight=False,
            )
        if result.get("message"):
            console.print(f"{escape(result['ep'])}: {escape(result['message'])}", highlight=False)
        if result.get("latency_not_timed"):
            console.print(f"{escape(result['ep'])}: not timed: {escape(result['latency_not_timed'])}", highlight=False)
        three = result.get("three_way")
        if three:
            parts = []
            for key, label in (("quantization", "precision (CPU: this model vs float)"), ("ep", "EP error (EP vs CPU)"),
                               ("total", "total (EP vs float)")):
                pair = three.get(key)
                if pair:
                    parts.append(f"{label}: cosine {number(pair['cosine'])}, max abs {number(pair['max_abs_diff'])}")
            console.print(f"{escape(result['ep'])}: " + "; ".join(parts), highlight=False)
        for op in result.get("profile", []):
            console.print(
                f"  {result['ep']} {op['op_type']}: {op['share'] * 100:.1f}% ({op['microseconds']} us)", highlight=False
            )
    render_causes(record["findings"], console)


def render_doctor(record: dict[str, Any], console: Console) -> None:
    if "scan" in record:
        console.print(f"scanned {record['scan']['files']} file(s) under {escape(record['scan']['path'])}")
        render_findings(record["findings"], console)
        return
    ort = record["onnxruntime"]
    console.print(f"ortprep {record['ortprep']}, Python {record['python']} on {record['platform']}")
    console.print(f"onnx {record['onnx']['version']} (opset <= {record['onnx']['max_opset']})")
    dists = ", ".join(f"{d['name']} {d['version']}" for d in ort["distributions"]) or "none"
    console.print(f"onnxruntime {ort['version'] or 'not importable'} (opset <= {ort['max_opset']}); packages: {dists}")
    console.print("available EPs: " + (", ".join(ort["providers"]) or "none"))
    if ort.get("max_ir_version") is not None:
        console.print(f"the installed ONNX Runtime loads IR <= {ort['max_ir_version']}, opset <= {ort['max_opset']}")
    if record.get("target_runtime"):
        target = record["target_runtime"]
        console.print(f"ONNX Runtime {target['version']} loads IR <= {target['max_ir_version']}, opset <= "
                      f"{target['max_opset']} ({escape(target['source'])})")
    eps = Table(title="Execution providers")
    for column in ("EP", "available", "through", "package", "devices", "why not"):
        add_column(eps, column)
    for row in record.get("eps", []):
        devices = ", ".join(f"{d['type']} {d['vendor']}".strip() for d in row["devices"]) or "-"
        eps.add_row(row["ep"], "[green]yes[/]" if row["available"] else "no", row["via"] or "-",
                    escape(row["package"] or "-"), escape(devices), escape(row["why_not"] or ""))
    console.print(eps)
    table = Table(title="GPU libraries (CUDA and TensorRT EPs)")
    for column in ("library", "file", "loads", "detail"):
        add_column(table, column)
    for lib in record["libraries"]:
        table.add_row(lib["label"], lib["file"], "yes" if lib["loaded"] else "no", escape(lib["detail"]))
    console.print(table)
    console.print("CPU int8-related features: " + (", ".join(record["cpu"]["features"]) or "none found"))
    render_findings(record["findings"], console)
