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
5. `load QDQ --ep qnn --reference FIXED --inputs SAMPLE.npz`;
6. `compile QDQ --ep qnn -o CTX --inputs SAMPLE.npz --eval CALIB` (every calibration sample judged too).

The QNN device: ortprep's default (`--device` is not passed; ortprep states the device it used in
each report, and this script's own QNN sessions use the same soc_model). Where `check --help`
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

ORTPREP = [sys.executable, "-m", "ortprep"]
OPENVINO = ROOT / ".venv-openvino" / "bin" / "python"
CALIB, INDEPENDENT = 24, 8
STEPS = ["check_qnn", "check_ov", "convert", "quantize", "fp16", "check_qdq_qnn", "check_ov_fixed", "load", "compile"]
STEP_TITLES = {
    "check_qnn": "check qnn",
    "check_ov": "check ov",
    "convert": "convert",
    "quantize": "quantize",
    "fp16": "FP16 (named by quantize)",
    "check_qdq_qnn": "check deployed qnn",
    "check_ov_fixed": "check ov fixed",
    "load": "load",
    "compile": "compile",
}
ARTIFACT_STEPS = ["convert", "quantize", "fp16", "load", "compile"]  # the steps that make or pass the deployed model

# A step runs under this launcher so that its peak RSS is its own (Linux carries a process's peak
# across fork and exec, so this benchmark must not be the parent it is measured from), and so that
# a timeout ends the step's whole process group (ortprep's workers included).
_LAUNCHER = r"""
import os, signal, subprocess, sys, threading
stdout, stderr, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(stdout, "wb") as out, open(stderr, "wb") as err:
    child = subprocess.Popen(sys.argv[4:], stdout=out, stderr=err, start_new_session=True)
    reaped = {}
    waiter = threading.Thread(target=lambda: reaped.update(result=os.wait4(child.pid, 0)), daemon=True)
    waiter.start()
    waiter.join(timeout)
    timed_out = waiter.is_alive()
    if timed_out:
        os.killpg(child.pid, signal.SIGKILL)
        waiter.join()
    _, status, usage = reaped["result"]
print("timeout" if timed_out else os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def launch(
    argv: list[str], stdout: Path, stderr: Path, timeout: float, cwd: Path = ROOT
) -> tuple[int | str, float, float]:
    """Run ``argv`` under the launcher: (exit code or "timeout", seconds, peak RSS in MB)."""
    started = time.perf_counter()
    launcher = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, str(stdout), str(stderr), str(timeout), *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    seconds = time.perf_counter() - started
    try:
        code, maxrss = launcher.stdout.split()
    except ValueError:
        return f"launcher failed: {launcher.stderr.strip()[-200:]}", seconds, 0.0
    return (code if code == "timeout" else int(code)), seconds, int(maxrss) / 1024


def ortprep(step: str, args: list, folder: Path, timeout: float) -> dict:
    """One ortprep command with --json: its exit, time, peak RSS, JSON report and stderr's tail."""
    stdout, stderr = folder / f"{step}.json", folder / f"{step}.stderr"
    code, seconds, rss = launch([*ORTPREP, *args, "--json"], stdout, stderr, timeout)
    entry = {"command": "ortprep " + " ".join(_shown(a) for a in args) + " --json", "exit": code,
             "seconds": round(seconds, 1), "peak_rss_mb": round(rss)}
    try:
        entry["report"] = json.loads(stdout.read_text())
    except (OSError, json.JSONDecodeError):
        entry["report"] = None
    text = stderr.read_text(errors="replace") if stderr.exists() else ""
    entry["traceback"] = "Traceback (most recent call last)" in text
    if entry["report"] is None or code not in (0, 1) or entry["traceback"]:
        entry["stderr_tail"] = text.strip()[-1500:]
    return entry


def _shown(arg) -> str:
    text = str(arg)
    return text.replace(str(ROOT) + "/", "") if text.startswith(str(ROOT)) else text


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
        session = ort.InferenceSession(request["model"], sess_options=options, enable_fallback=0)
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


def session(model: Path, ep: str, samples: list[Path], save: Path, timeout: float, soc_model: str) -> dict:
    """A user's session of ``model`` on ``ep`` in a child (OpenVINO under .venv-openvino), run on
    ``samples``: created, placement, outputs (read back with outputs_of)."""
    python = OPENVINO if ep == "openvino-cpu" else Path(sys.executable)
    request = json.dumps({"model": str(model), "ep": ep, "samples": [str(p) for p in samples], "save": str(save),
                          "soc_model": soc_model})
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


def run_case(case: JourneyCase, out: Path, models: Path, timeout: float, device: list[str]) -> dict:
    folder = out / case.name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    source = build(case, folder, models)
    calib = write_samples(case, folder / "calib", CALIB, seed=1)
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
        step("compile", "compile", deployed, "--ep", "qnn", "-o", ctx, "--inputs", sample, "--eval", folder / "calib",
             "--force", *device, *metric_args)

    # the sessions a user's application builds, and the outputs the decision is read from
    soc_model = str(((check_record(steps["check_qnn"]).get("device") or {}).get("soc_model")) or "60")
    bench_started = time.perf_counter()
    sessions: dict[str, dict] = {}
    saved = folder / "sessions"
    saved.mkdir(exist_ok=True)

    def own(label: str, model: Path, ep: str, samples: list[Path]) -> None:
        sessions[label] = session(model, ep, samples, saved / f"{label}.npz", timeout, soc_model)
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
        own("qnn_qdq", deployed, "qnn", independent)
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
        "note": case.note, "decision_kind": case.decision, "source": _shown(source),
        "deployed": None if deployed is None else "qdq" if deployed == qdq else "fp16",
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


CONFIRM_SAMPLES = 400  # fresh inputs that confirm or clear a wrong pass the 8 unseen samples flag


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


def confirmed_wrong(row: dict) -> bool:
    """A wrong pass that stands: flagged, and not cleared on the fresh inputs."""
    check = row.get("wrong_pass_check")
    return bool(row["wrong_passes"]) and not (check and check.get("checked") and not check.get("confirmed"))


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
        passed = (["quantize's FP16 probe"] if fp16 else []) + [s for s in ("quantize", "load")
                                                               if steps.get(s, {}).get("exit") == 0]
        if reasons and passed:
            found.append(f"{' and '.join(passed)}: {'FP16' if fp16 else 'QDQ'} on QNN vs float on the CPU, "
                         f"{'; '.join(reasons)}")
    if "qnn_ctx" in measures and steps.get("compile", {}).get("exit") == 0:
        reasons = wrong(measures["qnn_ctx"]["measure"], measures["qnn_ctx"]["decision"])
        if reasons:
            found.append(f"compile: the EPContext model on QNN vs float on the CPU, {'; '.join(reasons)}")
    return found


# ---------------------------------------------------------------- the report

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
        journey = (("complete" + (" (in FP16, named by quantize)" if result.get("via") == "fp16" else ""))
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
    quantized_material = [r for r in complete_material if r["outcome"].get("via") != "fp16"]
    flagged_material = [r for r in material if r["wrong_passes"]]
    wrong_material = [r for r in material if confirmed_wrong(r)]
    return {
        "models": len(rows), "npu_material": len(material),
        "complete_material": len(complete_material), "complete_quantized_material": len(quantized_material),
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


def tree_state() -> dict:
    """The ortprep code the steps ran: the commit, the uncommitted files under ortprep/, and a digest
    of their contents (others work in the same tree; a run is only one run of one code if the
    digest is the same at its start and its end)."""
    import hashlib

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout

    changed = sorted(line[3:] for line in git("status", "--porcelain", "--", "ortprep").splitlines())
    digest = hashlib.sha256(git("diff", "HEAD", "--", "ortprep").encode())
    for name in changed:
        path = ROOT / name
        if path.is_file():
            digest.update(path.read_bytes())
    return {
        "head": git("rev-parse", "--short", "HEAD").strip(),
        "uncommitted": changed,
        "digest": digest.hexdigest()[:12],
    }


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT / "journey")
    parser.add_argument("--only", nargs="*", help="model names (the others' records of the last run are kept)")
    parser.add_argument("--half", choices=["dev", "eval", "all"], default="all")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per step and per session")
    args = parser.parse_args()
    known = {case.name for case in CORPUS}
    unknown = set(args.only or []) - known
    if unknown:
        parser.error(f"unknown model(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    args.out.mkdir(parents=True, exist_ok=True)
    bench_corpus.fetch(args.out)
    device = device_options()
    meta = {"versions": versions(), "device": "ortprep's default (--device not passed)" if not device else
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
