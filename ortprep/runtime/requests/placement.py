"""Placement: what `ortprep load` asks of one EP: the EP-only session, ORT's graph assignment,
runs, NaN/Inf, latency, optionally the profiler's top ops."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState, clean_error
from ortprep.runtime.requests.sessions import (
    SessionSpec,
    _hook,
    assignment_of,
    build_session,
    captured_stderr,
)


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
    # the level and the ORT optimizers left out of the sessions that run (a load that asks why the EP
    # computes otherwise: prove/optimizers.py); the "off" placement stays off
    optimization: str = "default"
    disabled_optimizers: list[str] = field(default_factory=list)
    verbose_record: bool = False
    # (1) above: a session with CPU fallback disabled; off where only the user's session's outputs
    # are asked for (load's optimizer search: one session per judgement, not two)
    strict_session: bool = True
    label_unnamed: bool = False  # SessionSpec.label_unnamed: the model has unnamed nodes
    test_hook: str = field(default_factory=lambda: _hook("ORTPREP_TEST_LOAD_HOOK"))

    def affinity(self):
        if self.provider != "QNNExecutionProvider":
            return None
        return ("qnn", tuple(sorted(self.provider_options.items())))

    def spec(self, **changes) -> SessionSpec:
        plugin = self.plugin or {}
        base = SessionSpec(
            self.model,
            provider=self.provider,
            provider_options=tuple(sorted(self.provider_options.items())),
            plugin_library=plugin.get("library"),
            device_metadata=tuple(sorted((plugin.get("device_metadata") or {}).items())),
            custom_op_library=self.custom_op_library,
            label_unnamed=self.label_unnamed,
            optimization=self.optimization,
            disabled_optimizers=tuple(self.disabled_optimizers),
        )
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
                    if not self.strict_session:
                        reply.strict = {"ok": None, "error": "not asked"}
                    else:
                        session = self._session(state, reply, with_cpu=False, strict=True)
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
                                           profile_prefix=profile_prefix)
                except Exception as exc:  # noqa: BLE001
                    reply.placement["default"] = {"error": clean_error(str(exc))}
                    raise
                # The runs are the user's session's too: without CPU fallback QNN also runs the graph's
                # input Q and output DQ, and computes another value, so the strict session answers only
                # "does it all run there" (docs/decisions/docs-user-session-runs.md).
                session = record
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
            for _ in range(self.runs):  # (0: the EP's time here is not the device's; see load)
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
class Prove(Placement):
    """The session a user's application creates for one EP (CPU fallback allowed, the default
    optimization level, the EP's options): is it created, and where did ORT put each node? No run,
    so no inputs are needed (`check --prove`). A session that cannot be created is the answer:
    ``failed`` with the EP's own words."""

    feeds: dict[str, Any] = field(default_factory=dict)
    run_once: bool = False  # check --prove: also run once, on synthetic_feeds (a run can fail where creation did not)

    def handle(self, state: WorkerState) -> PlacementReply:
        reply = PlacementReply(stage="session")
        try:
            state.ort  # noqa: B018
            session = self._session(state, reply, with_cpu=True, verbose=self.verbose_record)
        except Exception as exc:  # noqa: BLE001 - the refusal is the result
            reply.status, reply.message = "failed", clean_error(str(exc))
            return reply
        assignment, subgraphs = assignment_of(session)
        reply.placement["default"] = {"assignment": assignment, "subgraphs": subgraphs}
        reply.session_providers = session.get_providers()
        if self.run_once:
            # A session the EP creates can still fail when it first runs (PP-OCRv4's recogniser as a
            # QDQ model on QNN: "QNN_GRAPH_ERROR_INVALID_TENSOR"); one run on made-up values of the
            # inputs' own shapes and types shows it (values do not make an EP's graph fail to run).
            feeds = synthetic_feeds(session)
            if feeds is None:
                reply.placement["run"] = "not run: an input has dynamic dimensions or a non-tensor type"
                return reply
            reply.stage = "run"
            try:
                session.run(None, feeds)
            except Exception as exc:  # noqa: BLE001 - the failure is the result
                if type(exc).__name__ != "EPFail":
                    # a CPU kernel refusing made-up values (a Range of step 0) says nothing of the EP
                    reply.stage = "session"
                    reply.placement["run"] = f"failed on made-up inputs, not in the EP: {clean_error(str(exc))[:300]}"
                    return reply
                reply.status, reply.message = "failed", clean_error(str(exc))
                reply.placement["run"] = "failed"
                return reply
            reply.placement["run"] = "ran"
        return reply


_NUMPY_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
                "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16", "tensor(int8)": "int8",
                "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(bool)": "bool"}


def synthetic_feeds(session) -> dict | None:
    """Inputs of the session's own shapes and types (floats: a seeded normal draw times 0.5; integers
    and booleans: zeros, a valid index and mask anywhere), or None where a dim is not fixed."""
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for value in session.get_inputs():
        dtype = _NUMPY_TYPES.get(value.type)
        shape = value.shape
        if dtype is None or any(not isinstance(d, int) or d < 0 for d in shape):
            return None
        if dtype.startswith("float"):
            feeds[value.name] = (rng.standard_normal(shape) * 0.5).astype(dtype)
        else:
            feeds[value.name] = np.zeros(shape, dtype)
    return feeds
