"""The report of bench/suite/engines.py: its head (command, date, commit, versions), the per-model
table of every row, a summary per row kind, and the needless refusals, from OUT/engines/results.json.
"""

from __future__ import annotations

import os
import platform

from bench.suite.engines_plain import LABELS

ORTPREP_LABELS = {"ortprep_ort": "ortprep --engine ort", "ortprep_nncf": "ortprep --engine nncf",
                  "ortprep_aimet": "ortprep --engine aimet", "ortprep_auto": "ortprep --engine auto",
                  "ortprep_auto_search": "ortprep --auto (engine auto, precisions searched)",
                  "ortprep_today": "ortprep (no --engine: today's ORT engine)"}


def label(key: str) -> str:
    return LABELS.get(key) or ORTPREP_LABELS.get(key, key)


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def agreement(row: dict, judged: dict | None) -> str:
    if not judged:
        return "-"
    if not judged.get("loads"):
        return "does not load: " + judged.get("error", "")[:60].replace("|", "/")
    if not judged.get("runs"):
        return "does not run: " + judged.get("error", "")[:60].replace("|", "/")
    low, high = judged["interval"]
    what = "" if row["decision"] else " at cosine 0.99"
    return f"{judged['agree']}/{judged['samples']}{what} ({_pct(low)}-{_pct(high)})"


def outcome(record: dict) -> str:
    code = record.get("exit")
    if isinstance(code, str):
        return code
    if record["kind"] == "plain":
        return "written" if code == 0 and record["written"] else f"**crash** (exit {code}): " + (
            record.get("error") or "")[:90].replace("|", "/")
    codes = ", ".join(record.get("error_codes") or [])
    if code == 0:
        used = f" by {record['engine_used']}" if record.get("engine_used") else ""
        return f"written{used}" if record["written"] else "exit 0, nothing written"
    if code == 1:
        return f"refused ({codes})" if codes else "refused"
    lines = [line for line in (record.get("stderr_tail") or "").splitlines() if line.strip()]
    said = (": " + lines[-1][:90].replace("|", "/")) if lines else ""
    return f"exit {code}" + (" (traceback)" if record.get("traceback") else "") + said


def verdict(record: dict) -> str:
    if record.get("silent_failure"):
        return "**SILENT FAILURE**"
    if record["kind"] == "ortprep" and record.get("exit") == 1:
        kind = record.get("refusal")
        return {"right": "rightly refused", "for size": "refused for size",
                "needless": "**needless refusal**", "needless by the interval": "**needless refusal** (interval)",
                None: "refused (no file to judge)"}.get(kind, kind)
    if not record.get("written"):
        return "-"
    return "**below bar**" if record.get("below_bar") else "holds"


def refused_by(record: dict) -> str:
    errors = [f for f in record.get("findings") or [] if f.get("severity") == "error"]
    if not errors:
        return "-"
    first = errors[0]
    return f"{first['code']}: " + " ".join((first.get("message") or "").split())[:140].replace("|", "/")


def model_table(row: dict) -> list[str]:
    lines = ["| row | outcome | decision agreement (95% interval) | verdict | map pixels | size | latency | "
             "weight ops int8 | engine s | process s | peak RSS MB | refused by | refused file |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for key, record in row["rows"].items():
        judged = record.get("judged")
        refused = record.get("refused") or {}
        ops = (f"{record['weight_ops_int8']}/{record['weight_ops']}" if record.get("weight_ops") else "-")
        lines.append(" | ".join([
            f"| {label(key)}", outcome(record), agreement(row, judged), verdict(record),
            _pct((judged or {}).get("map_pixels")), _num(record.get("size_ratio")),
            _num(record.get("latency_ratio")), ops, _num(record.get("engine_seconds"), "{:.1f}"),
            _num(record.get("seconds") if not isinstance(record.get("exit"), str) else None, "{:.1f}"),
            _num(record.get("peak_rss_mb"), "{:.0f}"), refused_by(record),
            agreement(row, refused.get("judged")) if refused else "-"]) + " |")
    return lines


def holds(record: dict) -> bool:
    return bool(record.get("written") and record.get("below_bar") is False and not record.get("silent_failure"))


def summary_table(rows: list[dict]) -> list[str]:
    kinds: list[str] = []
    for row in rows:
        kinds += [k for k in row.get("rows", {}) if k not in kinds]
    lines = ["| row | models run | file holds the bar | below the bar (silent for ortprep) | crash / timeout | "
             "refused (rightly / needlessly) |", "|---|---:|---:|---:|---:|---|"]
    for key in kinds:
        records = [(row, row["rows"][key]) for row in rows if key in row.get("rows", {})]
        run = [(r, rec) for r, rec in records if not (isinstance(rec.get("exit"), str)
                                                      and rec["exit"].startswith("not run"))]
        held = [r["model"] for r, rec in run if holds(rec)]
        below = [r["model"] for r, rec in run if rec.get("written") and rec.get("below_bar")]
        crashed = [r["model"] for r, rec in run if rec.get("exit") not in (0, 1) or (
            rec["kind"] == "plain" and rec.get("exit") != 0)]
        refused = [rec for _, rec in run if rec["kind"] == "ortprep" and rec.get("exit") == 1]
        needless = [rec for rec in refused if (rec.get("refusal") or "").startswith("needless")]
        below_text = f"**{len(below)}**" if below and key.startswith("ortprep") else str(len(below))
        lines.append(f"| {label(key)} | {len(run)} | {len(held)}" + (f" ({', '.join(held)})" if held else "")
                     + f" | {below_text}" + (f" ({', '.join(below)})" if below else "")
                     + f" | {len(crashed)}" + (f" ({', '.join(crashed)})" if crashed else "")
                     + (f" | {len(refused) - len(needless)} / {len(needless)} |" if refused else " | - |"))
    return lines


def cell(record: dict) -> str:
    """One row's result in a word or two: the agreement (bold where it holds the bar), or what happened."""
    code = record.get("exit")
    if isinstance(code, str):
        return "not run" if code.startswith("not run") else code
    if record["kind"] == "plain" and code != 0:
        return "crash"

    def share(judged: dict | None) -> str:
        if not judged or not judged.get("runs"):
            return "does not run"
        pixels = judged.get("map_pixels")
        text = f"{judged['agree'] / judged['samples'] * 100:.1f}%"
        return text + (f" (pixels {pixels * 100:.1f}%)" if pixels else "")

    if record["kind"] == "ortprep" and code == 1:
        refused = (record.get("refused") or {}).get("judged")
        return "refused" + (f" (its file: {share(refused)})" if refused else "")
    if record["kind"] == "ortprep" and code != 0:
        return f"exit {code}"
    text = share(record.get("judged"))
    return f"**{text}**" if holds(record) else text


def side_by_side(rows: list[dict]) -> list[str]:
    kinds: list[str] = []
    for row in rows:
        kinds += [k for k in row.get("rows", {}) if k not in kinds and not all(
            str(r.get("rows", {}).get(k, {}).get("exit", "")).startswith("not run") for r in rows)]
    lines = ["| model | judged by | " + " | ".join(label(k) for k in kinds) + " |",
             "|---|---|" + "---|" * len(kinds)]
    for row in rows:
        bar = f"{row['decision']} >= {row['bar'] * 100:.0f}%" if row["decision"] else "every input at cosine 0.99"
        lines.append(f"| {row['model']} | {bar} | "
                     + " | ".join(cell(row["rows"][k]) if k in row["rows"] else "-" for k in kinds) + " |")
    return lines


def needless_table(rows: list[dict]) -> list[str]:
    lines = ["| model | row | rule that refused | refused file on the fresh inputs | class |", "|---|---|---|---|---|"]
    found = 0
    for row in rows:
        for key, record in row.get("rows", {}).items():
            if record["kind"] == "ortprep" and record.get("exit") == 1:
                refused = record.get("refused") or {}
                lines.append(f"| {row['model']} | {label(key)} | {refused_by(record)} | "
                             f"{agreement(row, refused.get('judged'))} | {record.get('refusal') or 'no file kept'} |")
                found += 1
    return lines if found else ["(no refusal in this run)"]


def plain_note(meta: dict) -> list[str]:
    """Where the plain rows were kept from an earlier run (--no-plain): that run's command and date."""
    kept = meta.get("plain_rows_from")
    if not kept:
        return []
    head = (kept.get("tree_at_start") or {}).get("head")
    lines = [f"The plain engines' rows are kept from an earlier run (`{kept.get('command')}`, {kept.get('date')}, "
             f"commit {head}) on the same float models, calibration samples and fresh inputs; only the ortprep "
             "rows ran in this one.", ""]
    runs = meta.get("runs") or []
    if len(runs) > 1:  # rows made by several runs (--only, --rows): which run made which
        lines += ["Runs that made the ortprep rows here, the last one's rows winning:", ""]
        lines += [f"- `{run['command']}`, {run['date']}, commit {run['head']}: "
                  + ", ".join(label(r) for r in run["rows"]) + " for " + ", ".join(run["models"])
                  for run in runs]
        lines.append("")
    other = meta.get("other_rows_from")
    if other and meta.get("rows_run"):
        ran = ", ".join(f"`{label(key)}`" for key in meta["rows_run"])
        lines[-2] = lines[-2].replace("only the ortprep rows ran in this one.", f"only {ran} ran in this one.")
        lines += [f"The other ortprep rows are kept from `{other.get('command')}` ({other.get('date')}, commit "
                  f"{(other.get('tree_at_start') or {}).get('head')}).", ""]
    return lines


def report(rows: list[dict], meta: dict) -> str:
    tree = meta.get("tree_at_start") or {}
    end = meta.get("tree_at_end") or {}
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown CPU") if os.path.exists("/proc/cpuinfo") else "unknown CPU"
    out = ["# Quantize engines side by side: plain, and under ortprep's gate (issue 51)", "",
           f"Command: `{meta.get('command')}` from the repository root, {meta.get('date')} (UTC), "
           f"commit {tree.get('head')}" + (f" with uncommitted changes to {', '.join(tree['uncommitted'])}"
                                           if tree.get("uncommitted") else "")
           + (" (the ortprep code changed during the run)" if end and end.get("digest") != tree.get("digest") else "")
           + f"; {meta.get('seconds', 0):.0f} s in all.",
           f"Machine: {cpu}, {os.cpu_count()} cores shared with other work (run under `nice -n 10`), "
           f"{platform.system()} {platform.machine()}, Python {platform.python_version()}; {versions}.", "",
           *plain_note(meta),
           f"Every row gets the same float model and the same {meta.get('calib')} calibration samples (seed 1); "
           f"each written file is run on the CPU EP on {meta.get('fresh')} fresh inputs (seed 51, none of them "
           "a calibration sample) and judged against the float model by bench/referee.py: the application's "
           "decision (top-1, whole CTC strings, NudeNet's detections with boxes within 2 px) against its bar "
           "(top-1 99%, strings 95%, detections 99%), or for a model without a decision a lowest cosine of "
           "0.99 on each input. \"map pixels\": for the text detectors, the share of map pixels on the same "
           "side of 0.3 (rapidocr's threshold), a figure beside the verdict. Size: bytes over the float "
           "model's. Latency: median of 15 interleaved single-thread runs, file over float. Weight ops int8: "
           "Conv/MatMul/Gemm whose weight comes through a DequantizeLinear, of those with a constant weight. "
           "Engine s: the engine call alone; process s and peak RSS: the whole child process (imports "
           f"included), each under a {meta.get('timeout_s', 600):.0f} s timeout. The rules are stated in "
           "full in bench/suite/engines.py's docstring.", ""]
    if not meta.get("engine_option"):
        out += ["This tree's `ortprep quantize` has no `--engine` yet: the rows `ortprep --engine E` say "
                "\"not run: --engine not merged\" and the row \"ortprep (no --engine)\" is the same command "
                "without it.", ""]
    skipped = [row for row in rows if row.get("skipped")]
    run = [row for row in rows if not row.get("skipped")]
    out += ["## Summary (evaluation half)", "", *summary_table(run), ""]
    out += ["## Side by side", "",
            "The share of the fresh inputs on which the file keeps the float model's decision (for a model "
            "without one, the share at cosine 0.99), bold where it holds the bar; for a refusal, its kept "
            "file's share.", "", *side_by_side(run), ""]
    out += ["## Needless refusals", "",
            "Each ortprep refusal, its kept file (`--keep-failed`: NAME.failed.onnx) judged on the fresh inputs "
            "like a written one: \"needless\" where it holds the application's bar.", "", *needless_table(run), ""]
    out += ["## Per model", ""]
    for row in run:
        bar = f"{row['decision']} at {row['bar'] * 100:.0f}%" if row["decision"] else "lowest cosine 0.99"
        out += [f"### {row['model']}", "", f"{row['note']}. Float model `{row['float_model']}`, "
                f"{row.get('weight_ops')} weighted ops; bar: {bar}; {row.get('seconds', 0):.0f} s.", "",
                *model_table(row), ""]
    if skipped:
        out += ["## Not run", "", *[f"- {row['model']}: {row['skipped']}" for row in skipped], ""]
    return "\n".join(out)
