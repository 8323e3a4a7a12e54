"""Compile: ORT's compile API writes an EPContext model, which is reloaded on the same EP and
run beside the source model on the CPU EP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortprep.runtime.protocol import Reply, Request, WorkerState
from ortprep.runtime.requests.sessions import (
    SessionSpec,
    add_plugin_ep,
    build_session,
    no_silent_cpu_rerun,
)


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
    # "api": ORT's compile API (ModelCompiler); "session": a session created with ep.context_enable,
    # which writes the context as it loads (docs/decisions/docs-compile-context-route.md)
    route: str = "api"

    def affinity(self):
        if self.provider != "QNNExecutionProvider":
            return None
        return ("qnn", tuple(sorted((self.provider_options or {}).items())))

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
            if self.route == "session":
                writer = self._options(state)
                for key, value in (("ep.context_enable", "1"), ("ep.context_file_path", self.output),
                                   ("ep.context_embed_mode", "1")):
                    writer.add_session_config_entry(key, value)
                ort.InferenceSession(self.model, sess_options=writer)
            else:
                compiler = ort.ModelCompiler(self._options(state), self.model, embed_compiled_data_into_model=True,
                                             flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
                compiler.compile_to_file(self.output)
            reply.stage = "reload"
            state.count_session(self.output)
            compiled = ort.InferenceSession(self.output, sess_options=self._options(state), enable_fallback=0)
            no_silent_cpu_rerun(compiled)
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
