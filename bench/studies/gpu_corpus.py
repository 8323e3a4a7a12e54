"""Conclusion (sessions 22-23; bench/studies/gpu.md): check's CUDA verdict equals the real
session on 20 of 20 corpus files and 9 of 9 unseen ones; a wrong LOD006 refusal on CUDA was found
and fixed.

The journey corpus's models on a real CUDA EP: check's table verdict held against the real
session (`check --ep cuda --prove`), then `load --ep cuda --ep cpu` on one realistic sample (the
journey's first held-back sample where the model has one): placement, outputs against the CPU EP,
latency. Not part of make test: CI has no GPU. Figures in bench/studies/gpu.md.

Run on a machine with onnxruntime-gpu (bench/gpu_env.sh sets one up from carried wheels):
    python3 -m bench.studies.gpu_corpus MODELS_DIR [--out DIR] [--runs N]
MODELS_DIR holds NAME.onnx (a float model as the journey fixed its shapes), NAME.qdq.onnx (the
journey's deployed QDQ model, where it wrote one) and NAME.npz (a sample).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def ortprep(*args: str, timeout: float = 600) -> tuple[int, dict | None, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "ortprep", *args, "--json"], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, None, f"timed out after {timeout:g} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = None
    lines = done.stderr.strip().splitlines()
    return done.returncode, report, lines[-1] if lines else "", seconds


def check_row(report: dict | None) -> dict:
    result = ((report or {}).get("results") or [{}])[0]
    proof = result.get("proof") or {}
    total, on_ep = proof.get("nodes_total"), proof.get("nodes_on_ep")
    return {
        "predicted": result.get("predicted_verdict"),
        "proven": result.get("verdict"),
        "status": proof.get("status"),
        "share_predicted": result.get("node_share"),
        "share_real": round(on_ep / total, 3) if total else None,
        "partitions_predicted": result.get("partitions"),
        "partitions_real": (proof.get("comparison") or {}).get("actual_partitions"),
        "fallback_predicted": (result.get("fallback_nodes") or [])[:6],
        "message": proof.get("message"),
    }


def load_row(report: dict | None) -> dict:
    rows = {r["ep"]: r for r in (report or {}).get("results", [])}
    cuda, cpu = rows.get("cuda") or {}, rows.get("cpu") or {}
    return {
        "status": cuda.get("status"),
        "message": (cuda.get("message") or "")[:300],
        "nodes": f"{cuda.get('nodes_on_ep')}/{cuda.get('nodes_total')}",
        "outputs_match": cuda.get("outputs_match"),
        "max_abs_diff": cuda.get("max_abs_diff"),
        "cuda_ms": (cuda.get("latency_ms") or {}).get("median"),
        "cpu_ms": (cpu.get("latency_ms") or {}).get("median"),
        "tf32_off": cuda.get("tf32_off"),
        "codes": sorted({f["code"] for f in (report or {}).get("findings", [])}),
        "differ": [f["message"][:400] for f in (report or {}).get("findings", []) if f["code"] in ("LOD006", "LOD010")],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path)
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu"))
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in sorted(args.models.glob("*.onnx")):
        name = model.name[: -len(".onnx")]
        sample = args.models / f"{name.removesuffix('.qdq')}.npz"
        inputs = ["--inputs", str(sample)] if sample.exists() else []
        code, report, tail, seconds = ortprep("check", str(model), "--ep", "cuda", "--prove")
        row = {"model": name, "check_exit": code, "check_s": round(seconds, 1), **check_row(report)}
        if report is None:
            row["check_error"] = tail
        code, report, tail, seconds = ortprep(
            "load", str(model), "--ep", "cuda", "--ep", "cpu", "--runs", str(args.runs), *inputs
        )
        row["load"] = {"exit": code, "seconds": round(seconds, 1), "sample": bool(inputs), **load_row(report)}
        if report is None:
            row["load"]["error"] = tail
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "gpu_corpus.json").write_text(json.dumps(rows, indent=1))
    print(
        "| model | predicted / proven | nodes on CUDA (predicted / real) | partitions | load | outputs vs CPU EP | "
        "CUDA / CPU ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        load = r["load"]
        diff = "match" if load["outputs_match"] else ("differ" if load["outputs_match"] is False else "-")
        if load["max_abs_diff"] is not None:
            diff += f", max abs {load['max_abs_diff']:.1e}"
        if load.get("tf32_off"):
            off = load["tf32_off"]
            diff += (
                f"; use_tf32=0: {'match' if off.get('outputs_match') else 'differ'}, max abs {off['max_abs_diff']:.1e}"
                if off.get("ran")
                else f"; use_tf32=0 did not run: {off.get('error')}"
            )
        ms = "/".join(f"{v:.2f}" if v is not None else "-" for v in (load["cuda_ms"], load["cpu_ms"]))
        print(
            f"| {r['model']} | {r['predicted']} / {r['proven']} | {r['share_predicted']} / {r['share_real']} | "
            f"{r['partitions_predicted']} / {r['partitions_real']} | {load['status']} ({load['nodes']}) | {diff} | "
            f"{ms} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
