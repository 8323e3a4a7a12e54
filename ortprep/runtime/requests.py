"""The requests ortprep sends its ORT workers, each with its handler and its reply.

    RunModel     feeds -> outputs (extra intermediates, latency runs, optimization level); with
                 ``optimized_model`` only the session is built, ORT writing its optimized graph
    Placement    what `load` asks of one EP: the EP-only session, ORT's graph assignment, runs,
                 NaN/Inf, latency, optionally the profiler's top ops
    Compile      ORT's compile API to an EPContext model, reloaded and run beside the source model
    Quantize     onnxruntime.quantization (pre-processing, dynamic, static with calibration)
    Probe        what an ORT environment can run: version, providers, plugin EPs and devices
    OpProbe      does an EP claim and run a single-op model
    Stats        sessions built per model file (tests and benchmarks count them)

The handlers run in the worker; they import numpy and onnxruntime there, onnx only where a
handler needs it (the OpenVINO environment has no onnx).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import CachedSession, Reply, Request, WorkerState, clean_error, model_key

LEVELS = {"disable": "ORT_DISABLE_ALL", "off": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def _hook(name: str) -> str:
    # Read in the parent when the request is made: a long-lived worker's environment is fixed at its start.
    return os.environ.get(name, "")


@dataclass(frozen=True)
class SessionSpec:
    """How to build a session for a model file. Sessions with equal specs on an unchanged file are
    shared (the worker's cache); every session records ORT's graph assignment, which costs nothing."""

    model: str
    provider: str = "CPUExecutionProvider"
    provider_options: tuple[tuple[str, str], ...] = ()
    with_cpu: bool = True  # add the CPU EP after ``provider``
    strict: bool = False  # session.disable_cpu_ep_fallback
    optimization: str = "default"
    plugin_library: str | None = None  # a plugin EP: added through its devices
    device_metadata: tuple[tuple[str, str], ...] = ()
    custom_op_library: str | None = None
    extra_outputs: tuple[str, ...] = ()  # intermediates to expose as outputs
    profile_prefix: str | None = None  # profiling on: never cached (ending it ends the session's use)
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.provider == "CPUExecutionProvider":  # the CPU EP alone either way: one key for one session
            object.__setattr__(self, "with_cpu", False)
            object.__setattr__(self, "strict", False)

    def key(self) -> tuple:
        return model_key(self.model) + (self.provider, self.provider_options, self.with_cpu, self.strict, self.optimization,
                                        self.plugin_library, self.device_metadata, self.custom_op_library, self.extra_outputs)


def session_options(state: WorkerState, spec: SessionSpec):
    ort = state.ort
    options = ort.SessionOptions()
    options.log_severity_level = 0 if spec.verbose else 3
    if spec.custom_op_library:
        options.register_custom_ops_library(spec.custom_op_library)
    if spec.strict and spec.provider != "CPUExecutionProvider":
        # (ORT refuses the flag when the CPU EP itself is the one asked for.)
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if spec.optimization in LEVELS:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[spec.optimization])
    with contextlib.suppress(Exception):  # an older ORT without the record: placement stays unknown
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if spec.profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = spec.profile_prefix
    if spec.plugin_library:
        add_plugin_ep(state, spec, options)
    return options


def add_plugin_ep(state: WorkerState, spec: SessionSpec, options) -> None:
    """Add a registered plugin EP through its devices: a providers= entry would silently give a
    CPU-only session."""
    state.register_plugin(spec.provider, spec.plugin_library)
    wanted = dict(spec.device_metadata)
    devices = [d for d in state.ort.get_ep_devices() if d.ep_name == spec.provider
               and all(d.ep_metadata.get(k) == v for k, v in wanted.items())]
    if not devices:
        raise RuntimeError(f"{spec.provider} offers no device matching {wanted or 'any'} here")
    options.add_provider_for_devices(devices, dict(spec.provider_options))


def _with_extra_outputs(spec: SessionSpec, options) -> tuple[str | bytes, list[str] | None]:
    """What to give InferenceSession: the file itself, or (with ``extra_outputs``) its graph with
    the intermediates as outputs, in memory, its external data read from the file's folder."""
    if not spec.extra_outputs:
        return spec.model, None
    import onnx

    proto = onnx.load(spec.model, load_external_data=False)
    graph_outputs = [v.name for v in proto.graph.output]
    present = set(graph_outputs)
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(spec.extra_outputs) if n not in present)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     os.path.dirname(os.path.abspath(spec.model)))
    return proto.SerializeToString(), graph_outputs


def build_session(state: WorkerState, spec: SessionSpec) -> CachedSession:
    """A session for ``spec``: from the cache when an equal one was built, else a new one (counted)."""
    key = None if spec.profile_prefix or spec.verbose else spec.key()
    if key is not None:
        # A session exposing more outputs serves a request for fewer (the reference run with every
        # intermediate also serves the plain runs of the same model).
        entry = state.cached(key[:-1], set(spec.extra_outputs))
        if entry is not None:
            return entry
    ort = state.ort
    options = session_options(state, spec)
    source, graph_outputs = _with_extra_outputs(spec, options)
    state.count_session(spec.model)
    if spec.plugin_library:
        session = ort.InferenceSession(source, sess_options=options)
    else:
        entry = (spec.provider, dict(spec.provider_options))
        providers = [entry] if spec.provider == "CPUExecutionProvider" or not spec.with_cpu else [entry, "CPUExecutionProvider"]
        session = ort.InferenceSession(source, options, providers=providers)
    names = [o.name for o in session.get_outputs()]
    cached = CachedSession(session, graph_outputs or names, frozenset(spec.extra_outputs))
    if key is not None:
        state.keep(key, cached)
    return cached


def assignment_of(session) -> tuple[dict[str, str], list[list]]:
    """Which EP took which node, and the EP subgraphs with their sizes (ORT's record)."""
    assignment, subgraphs = {}, []
    for subgraph in session.get_provider_graph_assignment_info():
        names = [node.name for node in subgraph.get_nodes()]
        subgraphs.append([subgraph.ep_name, len(names)])
        for name in names:
            assignment[name] = subgraph.ep_name
    return assignment, subgraphs


@contextlib.contextmanager
def captured_stderr():
    """fd 2 into a temporary file for the time of the block (native libraries' logs included);
    yields a list that holds the text afterwards."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    text: list[str] = []
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text.append(capture.read().decode("utf-8", errors="replace"))


def _crash_requested(hook: str, model_path: str | bytes) -> bool:
    """ORTPREP_TEST_CRASH_WORKER=1 crashes every run; =fp16 only runs of models holding float16;
    =fp16:OP only runs where an OP node computes on float16 (its first input is float16)."""
    if hook == "1":
        return True
    if not hook.startswith("fp16"):
        return False
    import onnx

    model = onnx.load_from_string(model_path) if isinstance(model_path, bytes) else onnx.load(model_path, load_external_data=False)
    if hook == "fp16":
        return any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    op_type = hook.partition(":")[2]
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return any(node.op_type == op_type and types.get(node.input[0]) == onnx.TensorProto.FLOAT16 for node in model.graph.node)


# --- RunModel ------------------------------------------------------------------------------------


@dataclass
class RunReply(Reply):
    providers: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # outputs per sample (portable arrays)
    latency_ms: list[float] = field(default_factory=list)
    session_seconds: float | None = None
    cached_session: bool = False


@dataclass
class RunModel(Request):
    """Run a model file on feeds (one dict per sample). ``outputs``: which to fetch (default: the
    graph's); ``extra_outputs``: intermediates to expose too; ``latency_runs``: timed runs of the
    first sample; ``optimized_model``: only build the session, ORT writing its optimized graph
    there (and its weights to ``optimized_data`` beside it)."""

    reply_type = RunReply

    model: str
    feeds: list[dict[str, Any]] = field(default_factory=list)
    providers: list[str] = field(default_factory=lambda: ["CPUExecutionProvider"])
    outputs: list[str] | None = None
    extra_outputs: list[str] = field(default_factory=list)
    optimization: str = "default"
    optimized_model: str | None = None
    optimized_data: str | None = None
    latency_runs: int = 0
    crash_hook: str = field(default_factory=lambda: _hook("ORTPREP_TEST_CRASH_WORKER"))
    model_bytes: bytes | None = None  # a model held in memory (``model`` then only names it); never cached

    def handle(self, state: WorkerState) -> RunReply:
        from ortprep.runtime.values import portable

        reply = RunReply(stage="import")
        try:
            state.ort  # noqa: B018 - the import is its own stage
            if _crash_requested(self.crash_hook, self.model_bytes or self.model):
                os.abort()  # test hook: lets tests prove a crash becomes a status, not the tool's death
            reply.stage = "session"
            started = time.perf_counter()
            if self.optimized_model:
                self._write_optimized(state, reply)
                return reply
            spec = SessionSpec(self.model, provider=self.providers[0], with_cpu=len(self.providers) > 1,
                               optimization=self.optimization, extra_outputs=tuple(self.extra_outputs))
            created_before = sum(state.sessions_created.values())
            entry = build_session(state, spec) if self.model_bytes is None else self._from_bytes(state, spec)
            reply.cached_session = sum(state.sessions_created.values()) == created_before
            reply.session_seconds = time.perf_counter() - started
            session = entry.session
            reply.providers = session.get_providers()
            names = self.outputs or (entry.graph_outputs + [n for n in self.extra_outputs if n not in entry.graph_outputs])
            reply.stage = "run"
            for index, feeds in enumerate(self.feeds):
                values = session.run(names, feeds)
                reply.samples.append({name: portable(value) for name, value in zip(names, values)})
                if index == 0 and self.latency_runs:
                    for _ in range(self.latency_runs):
                        began = time.perf_counter()
                        session.run(names, feeds)
                        reply.latency_ms.append((time.perf_counter() - began) * 1000.0)
            reply.output_names = names
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.status, reply.message = "failed", clean_error(str(exc))[:1000] or type(exc).__name__
        return reply

    def _from_bytes(self, state: WorkerState, spec: SessionSpec) -> CachedSession:
        state.count_session(self.model)
        session = state.ort.InferenceSession(self.model_bytes, session_options(state, spec), providers=self.providers)
        names = [o.name for o in session.get_outputs()]
        return CachedSession(session, names)

    def _write_optimized(self, state: WorkerState, reply: RunReply) -> None:
        # Offline optimization: ORT writes the optimized graph (and its weights) while creating the
        # session; such a session is used once, never cached.
        ort = state.ort
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if self.optimization in LEVELS:
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[self.optimization])
        options.optimized_model_filepath = self.optimized_model
        if self.optimized_data:
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name", self.optimized_data)
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        state.count_session(self.model)
        session = ort.InferenceSession(self.model, options, providers=self.providers)
        reply.providers = session.get_providers()


# --- Placement (load) ----------------------------------------------------------------------------


@dataclass
class PlacementReply(Reply):
    strict: dict[str, Any] = field(default_factory=dict)  # {"ok": True/False/None, "error"}
    placement: dict[str, dict] = field(default_factory=dict)  # level -> {"assignment", "subgraphs"} or {"error"}
    session_providers: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    output_names: list[str] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    non_tensor_outputs: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)
    profile: list[dict] | None = None
    verbose_log: str = ""  # the EP's verbose log while its placement was recorded (QNN's rejections)
    sessions_built: int = 0


@dataclass
class Placement(Request):
    """What `load` asks of one EP: (1) a session with the EP alone, CPU fallback disabled: does the
    whole model run there; (2) ORT's graph assignment at the default optimization level (recorded
    on that same session when it succeeds, else on one with CPU fallback) and optionally with
    optimizations off; (3) runs on the feeds: outputs, NaN/Inf, latency after a warm-up, and on
    request ORT's profiler."""

    reply_type = PlacementReply

    model: str
    provider: str
    feeds: dict[str, Any]
    provider_options: dict[str, str] = field(default_factory=dict)
    plugin: dict[str, Any] | None = None  # {"library", "device_metadata"}
    custom_op_library: str | None = None
    runs: int = 10
    profile: bool = False
    workdir: str | None = None  # where the profiler writes
    levels: list[str] = field(default_factory=lambda: ["default"])
    verbose_record: bool = False
    test_hook: str = field(default_factory=lambda: _hook("ORTPREP_TEST_LOAD_HOOK"))

    def spec(self, **changes) -> SessionSpec:
        plugin = self.plugin or {}
        base = SessionSpec(self.model, provider=self.provider, provider_options=tuple(sorted(self.provider_options.items())),
                           plugin_library=plugin.get("library"),
                           device_metadata=tuple(sorted((plugin.get("device_metadata") or {}).items())),
                           custom_op_library=self.custom_op_library)
        return SessionSpec(**{**base.__dict__, **changes})

    def _session(self, state: WorkerState, reply: PlacementReply, **changes):
        before = sum(state.sessions_created.values())
        verbose = changes.get("verbose", False)
        if not verbose:
            entry = build_session(state, self.spec(**changes))
        else:
            with captured_stderr() as log:
                entry = build_session(state, self.spec(**changes))
            reply.verbose_log = log[0]
        reply.sessions_built += sum(state.sessions_created.values()) - before
        return entry.session

    def handle(self, state: WorkerState) -> PlacementReply:
        import numpy as np

        from ortprep.runtime.values import is_tensor, portable

        reply = PlacementReply(stage="import")
        try:
            if self.test_hook == f"crash:{self.provider}":
                os.abort()  # test hook: a worker that dies
            if self.test_hook == f"hang:{self.provider}":
                time.sleep(3600)  # test hook: a worker that hangs
            state.ort  # noqa: B018
            reply.stage = "session"
            cpu = self.provider == "CPUExecutionProvider"
            profile_prefix = os.path.join(self.workdir or tempfile.gettempdir(), "profile") if self.profile else None
            if cpu:
                # The CPU EP alone: one session answers everything (and is the one RunModel shares).
                session = self._session(state, reply, profile_prefix=profile_prefix)
                reply.strict = {"ok": True}
                record = session
            else:
                session = None
                try:
                    session = self._session(state, reply, with_cpu=False, strict=True, profile_prefix=profile_prefix)
                    reply.strict = {"ok": True}
                except Exception as exc:  # noqa: BLE001 - the message is the result
                    message = clean_error(str(exc))
                    # ORT's Python adds the CPU EP after TensorRT itself, which the no-fallback flag refuses:
                    # the strict session cannot be asked for such an EP (ok: None, "not testable").
                    reply.strict = {"ok": None if "Conflicting session configuration" in message else False,
                                    "error": message}
                # The placement a user's session gets (CPU fallback allowed) is recorded on its own session:
                # an EP may place differently without fallback (QNN then also takes the graph's input Q and
                # output DQ, which it leaves to the CPU otherwise).
                try:
                    record = self._session(state, reply, with_cpu=True, verbose=self.verbose_record,
                                           profile_prefix=profile_prefix if session is None else None)
                except Exception as exc:  # noqa: BLE001
                    reply.placement["default"] = {"error": clean_error(str(exc))}
                    raise
                session = session or record
            assignment, subgraphs = assignment_of(record)
            reply.placement["default"] = {"assignment": assignment, "subgraphs": subgraphs}
            if "off" in self.levels:
                try:
                    off = self._session(state, reply, with_cpu=True, optimization="off")
                    assignment, subgraphs = assignment_of(off)
                    reply.placement["off"] = {"assignment": assignment, "subgraphs": subgraphs}
                except Exception as exc:  # noqa: BLE001
                    reply.placement["off"] = {"error": clean_error(str(exc))}
            reply.session_providers = session.get_providers()
            reply.stage = "run"
            names = [o.name for o in session.get_outputs()]
            raw_values = session.run(names, self.feeds)  # also the warm-up
            for _ in range(max(1, self.runs)):
                started = time.perf_counter()
                session.run(names, self.feeds)
                reply.latency_ms.append((time.perf_counter() - started) * 1000.0)
            values = [portable(v) for v in raw_values]
            reply.non_tensor_outputs = [n for n, v in zip(names, raw_values) if not is_tensor(v)]
            reply.nonfinite = [n for n, v in zip(names, values) if v.dtype.kind == "f" and not np.isfinite(v).all()]
            reply.outputs = dict(zip(names, values))
            reply.output_names = names
            if profile_prefix:
                reply.profile = _top_ops(session.end_profiling())
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.status, reply.message = "failed", clean_error(str(exc)) or type(exc).__name__
        return reply


def _top_ops(profile_path: str, limit: int = 10) -> list[dict]:
    with open(profile_path, encoding="utf-8") as handle:
        events = json.load(handle)
    per_op: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_op[event.get("args", {}).get("op_name", "?")] += event.get("dur", 0)
    total = sum(per_op.values()) or 1.0
    ranked = sorted(per_op.items(), key=lambda item: -item[1])[:limit]
    return [{"op_type": op, "microseconds": us, "share": round(us / total, 4)} for op, us in ranked]


# --- Compile ---------------------------------------------------------------------------------------


@dataclass
class CompileReply(Reply):
    session_providers: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    compiled: dict[str, Any] = field(default_factory=dict)  # the compiled model's outputs
    reference: dict[str, Any] = field(default_factory=dict)  # the source model's, on the CPU EP


@dataclass
class Compile(Request):
    """ORT's compile API writes an EPContext model to ``output``; it is reloaded on the same EP and
    run next to the source model on the CPU EP (that session comes from the cache when there is one)."""

    reply_type = CompileReply

    model: str
    output: str
    provider: str
    feeds: dict[str, Any]
    provider_options: dict[str, str] = field(default_factory=dict)
    plugin: dict[str, Any] | None = None

    def _options(self, state: WorkerState):
        options = state.ort.SessionOptions()
        options.log_severity_level = 3
        if self.plugin:
            spec = SessionSpec(self.model, self.provider, tuple(sorted(self.provider_options.items())),
                               plugin_library=self.plugin["library"],
                               device_metadata=tuple(sorted((self.plugin.get("device_metadata") or {}).items())))
            add_plugin_ep(state, spec, options)
        else:
            options.add_provider(self.provider, self.provider_options)
        return options

    def handle(self, state: WorkerState) -> CompileReply:
        from ortprep.runtime.values import portable

        reply = CompileReply(status="failed", stage="import")
        try:
            ort = state.ort
            reply.stage = "compile"
            compiler = ort.ModelCompiler(self._options(state), self.model, embed_compiled_data_into_model=True,
                                         flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
            compiler.compile_to_file(self.output)
            reply.stage = "reload"
            state.count_session(self.output)
            compiled = ort.InferenceSession(self.output, sess_options=self._options(state))
            reply.session_providers = compiled.get_providers()
            reply.stage = "run"
            names = [o.name for o in compiled.get_outputs()]
            values = compiled.run(names, self.feeds)
            reference = build_session(state, SessionSpec(self.model)).session.run(names, self.feeds)
            reply.compiled = {n: portable(v) for n, v in zip(names, values)}
            reply.reference = {n: portable(v) for n, v in zip(names, reference)}
            reply.output_names = names
            reply.status = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.message = " ".join(str(exc).split()) or type(exc).__name__
        return reply


# --- Quantize --------------------------------------------------------------------------------------

# Calibration collects intermediate outputs for at most this many samples at a time.
MAX_STRIDE = 8


def _stride(count: int) -> int:
    return max(d for d in range(1, min(MAX_STRIDE, count) + 1) if count % d == 0)


class StreamingReader:
    """A CalibrationDataReader over CalibrationSet samples, read one at a time; supports the
    ranges ORT's strided calibration asks for."""

    def __init__(self, calibration, indices: list[int], progress_path: str | None = None) -> None:
        self.calibration = calibration
        self.indices = indices
        self.window = (0, len(indices))
        self.position = 0
        self.progress_path = progress_path
        self.read = 0

    def __len__(self) -> int:
        return len(self.indices)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.window = (start_index, min(end_index, len(self.indices)))
        self.position = start_index

    def get_next(self):
        if self.position >= self.window[1]:
            return None
        sample = self.calibration.sample(self.indices[self.position])
        self.position += 1
        self.read += 1
        if self.progress_path:
            # The parent polls this file to draw its progress bar.
            with open(self.progress_path, "w", encoding="utf-8") as out:
                out.write(f"{self.read} {len(self.indices)}")
        return sample

    def rewind(self) -> None:
        self.position = self.window[0]


@dataclass
class QuantizeReply(Reply):
    error_type: str | None = None
    traceback: str | None = None
    stderr: str = ""  # what the quantizer logged (quant_pre_process reports some failures only there)


@dataclass
class Quantize(Request):
    """onnxruntime.quantization in the worker, with ``workdir`` as the working directory for the
    time of the request (nothing the quantizer writes lands in the user's). The fields are those
    of the quantize step's request: ``mode`` preprocess, dynamic or static; ``calibration`` a
    CalibrationSet's JSON; ``options`` the settings (op_types, per_channel, weight_type, ...)."""

    reply_type = QuantizeReply

    workdir: str
    model: str
    output: str
    mode: str
    options: dict[str, Any] = field(default_factory=dict)
    calibration: Any = None
    calibration_indices: list[int] | None = None
    progress: str | None = None

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Quantize:
        """From the dict the quantize step used to write as JSON for its child (its "status" is not needed)."""
        return cls(workdir=request["workdir"], model=request["model"], output=request["output"], mode=request["mode"],
                   options=request.get("options") or {}, calibration=request.get("calibration"),
                   calibration_indices=request.get("calibration_indices"), progress=request.get("progress"))

    def handle(self, state: WorkerState) -> QuantizeReply:
        import logging
        import traceback

        reply = QuantizeReply(status="failed", stage="quantize")
        logging.basicConfig(level=logging.ERROR)
        previous = os.getcwd()
        with captured_stderr() as log:
            try:
                os.chdir(self.workdir)
                self._quantize()
                reply.status = "ok"
            except Exception as exc:  # noqa: BLE001 - reported to the parent as data
                reply.message = " ".join(str(exc).split()) or type(exc).__name__
                reply.error_type = type(exc).__name__
                reply.traceback = traceback.format_exc()[-2000:]
            finally:
                os.chdir(previous)
        reply.stderr = log[0]
        return reply

    def _quantize(self) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

        from ortprep.runtime.calibration import CalibrationSet

        options = self.options
        types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16, "uint16": QuantType.QUInt16}
        if self.mode == "preprocess":
            from onnxruntime.quantization.preprocess import quant_pre_process

            quant_pre_process(self.model, self.output, skip_symbolic_shape=not options["symbolic"],
                              save_as_external_data=options["external_data"])
            return
        common = dict(
            op_types_to_quantize=options.get("op_types") or None,
            per_channel=options.get("per_channel", False),
            weight_type=types[options.get("weight_type", "int8")],
            nodes_to_exclude=options.get("exclude_nodes") or None,
            use_external_data_format=options.get("external_data", False),
            extra_options=options.get("extra_options") or {},
        )
        if self.mode == "dynamic":
            quantize_dynamic(self.model, self.output, **common)
            return
        calibration = CalibrationSet.from_json(self.calibration)
        reader = StreamingReader(calibration, self.calibration_indices, self.progress)
        extra = dict(common.pop("extra_options"))
        extra["CalibStridedMinMax"] = _stride(len(reader))
        methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                   "percentile": CalibrationMethod.Percentile}
        quantize_static(self.model, self.output, reader,
                        quant_format=QuantFormat.QDQ if options["format"] == "qdq" else QuantFormat.QOperator,
                        activation_type=types[options["activation_type"]], calibrate_method=methods[options["method"]],
                        extra_options=extra, **common)


# --- Probe, OpProbe, Stats -------------------------------------------------------------------------


@dataclass
class ProbeReply(Reply):
    version: str | None = None
    providers: list[str] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    kernels: list | None = None


@dataclass
class Probe(Request):
    """What this worker's ORT can run: version, built-in providers, each known plugin package found
    in its environment (registered, with its devices), and on request the CPU kernel registry."""

    reply_type = ProbeReply

    plugins: list[dict] = field(default_factory=list)  # eps.json's plugin table
    kernels: bool = False

    def handle(self, state: WorkerState) -> ProbeReply:
        reply = ProbeReply(status="failed")
        try:
            ort = state.ort
            reply.version = getattr(ort, "__version__", None)
            # Built in only: a plugin this worker registered before (a probe, a load) is listed there too.
            reply.providers = [p for p in ort.get_available_providers()
                               if p != "AzureExecutionProvider" and p not in state.registered]
            if hasattr(ort, "register_execution_provider_library"):
                reply.plugins = [_plugin(state, entry) for entry in self.plugins]
            if self.kernels:
                from onnxruntime.capi import onnxruntime_pybind11_state as pybind

                reply.kernels = [
                    [k.domain, k.op_name, list(k.version_range), {n: list(t) for n, t in k.type_constraints.items()}]
                    for k in pybind.get_all_opkernel_def() if k.provider == "CPUExecutionProvider"
                ]
            reply.status = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.message = f"{type(exc).__name__}: {exc}"
        return reply


def _plugin(state: WorkerState, entry: dict) -> dict:
    import importlib

    found: dict = {"distribution": entry["distribution"], "provider": entry["provider"], "module": entry["module"]}
    try:
        module = importlib.import_module(entry["module"])
    except Exception as exc:  # noqa: BLE001 - not installed here, or broken
        found["installed"] = False
        found["error"] = f"{type(exc).__name__}: {exc}"
        return found
    found["installed"] = True
    found["version"] = getattr(module, "__version__", None)
    try:
        library = getattr(module, entry["library_function"])()
        found["library"] = library
        functions = {name: getattr(module, name)() for name in dir(module)
                     if name.startswith("get_") and name.endswith("_path") and callable(getattr(module, name))}
        found["paths"] = {name: value for name, value in functions.items() if isinstance(value, str)}
        state.register_plugin(entry["provider"], library)
        found["registered"] = True
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        found["registered"] = False
        found["error"] = f"{type(exc).__name__}: {exc}"
        return found
    found["devices"] = [{
        "ep_vendor": device.ep_vendor,
        "type": str(device.device.type).rsplit(".", 1)[-1],
        "vendor": device.device.vendor,
        "ep_metadata": dict(device.ep_metadata),
        "device_metadata": dict(device.device.metadata),
    } for device in state.ort.get_ep_devices() if device.ep_name == entry["provider"]]
    return found


@dataclass
class OpProbeReply(Reply):
    claimed: bool = False
    ran: bool = False
    error: str | None = None


@dataclass
class OpProbe(Request):
    """Does ``provider`` claim the single ``op`` node of ``model`` (CPU fallback allowed, ORT's
    assignment recorded), and does the session run on ``feeds``."""

    reply_type = OpProbeReply

    model: str
    op: str
    feeds: dict[str, Any]
    provider: str
    provider_options: dict[str, str] = field(default_factory=dict)
    plugin: dict[str, Any] | None = None

    def handle(self, state: WorkerState) -> OpProbeReply:
        plugin = self.plugin or {}
        spec = SessionSpec(self.model, self.provider, tuple(sorted(self.provider_options.items())),
                           plugin_library=plugin.get("library"),
                           device_metadata=tuple(sorted((plugin.get("device_metadata") or {}).items())))
        try:
            session = build_session(state, spec).session
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            return OpProbeReply(error=" ".join(str(exc).split())[:400])
        # By op type, not name: an EP's layout pass (QNN prefers NHWC) replaces the node with a renamed one.
        placed = [(sub.ep_name, node.op_type) for sub in session.get_provider_graph_assignment_info() for node in sub.get_nodes()]
        claimed = any(ep == self.provider and op == self.op for ep, op in placed) and not any(
            ep != self.provider and op == self.op for ep, op in placed)
        reply = OpProbeReply(claimed=claimed)
        try:
            session.run(None, self.feeds)
            reply.ran = True
        except Exception as exc:  # noqa: BLE001
            reply.error = " ".join(str(exc).split())[:400]
        return reply


@dataclass
class StatsReply(Reply):
    pid: int = 0
    sessions_created: dict[str, int] = field(default_factory=dict)  # absolute model path -> sessions built
    sessions_cached: int = 0


@dataclass
class Stats(Request):
    """The worker's counters: sessions built per model file since it started."""

    reply_type = StatsReply

    def handle(self, state: WorkerState) -> StatsReply:
        return StatsReply(pid=os.getpid(), sessions_created=dict(state.sessions_created),
                          sessions_cached=len(state.sessions))


def quantize(request: dict[str, Any], *, timeout: float, poll=None) -> QuantizeReply:
    """Quantize from the dict the quantize step wrote as JSON for its former child:
    ``request`` holds (workdir, model, output, mode, calibration,
    calibration_indices, options, progress; "status" is ignored). The reply's ``ok``/``status``
    ("ok", "failed", "crashed", "timeout"), ``message``, ``error_type``, ``traceback`` and
    ``stderr`` replace the status file and ChildResult."""
    from ortprep.runtime.worker import call

    return call(Quantize.from_request(request), timeout=timeout, poll=poll)
