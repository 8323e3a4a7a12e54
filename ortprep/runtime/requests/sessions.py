"""Sessions in the worker: what a session is made of (SessionSpec), building one (plugin EPs
registered through ORT's API, extra outputs exposed), ORT's graph assignment, and the test hooks
that crash a worker on purpose."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass

from ortprep.runtime.protocol import CachedSession, WorkerState, model_key

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
    # ORT graph optimizers (rewrite rules or transformers) this session leaves out, by ORT's names;
    # ORT ignores a name it does not know
    disabled_optimizers: tuple[str, ...] = ()
    plugin_library: str | None = None  # a plugin EP: added through its devices
    device_metadata: tuple[tuple[str, str], ...] = ()
    custom_op_library: str | None = None
    extra_outputs: tuple[str, ...] = ()  # intermediates to expose as outputs
    profile_prefix: str | None = None  # profiling on: never cached (ending it ends the session's use)
    verbose: bool = False
    # give every unnamed main-graph node the label ortprep's analysis knows it by (OP#INDEX): ORT
    # records its graph assignment by node name, and unnamed nodes would all be '' there
    label_unnamed: bool = False

    def __post_init__(self) -> None:
        if self.provider == "CPUExecutionProvider":  # the CPU EP alone either way: one key for one session
            object.__setattr__(self, "with_cpu", False)
            object.__setattr__(self, "strict", False)

    def key(self) -> tuple:
        return model_key(self.model) + (
            self.provider,
            self.provider_options,
            self.with_cpu,
            self.strict,
            self.optimization,
            self.disabled_optimizers,
            self.plugin_library,
            self.device_metadata,
            self.custom_op_library,
            self.label_unnamed,
            self.extra_outputs,
        )


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
    """What to give InferenceSession: the file itself, or (with ``extra_outputs`` or
    ``label_unnamed``) its graph changed in memory (the intermediates as outputs, the unnamed nodes
    labelled), its external data read from the file's folder."""
    if not spec.extra_outputs and not spec.label_unnamed:
        return spec.model, None
    try:
        import onnx
    except ImportError:  # an EP's own environment (--runtime EP=PYTHON) need not have onnx
        if spec.extra_outputs:
            raise
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         os.path.dirname(os.path.abspath(spec.model)))
        with open(spec.model, "rb") as handle:
            return label_unnamed_nodes(handle.read()), None

    proto = onnx.load(spec.model, load_external_data=False)
    if spec.label_unnamed:
        for index, node in enumerate(proto.graph.node):
            if not node.name:
                node.name = f"{node.op_type}#{index}"
    graph_outputs = [v.name for v in proto.graph.output]
    present = set(graph_outputs)
    proto.graph.output.extend(
        onnx.ValueInfoProto(name=n) for n in dict.fromkeys(spec.extra_outputs) if n not in present
    )
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     os.path.dirname(os.path.abspath(spec.model)))
    return proto.SerializeToString(), graph_outputs


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _fields(data: bytes):
    """(field number, wire type, the field's raw bytes, its payload for a length-delimited field)
    of one protobuf message, in order."""
    at = 0
    while at < len(data):
        start = at
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        payload = None
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = _varint(data, at)
            payload = data[at:at + size]
            at += size
        else:
            raise ValueError(f"protobuf wire type {wire} is not one ONNX writes")
        yield number, wire, data[start:at], payload


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def label_unnamed_nodes(model: bytes) -> bytes:
    """``model`` (a serialized ModelProto) with each unnamed node of its main graph named
    OP#INDEX, as check labels them, read and written at the protobuf wire level: an EP's own
    environment (onnxruntime-openvino's, say) has protobuf, which ONNX Runtime needs, and not
    necessarily onnx. ModelProto.graph is field 7, GraphProto.node field 1, NodeProto.name field 3
    and op_type field 4 (onnx.proto); a field appended to a message is read as if it were in place."""
    out = bytearray()
    for number, wire, raw, payload in _fields(model):
        if number != 7 or wire != 2:
            out += raw
            continue
        graph = bytearray()
        index = 0
        for g_number, g_wire, g_raw, g_payload in _fields(payload):
            if g_number != 1 or g_wire != 2:
                graph += g_raw
                continue
            named, op_type = False, ""
            for n_number, n_wire, _, n_payload in _fields(g_payload):
                if n_number == 3 and n_wire == 2 and n_payload:
                    named = True
                elif n_number == 4 and n_wire == 2:
                    op_type = n_payload.decode("utf-8", "replace")
            node = g_payload if named else g_payload + _length_delimited(3, f"{op_type}#{index}".encode())
            graph += _length_delimited(1, node)
            index += 1
        out += _length_delimited(7, bytes(graph))
    return bytes(out)


def build_session(state: WorkerState, spec: SessionSpec, exact: bool = False) -> CachedSession:
    """A session for ``spec``: from the cache when an equal one was built, else a new one (counted).
    ``exact``: only a session exposing exactly ``spec``'s outputs (a timed run: one exposing every
    intermediate ran a 1 ms classifier about 9x slower, its outputs' buffers never reused)."""
    key = None if spec.profile_prefix or spec.verbose else spec.key()
    if key is not None:
        # A session exposing more outputs serves a request for fewer (the reference run with every
        # intermediate also serves the plain runs of the same model), except where it is timed.
        entry = state.cached(key[:-1], set(spec.extra_outputs), exact=exact)
        if entry is not None:
            return entry
    ort = state.ort
    options = session_options(state, spec)
    source, graph_outputs = _with_extra_outputs(spec, options)
    state.count_session(spec.model)
    # on an EP, ORT's Python fallback is off from the start: a failed creation is not silently a CPU session
    fallback = {"enable_fallback": 0} if spec.provider != "CPUExecutionProvider" else {}
    if spec.disabled_optimizers:
        fallback["disabled_optimizers"] = list(spec.disabled_optimizers)
    if spec.plugin_library:
        session = ort.InferenceSession(source, sess_options=options, **fallback)
    else:
        entry = (spec.provider, dict(spec.provider_options))
        providers = (
            [entry] if spec.provider == "CPUExecutionProvider" or not spec.with_cpu else [entry, "CPUExecutionProvider"]
        )
        session = ort.InferenceSession(source, options, providers=providers, **fallback)
    if spec.provider != "CPUExecutionProvider":
        no_silent_cpu_rerun(session)
    names = [o.name for o in session.get_outputs()]
    cached = CachedSession(session, graph_outputs or names, frozenset(spec.extra_outputs))
    if key is not None:
        state.keep(key, cached)
    return cached


# What ORT's Python does when an EP fails while a session runs (onnxruntime_inference_collection.py,
# InferenceSession.run; session creation likewise, in __init__): it prints
# "EP Error ... Falling back to ['CPUExecutionProvider'] and retrying" to stdout, rebuilds the session
# on the CPU EP and returns the CPU EP's outputs, once and for good. A proof must see that failure:
# ortprep's sessions on an EP never fall back (docs/decisions/docs-no-ep-fallback.md).
EP_RUN_FALLBACK = ("ORT's Python API would print 'EP Error' and re-run this model on the CPU EP from then on, "
                   "so an application's results would silently be the CPU's")
EP_CREATE_FALLBACK = ("ORT's Python API would print 'EP Error' and create the session without this EP instead "
                      "(TensorRT: on CUDA and the CPU EP; any other: on the CPU EP), so an application would run, "
                      "silently, somewhere else")


def no_silent_cpu_rerun(session) -> None:
    """Turn off ORT's Python fallback for ``session`` (an EP failure at run time then raises)."""
    disable = getattr(session, "disable_fallback", None)
    if disable is not None:
        disable()


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

    model = (
        onnx.load_from_string(model_path)
        if isinstance(model_path, bytes)
        else onnx.load(model_path, load_external_data=False)
    )
    if hook == "fp16":
        return any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    op_type = hook.partition(":")[2]
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return any(
        node.op_type == op_type and types.get(node.input[0]) == onnx.TensorProto.FLOAT16 for node in model.graph.node
    )


# --- RunModel ------------------------------------------------------------------------------------
