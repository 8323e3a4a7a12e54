"""The worker protocol (ortprep/runtime/worker.py): typed requests round trip with arrays, sessions
are cached and counted, a crash or a hang answers only its own request and the next one gets a
fresh worker, requests defined outside ortprep are served, N workers run at once, and another
interpreter (the OpenVINO environment) serves a RunModel."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest

import models
from conftest import ROOT
from ortprep.runtime.protocol import Reply, Request, WorkerState
from ortprep.runtime.requests import RunModel, Stats
from ortprep.runtime.worker import WorkerPool, call, current_pool, workers_scope

OPENVINO_PYTHON = ROOT / ".venv-openvino" / "bin" / "python"


@dataclass
class ScaleReply(Reply):
    scaled: np.ndarray | None = None
    pid: int = 0


@dataclass
class Scale(Request):
    """A request the worker has never heard of: served because it brings its own handle()."""

    reply_type = ScaleReply

    values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    factor: float = 2.0

    def handle(self, state: WorkerState) -> ScaleReply:
        state.extras["scaled"] = state.extras.get("scaled", 0) + 1
        return ScaleReply(scaled=self.values * self.factor, pid=os.getpid())


@dataclass
class Sleep(Request):
    seconds: float = 60.0

    def handle(self, state: WorkerState) -> Reply:
        time.sleep(self.seconds)
        return Reply()


@dataclass
class Abort(Request):
    def handle(self, state: WorkerState) -> Reply:
        os.abort()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


@pytest.fixture
def matmul_model(tmp_path) -> tuple[Path, np.ndarray]:
    proto = models.matmul_weights()
    path = tmp_path / "matmul.onnx"
    onnx.save(proto, str(path))
    return path, onnx.numpy_helper.to_array(proto.graph.initializer[0])


def test_run_model_round_trip_with_arrays(matmul_model):
    path, weight = matmul_model
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    reply = call(RunModel(model=str(path), feeds=[{"x": x}, {"x": 2 * x}], latency_runs=3))
    assert reply.ok and reply.stage == "run" and reply.output_names == ["y"]
    assert len(reply.samples) == 2 and len(reply.latency_ms) == 3
    np.testing.assert_allclose(reply.samples[0]["y"], x @ weight, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reply.samples[1]["y"], 2 * x @ weight, rtol=1e-5, atol=1e-5)
    assert current_pool() is None  # a one-shot worker: started, used, closed


def test_session_cache_reuses_and_counts(matmul_model, tmp_path):
    path, _ = matmul_model
    feeds = [{"x": np.ones((2, 32), np.float32)}]
    with workers_scope() as pool:
        first = call(RunModel(model=str(path), feeds=feeds))
        second = call(RunModel(model=str(path), feeds=feeds))
        intermediates = call(RunModel(model=str(path), feeds=feeds, extra_outputs=["y"]))
        assert first.ok and second.ok and intermediates.ok
        assert not first.cached_session and second.cached_session
        assert pool.sessions_created() == {str(path): 1}
        # a changed file is another model: a new session
        onnx.save(models.matmul_weights(seed=3), str(path))
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
        third = call(RunModel(model=str(path), feeds=feeds))
        assert not third.cached_session and pool.sessions_created() == {str(path): 2}
        assert not np.allclose(third.samples[0]["y"], first.samples[0]["y"])
        assert pool.started == 1  # one worker served all of it
    assert list(tmp_path.iterdir()) == [path]  # no temporary model left beside it


def test_a_file_written_again_leaves_no_session_of_its_old_version(matmul_model):
    """quantize's rankings write each group of exposed tensors to the same file in turn: the
    session of the file's old version can never be asked for again, and is closed."""
    path, _ = matmul_model
    feeds = [{"x": np.ones((2, 32), np.float32)}]
    with workers_scope():
        for seed in (3, 4, 5):
            onnx.save(models.matmul_weights(seed=seed), str(path))
            os.utime(path, ns=(time.time_ns(), time.time_ns() + seed * 10**9))
            assert call(RunModel(model=str(path), feeds=feeds)).ok
        assert call(Stats()).sessions_cached == 1


def test_crash_answers_crashed_and_next_request_gets_a_fresh_worker(matmul_model):
    path, _ = matmul_model
    with workers_scope() as pool:
        before = call(Stats()).pid
        crashed = call(RunModel(model=str(path), feeds=[{"x": np.ones((2, 32), np.float32)}], crash_hook="1"))
        assert crashed.status == "crashed" and crashed.died == "SIGABRT", crashed
        assert "died (SIGABRT)" in crashed.message
        assert not _alive(before)
        after = call(RunModel(model=str(path), feeds=[{"x": np.ones((2, 32), np.float32)}]))
        assert after.ok and call(Stats()).pid != before
        assert pool.started == 2


def test_crash_hook_is_read_in_the_parent(monkeypatch, matmul_model):
    path, _ = matmul_model
    with workers_scope():
        assert call(Stats()).ok  # the worker starts before the variable is set
        monkeypatch.setenv("ORTPREP_TEST_CRASH_WORKER", "1")
        assert call(RunModel(model=str(path), feeds=[{"x": np.ones((2, 32), np.float32)}])).status == "crashed"


def test_hang_past_its_timeout_answers_timeout_and_leaves_no_process():
    with workers_scope() as pool:
        pid = call(Stats()).pid
        started = time.monotonic()
        reply = call(Sleep(seconds=60), timeout=1)
        assert reply.status == "timeout" and reply.message == "no answer within 1 s"
        assert time.monotonic() - started < 10
        assert not _alive(pid)
        assert call(Stats()).pid != pid and pool.started == 2


def test_request_defined_outside_ortprep_is_served():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    with workers_scope():
        first = call(Scale(values=values, factor=3.0))
        second = call(Scale(values=values))
    assert isinstance(first, ScaleReply) and first.ok
    np.testing.assert_array_equal(first.scaled, values * 3.0)
    np.testing.assert_array_equal(second.scaled, values * 2.0)
    assert first.pid == second.pid != os.getpid()


def test_run_many_isolates_a_crash_to_its_own_request():
    values = np.ones(4, dtype=np.float32)
    requests = [Scale(values=values, factor=1.0), Abort(), Scale(values=values, factor=2.0),
                Scale(values=values, factor=3.0), Scale(values=values, factor=4.0)]
    done = []
    with WorkerPool() as pool:
        replies = pool.run_many(requests, jobs=2, on_done=lambda index, reply: done.append(index))
        assert sorted(done) == list(range(5))
        assert [r.status for r in replies] == ["ok", "crashed", "ok", "ok", "ok"]
        for reply, factor in zip([replies[0], *replies[2:]], (1.0, 2.0, 3.0, 4.0)):
            np.testing.assert_array_equal(reply.scaled, values * factor)
        assert 2 <= pool.started <= 3  # two at once, and at most one to replace the crashed one


def test_run_many_runs_concurrently():
    with WorkerPool() as pool:
        pool.run_many([Scale(), Scale()], jobs=2)  # start both workers
        started = time.monotonic()
        replies = pool.run_many([Sleep(seconds=1.0), Sleep(seconds=1.0)], jobs=2)
        elapsed = time.monotonic() - started
    assert all(r.ok for r in replies) and elapsed < 1.8


@pytest.mark.skipif(
    not OPENVINO_PYTHON.exists(), reason="no .venv-openvino (onnxruntime-openvino) next to the repository"
)
def test_openvino_interpreter_serves_run_model(matmul_model):
    path, weight = matmul_model
    x = np.ones((2, 32), np.float32)
    with workers_scope() as pool:
        reply = call(
            RunModel(
                model=str(path), feeds=[{"x": x}], providers=["OpenVINOExecutionProvider", "CPUExecutionProvider"]
            ),
            python=str(OPENVINO_PYTHON),
        )
        assert reply.ok, reply.message
        assert reply.providers[0] == "OpenVINOExecutionProvider"
        np.testing.assert_allclose(reply.samples[0]["y"], x @ weight, rtol=1e-3, atol=1e-3)
        assert pool.sessions_created(python=str(OPENVINO_PYTHON)) == {str(path): 1}


def test_pipeline_convert_quantize_load_builds_each_models_session_once(tmp_path):
    """A pipeline runs inside one workers_scope: the original model's CPU session is built once
    (convert's reference run), and no model file gets a second session."""
    import shutil
    import textwrap

    from conftest import SAMPLES
    from ortprep.config import read_raw
    from ortprep.pipeline import Pipeline

    shutil.copy(SAMPLES / "cnn.onnx", tmp_path / "cnn.onnx")
    config = tmp_path / "ortprep.toml"
    config.write_text(textwrap.dedent("""
        model = "cnn.onnx"

        [[steps]]
        run = "convert"
        opset = 18

        [[steps]]
        run = "quantize"
        mode = "dynamic"
        eval = "random"  # no data: seeded inputs, asked for (else QNT033)
        metrics = { logits = "cosine" }  # no data: a decision cannot be judged on seeded inputs (QNT019)

        [[steps]]
        run = "load"
        eps = ["cpu"]
    """))
    with workers_scope() as pool:
        report = Pipeline.from_dict(read_raw(config)[0], config).run()
        counts = pool.sessions_created()
    assert [s.status for s in report.steps] == ["passed", "passed", "passed"], report
    assert counts[str(tmp_path / "cnn.onnx")] == 1, counts
    assert max(counts.values()) == 1, counts


def test_load_inside_a_scope_uses_the_scopes_worker(tmp_path):
    """load runs its EPs from a helper thread (the graph analysis overlaps the worker's session):
    that thread must still use the pipeline's pool, not start a worker per call."""
    import shutil

    import ortprep

    with workers_scope() as pool:
        for index in range(3):
            copy = tmp_path / f"cnn{index}.onnx"
            shutil.copy(ROOT / "sample_models" / "cnn.onnx", copy)
            result = ortprep.test_load(copy, eps=["cpu"])
            assert result.data["results"][0]["status"] == "ok"
        assert pool.started == 1
        counts = pool.sessions_created()
    assert sorted(Path(p).name for p in counts) == ["cnn0.onnx", "cnn1.onnx", "cnn2.onnx"]
    assert set(counts.values()) == {1}


def test_an_eps_exception_is_cleaned_of_cpp_signatures_and_source_locations():
    """onnxruntime-openvino 1.24's refusal of Silero v5 (dynamic rank in an If branch) was 1.4 KB a
    subgraph: build paths, C++ signatures with template arguments, OpenVINO's chain of source
    locations, around one sentence. The finding keeps the sentence and the names."""
    from ortprep.runtime.protocol import clean_error

    raw = (
        "Exception during initialization: "
        "/onnxruntime/onnxruntime/core/providers/openvino/backends/basic_backend.cc:136 "
        "onnxruntime::openvino_ep::BasicBackend::BasicBackend(std::unique_ptr<onnx::ModelProto>&, "
        "onnxruntime::openvino_ep::SessionContext&, const onnxruntime::openvino_ep::SubGraphContext&) "
        "/onnxruntime/onnxruntime/core/providers/openvino/ov_interface.cc:28 auto "
        "onnxruntime::openvino_ep::OvExceptionBoundary(Func&&, std::format_string<Args ...>&&, Args&& ...) [with bool "
        "typed = false; Func = OVCore::CompileModel(std::shared_ptr<const ov::Model>&, std::string&)::<lambda()>; "
        "Args = {const std::__cxx11::basic_string<char>&}] [OpenVINO-EP] Exception while Loading Network for graph "
        "OpenVINO-EP-subgraph_1_0: Exception from src/inference/src/cpp/core.cpp:114: Exception from "
        "src/inference/src/dev/plugin.cpp:53: Check '!shape.rank().is_dynamic()' failed at "
        "src/plugins/intel_cpu/src/node.cpp:106: Unexpected: CPU plug-in doesn't support Parameter operation with "
        "dynamic rank. Operation name: If_0_else_branch__Inline_0__/decoder/If_output_0"
    )
    assert clean_error(raw) == (
        "Exception during initialization: "
        "[OpenVINO-EP] Exception while Loading Network for graph OpenVINO-EP-subgraph_1_0: "
        "Check '!shape.rank().is_dynamic()' failed: Unexpected: CPU plug-in doesn't support Parameter operation with "
        "dynamic rank. Operation name: If_0_else_branch__Inline_0__/decoder/If_output_0"
    )
    assert clean_error("[ONNXRuntimeError] : 1 : FAIL : QNN graph finalize failed: QNN_COMMON_ERROR_MEM_ALLOC") == \
        "QNN graph finalize failed: QNN_COMMON_ERROR_MEM_ALLOC"


def _two_nodes(tmp_path) -> Path:
    """x -> Relu -> a -> Neg -> y: 'a' is an intermediate a request can expose."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Neg", ["a"], ["y"], name="neg")],
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    path = tmp_path / "two.onnx"
    onnx.save(models.make(graph), str(path))
    return path


def test_a_session_asked_once_is_not_kept(tmp_path):
    """FP16's intermediates are read a group at a time (transforms/verify.py: Intermediates); each
    group's session is used once, and kept it would hold its arena (PP-PicoDet: the worker at 1.06
    GB with them, 0.54 GB without). A ``once`` request's session is closed after its run, whether
    the run succeeds or fails; the plain session stays."""
    path = _two_nodes(tmp_path)
    feeds = [{"x": np.ones((2, 4), np.float32)}]
    with workers_scope() as pool:
        assert call(RunModel(model=str(path), feeds=feeds)).ok
        exposed = call(RunModel(model=str(path), feeds=feeds, extra_outputs=["a"], once=True))
        assert exposed.ok and not exposed.cached_session and "a" in exposed.samples[0]
        assert call(Stats()).sessions_cached == 1 and pool.sessions_created() == {str(path): 2}
        failed = call(
            RunModel(model=str(path), feeds=[{"x": np.ones((2, 7), np.float32)}], extra_outputs=["a"], once=True)
        )
        assert not failed.ok and call(Stats()).sessions_cached == 1
        kept = call(RunModel(model=str(path), feeds=feeds, extra_outputs=["a"]))
        assert kept.ok and call(Stats()).sessions_cached == 2  # without once it stays


def test_a_timed_run_is_never_a_session_that_exposes_more(tmp_path):
    """A session exposing every intermediate serves plain runs of the same model, but not a timed
    one: its outputs' buffers are never reused, and a 1 ms classifier (PP-OCR's direction
    classifier) timed there ran 2-9x slower, which read as FP16 at 0.11x the float model's time."""
    path = _two_nodes(tmp_path)
    feeds = [{"x": np.ones((2, 4), np.float32)}]
    with workers_scope() as pool:
        assert call(RunModel(model=str(path), feeds=feeds, extra_outputs=["a"])).ok
        plain = call(RunModel(model=str(path), feeds=feeds))
        assert plain.ok and plain.cached_session  # the exposing session serves an untimed run
        timed = call(RunModel(model=str(path), feeds=feeds, latency_runs=2))
        assert timed.ok and not timed.cached_session and pool.sessions_created() == {str(path): 2}
        again = call(RunModel(model=str(path), feeds=feeds, latency_runs=2))
        assert again.cached_session and pool.sessions_created() == {str(path): 2}


def _chain(path: Path, links: int) -> Path:
    """``links`` 256x256 MatMuls in a row on a [64, 256] input."""
    rng = np.random.default_rng(links)
    weights = [onnx.numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), f"w{i}")
               for i in range(links)]
    nodes = [onnx.helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"],
                                   ["y" if i == links - 1 else f"h{i}"], name=f"mm{i}") for i in range(links)]
    graph = onnx.helper.make_graph(
        nodes,
        "chain",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64, 256])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 256])],
        weights,
    )
    onnx.save(models.make(graph), str(path))
    return path


def test_time_models_times_each_model_in_turns_and_tells_the_slower(tmp_path):
    """TimeModels (what quantize's latency figures and --accuracy-level auto read) times the models
    one run each in turn: as many times as rounds for each, and a model of 24 MatMuls measures
    slower than one of 1 on the same feed. A model that cannot run gives no times at all."""
    from ortprep.runtime.isolated import time_isolated

    short, long = _chain(tmp_path / "short.onnx", 1), _chain(tmp_path / "long.onnx", 24)
    feed = {"x": np.ones((64, 256), np.float32)}
    with workers_scope() as pool:
        # a session exposing an intermediate serves plain runs, never a timed one
        assert call(RunModel(model=str(long), feeds=[feed], extra_outputs=["h0"])).ok
        times = time_isolated([short, long], feed, runs=7)
        assert times is not None and [len(t) for t in times] == [7, 7]
        assert pool.sessions_created() == {str(short): 1, str(long): 2}
        assert np.median(times[1]) > 5 * np.median(times[0])
        assert time_isolated([short, tmp_path / "missing.onnx"], feed, runs=3) is None
