"""compile: an EPContext model for an NPU-style EP (QNN, OpenVINO) through ORT's compile API, the
form NPU deployments load without compiling at start-up. The result is reloaded on the same EP and
its outputs compared with the source model's on the CPU EP before it is written."""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortprep.eps.registry import resolve_ep
from ortprep.fidelity.decisions import dfl_hint
from ortprep.fidelity.ep_match import judge_ep_outputs, judge_ep_samples, summarize_samples
from ortprep.fidelity.words import fmt_cosine
from ortprep.findings import Finding
from ortprep.graphops import body_weights, feed_body_weights, localize_body_initializers, small_body_reads
from ortprep.model import ModelHandle, failed_path
from ortprep.options import CompileOptions
from ortprep.prove.share import share_fix, share_shortfall
from ortprep.report import StepResult
from ortprep.runtime.budget import limited_words, run_within
from ortprep.runtime.feeds import choose_feeds, input_specs
from ortprep.runtime.requests import Compile
from ortprep.runtime.targets import ep_runtime, session_options, target_device
from ortprep.runtime.tolerance import computes_tf32
from ortprep.runtime.worker import call
from ortprep.steps.base import Step, StepContext, output_path

SCHEMA = "ortprep.compile/1"


def ep_context_facts(path: Path) -> dict[str, Any]:
    """What a compiled model says about itself: EPContext nodes, SDK versions, compatibility strings."""
    model = onnx.load(str(path), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "EPContext"]
    facts = {
        "ep_context_nodes": len(nodes),
        "other_nodes": len(model.graph.node) - len(nodes),
        "compatibility": {p.key.removeprefix("ep_compatibility_info."): p.value for p in model.metadata_props
                          if p.key.startswith("ep_compatibility_info.")},
        "partitions": [],
    }
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name != "ep_cache_context"}
        facts["partitions"].append(
            {
                key: (value.decode() if isinstance(value, bytes) else value)
                for key, value in attrs.items()
                if key in ("source", "ep_sdk_version", "partition_name", "embed_mode", "main_context")
            }
        )
    return facts


def _bodies_with_own_weights(handle: ModelHandle, staging: Path) -> tuple[Path, list[str], list[str]]:
    """The model to compile: ``handle``'s file, or where If/Loop/Scan bodies read main-graph
    initializers, a copy in ``staging`` with the small ones copied into the bodies
    (graphops.localize_body_initializers) and the larger ones read through a main-graph Identity
    (graphops.feed_body_weights); and the initializers copied, and those fed."""
    graph = handle.proto.graph
    if not small_body_reads(graph) and not body_weights(graph):  # from the graph alone: the weights stay put
        return Path(handle.path), [], []
    handle.load_weights()
    proto = onnx.ModelProto()
    proto.CopyFrom(handle.proto)
    localized = localize_body_initializers(proto.graph)
    fed = feed_body_weights(proto.graph)
    written = ModelHandle(proto=proto, path=None).save(staging / "source.onnx", external_data=True if
                                                         handle.has_external_data() else None)
    return written, localized, fed


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def compile_model(handle: ModelHandle, dest: Path, options: CompileOptions, *, force: bool = False) -> StepResult:
    """Compile ``handle``'s model for ``options.ep``; write ``dest`` when the reloaded result
    matches the source model on the CPU EP."""
    report = StepResult(step="compile", schema=SCHEMA)
    spec = resolve_ep(options.ep)
    target = ep_runtime(spec, options.runtimes)
    data: dict[str, Any] = {"input": str(handle.path), "output": None, "kept_failed": None, "ep": spec.name,
                            "runtime": target.python or "this environment",
                            "package": target.plugin["package"] if target.plugin else None}
    device = target_device(target, options.provider_options, options.device)
    if device is not None:
        data["device"] = device.record()
    if not target.available:
        message = f"{spec.name}: not available here; {spec.install_hint}"
        report.add(Finding.of("LOD002", message, ep=spec.name, fix=spec.install_hint))
        report.missing.append(message)
        report.data = data
        return report
    specs = input_specs(handle.proto)
    from ortprep.runtime.isolated import run_isolated

    choice = choose_feeds(specs, proto=handle.proto, inputs=options.inputs, shapes=options.shapes,
                          runs=lambda feeds: run_isolated(handle.path, feeds, timeout=options.timeout))
    feeds = choice.feeds
    data["inputs"] = choice.record()
    with tempfile.TemporaryDirectory(prefix=".ortprep-tmp-compile-", dir=dest.parent) as staging:
        compiled = Path(staging) / dest.name
        source, localized, fed = _bodies_with_own_weights(handle, Path(staging))
        for code, key, names, how in (
            ("CMP005", "localized_initializers", localized, "were copied into those bodies"),
            ("CMP006", "fed_initializers", fed, "(larger ones) were read through an Identity node in the main graph"),
        ):
            if not names:
                continue
            data[key] = names
            report.add(Finding.of(
                code, f"{len(names)} initializer(s) that If/Loop/Scan bodies read from the main graph {how} before "
                f"compiling ({', '.join(names[:4])}" + (", ..." if len(names) > 4 else "")
                + "): ORT's EP-context writer "
                "keeps only what main-graph nodes read (and writes a larger one copied into a body as an in-memory "
                "marker), and the compiled model would not load without them", ep=spec.name, fix="nothing to do"))
        def compile_by(route: str, written: Path):
            request = Compile(
                model=os.path.abspath(source),
                output=str(written.resolve()),
                provider=spec.provider,
                feeds=feeds,
                provider_options=session_options(target, options.provider_options, options.device),
                plugin=target.plugin,
                route=route,
            )
            reply = call(request, python=target.python, timeout=options.timeout)
            status = {"ok": reply.ok, "stage": reply.stage if reply.status in ("ok", "failed") else "compile",
                      "error": reply.message if reply.status == "failed" else
                      f"the process died ({reply.died})" if not reply.ok else None}
            comparison = None
            if status.get("ok"):
                # load's rule (fidelity/ep_match.py): the EP's precision, a quantized model's own steps, the norm
                comparison = judge_ep_outputs(handle.proto, spec.name,
                                              {name: reply.reference[name] for name in reply.output_names},
                                              {name: reply.compiled[name] for name in reply.output_names},
                                              options.metrics, computes_tf32(spec.name, None))
            return reply, status, comparison

        reply, status, comparison = compile_by("api", compiled)
        data["route"] = "api"
        if status.get("ok") and not all(c["within_tolerance"] for c in comparison or []):
            # ORT's compile API wrote a context that computes otherwise (QNN: a QDQ Conv with 16-bit
            # weights and a float bias); a session with ep.context_enable writes it as it loads
            first = next(c for c in comparison if not c["within_tolerance"])
            other = compiled.with_name(f"{compiled.stem}.session{compiled.suffix}")
            again = compile_by("session", other)
            if again[1].get("ok") and again[2] and all(c["within_tolerance"] for c in again[2]):
                os.replace(other, compiled)
                reply, status, comparison = again
                data["route"] = "session"
                report.add(Finding.of(
                    "CMP008", f"{spec.name}: the context ORT's compile API wrote computes otherwise "
                    f"('{first['name']}': cosine {fmt_cosine(first['cosine'])}, norm ratio "
                    f"{fmt_ratio(first['norm_ratio'])} against the source model on the CPU EP); the one a session "
                    "writes as it loads (ep.context_enable) matches, and is the one judged and written", ep=spec.name,
                    fix="nothing to do; a session your application creates with ep.context_enable writes the same"))
            else:
                other.unlink(missing_ok=True)  # the API's result stands
        if compiled.exists():
            data.update(ep_context_facts(compiled))
        data["stage"] = status.get("stage")
        data["error"] = status.get("error")
        data["outputs"] = comparison
        passed = bool(comparison) and all(c["within_tolerance"] for c in comparison)
        if passed and options.eval is not None:
            data["eval"] = eval_samples(handle, compiled, spec, target, options)
            worst = data["eval"].get("worst")
            if data["eval"].get("error") or (worst and not worst["passed"]):
                passed = False
                comparison = worst["outputs"] if worst else comparison
        if not status.get("ok"):
            what = {"compile": "compiling failed", "reload": "the compiled model does not load",
                    "run": "the compiled model does not run"}.get(status.get("stage"), "compile failed")
            from ortprep.transforms.off_ep import OFF_EP_PREFIX

            wrapped = [n.name for n in handle.graph.node if n.op_type == "If" and n.name.startswith(OFF_EP_PREFIX)]
            fix = (f"{len(wrapped)} node(s) are kept off {spec.name} inside If nodes (quantize's or convert's "
                   f"--keep-off-ep: {', '.join(wrapped[:3])}), where ORT's compile API can fail (INVALID_GRAPH, "
                   "measured on a MiniLM's QNN model); ship the model as it is, which the EP compiles when the "
                   f"session is created (ortprep load {shlex.quote(str(handle.path))} --ep {spec.name} shows what it "
                   "takes)"
                   if status.get("stage") == "compile" and wrapped else
                   f"ortprep load {shlex.quote(str(handle.path))} --ep {spec.name} shows what the EP takes; a model "
                   "the EP takes no "
                   "node of cannot be compiled" if status.get("stage") == "compile" else
                   "the EP wrote a context it cannot read back (seen with onnxruntime-openvino 1.24.1 on CPU): ship "
                   "the "
                   "source model, which the EP compiles at load, or compile with another release of the EP")
            report.add(Finding.of("CMP001", f"{spec.name}: {what}: {status.get('error')}", ep=spec.name, fix=fix))
        elif data.get("eval", {}).get("error"):
            report.add(Finding.of("CMP001", f"{spec.name}: --eval: {data['eval']['error']}", ep=spec.name,
                                  fix="check the samples against the model's inputs (ortprep inspect MODEL)"))
        elif not passed:
            worst = next(c for c in comparison or [] if not c["within_tolerance"]) if comparison else None
            detail = (f" ('{worst['name']}': max abs diff {worst['max_abs_diff']:.4g}, norm ratio "
                      f"{worst['norm_ratio']:.4f}; "
                      f"allowed {worst['tolerance']:.4g}: {worst['tolerance_rule']})"
                      if worst and worst["max_abs_diff"] is not None and worst["norm_ratio"] is not None else "")
            sample = data.get("eval", {}).get("worst")
            where = (f" on --eval sample {sample['sample']} ({data['eval']['failed']} of {data['eval']['samples']} "
                     "samples "
                     "fail)" if sample else "")
            report.add(
                Finding.of(
                    "CMP002",
                    f"{spec.name}: the compiled model's outputs differ from the source model's "
                    f"on the CPU EP beyond tolerance{where}{detail}",
                    ep=spec.name,
                    fix="compare per output in the JSON; quantization or FP16 on the EP may explain it"
                    + (
                        dfl_hint(worst["name"], tuple(np.shape(reply.reference[worst["name"]])), options.metrics)
                        if worst and status.get("ok") and worst["name"] in reply.reference
                        else ""
                    ),
                )
            )
        if (data.get("eval") or {}).get("limited"):
            report.add(Finding.of("CMP004", f"{spec.name}: --eval judged {limited_words(data['eval']['limited'])}",
                                  ep=spec.name,
                                  fix="--ep-seconds N judges more of them; on the device one run takes milliseconds"))
        if data.get("other_nodes"):
            report.add(Finding.of("CMP003", f"{spec.name}: {data['other_nodes']} node(s) stay outside the EPContext "
                                  "node(s) and run on the CPU EP", ep=spec.name,
                                  fix=f"ortprep load MODEL --ep {spec.name} names them and why"))
        short = _share_shortfall(handle, spec.name, status)
        if short is not None:
            passed = False
            report.add(Finding.of("CMP007", short, ep=spec.name,
                                  fix=share_fix(spec.name, shlex.quote(str(handle.path)))))
        if status.get("ok") and passed:
            os.replace(compiled, dest)
            data["output"] = str(dest)
            report.artifacts.append(str(dest))
            report.output = dest
        elif status.get("ok") and options.keep_failed:  # beside -o, never at it
            kept = failed_path(dest)
            os.replace(compiled, kept)
            data["kept_failed"] = str(kept)
            report.artifacts.append(str(kept))
    report.data = data
    return report


def _share_shortfall(handle: ModelHandle, ep: str, status: dict[str, Any]) -> str | None:
    """CMP007's words where the EP compiles none of the model (ORT: "Unable to compile any nodes").
    A share below that is `load --ep EP --min-share`'s to judge: the compiled graph's leftover nodes
    come after ORT's optimizations, so they do not count the model's nodes one for one."""
    if not status.get("ok") and "Unable to compile any nodes" in (status.get("error") or ""):
        return share_shortfall(ep, 0, len(handle.graph.node), [], None, where="its compiled model")
    return None


EVAL_SAMPLES = 32  # compile --eval: samples judged at most


def eval_samples(handle: ModelHandle, compiled: Path, spec, target, options: CompileOptions) -> dict[str, Any]:
    """The compiled model on the EP (the session an application creates) against the source model
    on the CPU EP, sample by sample (--eval): one compared sample is one input, and the error an EP
    makes can depend on the input. Runs both; fidelity.ep_match judges. Returns the count, the
    failures and the worst (summarize_samples), and the samples --ep-seconds left out."""
    from ortprep.runtime.calibration import discover
    from ortprep.runtime.isolated import run_isolated
    from ortprep.runtime.requests import RunOnEp

    found = discover(str(options.eval), input_specs(handle.proto))
    feeds = list(found.samples(list(range(min(found.count, EVAL_SAMPLES)))))

    def on_ep(part: list) -> Any:
        return call(RunOnEp(model=str(compiled.resolve()), provider=spec.provider, feeds=part,
                            provider_options=session_options(target, options.provider_options, options.device),
                            plugin=target.plugin), python=target.python, timeout=options.timeout)

    # where one run is slow on the EP (a simulator), the first samples that fit in --ep-seconds
    reply, limited = run_within(on_ep, feeds, options.ep_seconds, spec.name)
    offered = feeds
    if reply.ok:
        feeds = feeds[:len(reply.samples)]
    if not reply.ok:
        return {"samples": len(feeds), "error": f"the compiled model failed on the samples ({reply.status}): "
                                                f"{reply.message}"}
    # the source model on the CPU EP on every offered sample: those the EP judged are the
    # references; the others' decisions join the margins of the expected agreement, as quantize's
    # gate reads its calibration samples' (docs/decisions/fidelity-quantize-gate.md)
    source = run_isolated(handle.path, offered, timeout=options.timeout)
    if not source.ok:
        return {"samples": len(feeds), "error": f"the source model failed on the samples: {source.message}"}
    references, more = source.samples[:len(feeds)], source.samples[len(feeds):]
    candidates = [{k: np.asarray(v) for k, v in candidate.items()} for candidate in reply.samples]
    judged, pooled = judge_ep_samples(handle.proto, spec.name, references, candidates, options.metrics,
                                      computes_tf32(spec.name, None), more=more)
    return {**summarize_samples(judged, pooled), "limited": limited}


class CompileStep(Step):
    name = "compile"
    Options = CompileOptions
    memory_factor = 1.0
    refuses_ep_context = True
    needs_ort = "always"
    progress_label = "compiling"
    default_suffix = ".ctx.onnx"

    def default_output(self, model: Path) -> Path:
        return model.with_name(model.name.removesuffix(".onnx") + f".{self.options.ep}.ctx.onnx")

    def run(self, model: ModelHandle | None, ctx: StepContext) -> StepResult:
        return compile_model(model, output_path(self, model, ctx), self.options, force=ctx.force)
