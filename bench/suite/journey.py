"""The whole NPU journey of issue 20 on a corpus of real and built models, each step run as a user
runs it (the CLI with --json, in a child process), and every verdict and output held against
sessions this script builds itself.

    .venv/bin/python -m bench.suite.journey [--only NAME ...] [--half dev|eval|all] [--out bench/out/journey]
                                                [--timeout 600]

Per model (bench/suite/journey_corpus.py: the corpus, its halves and which models are NPU material):

1. `check MODEL --ep qnn --prove` and `check MODEL --ep openvino-cpu --prove --runtime
   openvino-cpu=.venv-openvino/bin/python` on the model as shipped;
2. `convert MODEL --fix-shape NAME=DIMS ... --inputs SAMPLE.npz` when it has dynamic inputs
   (the corpus's static shapes; verified on a realistic sample);
3. `quantize FIXED --static --ep qnn --auto --auto-exclude --calib CALIB/` (24 realistic samples;
   `--auto`: where QNN's preset, A16W8, fails the gate, A16W16 next, as QNT005's fix says; from
   session 10 on, before it the preset alone); where it refuses every precision and names FP16,
   measured to pass its gate on QNN (`auto.fp16` in its JSON, session 17 on), the `ortprep
   convert ... --fp16` command it printed, and the journey goes on with that file (the "deployed"
   model below: the QDQ model, or that FP16 one);
4. `check QDQ --ep qnn --prove`, and `check FIXED --ep openvino-cpu --prove` (when FIXED is
   not the model as shipped);
5. `load QDQ --ep qnn --reference FIXED --inputs SAMPLE.npz`; where it fails and names ORT
   optimizers a session without which matches (LOD012, session 40 on), the same load with
   `--disable-optimizer NAME ...` (a user creates the application's session so, and confirms it), and
   this script's own QNN session of the deployed model leaves them out too;
6. `compile QDQ --ep qnn -o CTX --inputs SAMPLE.npz --eval CALIB` (every calibration sample judged too).

The QNN device: ortprep's default (`--device` is not passed; ortprep states the device it used in
each report, and this script's own QNN sessions use the same soc_model); `--device NAME` passes
ortprep's `--device` to check, quantize, load and compile (a deployment to that SoC; the FP16 step's
`convert` has none: it verifies on the CPU EP, and load judges its file on the device). Where `check --help`
has no `--device`, `--provider-option qnn:soc_model=60` is passed to check, load and compile.

Then this script builds the sessions a user's application would (fallback allowed, default
optimization level) in child processes: the model as shipped and the QDQ model on QNN, the float
models on OpenVINO's CPU device (under .venv-openvino) and on the CPU EP, the compiled EPContext
model on QNN. Their outcome (created, ran, placement) is the real verdict each `check --prove`
verdict and each table prediction is held against; their outputs on 8 realistic samples that no
step saw give the cosine, the norm ratio and the application-level decision (top-1 class, CTC
text, argmax sequence, speech at 0.5) of the QDQ model on QNN against the float model on the CPU.
A step that passed a model whose decision differs on one of those 8 samples is flagged as a pass of
a wrong output; from session 18 on, a flag that only a decision shows is checked on 400 fresh
inputs on QNN (decision_rates.py), and stands only where the 95% interval of the agreement there
lies wholly below the application's bar (8 samples cannot carry a 99% bar: one flip is 87.5%).
The acceptance counts the flags that stand; the table shows both.

Each step has a timeout (a timeout is its outcome); wall time and peak RSS (os.wait4 on the step's
process, which reaps ortprep's workers) are recorded per step. Results: OUT/results.json (one
record per model), OUT/table.md (what bench/suite/results/journey.md shows); --only keeps the other models' records
of the last run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.paths import OUT, ROOT
from bench.referee import compare, decisions, session_verdict, wrong
from bench.suite import bench_corpus
from bench.suite.journey_corpus import CORPUS, JourneyCase, build
from bench.suite.journey_report import ARTIFACT_STEPS, CONFIRM_SAMPLES, STEPS, check_record, first_error, report
from bench.suite.runner import ORTPREP, shown, launch, ortprep, tree_state

OPENVINO = ROOT / ".venv-openvino" / "bin" / "python"
CALIB, INDEPENDENT = 24, 8


# ---------------------------------------------------------------- the sessions this script builds

SESSION = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
request = json.loads(sys.argv[1])
provider = {"qnn": "QNNExecutionProvider", "openvino-cpu": "OpenVINOExecutionProvider",
            "cpu": "CPUExecutionProvider"}[request["ep"]]
options = ort.SessionOptions()
options.log_severity_level = 3
options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
reply = {"created": False}
started = time.perf_counter()
try:
    if request["ep"] == "qnn":  # a plugin EP: registered, then added through its device, as ORT's docs say
        import onnxruntime_qnn
        ort.register_execution_provider_library(provider, onnxruntime_qnn.get_library_path())
        devices = [d for d in ort.get_ep_devices() if d.ep_name == provider]
        options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(),
                                                   "soc_model": request["soc_model"]})
        session = ort.InferenceSession(request["model"], sess_options=options, enable_fallback=0,
                                       disabled_optimizers=request.get("disabled") or None)
    elif request["ep"] == "openvino-cpu":
        session = ort.InferenceSession(request["model"], options,
                                       providers=[(provider, {"device_type": "CPU"}), "CPUExecutionProvider"],
                                       enable_fallback=0)
    else:
        session = ort.InferenceSession(request["model"], options, providers=["CPUExecutionProvider"])
except Exception as error:
    reply["error"] = " ".join(str(error).split())[:600]
    print(json.dumps(reply)); sys.exit()
reply["created"], reply["create_seconds"] = True, round(time.perf_counter() - started, 2)
if request["ep"] != "cpu":
    # ORT's Python re-runs a failed EP run on the CPU EP and returns the CPU's outputs (printing
    # "EP Error ... Falling back"): what is measured here must be the EP's, so a run failure stays one
    session.disable_fallback()
assignment, partitions = {}, 0
for subgraph in session.get_provider_graph_assignment_info():
    partitions += subgraph.ep_name == provider
    for node in subgraph.get_nodes():
        assignment[node.name] = subgraph.ep_name
reply.update(nodes_total=len(assignment), nodes_on_ep=sum(ep == provider for ep in assignment.values()),
             partitions=partitions)
names = {i.name for i in session.get_inputs()}
outputs, started = {}, time.perf_counter()
try:
    for index, path in enumerate(request["samples"]):
        feeds = {k: v for k, v in np.load(path).items() if k in names}
        for position, value in enumerate(session.run(None, feeds)):
            outputs[f"{index}/{position}"] = np.asarray(value)
except Exception as error:
    reply["run_error"] = " ".join(str(error).split())[:600]
reply["runs"], reply["run_seconds"] = len({k.split("/")[0] for k in outputs}), round(time.perf_counter() - started, 2)
np.savez(request["save"], **outputs)
print(json.dumps(reply))
"""


def session(model: Path, ep: str, samples: list[Path], save: Path, timeout: float, soc_model: str,
            disabled: list[str] | None = None) -> dict:
    """A user's session of ``model`` on ``ep`` in a child (OpenVINO under .venv-openvino), run on
    ``samples``: created, placement, outputs (read back with outputs_of). ``disabled``: ORT optimizers
    the application leaves out (QNN only: the session load named)."""
    python = OPENVINO if ep == "openvino-cpu" else Path(sys.executable)
    request = json.dumps({"model": str(model), "ep": ep, "samples": [str(p) for p in samples], "save": str(save),
                          "soc_model": soc_model, "disabled": disabled or []})
    log = save.with_suffix(".log")
    code, seconds, _ = launch([python, "-c", SESSION, request], log, save.with_suffix(".stderr"), timeout)
    reply: dict = {"seconds": round(seconds, 1)}
    if code == "timeout":
        return {**reply, "created": None, "error": f"timed out after {timeout:.0f} s"}
    try:
        reply.update(json.loads(log.read_text().strip().splitlines()[-1]))
    except (OSError, IndexError, json.JSONDecodeError):
        tail = (
            save.with_suffix(".stderr").read_text(errors="replace").strip()[-300:]
            if save.with_suffix(".stderr").exists()
            else ""
        )
        return {**reply, "created": None, "error": f"the session's process died (exit {code}): {tail}"}
    reply["expected_runs"] = len(samples)
    return reply


def outputs_of(save: Path) -> dict[int, list[np.ndarray]]:
    """sample index -> the outputs, from a session's saved arrays."""
    if not save.exists():
        return {}
    found: dict[int, dict[int, np.ndarray]] = {}
    with np.load(save) as data:
        for key in data.files:
            sample, position = map(int, key.split("/"))
            found.setdefault(sample, {})[position] = data[key]
    return {s: [outs[p] for p in sorted(outs)] for s, outs in found.items()}


# ---------------------------------------------------------------- one journey

def device_options() -> list[str]:
    """Nothing where ortprep has --device (its default is what a user gets); else the soc_model
    of a modern device as a provider option."""
    help_text = subprocess.run([*ORTPREP, "check", "--help"], capture_output=True, text=True, cwd=ROOT,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    return [] if "--device" in help_text else ["--provider-option", "qnn:soc_model=60"]


def write_samples(case: JourneyCase, folder: Path, count: int, seed: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(count):
        feeds = {k: np.ascontiguousarray(v) for k, v in case.inputs(rng, index).items()}
        for name, dims in case.static.items():
            if tuple(feeds[name].shape) != tuple(dims):
                raise ValueError(
                    f"{case.name}: sample input {name} has shape {feeds[name].shape}, the corpus fixes {dims}"
                )
        path = folder / f"{index:03d}.npz"
        np.savez(path, **feeds)
        paths.append(path)
    return paths


def run_case(case: JourneyCase, out: Path, models: Path, timeout: float, device: list[str]) -> dict:
    folder = out / case.name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    source = build(case, folder, models)
    write_samples(case, folder / "calib", CALIB, seed=1)
    independent = write_samples(case, folder / "independent", INDEPENDENT, seed=7)
    sample = independent[0]
    fixed, qdq, ctx = folder / "fixed.onnx", folder / "qdq.onnx", folder / "ctx.onnx"
    fp16 = folder / "fp16.onnx"
    for stale in (fixed, qdq, ctx, fp16):  # and their external data: a refusal this run must leave nothing
        stale.unlink(missing_ok=True)
        stale.with_name(stale.name + ".data").unlink(missing_ok=True)
    openvino = ["--runtime", f"openvino-cpu={OPENVINO}"]
    steps: dict[str, dict] = {}

    def step(name: str, *args) -> dict:
        steps[name] = ortprep(name, list(args), folder, timeout)
        print(
            f"  {case.name} {name}: exit {steps[name]['exit']} in {steps[name]['seconds']} s",
            file=sys.stderr,
            flush=True,
        )
        return steps[name]

    step("check_qnn", "check", source, "--ep", "qnn", "--prove", *device)
    step("check_ov", "check", source, "--ep", "openvino-cpu", "--prove", *openvino)
    metric_args = [a for name, kind in case.metrics.items() for a in ("--metric", f"{name}={kind}")]
    if case.static:
        shapes = [
            a for name, dims in case.static.items() for a in ("--fix-shape", f"{name}={','.join(map(str, dims))}")
        ]
        step("convert", "convert", source, *shapes, "--inputs", sample, "-o", fixed, "--force")
    else:
        fixed = source  # static as shipped: the float model the journey quantizes is the model itself
    if fixed.exists():
        step(
            "quantize",
            "quantize",
            fixed,
            "--static",
            "--ep",
            "qnn",
            "--auto",
            "--auto-exclude",
            "--calib",
            folder / "calib",
            "-o",
            qdq,
            "--force",
            *device,
            *metric_args,
        )
        if fixed != source:
            step("check_ov_fixed", "check", fixed, "--ep", "openvino-cpu", "--prove", *openvino)
    named = fp16_named(steps.get("quantize"))
    if not qdq.exists() and named:
        # quantize refused every precision it tried and named FP16, measured to pass its gate on this
        # EP, with the command that writes it: a user runs that command and goes on with its file
        step("fp16", *named, "-o", fp16, "--force")
    deployed = qdq if qdq.exists() else fp16 if fp16.exists() else None
    if deployed is not None:
        step("check_qdq_qnn", "check", deployed, "--ep", "qnn", "--prove", *device)
        step("load", "load", deployed, "--ep", "qnn", "--reference", fixed, "--inputs", sample, *device, *metric_args)
        named_session = session_named(steps.get("load"))
        if named_session:
            # load named the ORT optimizers without which QNN matches: a user leaves them out of the
            # application's session, and load judges that session
            step("load_session", "load", deployed, "--ep", "qnn", "--reference", fixed, "--inputs", sample, *device,
                 *metric_args, *[a for name in named_session for a in ("--disable-optimizer", name)])
        step("compile", "compile", deployed, "--ep", "qnn", "-o", ctx, "--inputs", sample, "--eval", folder / "calib",
             "--force", *device, *metric_args)

    # the sessions a user's application builds, and the outputs the decision is read from
    soc_model = str(((check_record(steps["check_qnn"]).get("device") or {}).get("soc_model")) or "60")
    bench_started = time.perf_counter()
    sessions: dict[str, dict] = {}
    saved = folder / "sessions"
    saved.mkdir(exist_ok=True)

    named_session = session_named(steps.get("load")) if steps.get("load_session", {}).get("exit") == 0 else None

    def own(label: str, model: Path, ep: str, samples: list[Path], disabled: list[str] | None = None) -> None:
        sessions[label] = session(model, ep, samples, saved / f"{label}.npz", timeout, soc_model, disabled)
        print(f"  {case.name} session {label}: {session_verdict(sessions[label])} in {sessions[label]['seconds']} s",
              file=sys.stderr, flush=True)

    own("cpu_source", source, "cpu", independent)
    own("qnn_source", source, "qnn", independent[:1])
    own("ov_source", source, "openvino-cpu", independent[:1])
    if fixed != source and fixed.exists():
        own("cpu_fixed", fixed, "cpu", independent)
        own("ov_fixed", fixed, "openvino-cpu", independent[:1])
    if deployed is not None:  # (labelled "qdq" whichever precision it is: "deployed" in the row says)
        own("cpu_qdq", deployed, "cpu", independent)  # to tell quantization's share of an error from the EP's
        own("qnn_qdq", deployed, "qnn", independent, named_session)  # the application's session
    if ctx.exists():
        own("qnn_ctx", ctx, "qnn", independent)
    bench_seconds = time.perf_counter() - bench_started

    reference = outputs_of(saved / ("cpu_fixed.npz" if fixed != source else "cpu_source.npz"))
    measures = {}
    if fixed != source and fixed.exists():
        source_outputs = outputs_of(saved / "cpu_source.npz")
        measures["convert"] = {
            "measure": compare(source_outputs, reference),
            "decision": decisions(case, source_outputs, reference),
        }
    for label in ("cpu_qdq", "qnn_qdq", "qnn_ctx"):
        if label in sessions:
            candidate = outputs_of(saved / f"{label}.npz")
            measures[label] = {
                "measure": compare(reference, candidate),
                "decision": decisions(case, reference, candidate),
            }
    if "cpu_qdq" in sessions and "qnn_qdq" in sessions:  # what the EP adds to the same QDQ model
        on_cpu, on_ep = outputs_of(saved / "cpu_qdq.npz"), outputs_of(saved / "qnn_qdq.npz")
        measures["qnn_vs_cpu_qdq"] = {"measure": compare(on_cpu, on_ep), "decision": decisions(case, on_cpu, on_ep)}

    targets = {
        "qnn_float": (
            check_record(steps["check_qnn"]),
            session_verdict(sessions.get("qnn_source")),
            sessions.get("qnn_source"),
        ),
        "ov_float": (
            check_record(steps["check_ov"]),
            session_verdict(sessions.get("ov_source")),
            sessions.get("ov_source"),
        ),
    }
    if "check_qdq_qnn" in steps:
        targets["qnn_qdq"] = (
            check_record(steps["check_qdq_qnn"]),
            session_verdict(sessions.get("qnn_qdq")),
            sessions.get("qnn_qdq"),
        )
    if "check_ov_fixed" in steps:
        targets["ov_fixed"] = (
            check_record(steps["check_ov_fixed"]),
            session_verdict(sessions.get("ov_fixed")),
            sessions.get("ov_fixed"),
        )
    verdicts = {}
    for label, (record, real, reply) in targets.items():
        record["session"] = real
        record["session_detail"] = (
            None
            if not reply
            else (
                reply.get("error")
                or reply.get("run_error")
                or f"{reply.get('nodes_on_ep')}/{reply.get('nodes_total')} nodes on the EP, {reply.get('partitions')} "
                   f"partition(s)"
            )
        )
        record["session_share"] = (
            (reply["nodes_on_ep"] / reply["nodes_total"]) if reply and reply.get("nodes_total") else None
        )
        record["session_partitions"] = reply.get("partitions") if reply and reply.get("created") else None
        verdicts[label] = record

    load = steps.get("load", {}).get("report") or {}
    load_result = (load.get("results") or [{}])[0]
    row = {
        "model": case.name, "half": case.half, "npu_material": case.npu_material, "not_material": case.not_material,
        "note": case.note, "decision_kind": case.decision, "source": shown(source),
        "deployed": None if deployed is None else "qdq" if deployed == qdq else "fp16",
        "session_setting": {"disabled_optimizers": named_session} if named_session else None,
        "static": {k: list(v) for k, v in case.static.items()},
        "steps": steps, "sessions": sessions, "verdicts": verdicts, "measures": measures,
        "load": {"status": load_result.get("status"), "three_way": load_result.get("three_way"),
                 "outputs": [{k: o.get(k) for k in ("name", "cosine", "norm_ratio", "within_tolerance")}
                             for o in load_result.get("outputs") or []],
                 "device": (load_result.get("device") or {}).get("provider_options")},
        "bench_seconds": round(bench_seconds, 1), "seconds": round(time.perf_counter() - started, 1),
    }
    row["outcome"] = outcome(case, row)
    row["wrong_passes"] = wrong_passes(row)
    row["wrong_pass_check"] = confirm_wrong_passes(case, folder, deployed, row)
    return row


def confirm_wrong_passes(case, folder: Path, deployed: Path | None, row: dict) -> dict | None:
    """A wrong pass that only a decision shows (cosine and norm within the rule) is flagged by 8
    unseen samples, which cannot carry a 99% bar: one flip in 8 is 87.5%, and a model that changes
    1 decision in 100 shows one in 8 samples 8% of the time. Such a flag is checked on
    CONFIRM_SAMPLES fresh inputs (decision_rates.py: seed 11, the deployed file on QNN's HTP
    simulator): the pass stays wrong when the 95% interval of the agreement measured there lies
    wholly below the application's bar, and is cleared otherwise; both figures are reported."""
    if not row["wrong_passes"] or deployed is None or case.decision is None:
        return None
    decided_only = all("decision differs" in text and "cosine" not in text and "norm ratio" not in text
                       and "NaN" not in text for text in row["wrong_passes"])
    if not decided_only:
        return {"checked": False, "why": "the output is wrong beyond its decisions (cosine, norm or NaN)"}
    from bench.suite.decision_rates import measure

    try:
        result = measure(case, folder, CONFIRM_SAMPLES, deployed, "qnn")
    except Exception as error:  # noqa: BLE001 - the check's failure is reported; the flag stands
        return {"checked": False, "why": f"{type(error).__name__}: {error}"[:300]}
    if result is None:
        return {"checked": False, "why": "no quantize report or deployed file"}
    return {"checked": True, "samples": result["samples"], "agree": result["agree"], "interval": result["interval"],
            "bar": result["bar"], "ep": "qnn", "confirmed": bool(result["below_bar"])}


def session_named(entry: dict | None) -> list[str] | None:
    """The ORT optimizers a failing load measured the EP to match without (LOD012 with
    ``ort_optimizations.optimizers``), where it named them; else None."""
    report = (entry or {}).get("report") or {}
    if entry is None or entry["exit"] != 1 or not any(f["code"] == "LOD012" for f in report.get("findings", [])):
        return None
    names = ((report.get("results") or [{}])[0].get("ort_optimizations") or {}).get("optimizers")
    return list(names) if names and len(names) <= 3 else None


def fp16_named(entry: dict | None) -> list[str] | None:
    """The arguments of the command a refusing quantize printed for FP16 (``auto.fp16``), where it
    measured that FP16 passes its gate; without its ``-o`` (this script names the file)."""
    report = (entry or {}).get("report") or {}
    probe = (report.get("auto") or {}).get("fp16") or {}
    if entry is None or entry["exit"] != 1 or not probe.get("passed") or not probe.get("command"):
        return None
    words = shlex.split(probe["command"])
    if words[:2] != ["ortprep", "convert"] or "-o" not in words:
        return None
    at = words.index("-o")
    return words[1:at] + words[at + 2:]


def outcome(case: JourneyCase, row: dict) -> dict:
    """complete: every step gave its answer (a check's exit 1 is its verdict), and every step that
    makes or passes the deployed model exited 0, or stopped at a refusal the corpus declared. A
    quantize that refused and named FP16 (measured to pass its gate) is followed by that command:
    the journey goes on with its file, and ``via`` says so."""
    steps = row["steps"]
    via = "fp16" if row.get("deployed") == "fp16" else None
    for name in STEPS:
        entry = steps.get(name)
        if entry is None:
            continue
        if name == "quantize" and via and entry["exit"] == 1:
            continue  # its refusal named the precision the journey went on with
        if name == "load" and entry["exit"] == 1 and steps.get("load_session", {}).get("exit") == 0:
            via = "+".join(filter(None, [via, "session setting"]))
            continue  # it named the session setting the application goes on with, and load passed that session
        if entry["exit"] == "timeout":
            return {"complete": False, "stopped_at": name, "why": "timed out"}
        if entry["traceback"] or entry["exit"] not in (0, 1):
            return {"complete": False, "stopped_at": name, "why": f"exit {entry['exit']}: {first_error(entry)}"}
        if name in ARTIFACT_STEPS and entry["exit"] == 1:
            codes = {f["code"] for f in (entry.get("report") or {}).get("findings", []) if f["severity"] == "error"}
            expected = case.expected_refusals.get(name)
            if expected and expected in codes:
                return {"complete": True, "stopped_at": name, "why": f"expected refusal: {first_error(entry)}"}
            return {"complete": False, "stopped_at": name, "why": first_error(entry)}
    if "compile" not in steps:
        return {"complete": False, "stopped_at": "quantize" if "quantize" not in steps else "-", "why": "no QDQ model"}
    return {"complete": True, "stopped_at": None, "why": "", "via": via}


def wrong_passes(row: dict) -> list[str]:
    """Steps that exited 0 and passed a model this benchmark measures as wrong (see ``wrong``)."""
    found = []
    steps, measures = row["steps"], row["measures"]
    if steps.get("convert", {}).get("exit") == 0 and "convert" in measures:
        reasons = wrong(measures["convert"]["measure"], measures["convert"]["decision"])
        if reasons:
            found.append(f"convert: fixed vs as shipped on the CPU, {'; '.join(reasons)}")
    if "qnn_qdq" in measures:
        reasons = wrong(measures["qnn_qdq"]["measure"], measures["qnn_qdq"]["decision"])
        fp16 = row.get("deployed") == "fp16"
        # in FP16, quantize's probe judged it on QNN (and refused the rest): its claim, and load's
        passed = (["quantize's FP16 probe"] if fp16 else []) + [s for s in ("quantize", "load", "load_session")
                                                               if steps.get(s, {}).get("exit") == 0]
        if reasons and passed:
            found.append(f"{' and '.join(passed)}: {'FP16' if fp16 else 'QDQ'} on QNN vs float on the CPU, "
                         f"{'; '.join(reasons)}")
    if "qnn_ctx" in measures and steps.get("compile", {}).get("exit") == 0:
        reasons = wrong(measures["qnn_ctx"]["measure"], measures["qnn_ctx"]["decision"])
        if reasons:
            found.append(f"compile: the EPContext model on QNN vs float on the CPU, {'; '.join(reasons)}")
    return found


def versions() -> dict[str, str]:
    found = {}
    for name in ("onnx", "onnxruntime", "onnxruntime-qnn", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    if OPENVINO.exists():
        child = subprocess.run(
            [str(OPENVINO), "-c", "import importlib.metadata as m; print(m.version('onnxruntime-openvino'))"],
            capture_output=True,
            text=True,
        )
        found["onnxruntime-openvino"] = child.stdout.strip() or "not installed"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT / "journey")
    parser.add_argument("--only", nargs="*", help="model names (the others' records of the last run are kept)")
    parser.add_argument("--half", choices=["dev", "eval", "all"], default="all")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per step and per session")
    parser.add_argument("--device", help="the QNN device every step targets (ortprep's --device: 888, 8gen3, ...); "
                        "default: ortprep's own")
    args = parser.parse_args()
    known = {case.name for case in CORPUS}
    unknown = set(args.only or []) - known
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    args.out.mkdir(parents=True, exist_ok=True)
    bench_corpus.fetch(args.out)
    device = ["--device", args.device] if args.device else device_options()
    meta = {"versions": versions(), "device": f"--device {args.device}" if args.device else
            "ortprep's default (--device not passed)" if not device else
            "--provider-option qnn:soc_model=60 (this ortprep has no --device)", "timeout_s": args.timeout,
            "tree_at_start": tree_state()}
    saved = args.out / "results.json"
    previous = {}
    if saved.exists() and (args.only or args.half != "all"):
        previous = {row["model"]: row for row in json.loads(saved.read_text()).get("rows", [])}
    chosen = [
        c for c in CORPUS if (not args.only or c.name in args.only) and (args.half == "all" or c.half == args.half)
    ]
    rows = {name: row for name, row in previous.items() if name in known}
    started = time.perf_counter()
    for case in chosen:
        print(f"{case.name} ({case.half})", file=sys.stderr, flush=True)
        rows[case.name] = run_case(case, args.out, args.out / "models", args.timeout, device)
        saved.write_text(json.dumps({"meta": meta, "rows": list(rows.values())}, indent=1, default=str))
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["tree_at_end"] = tree_state()
    saved.write_text(json.dumps({"meta": meta, "rows": list(rows.values())}, indent=1, default=str))
    text = report(list(rows.values()), meta)
    (args.out / "table.md").write_text(text)
    print(text)
    print(f"{len(chosen)} model(s) in {meta['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
