"""Human rendering of the steps that write a model (convert, simplify, optimize, quantize, compile):
pure functions of a report record."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ortprep.render.console import add_column, human_bytes, number, render_causes


def render_transform(record: dict[str, Any], console: Console) -> None:
    """convert / simplify / optimize: what was done, sizes, verification, kept nodes, findings."""
    console.print(
        f"[bold]{escape(str(record['input']))}[/] -> {escape(str(record.get('output') or 'nothing written'))}"
    )
    for transform in record.get("transforms", []):
        console.print(f"  {escape(transform['transform'])}: {escape(str(transform.get('detail', '')))}")
    console.print(
        f"nodes {record['nodes_before']} -> {record['nodes_after'] if record['nodes_after'] is not None else '-'}; "
        f"size {human_bytes(record['size_before'])} -> {human_bytes(record['size_after'])}"
    )
    if record.get("rewrite"):
        render_rewrite(record["rewrite"], console)
    verify = record["verify"]
    if verify["passed"] is None:
        console.print("verification: not run")
    else:
        verdict = "[green]passed[/]" if verify["passed"] else "[red]failed[/]"
        console.print(
            f"verification {verdict}: loads={verify['loads']}, lowest cosine {number(verify['cosine'])}, "
            f"max abs diff {number(verify['max_abs_diff'])}, max rel diff {number(verify['max_rel_diff'])}"
            + (f" (inputs: {escape(record['inputs'])})" if record.get("inputs") else "")
        )
        if verify.get("error"):
            console.print(f"  error: {escape(verify['error'])}", highlight=False)
    kept = record.get("kept_fp32_nodes") or []
    if kept:
        table = Table(title=f"Kept in FP32 ({len(kept)})")
        add_column(table, "node")
        add_column(table, "op")
        add_column(table, "why")
        for node in kept[:40]:
            table.add_row(escape(node.get("path") or node["name"]), node["op_type"], escape(node["reason"]))
        console.print(table)
        if len(kept) > 40:
            console.print(f"... and {len(kept) - 40} more (see --json)")
    render_causes(record["findings"], console)


def _placement_line(figures: dict[str, Any]) -> str:
    return (f"{figures['nodes_on_ep']}/{figures['nodes']} nodes on the EP, {figures['partitions']} partition(s), "
            f"{figures['copies']} copies")


def render_rewrite(rewrite: dict[str, Any], console: Console) -> None:
    """--rewrite-for: check's placement before -> after, and the real session's where the EP ran here."""
    ep = escape(rewrite["ep"])
    before, after = rewrite["predicted"]["before"], rewrite["predicted"]["after"]
    console.print(f"  {ep} (check's tables): {_placement_line(before)}, EP001 x{before['ep001']} -> "
                  f"{_placement_line(after)}, EP001 x{after['ep001']}", highlight=False)
    proof = rewrite.get("proof") or {}
    if proof.get("status") in ("proven", "failed"):
        sides = []
        for side in (proof["before"], proof["after"]):
            sides.append(_placement_line(side) if side["status"] == "created"
                         else f"no session ({escape(str(side.get('message')))})")
        console.print(f"  {ep} (real session here): {sides[0]} -> {sides[1]}", highlight=False)
    elif proof:
        console.print(f"  {ep} (real session): not proven: {escape(str(proof.get('message')))}", highlight=False)


def render_quantize(record: dict[str, Any], console: Console) -> None:
    preset = record["preset"]
    console.print(
        f"[bold]{escape(str(record['input']))}[/] -> {escape(str(record.get('output') or 'nothing written'))}"
    )
    weight_only = record.get("weight_only")
    if weight_only:
        console.print(f"weight-only: MatMul weights {weight_only['bits']} in blocks of {weight_only['block_size']}"
                      f"{' (symmetric)' if weight_only['symmetric'] else ''}, activations float ({weight_only['op']}), "
                      f"for {preset['ep']}")
    else:
        per_channel = " per channel" if preset["per_channel"] else ""
        if record["mode"] == "dynamic":
            # dynamic: integer ops (MatMulInteger, ConvInteger) quantize their activations at run time;
            # the preset's reason speaks of static QDQ models
            console.print(f"dynamic int8: weights {preset['weight_type']}{per_channel}, activations quantized to "
                          f"{preset['activation_type']} at run time ({record['format']} form), preset {preset['ep']}")
        else:
            console.print(f"static {record['format']}: activations {preset['activation_type']}, weights "
                          f"{preset['weight_type']}{per_channel}, preset {preset['ep']} ({escape(preset['reason'])})")
    calibration = record["calibration"]
    if calibration["source"] and record["mode"] == "static":
        console.print(
            f"calibration: {calibration['samples']} samples from {escape(calibration['source'])} "
            f"({calibration['kind']}), method {preset['method']}"
        )
    elif calibration["source"]:
        console.print(f"evaluation data: {escape(calibration['source'])} ({calibration['kind']})")
    console.print(f"pre-processing: {escape(record['preprocess'])}")
    console.print(
        f"quantized ops {record['quantized_ops']}, weights {record['quantized_weights']}"
        + (
            f" ({record['quantized_weight_share']:.0%} of the weight values)"
            if record.get("quantized_weight_share") is not None
            else ""
        )
        + "; size "
        f"{human_bytes(record['size_before'])} -> {human_bytes(record['size_after'])}"
    )
    verify = record["verify"]
    if verify["passed"] is None:
        refused = record["preprocess"] == "not run"  # stopped before quantizing (already quantized, nothing to do)
        console.print("evaluation: not run" + ("" if refused else " (--no-verify)"))
    else:
        verdict = "[green]passed[/]" if verify["passed"] else "[red]failed[/]"
        spread = verify.get("spread") or {}
        across = (
            f" (per sample: min {number(spread['min'])}, median {number(spread['median'])}, max "
            f"{number(spread['max'])})"
            if spread
            else ""
        )
        console.print(
            f"evaluation on {record['evaluation_samples']} sample(s) from "
            f"{escape(str(record.get('evaluation_inputs')))} "
            f"{verdict}: lowest cosine {number(verify['cosine'])}{across}, max abs diff "
            f"{number(verify['max_abs_diff'])}, "
            f"latency int8/fp32 {number(verify['latency_ratio'], 3)}"
        )
        decided = [o for o in verify.get("outputs") or [] if o.get("decision")]
        if decided:  # what the application reads from each output, beside cosine
            console.print(
                "decisions: "
                + "; ".join(
                    f"{escape(o['name'])} {o['decision']['kind']}"
                    + (f"@{o['decision']['threshold']:g}" if o["decision"].get("threshold") is not None else "")
                    + f" {number(o['decision']['agreement'])}"
                    + (
                        f", ranked {number(o['decision']['ranking']['agreement'])}"
                        if o["decision"].get("ranking")
                        else ""
                    )
                    + (
                        f", confident@{o['decision']['confidence']['level']:g} "
                        f"{number(o['decision']['confidence']['agreement'])}"
                        if o["decision"].get("confidence")
                        else ""
                    )
                    + (
                        " (reported, not gated)"
                        if not o["decision"].get("gated", True)
                        else f" (needs {o['decision']['required']:g}, "
                        + ("[green]ok[/]" if o["decision"]["passed"] else "[red]differs[/]")
                        + ")"
                    )
                    for o in decided
                )
            )
        confirmation = verify.get("confirmation")
        if confirmation:  # the same gate on the samples the model was calibrated on
            sides = [side for side in (confirmation["cpu"], confirmation.get("ep")) if side]
            console.print(
                f"with the {confirmation['samples']} calibration sample(s), the held-back ones included: "
                + ("[green]passed[/]" if confirmation["passed"] else "[red]failed[/]") + " ("
                + ", ".join(f"{escape(side['ep'])}: lowest cosine {number(side['cosine'])}" for side in sides) + ")")
    search = record.get("search")
    if search:
        table = Table(title=f"--auto-exclude trials (stopped: {escape(search['stopped'])})")
        for column in ("trial", "nodes kept in float", "lowest cosine", "size ratio", "gate"):
            add_column(table, column)
        for trial in search["trials"]:
            table.add_row(escape(trial["label"]), str(trial["kept_in_float"]), number(trial["cosine"]),
                          number(trial["size_ratio"], 3), _trial_gate(trial))
        console.print(table)
    if record["excluded_nodes"]:
        names = [escape(n["name"]) for n in record["excluded_nodes"]]
        console.print(f"kept in float ({len(names)}): " + ", ".join(names[:30]) + (" ..." if len(names) > 30 else ""))
    render_causes(record["findings"], console)


def _trial_gate(trial: dict) -> str:
    """A search trial's verdict; a pass whose decisions fall short of the margin a chosen result
    must hold (quantize's decision margin) says so."""
    if not trial["passed"]:
        return "fail"
    return "pass, short of the margin" if (trial.get("decision_margin_gap") or 0) > 0 else "pass"


def render_compile(record: dict[str, Any], console: Console) -> None:
    console.print(
        f"[bold]{escape(str(record['input']))}[/] -> {escape(str(record.get('output') or 'nothing written'))}"
    )
    console.print(
        f"EP {record['ep']} ({escape(record.get('package') or record.get('runtime') or '')}): "
        f"{record.get('ep_context_nodes', 0)} EPContext node(s), {record.get('other_nodes', 0)} other node(s)"
    )
    for ep, info in (record.get("compatibility") or {}).items():
        console.print(f"compatibility {escape(ep)}: {escape(info)}")
    for output in record.get("outputs") or []:
        verdict = "[green]within tolerance[/]" if output["within_tolerance"] else "[red]differs[/]"
        console.print(f"output {escape(output['name'])}: {verdict}, max abs diff {number(output['max_abs_diff'])}, "
                      f"cosine {number(output['cosine'])}")
    evaluation = record.get("eval")
    if evaluation:  # compile --eval: every sample held to load's rule
        if evaluation.get("error"):
            console.print(
                f"eval: {evaluation.get('samples', 0)} sample(s), not judged: {escape(str(evaluation['error']))}"
            )
        else:
            failed = evaluation.get("failed", 0)
            verdict = "[green]0 failed[/]" if not failed else f"[red]{failed} failed[/]"
            console.print(
                f"eval: {evaluation['samples']} sample(s), {verdict}, lowest cosine "
                f"{number(evaluation.get('lowest_cosine'))}"
                + (f"; worst: sample {evaluation['worst']['sample']}" if failed and evaluation.get("worst") else "")
            )
    render_causes(record["findings"], console)
