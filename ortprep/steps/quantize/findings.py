"""The findings of a quantize attempt's result, from its outcome: what the quantized model holds
(QNT002, QNT027, QNT020, QNT024, QNN005), how it was judged (VFY001, the gate's QNT005, QNT029,
QNT028, QNT006, QNT022, QNT019) and what it costs (latency, samples judged, QNT023, QNT003).
Their order is the report's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.eps.htp import small_multipliers
from ortprep.findings import Finding, Severity
from ortprep.model import iter_graphs
from ortprep.options import QuantizeOptions
from ortprep.report import StepResult
from ortprep.fidelity.tolerances import FLOAT16_COMPUTE
from ortprep.steps.quantize.calibrate import DataPlan
from ortprep.steps.quantize.ep_gate import GateTarget, first_divergence
from ortprep.fidelity.evaluation import Evaluation
from ortprep.fidelity.words import fmt_cosine
from ortprep.steps.quantize.gate_findings import assumption_finding, gate_finding, latency_finding, limited_finding
from ortprep.steps.quantize.choose import speed_words, with_engines
from ortprep.steps.quantize.diagnose import worst_nodes
from ortprep.steps.quantize.ladder import auto_order
from ortprep.steps.quantize.outcome import Outcome
from ortprep.transforms.qdq.facts import float_weighted, int8_compute_matmuls, output_writers
from ortprep.transforms.verify import model_bytes


@dataclass
class Attempt:
    """What the findings read: the attempt's options and settings, its data, where it was judged,
    its outcome, the quantized model kept (in memory) and the files it came from."""

    options: QuantizeOptions
    settings: dict
    plan: DataPlan
    target: GateTarget
    outcome: Outcome
    quantized: ModelProto
    float_path: Path
    eval_feeds: list
    workdir: Path
    sources: list[tuple[str, Path]]


def quality_findings(report: StepResult, attempt: Attempt, stats: dict) -> None:
    """What the quantized model holds and how it was judged, in the report's order."""
    options, settings, plan, target = attempt.options, attempt.settings, attempt.plan, attempt.target
    outcome, quantized = attempt.outcome, attempt.quantized
    float_path, eval_feeds = attempt.float_path, attempt.eval_feeds
    workdir, evaluation, excluded = attempt.workdir, attempt.outcome.evaluation, attempt.outcome.excluded
    result_path = outcome.trial.path
    if stats["quantized_ops"] == 0:
        report.add(Finding.of("QNT002", "nothing was quantized: no op computes on quantized data",
                              fix="check --exclude-op/--exclude-node, and that the model's weights are initializers"))
    elif options.mode == "static":
        kept_float, weighted = float_weighted(quantized)
        if weighted >= 2 and 2 * len(kept_float) > weighted:
            # a MiniLM's QNN result kept 17 of its 18 Gemm weights float and said nothing of it
            report.add(Finding.of(
                "QNT027", f"most of the model's weights stay float: {len(kept_float)} of {weighted} MatMul/Gemm/Conv "
                f"node(s) keep float weights (" + ", ".join(kept_float[:6]) + (", ..." if len(kept_float) > 6 else "")
                + "): the result is a float model with some quantized parts, and the target computes those nodes in "
                "float (on an NPU: FP16, or on the CPU)",
                fix="see excluded_nodes for why they stayed float; where the search kept them, a wider precision "
                    "(--auto) may quantize them; FP16 (ortprep convert MODEL --fp16) may be the format that fits"))
    if outcome.floored:
        channels = sum(f["channels"] for f in outcome.floored)
        shown = ", ".join(f"{f['node']} ({f['channels']}, down to 2^{np.log2(f['smallest']):.1f})"
                          for f in outcome.floored[:4])
        report.add(Finding.of(
            "QNT020",
                              f"{channels} channel(s) of {len(outcome.floored)} weight(s) had a requantization "
                              "multiplier (input "
            "scale x weight scale / output scale) below 2^-24, which QNN's HTP computes wrongly (measured: such a "
            "channel "
            "puts out large values (8 to 70 measured) where the CPU EP gives 0): their scales were raised to 2^-23; "
            "their weights are tiny "
            f"against the output's range, which rounds them to about 0 either way: {shown}"
            + (", ..." if len(outcome.floored) > 4 else ""), fix="nothing to do"))
    if outcome.fp16_matmuls:
        shown = ", ".join(outcome.fp16_matmuls[:4]) + (", ..." if len(outcome.fp16_matmuls) > 4 else "")
        report.add(Finding.of(
            "QNT024", f"{len(outcome.fp16_matmuls)} MatMul(s) of two 16-bit activations compute in FP16 (a Cast to "
            "float16 around each; they stay on QNN): QNN's HTP computes such a MatMul far less precisely in 16 bits "
            "(measured: max abs diff 0.099 at an output range of 20.7, where the CPU EP's run of the same model is "
            f"off by 0.0007; in FP16 on the HTP, 0.0064): {shown}", fix="nothing to do"))
    if settings.get("preset") == "qnn" and options.mode == "static":
        left = small_multipliers(quantized)
        if left:
            report.add(Finding.of(
                "QNN005", f"qnn: {sum(item['channels'] for item in left)} weight channel(s) of {len(left)} node(s) "
                "still have a requantization multiplier below 2^-24, which QNN's HTP computes wrongly (an "
                "initializer shared with another node, or a bias this edit could not keep consistent): "
                + ", ".join(item["node"] for item in left[:5]), ep="qnn",
                fix="ortprep load MODEL.qdq.onnx --ep qnn --reference MODEL shows whether the output suffers"))
    for name, what in (evaluation.degenerate if evaluation else []):
        report.add(Finding.of(
            "VFY001", f"output '{name}' is {what} on the evaluation samples: cosine similarity means nothing there, so "
            "it was judged by absolute error; these samples do not exercise it",
            fix="evaluate on real data that moves this output: --eval DATA"))
    if evaluation is not None and not evaluation.passed:
        # the CPU side's error is traced to its nodes; the EP's alone, to what writes the outputs it gets wrong
        worst = (worst_nodes(Path(float_path), result_path, eval_feeds[0], {e["name"] for e in excluded})
                 if evaluation.error is None and not evaluation.cpu_verdict else [])
        names = ", ".join(f"{n} ({op}, cosine {c:.4f})" for n, op, c in worst) or "none found"
        stopped = f"; the search stopped: {outcome.search['stopped']}" if outcome.search else ""
        writers = writers_text(quantized, evaluation, target) if evaluation.ep_only else ""
        parted = parted_at(evaluation, target, result_path, eval_feeds, workdir)
        report.data["ep_divergence"] = parted
        if parted:
            first = parted[0]
            writers = "; ".join(part for part in (writers, (
                f"{target.ep} parts from the CPU EP first at {first['node']} ({first['op_type']}: cosine "
                f"{first['cosine']:.4f} there, the model's own arithmetic on both)")) if part)
        # what --auto would try next, here
        held = (min(plan.eval_set.count, options.samples or plan.eval_set.count)
                if plan.eval_set is not None and plan.eval_set.kind != "random" else None)
        others = [label + (f" (calibrated on {changes['calib']}, a share held back)" if changes.get("calib") else "")
                  for label, changes in auto_order(options, held)[1:]]
        refusal = gate_finding(evaluation, min_cosine=options.min_cosine, ep_text=target.describe(), stopped=stopped,
                               worst=names, writers=writers, others=others, searched=bool(outcome.search))
        # the best engine's candidate, its figures and what writes it (choose.with_engines)
        report.add(replace(refusal, fix=with_engines(refusal.fix, outcome.engine_best, options.engine_name())))
    int8_compute = int8_compute_matmuls(quantized) if options.mode == "static" and options.ep in (None, "cpu") else []
    if int8_compute:
        shown = ", ".join(int8_compute[:6]) + (", ..." if len(int8_compute) > 6 else "")
        report.add(Finding.of(
            "QNT029", f"{len(int8_compute)} MatMul/Gemm node(s) read 16-bit activations and 8-bit weights ({shown}): "
            "ORT's CPU EP fuses each into MatMulNBits at accuracy level 4, which quantizes the activation to int8 per "
            "block of 32 at run time (measured, onnxruntime 1.32: an activation with one large channel, cosine 0.70 "
            "against float; 0.9999 in float compute); the gate judged that default session",
            fix="where the application's output suffers there, its session can set "
                "session.qdq_matmulnbits_accuracy_level=1 (float compute: SessionOptions.add_session_config_entry)"))
    if outcome.wide and evaluation is not None:
        report.add(Finding.of(
            "QNT028", f"--auto-exclude gave {len(outcome.wide)} activation(s) 16 bits, the weights staying "
            f"{settings['weight_type']} (" + ", ".join(outcome.wide[:8]) + (", ..." if len(outcome.wide) > 8 else "")
            + f"): lowest cosine {fmt_cosine(evaluation.gate_cosine)}",
            fix="see wide_activations and search; the CPU EP computes a 16-bit node in float between its Q/DQ pairs, "
                "except a MatMul with an 8-bit weight (QNT029)"))
    auto = [e for e in excluded if e["reason"] != "--exclude-node"]
    if auto and evaluation is not None:
        judged = " and ".join(evaluation.judged_on)
        report.add(Finding.of("QNT006", f"--auto-exclude kept {len(auto)} node(s) in float ("
                              + ", ".join(e["name"] for e in auto[:12]) + ("..." if len(auto) > 12 else "")
                              + f"): lowest cosine {fmt_cosine(evaluation.gate_cosine)} (judged on {judged})",
                              fix="see excluded_nodes and search"))
    if outcome.off_ep and target is not None:
        first = outcome.off_ep[0]
        report.add(Finding.of(
            "QNT022", f"{len(outcome.off_ep)} node(s) kept off {target.ep}, in If nodes that ORT runs on the CPU EP ("
            + ", ".join(e["name"] for e in outcome.off_ep[:8]) + ("..." if len(outcome.off_ep) > 8 else "")
            + f"): {first['reason']}", ep=target.ep,
            fix=f"nothing to do: the application creates its {target.ep} session as before; "
                f"ortprep load MODEL --ep {target.ep} shows what runs where"))
    seeded = any(f.code == "QNT011" for f in report.findings) or (
        plan.eval_set is not None and plan.eval_set.kind == "random")  # --calib random, held back
    decided = [o for o in (evaluation.outputs if evaluation is not None else [])
               if (o.get("decision") or {}).get("gated")]
    if seeded and decided and evaluation is not None and evaluation.passed:
        # a decision (a class, a CTC string, a mask) on seeded noise says nothing of the application's
        # inputs: measured in bench/suite/apps, a captcha OCR's dynamic int8 passed on seeded inputs at cosine
        # 0.9992 and changed 17% of the strings the application reads
        kinds = ", ".join(f"'{o['name']}' ({o['decision']['kind']})" for o in decided[:4])
        report.add(Finding.of("QNT019", f"the outputs {kinds} carry decisions the application reads, and the verdict "
                              "rests on seeded random inputs, where those decisions mean nothing: not written",
                              fix="pass a few real samples: --eval DATA (a folder of .npz, one per input set); "
                                  "--keep-failed keeps this result as NAME.failed.onnx; --metric OUTPUT=cosine if "
                                  "no application reads a decision from it"))


def cost_findings(report: StepResult, attempt: Attempt, size_before: int) -> None:
    """What the result costs: latency, the samples a slow EP judged, the EP's time, the size."""
    options, settings, target, outcome = attempt.options, attempt.settings, attempt.target, attempt.outcome
    quantized, sources, evaluation, excluded = attempt.quantized, attempt.sources, outcome.evaluation, outcome.excluded
    result_path = outcome.trial.path
    slower = latency_finding(evaluation)
    if slower is not None:  # with the engines' latency ratios, where --engine auto judged several (choose.speed_words)
        speed = speed_words(outcome.engines)
        report.add(replace(slower, message=f"{slower.message}; {speed}") if speed else slower)
    fewer = limited_finding(evaluation)
    if fewer is not None:
        report.add(fewer)
    assumed = assumption_finding(evaluation)
    if assumed is not None:
        report.add(assumed)
    if target.clock is not None and target.clock.refused:
        clock = target.clock
        report.add(Finding.of(
            "QNT023", f"the step's time on {target.ep} ({clock.total:g} s, --ep-total-seconds) was spent after "
            f"{clock.runs} judgement(s) there; {clock.refused} later one(s) did not run, and a trial not judged on "
            f"{target.ep} cannot pass the gate", ep=target.ep,
            fix="a larger --ep-total-seconds, or fewer judgements: --ep-seconds (each one's bound), fewer "
                "samples (--samples), or --gate-on-cpu to judge on the CPU EP only"))
    size_after = model_bytes(result_path)
    if size_after >= size_before:
        if settings["preset"] != "cpu" and options.mode == "static":
            # For an accelerator (an NPU above all) the point of a QDQ model is that the EP runs its ops in
            # integer; on a small model the Q/DQ pairs and scales outweigh the int8 weights, and that is fine.
            report.add(Finding.of("QNT003",
                                  f"the quantized model is not smaller ({size_after} bytes vs {size_before}): "
                                  f"kept, since for a static QDQ model for --ep {settings['preset']} the aim is "
                                  "integer ops on the EP, not size",
                                  severity=Severity.INFO, fix="nothing to do"))
        else:
            source = onnx.load(str(dict(sources)[outcome.source]), load_external_data=False)
            weights = float_weight_bytes(source)
            fix = not_smaller_fix(source, quantized, len(excluded))
            if weights < SMALL_WEIGHTS:
                # too few weights for int8 to pay by construction: the file is what was asked and the
                # gate judged it, so it is written and the size is said, not made a refusal
                report.add(Finding.of("QNT003", f"the quantized model is not smaller ({size_after} bytes vs "
                                      f"{size_before}): written, since the model holds only {weights:,} bytes of "
                                      "float weights, too few for int8 to shrink it", severity=Severity.WARNING,
                                      fix=fix))
            else:
                report.add(Finding.of("QNT003",
                                      f"the quantized model is not smaller ({size_after} bytes vs {size_before})",
                                      fix=fix))


def parted_at(evaluation: Evaluation, target: GateTarget, model: Path, feeds: list, workdir: Path) -> list[dict]:
    """Where the EP's run first parts from the CPU EP's (ep_gate.first_divergence), when the EP
    side fails the gate worse than the CPU side does."""
    on_ep = evaluation.on_ep
    if on_ep is None or on_ep.error is not None or on_ep.passed or not feeds:
        return []
    if not evaluation.ep_only and (on_ep.cosine is None or evaluation.cosine is None
                                   or on_ep.cosine >= evaluation.cosine - 0.01):
        return []  # the CPU EP is as wrong: quantization's error, not the EP's
    return first_divergence(target, model, feeds[:2], workdir)


def writers_text(quantized: ModelProto, evaluation: Evaluation, target: GateTarget) -> str:
    """What writes the outputs the EP alone gets wrong: the quantized nodes to keep float, and the
    float nodes on the way, which an EP that computes float in float16 computes there."""
    wrong = evaluation.on_ep.wrong_outputs()
    ops = {node.name: node.op_type for node in quantized.graph.node}
    quantized_nodes, float_nodes = output_writers(quantized, wrong)
    parts = []
    if quantized_nodes:
        parts.append("the quantized nodes that write the outputs it gets wrong: "
                     + ", ".join(f"{n} ({ops.get(n, '?')})" for n in quantized_nodes[:6]))
    if float_nodes and target.ep in FLOAT16_COMPUTE:
        parts.append("float nodes on the way, which " + target.ep
                     + " computes in float16 (its range ends at 65504, its "
                     "precision at 11 bits): " + ", ".join(f"{n} ({ops.get(n, '?')})" for n in float_nodes[:6]))
    return "; ".join(parts)


# int8 weights save 3 bytes per float32 element, while every quantized tensor (activations
# included) adds a scale, a zero point and a Q/DQ pair with their names: on a model with fewer
# float weight bytes than this, that overhead is the reason QNT003 names (a rule of thumb, not a
# bound: the journey's conv1d_audio, 3.2 KB of weights, grew from 4,137 to 6,020 bytes)
SMALL_WEIGHTS = 64 * 1024


FLOAT_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.DOUBLE: 8}


def float_weights(proto: onnx.ModelProto) -> dict[str, int]:
    """Each float initializer's size in bytes, from its dims (no data read), subgraphs included."""
    return {t.name: int(np.prod(t.dims)) * FLOAT_BYTES[t.data_type] for _, g in iter_graphs(proto.graph)
            for t in g.initializer if t.data_type in FLOAT_BYTES}


def float_weight_bytes(proto: onnx.ModelProto) -> int:
    """How many bytes of float weights a model holds: what int8 can shrink."""
    return sum(float_weights(proto).values())


def not_smaller_fix(float_proto: onnx.ModelProto, quantized: onnx.ModelProto, kept_float: int) -> str:
    """QNT003's fix: why the quantized file is not smaller, from the weights alone (their dims,
    no data read), and what to do instead. ``float_proto``: the model that was quantized (ORT's
    pre-processing renames the weights it fuses, so not the file as given); ``kept_float``: how
    many nodes were kept float."""
    before, after = float_weights(float_proto), float_weights(quantized)
    total = sum(before.values())
    if total < SMALL_WEIGHTS:
        return (f"the model holds only {total:,} bytes of float weights: the scales, zero points and Q/DQ nodes cost "
                "more than int8 saves on them. Keep the float model; `ortprep convert MODEL --fp16` halves the weights "
                "where the EP takes FP16")
    by_op: dict[str, int] = {}
    for _, graph in iter_graphs(quantized.graph):
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                if name in after and name in before:
                    by_op[node.op_type] = by_op.get(node.op_type, 0) + after.pop(name)
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1])
    where = ", ".join(f"{op} {size / total:.0%}" for i, (op, size) in enumerate(ranked[:3]) if i == 0
                      or size >= total / 100)
    kept = f"; {kept_float} node(s) were kept float" if kept_float else ""
    stayed = sum(by_op.values())
    return (f"{stayed / total:.0%} of the float weights stayed float (read by {where or 'no node'}){kept}: "
            "int8 pays where the weights of the ops it quantizes dominate; else keep the float model")
