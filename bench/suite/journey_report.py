"""The journey's report (bench/suite/journey.py): how a row's steps read (each check's verdicts, a step's
first error, a wrong pass that stands), and the tables of OUT/table.md and bench/suite/results/journey.md.
"""

from __future__ import annotations

from bench.referee import wrong
from bench.suite.journey_corpus import CORPUS

STEPS = ["check_qnn", "check_ov", "convert", "quantize", "fp16", "check_qdq_qnn", "check_ov_fixed", "load",
         "load_session", "compile"]
STEP_TITLES = {
    "check_qnn": "check qnn",
    "check_ov": "check ov",
    "convert": "convert",
    "quantize": "quantize",
    "fp16": "FP16 (named by quantize)",
    "check_qdq_qnn": "check deployed qnn",
    "check_ov_fixed": "check ov fixed",
    "load": "load",
    "load_session": "load, the session load named",
    "compile": "compile",
}
# the steps that make or pass the deployed model
ARTIFACT_STEPS = ["convert", "quantize", "fp16", "load", "load_session", "compile"]
CONFIRM_SAMPLES = 400  # fresh inputs that confirm or clear a wrong pass the 8 unseen samples flag


def check_record(entry: dict) -> dict:
    """What one check --prove says: predicted and proven verdict, node share and partitions both ways."""
    report = entry.get("report") or {}
    result = (report.get("results") or [{}])[0]
    proof = result.get("proof") or {}
    comparison = proof.get("comparison") or {}
    total, on_ep = proof.get("nodes_total"), proof.get("nodes_on_ep")
    record = {
        "predicted": result.get("predicted_verdict"),
        "proven": result.get("verdict"),
        "status": proof.get("status"),
        "share_predicted": result.get("node_share"),
        "share_real": on_ep / total if total else None,
        "partitions_predicted": result.get("partitions"),
        "partitions_real": comparison.get("actual_partitions"),
        "message": proof.get("message"),
        "device": (result.get("device") or {}).get("provider_options"),
        "errors": sorted({f["code"] for f in report.get("findings", []) if f["severity"] == "error"}),
    }
    if proof.get("culprit"):
        culprit = proof["culprit"]
        record["culprit"] = [f"{n['name']} ({n['op_type']})" for n in culprit.get("nodes", [])[:5]] or culprit.get(
            "stopped"
        )
    if record["status"] != "created" and record["status"] is not None:
        record["share_real"], record["partitions_real"] = 0.0, 0
    return record


def first_error(entry: dict) -> str:
    """The step's own words for a failure: its first error finding, else its stderr."""
    report = entry.get("report") or {}
    for finding in report.get("findings", []):
        if finding["severity"] == "error":
            return f"{finding['code']}: {' '.join(finding['message'].split())}"
    if entry.get("exit") == "timeout":
        return "timed out"
    tail = (entry.get("stderr_tail") or "").strip().splitlines()
    return tail[-1] if tail else f"exit {entry.get('exit')}"


def confirmed_wrong(row: dict) -> bool:
    """A wrong pass that stands: flagged, and not cleared on the fresh inputs."""
    check = row.get("wrong_pass_check")
    return bool(row["wrong_passes"]) and not (check and check.get("checked") and not check.get("confirmed"))


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def step_cell(row: dict, name: str) -> str:
    entry = row["steps"].get(name)
    if entry is None:
        if name == "convert" and not row["static"]:
            return "- (static)"
        if name == "check_ov_fixed" and not row["static"]:
            return "- (= as shipped)"
        return "n/a"
    code = entry["exit"]
    if code == "timeout":
        return "timeout"
    if name.startswith("check"):
        verdict = check_record(entry)
        return f"{code} ({verdict['proven']})"
    if code == 0:
        return "0"
    codes = sorted({f["code"] for f in (entry.get("report") or {}).get("findings", []) if f["severity"] == "error"})
    return f"{code} ({', '.join(codes)})" if codes else f"{code}" + (" traceback" if entry["traceback"] else "")


def verdict_cell(record: dict | None) -> str:
    if record is None:
        return "n/a"
    real = record.get("session")
    proven = record.get("proven")
    verdict = f"{record.get('predicted')} / {proven}" + ("" if real == proven else f" / **{real}**")
    return (f"{verdict} · {_pct(record.get('share_predicted'))} / {_pct(record.get('share_real'))} · "
            f"{record.get('partitions_predicted', '-')} / {record.get('partitions_real', '-')}")


def measure_cell(entry: dict | None) -> str:
    if not entry or not entry.get("measure"):
        return "-"
    measure = entry["measure"]
    text = f"{_num(measure['cosine'])} / {_num(measure['norm_ratio'])}"
    return text + (" NaN/Inf" if measure["nonfinite"] else "")


def decision_cell(entry: dict | None) -> str:
    decision = (entry or {}).get("decision")
    if not decision:
        return "-"
    return f"{decision['agree']}/{decision['samples']} ({decision['distinct_float_decisions']} distinct)"


def load_cell(row: dict) -> str:
    total = ((row["load"] or {}).get("three_way") or {}).get("total")
    if not total:
        return "-" if "load" not in row["steps"] else f"{row['load'].get('status') or 'no report'}"
    return f"{_num(total.get('cosine'))} / {_num(total.get('norm_ratio'))}"


def peak(row: dict) -> float:
    return max((entry["peak_rss_mb"] for entry in row["steps"].values()), default=0)


def tables_for(rows: list[dict]) -> list[str]:
    lines = [
        "| model | NPU material | "
        + " | ".join(STEP_TITLES[s] for s in STEPS)
        + " | journey | wall (s) | peak RSS (MB) |",
        "|---|---|" + "---|" * len(STEPS) + "---|---:|---:|",
    ]
    for row in rows:
        result = row["outcome"]
        via = result.get("via") or ""
        journey = (("complete" + (" (in FP16, named by quantize)" if "fp16" in via else "")
                    + (" (with the session setting load named)" if "session setting" in via else ""))
                   if not result["stopped_at"] else f"complete ({result['stopped_at']}: expected refusal)") \
            if result["complete"] else f"stopped at {result['stopped_at']}"
        lines.append(f"| {row['model']} | {'yes' if row['npu_material'] else 'no'} | "
                     + " | ".join(step_cell(row, name) for name in STEPS)
                     + f" | {journey} | {row['seconds']:.0f} | {peak(row):.0f} |")
    lines += [
        "",
        "| model | QNN, as shipped | QNN, deployed (QDQ, or FP16 where the journey says) | OpenVINO CPU, as shipped | "
        "OpenVINO CPU, static |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        v = row["verdicts"]
        lines.append(
            f"| {row['model']} | {verdict_cell(v.get('qnn_float'))} | {verdict_cell(v.get('qnn_qdq'))} | "
            f"{verdict_cell(v.get('ov_float'))} | "
            f"{verdict_cell(v.get('ov_fixed')) if 'ov_fixed' in v else '- (= as shipped)'} |"
        )
    lines += [
        "",
        "| model | decision | load: QDQ on QNN vs float, cosine / norm | this script: QDQ on QNN vs float, cosine / "
        "norm "
        "| decision agrees | of which quantization (QDQ on CPU vs float) | of which the EP (QDQ on QNN vs on CPU) "
        "| compiled on QNN: cosine / norm | compiled: decision | convert: cosine / norm | pass of a wrong output |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m = row["measures"]
        wrong_text = "yes: " + ", ".join(w.split(":")[0] for w in row["wrong_passes"]) if row["wrong_passes"] else "no"
        check = row.get("wrong_pass_check") or {}
        if check.get("checked"):
            low, high = check["interval"]
            wrong_text += (
                f"; on {check['samples']} fresh inputs {check['agree']}/{check['samples']} ({low:.1%}-{high:.1%}, "
                f"bar {check['bar']:.0%}): {'confirmed' if check['confirmed'] else 'cleared'}"
            )
        lines.append(
            f"| {row['model']} | {row['decision_kind'] or '-'} | {load_cell(row)} | {measure_cell(m.get('qnn_qdq'))} | "
            f"{decision_cell(m.get('qnn_qdq'))} | {measure_cell(m.get('cpu_qdq'))}, {decision_cell(m.get('cpu_qdq'))} "
            f"| "
            f"{measure_cell(m.get('qnn_vs_cpu_qdq'))}, {decision_cell(m.get('qnn_vs_cpu_qdq'))} | "
            f"{measure_cell(m.get('qnn_ctx'))} | {decision_cell(m.get('qnn_ctx'))} | "
            f"{measure_cell(m.get('convert'))} | {wrong_text} |"
        )
    lines += ["", "| model | " + " | ".join(STEP_TITLES[s] for s in STEPS) + " | own sessions | total |",
              "|---|" + "---:|" * (len(STEPS) + 2)]
    for row in rows:
        lines.append(
            f"| {row['model']} | "
            + " | ".join(f"{row['steps'][s]['seconds']:.1f}" if s in row["steps"] else "-" for s in STEPS)
            + f" | {row['bench_seconds']:.1f} | {row['seconds']:.1f} |"
        )
    return lines


def summary(rows: list[dict]) -> dict:
    material = [r for r in rows if r["npu_material"]]
    compared = [
        (r["model"], label, record) for r in rows for label, record in r["verdicts"].items() if record.get("session")
    ]
    wrong_verdicts = [(m, label, rec) for m, label, rec in compared if rec["proven"] != rec["session"]]
    table_agree = [(m, label, rec) for m, label, rec in compared if rec["predicted"] == rec["session"]]
    complete_material = [r for r in material if r["outcome"]["complete"]]
    quantized_material = [r for r in complete_material if "fp16" not in (r["outcome"].get("via") or "")]
    at_defaults = [r for r in complete_material if "session setting" not in (r["outcome"].get("via") or "")]
    flagged_material = [r for r in material if r["wrong_passes"]]
    wrong_material = [r for r in material if confirmed_wrong(r)]
    return {
        "models": len(rows), "npu_material": len(material),
        "complete_material": len(complete_material), "complete_quantized_material": len(quantized_material),
        "complete_material_defaults": len(at_defaults),
        "complete_all": sum(r["outcome"]["complete"] for r in rows),
        "verdicts_compared": len(compared), "wrong_verdicts": len(wrong_verdicts),
        "table_agreement": len(table_agree), "wrong_passes": sum(bool(r["wrong_passes"]) for r in rows),
        "wrong_shipped": sum(bool(r["wrong_passes"]) and r["outcome"]["complete"] for r in rows),
        "wrong_passes_material": len(flagged_material),
        "wrong_confirmed": sum(confirmed_wrong(r) for r in rows), "wrong_confirmed_material": len(wrong_material),
        "accepted": bool(material) and len(complete_material) >= 0.8 * len(material) and not wrong_verdicts
        and not wrong_material,
    }


def summary_table(groups: list[tuple[str, list[dict]]]) -> list[str]:
    figures = [(label, summary(rows)) for label, rows in groups if rows]
    def frac(a: int, b: int) -> str:
        return f"{a}/{b} ({a / b * 100:.0f}%)" if b else "-"
    lines = ["| figure | " + " | ".join(label for label, _ in figures) + " |", "|---|" + "---|" * len(figures)]
    rows = [
        ("models (NPU material)", lambda s: f"{s['models']} ({s['npu_material']})"),
        ("journeys complete, NPU material", lambda s: frac(s["complete_material"], s["npu_material"])),
        (
            "of which with a quantized model (the others in FP16, as quantize named it)",
            lambda s: frac(s.get("complete_quantized_material", s["complete_material"]), s["npu_material"]),
        ),
        (
            "of which at ORT's default session (the others with the session setting load named: LOD012)",
            lambda s: frac(s.get("complete_material_defaults", s["complete_material"]), s["npu_material"]),
        ),
        ("journeys complete, every model", lambda s: frac(s["complete_all"], s["models"])),
        (
            "wrong verdicts (check --prove vs the session this script builds)",
            lambda s: f"{s['wrong_verdicts']} of {s['verdicts_compared']}",
        ),
        (
            "table-only verdict agreement (prediction vs that session)",
            lambda s: frac(s["table_agreement"], s["verdicts_compared"]),
        ),
        (
            "passes of a wrong output flagged by 8 unseen samples (models; NPU material)",
            lambda s: f"{s['wrong_passes']} ({s['wrong_passes_material']})",
        ),
        (
            "of which the journey completed (every step exit 0: the wrong model would ship)",
            lambda s: f"{s['wrong_shipped']}",
        ),
        (
            f"of the flagged, wrong on {CONFIRM_SAMPLES} fresh inputs on QNN (interval below the bar; models; NPU "
            f"material)",
            lambda s: (
                f"{s.get('wrong_confirmed', s['wrong_passes'])} "
                f"({s.get('wrong_confirmed_material', s['wrong_passes_material'])})"
            ),
        ),
        (
            "acceptance: >= 80% complete, 0 wrong verdicts, 0 wrong passes (NPU material)",
            lambda s: "met" if s["accepted"] else "not met",
        ),
    ]
    for title, cell in rows:
        lines.append(f"| {title} | " + " | ".join(cell(s) for _, s in figures) + " |")
    return lines


def disagreements(rows: list[dict]) -> list[str]:
    """Every verdict that differs, every step that did not give its answer, every wrong output."""
    titles = {"qnn_float": "QNN, as shipped", "qnn_qdq": "QNN, deployed", "ov_float": "OpenVINO CPU, as shipped",
              "ov_fixed": "OpenVINO CPU, static"}
    lines = ["| half | model | where | what | in the EP's or ortprep's words |", "|---|---|---|---|---|"]

    def add(row: dict, where: str, what: str, words: str) -> None:
        words = " ".join(str(words).split()).replace("|", "/")
        lines.append(f"| {row['half']} | {row['model']} | {where} | {what} | {words[:400]} |")

    for row in rows:
        for label, record in row["verdicts"].items():
            real = record.get("session")
            if real is None:
                continue
            words = record.get("message") or record.get("session_detail") or ""
            if record.get("culprit"):
                words += f" (culprit: {record['culprit']})"
            if record["proven"] != real:
                add(row, titles[label], f"wrong verdict: proven {record['proven']}, session {real}",
                    f"session: {record.get('session_detail')}; proof: {record.get('message') or record.get('status')}")
            elif record["predicted"] != real:
                add(row, titles[label], f"table predicted {record['predicted']}, real {real}", words)
        for name in STEPS:
            entry = row["steps"].get(name)
            if entry is None:
                continue
            failed = entry["exit"] == "timeout" or entry["traceback"] or entry["exit"] not in (0, 1) \
                or (name in ARTIFACT_STEPS and entry["exit"] == 1)
            if failed:
                followed = (
                    " (it named FP16: the journey went on with it)"
                    if name == "quantize" and row.get("deployed") == "fp16"
                    else ""
                )
                add(
                    row,
                    STEP_TITLES[name],
                    f"exit {entry['exit']}" + (" with a traceback" if entry["traceback"] else "") + followed,
                    first_error(entry),
                )
        for text in row["wrong_passes"]:
            add(row, "output", "pass of a wrong output", text)
        if not row["wrong_passes"]:  # a wrong output no step passed (a step refused it, or nothing ran)
            for label in ("qnn_qdq", "qnn_ctx"):
                reasons = wrong(
                    row["measures"].get(label, {}).get("measure"), row["measures"].get(label, {}).get("decision")
                )
                if reasons:
                    add(row, label.replace("qnn_qdq", "QDQ on QNN").replace("qnn_ctx", "compiled on QNN"),
                        "wrong output, refused by a step", "; ".join(reasons))
    return lines


def report(rows: list[dict], meta: dict) -> str:
    order = {case.name: index for index, case in enumerate(CORPUS)}
    rows = sorted(rows, key=lambda r: order.get(r["model"], 999))
    evaluation = [r for r in rows if r["half"] == "eval"]
    development = [r for r in rows if r["half"] == "dev"]
    start, end = meta.get("tree_at_start") or {}, meta.get("tree_at_end") or {}
    tree = (f"ortprep at {start.get('head')}" + (f" with uncommitted changes to {len(start['uncommitted'])} file(s) "
                                                  f"(digest {start['digest']})" if start.get("uncommitted") else ""))
    if end and end != start:
        tree += f"; the code changed during the run (at the end: {end.get('head')}, digest {end.get('digest')})"
    lines = [f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}; {tree}. "
             f"QNN device: {meta['device']}. Timeout per step: {meta.get('timeout_s', 0):.0f} s.", ""]
    lines += summary_table([("evaluation half", evaluation), ("development half", development), ("all", rows)])
    for title, group in (
        ("Evaluation half", evaluation),
        ("Development half (labelled: not the evaluation)", development),
    ):
        if group:
            lines += ["", f"{title}, {len(group)} models:", ""] + tables_for(group)
    lines += ["", "Every disagreement and failure:", ""] + disagreements(evaluation + development)
    return "\n".join(lines) + "\n"
