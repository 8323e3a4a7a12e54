"""The requests ortprep sends its ORT workers, each with its handler and its reply.

    RunModel     feeds -> outputs (extra intermediates, latency runs, optimization level); with
                 ``optimized_model`` only the session is built, ORT writing its optimized graph
    Placement    what `load` asks of one EP: the EP-only session, ORT's graph assignment, runs,
                 NaN/Inf, latency, optionally the profiler's top ops
    Compile      ORT's compile API to an EPContext model, reloaded and run beside the source model
    Quantize     onnxruntime.quantization (pre-processing, dynamic, static with calibration)
    Probe        what an ORT environment can run: version, providers, plugin EPs and devices
    OpProbe      does an EP claim and run a single-op model
    TimeModels   model files timed against each other on one feed, one run of each in turn
    Stats        sessions built per model file (tests and benchmarks count them)
    RunOnEp      samples -> outputs in the session an application creates for one EP (quantize's gate)

One module a request (sessions.py: what they share). The handlers run in the worker; they import numpy
and onnxruntime there, onnx only where a handler needs it (the OpenVINO environment has no onnx).
"""

from ortprep.runtime.requests.compile import Compile, CompileReply
from ortprep.runtime.requests.on_ep import RunOnEp, RunOnEpReply
from ortprep.runtime.requests.placement import Placement, PlacementReply, Prove
from ortprep.runtime.requests.probe import OpProbe, OpProbeReply, Probe, ProbeReply
from ortprep.runtime.requests.quantize import Quantize, QuantizeReply, StreamingReader
from ortprep.runtime.requests.run import RunModel, RunReply, Stats, StatsReply, TimeModels, TimeReply
from ortprep.runtime.requests.sessions import (
           LEVELS,
           SessionSpec,
           add_plugin_ep,
           build_session,
           session_options,
)

__all__ = [
    "Compile",
    "CompileReply",
    "LEVELS",
    "OpProbe",
    "OpProbeReply",
    "Placement",
    "PlacementReply",
    "Probe",
    "ProbeReply",
    "Prove",
    "Quantize",
    "QuantizeReply",
    "RunModel",
    "RunOnEp",
    "RunOnEpReply",
    "RunReply",
    "SessionSpec",
    "Stats",
    "StatsReply",
    "StreamingReader",
    "TimeModels",
    "TimeReply",
    "add_plugin_ep",
    "build_session",
    "session_options",
]
