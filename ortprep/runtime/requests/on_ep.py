"""RunOnEp: a model run on several samples in the session a user's application creates for one
EP (the EP with its options, a plugin EP through its devices, CPU fallback allowed, the default
optimization level): what quantize's accuracy gate judges on the target EP."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState, clean_error
from ortprep.runtime.requests.sessions import SessionSpec, assignment_of, build_session

KEPT = "on_ep.kept"  # state.extras: the model whose session a RunOnEp kept for the next part


@dataclass
class RunOnEpReply(Reply):
    samples: list[dict[str, Any]] = field(default_factory=list)  # outputs per sample (portable arrays)
    session_providers: list[str] = field(default_factory=list)
    nodes_total: int | None = None  # ORT's graph assignment (None: this ORT does not record it)
    nodes_on_ep: int | None = None
    session_seconds: float | None = None
    run_seconds: float | None = None
    latency_ms: list[float] = field(default_factory=list)  # latency_runs timed runs of the first sample


@dataclass
class RunOnEp(Request):
    """Run ``model`` on ``feeds`` (one dict per sample) on ``provider`` with ``provider_options``,
    the CPU EP taking what the EP leaves (the session an application creates). ``plugin``:
    {"library", "device_metadata"} for a plugin EP (registered through its devices)."""

    reply_type = RunOnEpReply

    model: str
    provider: str
    feeds: list[dict[str, Any]] = field(default_factory=list)
    provider_options: dict[str, str] = field(default_factory=dict)
    plugin: dict[str, Any] | None = None
    latency_runs: int = 0  # time this many runs of the first sample after the outputs (a warm session)
    # keep the session for the caller's next request on the same model (quantize's gate runs a slow
    # EP's samples a few at a time, to stop once the first decide: docs/decisions/speed-ep-verdict.md);
    # the next request on another model closes it
    keep_session: bool = False

    def affinity(self):
        # as Placement's: QNN keeps the first session's soc_model for the whole process
        if self.provider != "QNNExecutionProvider":
            return None
        return ("qnn", tuple(sorted(self.provider_options.items())))

    def handle(self, state: WorkerState) -> RunOnEpReply:
        from ortprep.runtime.values import portable

        reply = RunOnEpReply(stage="import")
        kept = state.extras.pop(KEPT, None)
        if kept is not None and kept != self.model:
            state.release(kept)
        try:
            state.ort  # noqa: B018 - the import is its own stage
            reply.stage = "session"
            started = time.perf_counter()
            plugin = self.plugin or {}
            spec = SessionSpec(self.model, provider=self.provider,
                               provider_options=tuple(sorted(self.provider_options.items())), with_cpu=True,
                               plugin_library=plugin.get("library"),
                               device_metadata=tuple(sorted((plugin.get("device_metadata") or {}).items())))
            entry = build_session(state, spec)
            reply.session_seconds = time.perf_counter() - started
            session = entry.session
            reply.session_providers = session.get_providers()
            with contextlib.suppress(Exception):  # an older ORT without the record: placement stays unknown
                assignment, _ = assignment_of(session)
                reply.nodes_total = len(assignment)
                reply.nodes_on_ep = sum(1 for ep in assignment.values() if ep == self.provider)
            reply.stage = "run"
            started = time.perf_counter()
            names = entry.graph_outputs
            for feeds in self.feeds:
                values = session.run(names, feeds)
                reply.samples.append({name: portable(value) for name, value in zip(names, values)})
            reply.run_seconds = time.perf_counter() - started
            for _ in range(self.latency_runs if self.feeds else 0):
                started = time.perf_counter()
                session.run(names, self.feeds[0])
                reply.latency_ms.append((time.perf_counter() - started) * 1000.0)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            reply.status, reply.message = "failed", clean_error(str(exc))[:1000] or type(exc).__name__
        finally:
            # Each model is run here once (a search trial, a compiled model's samples): its session
            # is not kept (docs/decisions/docs-worker-session-memory.md), but for the caller's next part.
            if self.keep_session and reply.ok:
                state.extras[KEPT] = self.model
            else:
                state.release(self.model)
        return reply
