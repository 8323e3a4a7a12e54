"""The worker protocol (issue 19) against the bare library calls a user would make, in one run:
load overhead per model (bare InferenceSession + 11 runs vs ortprep's load on the CPU EP, with a
cold and a warm worker), verified FP16 against the bare converter on the 4,000-node chain, and
the sessions a convert -> quantize -> load pipeline builds.
Run: .venv/bin/python -m bench.suite.bench_worker
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.common import OUT, ROOT, VENV_BIN, chain_model, measure, table

RUNS = 5
INTERLEAVED = 9  # rounds of bare / ortprep load / the worker's part, one after the other
DIRECT = (
    "import onnx, warnings; warnings.simplefilter('ignore');"
    "from onnxconverter_common import float16;"
    "m = onnx.load({src!r});"
    "onnx.save_model(float16.convert_float_to_float16(m, keep_io_types=True), {dst!r}, save_as_external_data=True)"
)


def _median_seconds(action, runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def load_rows() -> list[tuple]:
    """In this process (onnxruntime already imported), per model: the bare session + 11 runs, and
    ortprep.test_load on a fresh copy of the file each time (so no session comes from the cache)."""
    import numpy as np
    import onnxruntime as ort

    import ortprep
    from ortprep import Placement, workers_scope

    rows = []
    work = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    counter = iter(range(10**6))

    def fresh(path: Path) -> Path:
        copy = work / f"{next(counter)}-{path.name}"
        shutil.copy(path, copy)
        return copy

    chain = chain_model(OUT / "worker_load_chain", blocks=100, width=320, realistic=True)
    inline = work / "chain-400-nodes.onnx"  # one file, so that a copy of it is the whole model
    import onnx

    onnx.save(onnx.load(str(chain)), str(inline))
    shutil.rmtree(chain.parent)
    for name, source in (("cnn.onnx", ROOT / "sample_models" / "cnn.onnx"),
                         ("transformer_block.onnx", ROOT / "sample_models" / "transformer_block.onnx"),
                         ("chain, 400 nodes, 40 MB", inline)):

        def bare() -> None:
            session = ort.InferenceSession(str(fresh(source)), providers=["CPUExecutionProvider"])
            feeds = {
                i.name: np.random.default_rng(0)
                .standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
                .astype(np.float32)
                for i in session.get_inputs()
            }
            for _ in range(11):
                session.run(None, feeds)

        def ortprep_load() -> None:
            result = ortprep.test_load(fresh(source), eps=["cpu"])
            assert result.data["results"][0]["status"] == "ok", result.data

        feeds_of = {}

        def worker_part(pool) -> None:
            """What the worker does for load on the CPU EP (the session, a warm-up and 10 timed runs,
            the graph assignment, the outputs back): the isolated share of the step."""
            path = fresh(source)
            if source not in feeds_of:
                session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                feeds_of[source] = {i.name: np.random.default_rng(0).standard_normal(
                    [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32) for i in session.get_inputs()}
            reply = pool.call(Placement(model=str(path), provider="CPUExecutionProvider", feeds=feeds_of[source]))
            assert reply.ok, reply.message

        cold_s = _median_seconds(ortprep_load)  # outside any scope: a one-shot worker per call
        with workers_scope() as pool:
            for _ in range(3):
                bare()  # warm the page cache and ORT's first-session costs, on both sides
                ortprep_load()
            # interleaved, so that both sides see the same machine (2 shared cores here)
            bare_times, warm_times, worker_times = [], [], []
            for _ in range(INTERLEAVED):
                for action, times in ((bare, bare_times), (ortprep_load, warm_times),
                                      (lambda: worker_part(pool), worker_times)):
                    started = time.perf_counter()
                    action()
                    times.append(time.perf_counter() - started)
            bare_s, warm_s, worker_s = (statistics.median(t) for t in (bare_times, warm_times, worker_times))
        rows += [
            (name, "bare InferenceSession + 11 runs (in process)", f"{bare_s:.3f}", "1.00"),
            (
                name,
                "ortprep: the worker's part (session + 11 runs + placement, over the pipe)",
                f"{worker_s:.3f}",
                f"{worker_s / bare_s:.2f}",
            ),
            (
                name,
                "ortprep test_load --ep cpu, warm worker (the whole step)",
                f"{warm_s:.3f}",
                f"{warm_s / bare_s:.2f}",
            ),
            (
                name,
                "of which the step's own checks in ortprep's process (whole step minus worker's part)",
                f"{warm_s - worker_s:.3f}",
                "",
            ),
            (name, "ortprep test_load --ep cpu, one-shot worker", f"{cold_s:.3f}", f"{cold_s / bare_s:.2f}"),
            (
                name,
                "isolation cost: the worker's start (one-shot minus warm), once per pipeline",
                f"{cold_s - warm_s:.3f}",
                "",
            ),
        ]
    shutil.rmtree(work)
    return rows


def fp16_rows():
    folder = OUT / "worker_fp16"
    path = chain_model(folder, blocks=1000, width=320, realistic=True)
    ortprep = str(VENV_BIN / "ortprep")
    verified = measure(
        "ortprep convert --fp16 --ep cuda (verified)",
        [ortprep, "convert", str(path), "--fp16", "--ep", "cuda", "-o", str(folder / "a.onnx"), "--force", "--json"],
        runs=3,
    )
    bare = measure("onnxconverter-common convert_float_to_float16",
                   [sys.executable, "-c", DIRECT.format(src=str(path), dst=str(folder / "c.onnx"))], runs=3)
    shutil.rmtree(folder)
    return [("4,000 nodes, 400 MB", verified), ("4,000 nodes, 400 MB", bare)], verified, bare


def pipeline_rows() -> list[tuple]:
    from ortprep import Pipeline, read_raw, workers_scope

    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    shutil.copy(ROOT / "sample_models" / "cnn.onnx", work / "cnn.onnx")
    config = work / "ortprep.toml"
    config.write_text(textwrap.dedent("""
        model = "cnn.onnx"
        [[steps]]
        run = "convert"
        opset = 18
        [[steps]]
        run = "quantize"
        mode = "dynamic"
        eval = "random"
        [[steps]]
        run = "load"
        eps = ["cpu"]
    """))
    with workers_scope() as pool:
        Pipeline.from_dict(read_raw(config)[0], config).run()
        counts = pool.sessions_created()
        workers = pool.started
    original = counts.get(str(work / "cnn.onnx"), 0)
    shutil.rmtree(work)
    return [
        (
            "convert (opset 18) -> quantize (dynamic) -> load (cpu)",
            "sessions of the original model",
            str(original),
            "3",
        ),
        ("", "sessions, every model file", str(sum(counts.values())), ""),
        ("", "most sessions of one model file", str(max(counts.values())), ""),
        ("", "worker processes started", str(workers), "one child per ORT call"),
    ]


def main() -> None:
    print(f"Load overhead per model (CPU EP; medians of {INTERLEAVED} interleaved rounds, in one process, seconds):\n")
    print("| model | what | median (s) | vs bare |\n|---|---|---:|---:|")
    for row in load_rows():
        print("| " + " | ".join(row) + " |")
    rows, verified, bare = fp16_rows()
    print("\nVerified FP16 against the bare converter (fresh processes, medians of 3):\n")
    print(table(rows))
    print(
        f"\n| ratio | value |\n|---|---:|\n| verified FP16 / bare converter | {verified.seconds / bare.seconds:.2f}x "
        f"|\n"
    )
    print("Sessions built by one pipeline run (ortprep vs the naive count, one session per ORT call):\n")
    print("| pipeline | what | ortprep | naive |\n|---|---|---:|---:|")
    for row in pipeline_rows():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
