"""What the convert step does, below the steps so that another step can convert too (quantize's FP16
probe): FP16 (with repair and mixed precision), opset, static shapes, 1-D to 2-D; every result
verified against the original before it is written."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import shlex
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto

from ortprep.errors import UsageError
from ortprep.findings import Finding
from ortprep.model import ModelHandle, failed_path, iter_graphs
from ortprep.report import StepResult
from ortprep.validity import drop_duplicate_imports
from ortprep.fidelity.gate import EXACT_GATE, Gate, VerifyResult, expect, judge_run
from ortprep.options import ConvertOptions
from ortprep.transforms import fp16 as fp16_step
from ortprep.transforms import fp16_stream, rewrites
from ortprep.transforms.common import (
    NOT_VERIFIED,
    decision_fix,
    finish,
    make_feeds,
    reference_run,
    report_unverifiable,
)
from ortprep.transforms.fp16_search import convert_to_fp16, fp32_op_types, keeps_io_types
from ortprep.transforms.off_ep import CutError, keep_off_ep
from ortprep.transforms.decompose.report import rewrite_record
from ortprep.runtime.isolated import run_isolated
from ortprep.transforms.verify import Intermediates, cast_feeds, model_bytes, node_count, run_model

log = logging.getLogger(__name__)

SCHEMA = "ortprep.convert/1"


def convert_model(handle: ModelHandle, dest: Path, options: ConvertOptions, *, force: bool = False) -> StepResult:
    """Apply the requested transforms, verify, and write ``dest`` only when verification passes
    (or ``keep_failed``). The handle's model is transformed in place (its file is not touched)."""
    checks = dataclasses.replace(
        options, shapes={**options.fix_shapes, **options.shapes}, dims={**options.fix_dims, **options.dims}
    )
    report = StepResult(step="convert", schema=SCHEMA)
    if fp16_stream.streams(handle, options):
        return convert_streamed(handle, dest, options, checks, report, force=force)
    size_before = model_bytes(handle.path)
    handle.load_weights()
    nodes_before = node_count(handle.proto)
    float_weights = sum(4 * int(np.prod(t.dims)) for _, g in iter_graphs(handle.proto.graph) for t in g.initializer
                        if t.data_type == TensorProto.FLOAT)
    # The reference run comes first: after it the transforms change handle.proto in place
    # (a copy would hold every weight twice).
    feeds, feed_source = make_feeds(handle, checks)
    rewrites_graph = (
        options.opset
        or options.ir_version
        or options.fix_dims
        or options.fix_shapes
        or options.conv1d_to_conv2d
        or options.keep_off_ep
        or options.rewrite_for
    )
    activations = None
    if options.verify and options.fp16 and not rewrites_graph:
        # one run serves as the reference and as the FP16 activation scan
        activations, reference = _reference_with_intermediates(
            handle, feeds, report, options.metrics, options.inputs is None
        )
    else:
        reference = (
            _reference(handle, feeds, report, _level(options), options.metrics, options.inputs is None)
            if options.verify
            else None
        )
    proto, applied = _rewrite(handle.proto, options)
    rewrite = None
    if options.rewrite_for:  # after the graph rewrites (an opset the decompositions need), before FP16
        from ortprep.eps.registry import resolve_ep
        from ortprep.transforms.decompose.apply import rewrite_for_ep

        proto, rewrite = rewrite_for_ep(proto, resolve_ep(options.rewrite_for))
        applied.append({"transform": "rewrite_for", "detail": rewrite.detail()})
    left = rewrites.dynamic_tensors(proto) if options.fix_dims or options.fix_shapes else []

    verify_result: VerifyResult | None = None
    kept: list[fp16_step.KeptNode] = []
    if options.fp16:
        proto, verify_result, kept = convert_to_fp16(proto, options, feeds, reference, report, activations=activations)
        applied.append({"transform": "fp16", "detail": f"ep {options.ep}" if options.ep else "no EP: ONNX's float16 "
                                                                                             "signatures"})
    elif reference is not None:
        verify_result = judge_run(reference, run_model(proto, feeds, optimization=_level(options)), EXACT_GATE)
        if verify_result.passed and _level(options) != "default":
            verify_result = _as_users_get_it(proto, feeds, verify_result)

    fix = (
        "keep more nodes in FP32 (--block-op / --block-node), or loosen the gate (--min-cosine)"
        if options.fp16
        else "report it: the transform changed the model's results"
    )
    written = finish(
        report,
        handle,
        nodes_before,
        proto,
        dest,
        verify_result,
        checks,
        force=force,
        size_before=size_before,
        transforms=applied,
        feed_source=feed_source,
        failure_fix=fix,
        extra={"kept_fp32_nodes": [k.to_record() for k in kept]},
    )
    if rewrite is not None:
        report.data["rewrite"] = rewrite_record(rewrite, handle.path, written, report, options.runtimes)
    if left:
        report.add(Finding.of(
            "CNV016", f"every input is static, but {len(left)} tensor(s) inside keep an unknown dimension (e.g. "
            f"{', '.join(left[:3])}): shape inference could not follow the sizes the model computes; an EP that needs "
            "every tensor static (QNN: 'Cannot get shape') leaves their nodes to the CPU",
            fix=("ONNX Runtime's symbolic inference (sympy is installed) could not follow them either: "
                 if importlib.util.find_spec("sympy") is not None else
                 "pip install sympy (ortprep[symbolic]: ONNX Runtime's symbolic inference follows computed sizes), or ")
            + f"ortprep simplify {shlex.quote(str(written or dest))} folds the shape computations; then "
              f"ortprep check {shlex.quote(str(written or dest))} --ep qnn --prove"))
    if isinstance(report.data.get("verify"), dict):
        report.data["verify"]["optimization"] = _level(options)  # ORT's graph optimization level of both runs
    size_after = report.data.get("size_after")
    if options.fp16 and size_after is not None and float_weights >= size_before / 2 and size_after >= 0.9 * size_before:
        kept_weights = "" if options.ep is None else f"; {options.ep} keeps ops in FP32 whose weights stay float32"
        report.add(Finding.of(
            "CNV012", f"the FP16 model is not smaller ({size_after} bytes vs {size_before}){kept_weights}",
            fix="see kept_fp32_nodes; without --ep every op with a float16 signature is converted"))
    report.output = written
    return report


def _level(options: ConvertOptions) -> str:
    """ORT's optimization level for the verifying runs. Nodes kept off the EP are compared with
    graph optimizations off: the rewrite is the same function, node for node, so the outputs must
    be equal; at the default level ORT fuses a QDQ model's float node with the DequantizeLinear
    before it (its weights quantized), and inside the If it does not, so the two differ by about a
    quantization step (measured: 0.05 on an output of scale 0.05), a difference of ORT's fusions."""
    return "disable" if options.keep_off_ep and not options.fp16 else "default"


def _as_users_get_it(proto, feeds, verified: VerifyResult) -> VerifyResult:
    """The result compared with graph optimizations off must also run in the session an application
    creates (the default level): where that session fails or kills its process, the comparison did
    not prove what a user gets, and the result fails verification (nothing is written; the case
    that showed it: docs/decisions/fidelity-verification.md)."""
    run = run_model(proto, feeds, optimization="default")
    if run.ok:
        return verified
    words = {"crashed": "killed its process", "timeout": "did not answer"}.get(run.status, "failed")
    return dataclasses.replace(
        verified,
        loads=False,
        passed=False,
        status=run.status,
        error=f"the session an application creates (ORT's default optimization level) {words}: {run.message}",
    )


def _reference(handle: ModelHandle, feeds, report: StepResult, optimization: str = "default",
               metrics: dict[str, str] | None = None, seeded: bool = False):
    """The original's run from its own file (its session stays in the worker for the steps after
    this one); a model held in memory only goes through transforms.common."""
    if handle.path is None:
        return reference_run(handle.proto, feeds, report, metrics, seeded)
    outcome = run_isolated(handle.path, cast_feeds(feeds, handle.proto), optimization=optimization)
    if not outcome.ok:
        report_unverifiable(outcome, report)
        return None
    return expect(outcome, handle.proto, metrics, seeded)


def _reference_with_intermediates(handle: ModelHandle, feeds, report: StepResult, metrics: dict[str, str] | None = None,
                                  seeded: bool = False):
    """(the original's intermediates, its reference run), from its own file: the worker adds the
    outputs to the file's graph, so its weights are not serialized again here, and its session
    stays in the worker for later runs of that file. Where every intermediate fits one group
    (transforms/verify.py: EXPOSED_BYTES), one run serves both. A model held in memory only is run
    from memory (Intermediates, and _reference's reference_run)."""
    activations = Intermediates(handle.proto, feeds, path=handle.path)
    if not activations.single:
        # more than one group: the reference is a run of its own, and the groups run when read
        reference = _reference(handle, feeds, report, "default", metrics, seeded)
        return (activations if reference is not None else None), reference
    _, full = next(activations.runs())
    if not full.ok:
        report_unverifiable(full, report)
        return None, None
    names = {v.name for v in handle.proto.graph.output}
    reference = expect(dataclasses.replace(full, outputs={k: v for k, v in full.outputs.items() if k in names}),
                       handle.proto, metrics, seeded)
    return activations, reference


def convert_streamed(
    handle: ModelHandle, dest: Path, options: ConvertOptions, checks: ConvertOptions, report: StepResult, *, force: bool
) -> StepResult:
    """FP16 of a model with more external weights than belong in memory: the graph converts
    without them, the weights stream across (transforms/fp16_stream.py), and verification runs
    both models from disk in child processes."""
    from ortprep.runtime.isolated import run_isolated

    size_before = model_bytes(handle.path)
    proto = handle.proto  # the graph; its external tensors are not loaded
    nodes_before = node_count(proto)
    fp16_step.ensure_node_names(proto)
    block_ops = fp32_op_types(handle, options, report)
    converted, repairs = fp16_step.convert_once(proto, keep_io_types=keeps_io_types(options), block_ops=set(block_ops),
                                                block_nodes=set(options.block_nodes))
    fp16_stream.require_disk(handle, converted, dest)
    staged, stats = fp16_stream.stage(handle, converted, dest, force=force)
    verify_result = None
    feeds, feed_source = make_feeds(handle, checks)
    unverifiable = False
    if options.verify:
        reference = run_isolated(handle.path, feeds)
        if reference.ok:
            expect(reference, handle.proto, options.metrics, options.inputs is None)
            candidate = run_isolated(staged, cast_feeds(feeds, converted))
            verify_result = judge_run(reference, candidate, Gate(min_cosine=options.min_cosine))
        else:
            report_unverifiable(reference, report)  # nothing is written (CNV007)
            unverifiable = True
    else:
        session = run_isolated(staged, [])  # unverified, but it must still create a CPU session
        if not session.ok:
            verify_result = VerifyResult(loads=False, passed=False, status=session.status,
                                         error=f"no ONNX Runtime CPU session: {session.message}")
    if stats.overflow:
        worst = max(stats.overflow, key=stats.overflow.get)
        report.add(Finding.of("CNV001", f"{len(stats.overflow)} weight tensor(s) hold values beyond FP16's 65504 "
                              f"(up to {stats.overflow[worst]:.4g} in '{worst}'); clamped to 65504 while streaming "
                              "(the streamed path keeps no nodes in FP32 for them)",
                              fix="keep their consumers in FP32: --block-node NODE"))
    if stats.underflow:
        report.add(Finding.of("CNV002", f"{sum(stats.underflow.values())} weight values in "
                              f"{len(stats.underflow)} tensor(s) are smaller than FP16 can hold (2^-24) and become "
                              "zero",
                              fix="usually harmless; if accuracy suffers, --block-node the consumer"))
    failed = verify_result is not None and not verify_result.passed
    if failed:
        what = verify_result.failure_words()
        report.add(Finding.of("CNV006", f"verification failed: {what}", fix=decision_fix(
            verify_result, "keep nodes in FP32 (--block-op / --block-node); the streamed path runs no mixed-precision "
                           "search")))
    written = kept_failed = None
    if not failed and not unverifiable:
        written = fp16_stream.commit(staged, dest)
        report.artifacts.append(str(written))
    elif options.keep_failed:  # beside -o, never at it
        kept_failed = fp16_stream.commit(staged, failed_path(dest))
        report.artifacts.append(str(kept_failed))
    else:
        fp16_stream.discard(staged)
    kept = [fp16_step.KeptNode(n.name, n.op_type, block_ops.get(n.op_type) or "--block-node", scope)
            for scope, g in iter_graphs(converted.graph) for n in g.node
            if n.op_type in block_ops or n.name in options.block_nodes]
    report.data = {
        "input": str(handle.path), "output": str(written) if written else None,
        "kept_failed": str(kept_failed) if kept_failed else None,
        "transforms": [{"transform": "fp16", "detail": (f"ep {options.ep}" if options.ep
                                                        else "no EP: ONNX's float16 signatures")
                        + f"; streamed: {stats.converted} tensor(s) halved, {stats.copied} copied, "
                        f"{stats.bytes_in} -> {stats.bytes_out} bytes of external data"}],
        "nodes_before": nodes_before, "nodes_after": node_count(converted), "size_before": size_before,
        "size_after": model_bytes(written) if written else None,
        "verify": verify_result.to_record() if verify_result else dict(NOT_VERIFIED),
        "verified": bool(verify_result is not None and verify_result.passed and options.verify),
        "inputs": feed_source if options.verify else None,
        "kept_fp32_nodes": [k.to_record() for k in kept],
    }
    for repair in repairs:
        log.info("repair: %s", repair)
    report.output = written
    return report


def _rewrite(proto: ModelProto, options: ConvertOptions) -> tuple[ModelProto, list[dict[str, Any]]]:
    """The graph rewrites before FP16: opset, static shapes, 1-D to 2-D."""
    applied: list[dict[str, Any]] = []
    dropped = drop_duplicate_imports(proto)
    if dropped:
        applied.append({"transform": "repair", "detail": f"dropped repeated opset import(s): {', '.join(dropped)}"})
    if options.opset:
        proto = rewrites.convert_opset(proto, options.opset)
        applied.append({"transform": "opset", "detail": f"opset {options.opset}"})
    if options.ir_version:
        if options.ir_version > proto.ir_version:  # equal: a no-op stamp
            raise UsageError(f"the model already has IR version {proto.ir_version}; --ir-version only stamps an older "
                             "one",
                             hint=f"give a version below {proto.ir_version}, or leave --ir-version out")
        applied.append({"transform": "ir_version", "detail": f"IR {proto.ir_version} -> {options.ir_version}"})
        proto.ir_version = options.ir_version
    if options.fix_dims or options.fix_shapes:
        changes = rewrites.fix_dims(proto, options.fix_dims) if options.fix_dims else []
        changes += rewrites.fix_shapes(proto, options.fix_shapes) if options.fix_shapes else []
        proto = rewrites.propagate_static_shapes(proto)
        folded = rewrites.fold_shape_computations(proto)
        if folded:
            changes.append(f"{len(folded)} shape computation node(s) folded into constants")
            # what reads a folded shape (a Reshape) can be shaped now: PP-OCR's direction classifier's
            # output stayed [?, 2] after one pass, its Reshape's shape computed through Casts
            proto = rewrites.propagate_static_shapes(proto)
        applied.append({"transform": "fix_shape", "detail": "; ".join(changes)})
    if options.conv1d_to_conv2d:
        working = ModelHandle(proto=proto, path=None)
        names = rewrites.conv1d_to_conv2d(working)
        proto = rewrites.propagate_static_shapes(working.proto)
        applied.append({"transform": "conv1d_to_conv2d", "detail": f"{len(names)} node(s): {', '.join(names)}"})
    if options.keep_off_ep:
        try:
            proto, moved = keep_off_ep(ModelHandle(proto=proto, path=None), options.keep_off_ep)
        except CutError as exc:
            raise UsageError(f"--keep-off-ep: {exc.message}", hint="name nodes of the main graph as check --prove "
                             "prints them") from None
        applied.append({"transform": "keep_off_ep", "detail": f"{len(moved)} node(s) in If nodes, run on the CPU EP: "
                        + ", ".join(moved)})
    return proto, applied
