"""Conclusion (2026-11-25; bench/studies/gpu.md): ORT's CUDA EP ran in all four foreign-context
scenarios, so the handle that goes invalid under pycuda.autoinit is TensorRT's, not ORT's (DOC004).

The CUDA-context clash of the seeds (ORT's CUDA EP next to TensorRT under pycuda.autoinit,
"invalid resource handle"), reproduced without TensorRT: a foreign, non-primary CUDA context made
current on the thread, as pycuda.autoinit does, around an ORT CUDA session. Each scenario runs in
its own process (a clash may kill it); prints one JSON line per scenario.

    python -m bench.studies.gpu_context_clash [MODEL]     # default: sample_models/cnn.onnx

Needs onnxruntime-gpu and cuda-bindings (NVIDIA's CUDA Python driver API). Not part of make test's
CPU run; tests/test_gpu.py runs it where a GPU is present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCENARIOS = {
    "ort_alone": "an ORT CUDA session, no other context owner",
    "foreign_current_at_create_then_destroyed": "a foreign context current when the session is created, destroyed "
                                                "before the next run (pycuda.autoinit's context popped at exit)",
    "foreign_pushed_after_create": "the session made first; a foreign context pushed before its run",
    "foreign_pushed_and_popped_around_use": "the seeds' fix: push the foreign context, use it, pop it; then ORT runs",
}


def _check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {int(err)} ({err})")
    return rest[0] if len(rest) == 1 else rest


def _foreign_context():
    from cuda.bindings import driver

    _check(driver.cuInit(0))
    device = _check(driver.cuDeviceGet(0))
    try:
        return driver, _check(driver.cuCtxCreate(None, 0, device))  # cuda-bindings 13: (params, flags, dev)
    except TypeError:
        return driver, _check(driver.cuCtxCreate(0, device))  # 12.x: (flags, dev)


def run_scenario(name: str, model: str) -> dict:
    import numpy as np
    import onnxruntime as ort

    def session():
        return ort.InferenceSession(model, providers=["CUDAExecutionProvider"])

    def run(sess):
        feeds = {
            i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32) for i in sess.get_inputs()
        }
        return sess.run(None, feeds)[0]

    steps = []
    try:
        if name == "ort_alone":
            sess = session()
            run(sess)
            steps.append("run ok")
        elif name == "foreign_current_at_create_then_destroyed":
            driver, ctx = _foreign_context()
            sess = session()
            run(sess)
            steps.append("run with the foreign context current ok")
            _check(driver.cuCtxDestroy(ctx))
            steps.append("foreign context destroyed")
            run(sess)
            steps.append("run after it ok")
        elif name == "foreign_pushed_after_create":
            sess = session()
            reference = run(sess)
            steps.append("run ok")
            driver, ctx = _foreign_context()
            steps.append("foreign context current")
            out = run(sess)
            steps.append("run with it current ok" + ("" if np.allclose(out, reference) else ", but outputs differ"))
        elif name == "foreign_pushed_and_popped_around_use":
            driver, ctx = _foreign_context()
            _check(driver.cuCtxPopCurrent())
            steps.append("foreign context created and popped")
            sess = session()
            run(sess)
            steps.append("run ok")
            _check(driver.cuCtxPushCurrent(ctx))
            _check(driver.cuCtxPopCurrent())
            run(sess)
            steps.append("run after push/pop ok")
        return {"scenario": name, "status": "ok", "steps": steps, "providers": sess.get_providers()}
    except Exception as exc:  # noqa: BLE001 - the clash is what we measure
        return {"scenario": name, "status": "failed", "steps": steps, "error": f"{type(exc).__name__}: {exc}"[:400]}


def main(argv: list[str]) -> int:
    if len(argv) > 2 and argv[1] == "--one":
        print(json.dumps(run_scenario(argv[2], argv[3])))
        return 0
    model = argv[1] if len(argv) > 1 else str(Path(__file__).resolve().parents[2] / "sample_models" / "cnn.onnx")
    for name, what in SCENARIOS.items():
        done = subprocess.run(
            [sys.executable, __file__, "--one", name, model], capture_output=True, text=True, timeout=300
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"scenario": name, "status": f"died (exit {done.returncode})",
                                                   "stderr": done.stderr[-400:]}
        row["what"] = what
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
