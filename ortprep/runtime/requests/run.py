"""RunModel (feeds -> outputs, extra intermediates, latency runs, optimized-model writing),
TimeModels (model files timed against each other in turns) and Stats (sessions built per model
file, for tests and benchmarks)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import (
    CachedSession,
    Reply,
    Request,
    WorkerState,
    clean_error,
)
from ortprep.runtime.requests.sessions import (
    LEVELS,
    SessionSpec,
    _crash_requested,
    _hook,
    build_session,
    no_silent_cpu_rerun,
    session_options,
)


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
    # a session built for this request is closed after it (a group of exposed tensors is read once;
    # each session kept its arena, grown to its run)
    once: bool = False

    def handle(self, state: WorkerState) -> RunReply:
        from ortprep.runtime.values import portable

        reply = RunReply(stage="import")
        entry = None
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
            entry = build_session(state, spec, exact=bool(self.latency_runs)) if self.model_bytes is None \
                else self._from_bytes(state, spec)
            reply.cached_session = sum(state.sessions_created.values()) == created_before
            reply.session_seconds = time.perf_counter() - started
            session = entry.session
            reply.providers = session.get_providers()
            names = self.outputs or (
                entry.graph_outputs + [n for n in self.extra_outputs if n not in entry.graph_outputs]
            )
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
        finally:
            if self.once and entry is not None and not reply.cached_session:  # its run failed or not
                for key in [k for k, kept in state.sessions.items() if kept is entry]:
                    del state.sessions[key]
        return reply

    def _from_bytes(self, state: WorkerState, spec: SessionSpec) -> CachedSession:
        state.count_session(self.model)
        on_ep = any(
            p != "CPUExecutionProvider" for p in (e if isinstance(e, str) else e[0] for e in self.providers or [])
        )
        session = state.ort.InferenceSession(self.model_bytes, session_options(state, spec), providers=self.providers,
                                             **({"enable_fallback": 0} if on_ep else {}))
        if on_ep:
            no_silent_cpu_rerun(session)
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
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", self.optimized_data
            )
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        state.count_session(self.model)
        session = ort.InferenceSession(self.model, options, providers=self.providers)
        reply.providers = session.get_providers()


@dataclass
class TimeReply(Reply):
    latency_ms: list[list[float]] = field(default_factory=list)  # per model, in the request's order


@dataclass
class TimeModels(Request):
    """Time model files against each other on one feed, on the CPU EP: a session each (timed
    sessions expose only the graph's outputs), ``warmup`` runs of each, then ``runs`` rounds of one
    run of every model, the order turned each round (A B, B A, ...). Timed in turns of one run, the
    models meet the same load (docs/decisions/docs-timing-in-turns.md)."""

    reply_type = TimeReply

    models: list[str]
    feed: dict[str, Any]
    runs: int = 20
    warmup: int = 2

    def handle(self, state: WorkerState) -> TimeReply:
        reply = TimeReply(stage="import")
        try:
            state.ort  # noqa: B018 - the import is its own stage
            reply.stage = "session"
            sessions = [build_session(state, SessionSpec(model, with_cpu=False), exact=True) for model in self.models]
            reply.stage = "run"
            for entry in sessions:
                for _ in range(self.warmup):
                    entry.session.run(entry.graph_outputs, self.feed)
            reply.latency_ms = [[] for _ in sessions]
            for number in range(self.runs):
                turn = number % len(sessions)
                for index in list(range(turn, len(sessions))) + list(range(turn)):
                    entry = sessions[index]
                    began = time.perf_counter()
                    entry.session.run(entry.graph_outputs, self.feed)
                    reply.latency_ms[index].append((time.perf_counter() - began) * 1000.0)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.status, reply.message = "failed", clean_error(str(exc))[:1000] or type(exc).__name__
        return reply


# --- Placement (load) ----------------------------------------------------------------------------



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
