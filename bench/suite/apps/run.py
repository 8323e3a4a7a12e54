"""ortprep's outputs swapped into real applications (issue 21): do the applications still answer
the same?

    .venv/bin/python -m bench.suite.apps.run [--only rapidocr magika vad ddddocr] [--split eval]

For each application (one module each: app_rapidocr.py, app_magika.py, app_vad.py,
app_ddddocr.py), in its own environment bench/out/apps-venv (made here, with the pinned wheels
and the same onnxruntime as ortprep's environment):
1. the application runs on its calibration inputs with the float models it ships, and the
   tensors it feeds each model are saved, one .npz per call (harness.py prepare);
2. per model, ortprep runs as a user would run it: `convert --fp16`, `convert --fp16 --inputs
   ONE.npz`, `quantize --static --calib DIR`, `quantize --dynamic`, `quantize --dynamic --eval
   DIR`, and where the app's feeds have mixed shapes the two quantize-with-data commands again on
   the samples cut to their smallest common shape; a refused result is made again with
   --keep-failed, to see what the refusal saved;
3. the application runs on the evaluation inputs with that file in place of the model it ships
   (the other models float), and its answers are scored against the float application's.
A control swaps in byte-for-byte copies of the shipped models: it must agree 100%.

The acceptance of issue 21: every exit 0 keeps the application's answers (OCR CER against the
float pipeline <= 1%, labels >= 99% equal, strings >= 95% equal, VAD frames >= 98% equal); every
larger change is an exit != 0. A silent failure: exit 0, answers changed beyond the bound. A
needless refusal: exit != 0, though the refused file (--keep-failed) keeps the answers.
Results: OUT/results.json (everything), OUT/table.md (the tables printed at the end).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.paths import OUT, ROOT
from bench.referee import app_verdict as classify

VENV = OUT / "apps-venv"
APPS_PYTHON = VENV / "bin" / "python"
ORTPREP = [sys.executable, "-m", "ortprep"]
APPS = ["magika", "vad", "ddddocr", "rapidocr"]
# the wheels the applications come in; onnxruntime is pinned to ortprep's own version below
PINS = ["rapidocr==3.10.0", "magika==1.0.3", "faster-whisper==1.2.1", "ddddocr==1.6.1"]
TRANSFORMS = {
    "fp16": ["convert", "--fp16"],
    "fp16 --inputs": ["convert", "--fp16", "--inputs", "{sample}"],
    "static": ["quantize", "--static", "--calib", "{calib}"],
    "dynamic": ["quantize", "--dynamic"],
    "dynamic --eval": ["quantize", "--dynamic", "--eval", "{calib}"],
    # where the app's feeds have mixed shapes: the same samples cut to their common (smallest)
    # shape, as a user would after ortprep refused the mixed ones
    "static, one shape": ["quantize", "--static", "--calib", "{calib_one_shape}"],
    "dynamic --eval, one shape": ["quantize", "--dynamic", "--eval", "{calib_one_shape}"],
}
ONE_SHAPE = {"static, one shape", "dynamic --eval, one shape"}
TIMEOUT = 3600


def ortprep_source() -> dict:
    """The commit ortprep's code came from, and its files changed since (the tree is shared)."""
    def git(*args: str) -> str:
        child = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return child.stdout.strip()
    return {"commit": git("rev-parse", "--short", "HEAD"), "changed": git("status", "--short", "ortprep").splitlines()}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_venv() -> None:
    """The applications' environment: never ortprep's (they bring opencv, the CPU ORT wheel, ...)."""
    wanted = f"onnxruntime=={importlib.metadata.version('onnxruntime')}"
    marker = VENV / "pins.txt"
    if marker.exists() and marker.read_text().split() == [wanted, *PINS]:
        return
    if not APPS_PYTHON.exists():
        log(f"creating {VENV.relative_to(ROOT)}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log(f"installing {' '.join([wanted, *PINS])}")
    subprocess.run([str(APPS_PYTHON), "-m", "pip", "install", "-q", wanted, *PINS], check=True)
    marker.write_text("\n".join([wanted, *PINS]) + "\n")


def harness(*args: str) -> None:
    child = subprocess.run([str(APPS_PYTHON), "-m", "bench.suite.apps.harness", *args], capture_output=True, text=True,
                           timeout=TIMEOUT, cwd=ROOT)
    if child.returncode != 0:
        raise RuntimeError(f"harness {' '.join(args)} failed ({child.returncode}): {child.stderr[-2000:]}")


def app_answers(app: str, split: str, target: Path, swaps: dict[str, Path]) -> dict:
    args = ["answer", app, "--split", split, "--out", str(target)]
    for key, path in swaps.items():
        args += ["--swap", f"{key}={path}"]
    harness(*args)
    return json.loads(target.read_text())


def ortprep(args: list[str]) -> tuple[int, dict, float, str]:
    started = time.perf_counter()
    try:
        child = subprocess.run([*ORTPREP, *args, "--json"], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return -1, {}, time.perf_counter() - started, "timed out"
    seconds = time.perf_counter() - started
    try:
        record = json.loads(child.stdout)
    except json.JSONDecodeError:
        record = {}
    stderr = " ".join(line for line in child.stderr.strip().splitlines()[-3:])[-400:]
    return child.returncode, record, seconds, stderr


def gate_figures(record: dict) -> dict:
    """What ortprep's --json said: its gate's figures and its error findings."""
    verify = record.get("verify") or {}
    figures = {"cosine": verify.get("cosine"), "passed": verify.get("passed", record.get("verified"))}
    if "top1_agreement" in verify:
        figures["top1"] = verify.get("top1_agreement")
    if verify.get("spread"):
        figures["spread_median"] = verify["spread"].get("median")
    if "evaluation_samples" in record:
        figures["evaluation_samples"] = record.get("evaluation_samples")
        figures["evaluation_inputs"] = record.get("evaluation_inputs")
        figures["calibration_samples"] = (record.get("calibration") or {}).get("samples")
        figures["kept_float"] = len(record.get("excluded_nodes") or [])
        figures["size_ratio"] = record.get("size_ratio")
    else:
        figures["inputs"] = record.get("inputs")
        figures["kept_float"] = len(record.get("kept_fp32_nodes") or [])
        if record.get("size_before") and record.get("size_after"):  # nothing written: no size
            figures["size_ratio"] = round(record["size_after"] / record["size_before"], 3)
    findings = record.get("findings") or []
    figures["errors"] = sorted({f["code"] for f in findings if f.get("severity") == "error"})
    figures["warnings"] = sorted({f["code"] for f in findings if f.get("severity") == "warning"})
    figures["messages"] = [f"{f['code']}: {f['message'][:300]}" for f in findings if f.get("severity") in ("error",)][
        :3
    ]
    return figures


def one_shape(calib: Path, target: Path) -> bool:
    """Cut every sample to the smallest shape all samples share (each input, each axis, from the
    start); False when the samples already have one shape (nothing written)."""
    import numpy as np

    samples = [dict(np.load(path)) for path in sorted(calib.glob("*.npz"))]
    names = list(samples[0])
    if all(sample[n].shape == samples[0][n].shape for sample in samples for n in names):
        return False
    common = {n: tuple(min(s[n].shape[axis] for s in samples) for axis in range(samples[0][n].ndim)) for n in names}
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for index, sample in enumerate(samples):
        np.savez(target / f"{index:03d}.npz",
                 **{n: np.ascontiguousarray(v[tuple(slice(0, d) for d in common[n])]) for n, v in sample.items()})
    return True


def run_transform(module, key: str, name: str, source: Path, calib: Path, folder: Path,
                  split: str, reference: dict) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    output = folder / f"{key}.onnx"
    args = [
        part.format(
            sample=sorted(calib.glob("*.npz"))[0],
            calib=calib,
            calib_one_shape=calib.parent.parent / "calib-one-shape" / key,
        )
        for part in TRANSFORMS[name]
    ]
    args = [args[0], str(source), *args[1:], "-o", str(output)]
    code, record, seconds, stderr = ortprep(args)
    (folder / "ortprep.json").write_text(json.dumps(record, indent=1))
    entry = {"model": key, "transform": name, "command": "ortprep " + " ".join(args).replace(str(ROOT) + "/", ""),
             "exit": code, "seconds": round(seconds, 1), "written": output.exists(), **gate_figures(record)}
    if code not in (0, 1):
        entry["stderr"] = stderr
    candidate = output if output.exists() else None
    if code == 1 and not output.exists():
        # what the refusal kept from the user: the same command with --keep-failed
        again = folder / "keep-failed"
        again.mkdir()
        kept_output = again / f"{key}.onnx"
        code2, record2, _, _ = ortprep([args[0], *args[1:-1], str(kept_output), "--keep-failed"])
        kept = [p for p in (kept_output, *sorted(again.glob("*.failed.onnx"))) if p.exists()]
        entry["keep_failed"] = {"exit": code2, "file": kept[0].name if kept else None,
                                "cosine": (record2.get("verify") or {}).get("cosine")}
        if candidate is None and kept:
            candidate = kept[0]
    if candidate is None:
        entry["app"] = None
        return entry
    answers = app_answers(module.NAME_IN_HARNESS, split, folder / "answers.json", {key: candidate})
    if answers.get("build_error"):
        entry["app"] = {"value": None, "error": answers["build_error"]}
    else:
        scored = module.score(reference["answers"], answers["answers"], key)
        errors = [a["error"] for a in answers["answers"] if "error" in a]
        scored["errors"] = len(errors)
        if errors:
            scored["first_error"] = errors[0]
        scored["not_opened"] = answers.get("not_opened")
        entry["app"] = scored
    entry["app_file"] = candidate.name if candidate.parent == folder else f"keep-failed/{candidate.name}"
    return entry


def run_app(app: str, out: Path, split: str, transforms: list[str], only_models: list[str] | None = None) -> dict:
    module = importlib.import_module(f"bench.suite.apps.app_{app}")
    module.NAME_IN_HARNESS = app
    folder = out / app
    log(f"{app}: recording the app's feeds on its calibration inputs")
    harness("prepare", app, "--out", str(folder))
    prepared = json.loads((folder / "prepare.json").read_text())
    harness("versions", app, "--out", str(folder / "versions.json"))
    log(f"{app}: float answers ({split})")
    reference = app_answers(app, split, folder / "float.json", {})
    models = sorted(p.stem for p in (folder / "models").glob("*.onnx"))
    control = app_answers(app, split, folder / "control.json", {k: folder / "models" / f"{k}.onnx" for k in models})
    result = {
        "app": app,
        "metric": module.METRIC,
        "bound": module.BOUND,
        "prepared": prepared,
        "versions": json.loads((folder / "versions.json").read_text()),
        "float_seconds": reference["seconds"],
        "inputs": len(reference["answers"]),
        "control": {k: module.score(reference["answers"], control["answers"], k) for k in models},
        "rows": [],
    }
    source = ortprep_source()
    earlier = _earlier_rows(folder / "result.json", transforms, only_models)
    for key in models:
        if only_models and key not in only_models:
            continue
        mixed = one_shape(folder / "calib" / key, folder / "calib-one-shape" / key)
        for name in transforms:
            if name in ONE_SHAPE and not mixed:
                continue
            log(f"{app}/{key}: {name}")
            entry = run_transform(module, key, name, folder / "models" / f"{key}.onnx", folder / "calib" / key,
                                  folder / "runs" / key / name.replace(" ", "").replace("--", "_"), split, reference)
            entry["verdict"] = classify(entry, module.BOUND)
            entry["ortprep"] = source
            log(
                f"{app}/{key}: {name}: exit {entry['exit']}, app {(entry.get('app') or {}).get('value')}, "
                f"{entry['verdict']}"
            )
            result["rows"].append(entry)
            (folder / "result.json").write_text(
                json.dumps(result | {"rows": _merged(earlier, result["rows"])}, indent=1)
            )
    result["rows"] = _merged(earlier, result["rows"])
    (folder / "result.json").write_text(json.dumps(result, indent=1))
    return result


def _earlier_rows(saved: Path, transforms: list[str], only_models: list[str] | None) -> list[dict]:
    """The last run's rows that this run does not redo (a run of some models or transforms keeps
    the others); each keeps the ortprep commit it was measured at ("ortprep", where recorded)."""
    if not saved.exists() or (only_models is None and set(transforms) == set(TRANSFORMS)):
        return []
    rows = json.loads(saved.read_text()).get("rows", [])
    redone = lambda row: row["transform"] in transforms and (not only_models or row["model"] in only_models)
    return [row for row in rows if not redone(row)]


def _merged(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """Rows in the order a full run writes them: by model, then by transform."""
    order = {name: i for i, name in enumerate(TRANSFORMS)}
    return sorted(earlier + rows, key=lambda row: (row["model"], order.get(row["transform"], len(order))))


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tables(results: list[dict]) -> str:
    lines = []
    for result in results:
        kind, limit = result["bound"]
        unit = "%"
        lines += [
            f"{result['app']}: {result['metric']} ({'<=' if kind == 'max' else '>='} {limit:g}{unit} to keep the "
            f"answers), "
            f"{result['inputs']} evaluation inputs",
            "",
            "| model | transform | ortprep exit | written | ortprep's gate: cosine | ortprep's errors | "
            f"app: {result['metric']} | app detail | verdict |",
            "|---|---|---|---|---:|---|---:|---|---|",
        ]
        for key, control in result["control"].items():
            lines.append(f"| {key} | control: the shipped file, copied | - | - | - | - | {control['value']:.2f}% | "
                         f"{control.get('detail', '')} | harness check |")
        commits = {(row.get("ortprep") or {}).get("commit") for row in result["rows"]}
        for row in result["rows"]:
            app = row.get("app") or {}
            value = app.get("value")
            metric = "-" if not app else ("app fails: " + app["error"][:80] if app.get("error") else f"{value:.2f}%")
            if row["exit"] != 0 and app and row.get("keep_failed"):
                metric += " (kept-failed file)" if row["keep_failed"].get("file") and not row["written"] else ""
            detail = app.get("detail", "")
            if app.get("errors"):
                detail += f"; {app['errors']} inputs raised: {app.get('first_error', '')[:80]}"
            verdict = row["verdict"]
            verdict = (
                f"**{verdict}**"
                if verdict.isupper() or verdict.startswith(("SILENT", "NEEDLESS", "silent", "exit"))
                else verdict
            )
            at = f" (at {(row.get('ortprep') or {}).get('commit') or 'an earlier run'})" if len(commits) > 1 else ""
            lines.append(
                f"| {row['model']} | {row['transform']}{at} | {row['exit']} | {'yes' if row['written'] else 'no'} | "
                f"{_num(row.get('cosine'))} | {', '.join(row.get('errors') or []) or '-'} | {metric} | {detail} | "
                f"{verdict} |"
            )
        lines.append("")
    lines += [
        "| app | (model, transform) runs | exit 0, answers kept | silent failures | rightly refused | needless "
        "refusals | "
        "refused, nothing to measure | ortprep crashed (exit 4) | other |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    totals = [0] * 8
    for result in results:
        verdicts = [row["verdict"] for row in result["rows"]]
        counts = [len(verdicts), verdicts.count("kept"), sum(v.lower().startswith("silent") for v in verdicts),
                  verdicts.count("rightly refused"), verdicts.count("NEEDLESS REFUSAL"),
                  verdicts.count("refused (nothing to measure)"), verdicts.count("exit 4")]
        counts.append(counts[0] - sum(counts[1:]))
        totals = [a + b for a, b in zip(totals, counts)]
        lines.append(f"| {result['app']} | " + " | ".join(map(str, counts)) + " |")
    lines.append("| all | " + " | ".join(map(str, totals)) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=OUT / "apps")
    parser.add_argument("--only", nargs="*", choices=APPS)
    parser.add_argument("--split", choices=["dev", "eval"], default="eval",
                        help="which half of each app's inputs judges the results (default: eval)")
    parser.add_argument("--transforms", nargs="*", choices=list(TRANSFORMS), default=list(TRANSFORMS))
    parser.add_argument("--models", nargs="*", help="only these models of the apps run (e.g. ocr_rec); "
                        "the last run's rows of the others are kept, each with its commit")
    parser.add_argument(
        "--render", action="store_true", help="print the tables of the last run (OUT/results.json) again"
    )
    args = parser.parse_args()
    if args.render:
        print(tables(json.loads((args.out / "results.json").read_text())))
        return 0
    started = time.perf_counter()
    ensure_venv()
    args.out.mkdir(parents=True, exist_ok=True)
    source_before = ortprep_source()
    results = []
    for app in APPS:
        if args.only and app not in args.only:
            saved = args.out / app / "result.json"
            if saved.exists():  # keep the last run's rows of the apps not rerun
                results.append(json.loads(saved.read_text()))
            continue
        results.append(run_app(app, args.out, args.split, args.transforms, args.models))
    text = tables(results)
    source = {"before": source_before, "after": ortprep_source()}
    for result in results:
        result.setdefault("ortprep_source", source)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    log(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
