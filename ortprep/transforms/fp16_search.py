"""The FP16 search: convert, load, compare against FP32; keep the nodes where the error starts in
FP32 and try again (mixed precision). Used by the convert step."""

from __future__ import annotations

import logging

from onnx import ModelProto

from ortprep.eps.registry import resolve_ep
from ortprep.findings import Finding, Severity
from ortprep.model import ModelHandle, iter_graphs
from ortprep.report import StepResult
from ortprep.fidelity.compare import compare_arrays
from ortprep.fidelity.gate import EXACT_GATE, Gate, VerifyResult, judge_run
from ortprep.options import ConvertOptions
from ortprep.transforms import fp16 as fp16_step
from ortprep.transforms.fp16 import KeepReason
from ortprep.transforms.verify import Intermediates, node_count, run_model, run_with_intermediates
from ortprep.transforms.rescale import plan_rescale, rescaled

log = logging.getLogger(__name__)
# The tensor gate tightens 10x per round where only a decision fails, at most this many times.
MAX_TIGHTENING = 4


class Fp16Search:
    """The FP16 loop: convert, load, compare; keep the nodes responsible in FP32; repeat."""

    def __init__(self, proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepResult) -> None:
        self.source = proto
        self.options = options
        self.feeds = feeds
        self.reference = reference
        self.report = report
        self.keep_io = keeps_io_types(options)
        self.block_ops: dict[str, str] = {op: "--block-op" for op in options.block_ops}
        self.block_nodes: dict[str, str] = {name: "--block-node" for name in options.block_nodes}
        # Why each node in block_nodes is there, as data (the text above is for people).
        self.keep_reasons: dict[str, KeepReason] = {name: KeepReason.ASKED for name in options.block_nodes}
        self.gate = Gate(min_cosine=options.min_cosine)
        # Where every output passes the cosine gate but a decision changes (a detector's map
        # crossing its threshold at a few pixels), the tensors are held 10x tighter per such round
        # to find where the error grows; this counts those rounds.
        self.tightened = 0
        self.repairs: list[str] = []
        self.rounds = 0
        self.bisect_tries = 0
        # FP32 values of every intermediate tensor on the feeds: measured once, for the activation
        # scan, and reused by every round that localizes a failure.
        self.source_activations = None

    def kept(self, converted: ModelProto) -> list[fp16_step.KeptNode]:
        from onnxconverter_common.float16 import DEFAULT_OP_BLOCK_LIST

        kept = []
        for scope, graph in iter_graphs(self.source.graph):
            for node in graph.node:
                if node.name in self.block_nodes:
                    reason = self.block_nodes[node.name]
                elif node.op_type in self.block_ops:
                    reason = self.block_ops[node.op_type]
                elif node.op_type in DEFAULT_OP_BLOCK_LIST:
                    reason = "onnxconverter-common keeps this op in FP32"
                else:
                    continue
                kept.append(fp16_step.KeptNode(node.name, node.op_type, reason, scope))
        return kept

    def convert_with(self, extra_ops: set[str] = frozenset(), extra_nodes: set[str] = frozenset()) -> ModelProto:
        converted, self.repairs = fp16_step.convert_once(
            self.source,
            keep_io_types=self.keep_io,
            block_ops=set(self.block_ops) | set(extra_ops),
            block_nodes=set(self.block_nodes) | set(extra_nodes),
        )
        return converted

    def convert(self) -> tuple[ModelProto | None, VerifyResult | None]:
        last: VerifyResult | None = None
        converted: ModelProto | None = None
        bisected = False
        for self.rounds in range(1, self.options.max_rounds + 1):
            try:
                converted = self.convert_with()
            except Exception as error:  # noqa: BLE001 - the converter's failure becomes a finding
                self.report.add(Finding.of(
                    "CNV011", f"onnxconverter-common failed on this model ({type(error).__name__}: {error})",
                    fix="keep the op types involved in FP32 with --block-op OP, and report the model to ortprep"))
                return None, None
            if self.reference is None:
                return converted, None
            candidate = run_model(converted, self.feeds)
            last = judge_run(self.reference, candidate, self.gate)
            if last.passed:
                return converted, last
            if last.status == "crashed" and not bisected:
                bisected = True
                self.report.add(Finding.of(
                    "CNV005", f"ONNX Runtime crashed on the FP16 model ({last.error}); bisecting the op types and "
                              "nodes "
                    "that cause it", severity=Severity.WARNING,
                    fix="if it persists: ortprep convert --fp16 --block-op OP for the op types involved"))
                if self._bisect_crash(last.error or "crashed"):
                    continue
            culprits = self._culprits(converted, last)
            if not culprits:
                break
            for name, (why, reason) in culprits.items():
                self.keep(name, why, reason)
        return converted, last

    def _crashes(self, ops: set[str], nodes: set[str]) -> bool:
        """Does ORT still die on the model converted with ``ops`` and ``nodes`` kept in FP32?"""
        self.bisect_tries += 1
        try:
            model = self.convert_with(ops, nodes)
        except Exception:  # noqa: BLE001 - a conversion that fails does not avoid the crash
            return True
        return run_model(model, self.feeds).status == "crashed"

    def _bisect_crash(self, error: str) -> bool:
        """Delta debugging: the fewest op types, then nodes, whose FP32-keeping avoids the crash.
        Every try converts and runs in its own child. Returns True when the crash was avoided."""
        candidates: dict[str, list[str]] = {}
        for _, graph in iter_graphs(self.source.graph):
            for node in graph.node:
                if node.op_type in NEVER_BLAMED or node.name in self.block_nodes or node.op_type in self.block_ops:
                    continue
                candidates.setdefault(node.op_type, []).append(node.name)
        if not candidates or self._crashes(set(candidates), set()):
            return False
        ops = ddmin(sorted(candidates), lambda subset: not self._crashes(set(subset), set()))
        names = [name for op in ops for name in candidates[op]]
        nodes = ddmin(names, lambda subset: not self._crashes(set(), set(subset)))
        for name in nodes:
            self.keep(name, KeepReason.CRASH, "ORT crashes on this op in float16")
        self.report.add(Finding.of(
            "CNV010",
            f"ONNX Runtime crashed on the FP16 model ({error[:160]}); bisection ({self.bisect_tries} tries, each in "
            "its "
            f"own process) found that keeping {len(nodes)} node(s) in FP32 avoids it: "
            + ", ".join(f"{n} ({self._op_of(n)})" for n in nodes[:8]),
            fix="nothing to do: ortprep kept them; report the crash to ONNX Runtime with the op types named"))
        return True

    def _op_of(self, name: str) -> str:
        return next((n.op_type for _, g in iter_graphs(self.source.graph) for n in g.node if n.name == name), "?")

    def keep(self, name: str, why: KeepReason, text: str, *, replace: bool = True) -> None:
        """Keep node ``name`` in FP32 from the next round on."""
        if replace or name not in self.block_nodes:
            self.block_nodes[name] = text
            self.keep_reasons[name] = why

    def _culprits(self, converted: ModelProto, result: VerifyResult) -> dict[str, tuple[KeepReason, str]]:
        if result.decision_failed and result.loads and not result.error and all(
                d.shape_match and not d.nonfinite and (d.cosine is None or d.cosine >= self.gate.min_cosine)
                for d in result.outputs):
            # Tighter until some tensor fails: a detector's regions can move at FP16's rounding alone,
            # which a gate 10x tighter still passes everywhere (docs/decisions/fidelity-verification.md).
            while True:
                self.tightened += 1
                level = min(self.tightened, MAX_TIGHTENING)
                found = self._localize(converted, Gate(min_cosine=1.0 - (1.0 - self.gate.min_cosine) / 10.0 ** level))
                if found or level >= MAX_TIGHTENING:
                    return found
        return self._localize(converted, self.gate)

    def _localize(self, converted: ModelProto, gate: Gate | None = None) -> dict[str, tuple[KeepReason, str]]:
        """Compare every intermediate tensor; the nodes where the error starts stay FP32."""
        present = {out for node in converted.graph.node for out in node.output}
        if self.source_activations is None:
            self.source_activations = Intermediates(self.source, self.feeds)
        # a group of tensors at a time (Intermediates: at most EXPOSED_BYTES a run), the candidate
        # exposing the same ones; the graph's outputs are compared once
        bad: set[str] = set()
        outputs_done = False
        failure = None
        for names, original in self.source_activations.runs(only=present):
            if not original.ok:
                return {}
            candidate = run_with_intermediates(converted, self.feeds, names)
            if not candidate.ok:
                failure = candidate.message
            compared = set(names) | (set() if outputs_done else {v.name for v in self.source.graph.output})
            outputs_done = True
            for name, value in original.outputs.items():
                if name not in compared or value.dtype.kind != "f":
                    continue
                other = candidate.outputs.get(name) if candidate.ok else None
                if other is None or not (gate or self.gate).passes(compare_arrays(name, value, other), value):
                    bad.add(name)
        return blame(self.source, bad, set(self.block_nodes), failure)


def keeps_io_types(options: ConvertOptions) -> bool:
    """Float32 inputs and outputs unless asked otherwise, or unless the EP feeds FP16 (dml-npu)."""
    if options.keep_io_types is not None:
        return options.keep_io_types
    return not (options.ep is not None and resolve_ep(options.ep).fp16_io)


def fp32_op_types(handle: ModelHandle, options: ConvertOptions, report: StepResult) -> dict[str, str]:
    """Op types that stay FP32 before any verification, with why: --block-op, ops ONNX defines
    without a float16 signature, and the target EP's FP32-only ops (CNV008); without an EP, the
    note that the CPU EP runs some FP16 ops through Casts (CNV014). Reads the graph only."""
    kept = {op: "--block-op" for op in options.block_ops}
    for op, reason in fp16_step.no_fp16_signature_ops(handle.proto).items():
        kept.setdefault(op, reason)
    if options.ep is None:
        report.add(Finding.of(
            "CNV014", "FP16 for no particular EP: every op with a float16 signature in ONNX computes in FP16; ONNX "
                      "Runtime's "
            "CPU EP runs those it has no float16 kernel for (Conv, for one) through Casts to float32",
            fix="name the EP you deploy to (--ep cuda, --ep dml, --ep cpu) to keep its FP32-only ops in FP32"))
        return kept
    ep_ops = fp16_step.ep_blocked_ops(handle, options.ep)
    for op, reason in ep_ops.items():
        kept.setdefault(op, reason)
    if ep_ops:
        report.add(
            Finding.of(
                "CNV008",
                f"{len(ep_ops)} op type(s) stay FP32 because {options.ep} has no FP16 kernel for them: "
                f"{', '.join(sorted(ep_ops))}",
                fix="convert for the EP you deploy to: --ep cuda, --ep dml or --ep dml-npu",
            )
        )
    return kept


NEVER_BLAMED = {"Cast", "Constant", "Identity", "Shape", "Size"}


def ddmin(items: list, passes) -> list:
    """The smallest subset of ``items`` (1-minimal) for which ``passes(subset)`` holds, given that it
    holds for all of them (Zeller's delta debugging, on the passing side)."""
    items = list(items)
    chunks = 2
    while len(items) >= 2:
        size = -(-len(items) // chunks)
        parts = [items[i:i + size] for i in range(0, len(items), size)]
        for part in parts:
            if passes(part):
                items, chunks = part, 2
                break
        else:
            for part in parts:
                rest = [item for item in items if item not in part]
                if rest and len(parts) > 2 and passes(rest):
                    items, chunks = rest, max(chunks - 1, 2)
                    break
            else:
                if chunks >= len(items):
                    break
                chunks = min(len(items), chunks * 2)
    return items


def has_foldable(proto: ModelProto) -> bool:
    """Is there anything for onnxsim to fold: a node whose inputs are all constants, or a Shape
    (onnxsim folds it where shapes are static)? Skipping onnxsim otherwise saves its cost (it runs
    the model in ORT) on graphs with nothing to fold."""
    constants = {t.name for t in proto.graph.initializer}
    constants |= {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
    for node in proto.graph.node:
        if node.op_type == "Constant":
            continue
        if node.op_type in ("Shape", "Size") or (node.input and all(not i or i in constants for i in node.input)):
            return True
    return False


def prefold(proto: ModelProto, feeds, reference, report: StepResult) -> ModelProto:
    """What the peers' best chain does first: BatchNormalization folded (into the Conv before it,
    or into a per-channel Mul and Add computed in float64) and constants folded by onnxsim.
    Verified with the tight gate against the original; whatever fails verification is not kept."""
    from ortprep.transforms.simplify import run_onnxsim

    has_bn = any(node.op_type == "BatchNormalization" for node in proto.graph.node)
    if not has_bn and (reference is None or not has_foldable(proto)):
        return proto  # nothing to fold: no copy of the weights, no shape inference
    original = ModelProto()
    original.CopyFrom(proto)
    folded = fp16_step.fold_batchnorms(proto, ranks=fp16_step.tensor_ranks(proto)) if has_bn else []
    steps = [f"{len(folded)} BatchNormalization node(s) folded"] if folded else []
    simplified = None
    if reference is not None and has_foldable(proto):  # onnxsim's rewrites are only taken when they can be verified
        simplified, _ = run_onnxsim(proto, ModelHandle(proto=proto, path=None))
    candidates = ([(simplified, steps + ["constants folded (onnxsim)"])] if simplified is not None else []) + [
        (proto, steps)
    ]
    for candidate, done in candidates:
        if not done:
            continue
        if reference is None:
            report.add(Finding.of("CNV013", "before FP16: " + "; ".join(done) + " (exact arithmetic, not verified: "
                                  "verification is off)", fix="nothing to do"))
            return candidate
        removed = node_count(original) - node_count(candidate)
        if not folded and removed <= 0:
            continue  # onnxsim found nothing to fold: keep the model as it was
        check = judge_run(reference, run_model(candidate, feeds), EXACT_GATE)
        if check.passed:
            report.add(Finding.of("CNV013", "before FP16: " + "; ".join(done)
                                  + f" ({node_count(original)} -> {node_count(candidate)} nodes); verified "
                                  f"against the original: max abs diff {check.max_abs_diff:.3g}", fix="nothing to do"))
            return candidate
    return original if folded else proto


def rescale_inputs(proto: ModelProto, activations: Intermediates, feeds, reference, report: StepResult) -> ModelProto:
    """``proto`` with each input whose activations overflow FP16 scaled down where the scale can
    be taken out again (transforms/rescale.py), verified against ``reference`` in FP32; ``proto``
    itself where nothing overflows, nothing can be rescaled, or the rescaled model differs."""
    peaks = activations.peaks()
    if not peaks:
        return proto
    plans = plan_rescale(proto, peaks, fp16_step.ACTIVATION_LIMIT)
    if not plans:
        return proto
    try:
        candidate, plans = rescaled(proto, plans)
        check = judge_run(reference, run_model(candidate, feeds), EXACT_GATE)
    except Exception as error:  # noqa: BLE001 - a rescale that cannot be built leaves FP32 keeps as before
        log.info("rescale not applied: %s", error)
        return proto
    if not plans or not check.passed:
        return proto
    for plan in plans:
        before = max(peaks.get(name, 0.0) for name in plan.degrees)
        after = max(peaks.get(name, 0.0) * 2.0 ** (-plan.octaves * degree) for name, degree in plan.degrees.items())
        report.add(Finding.of(
            "CNV020",
            f"input '{plan.source}' scaled by 2^-{plan.octaves} before FP16: the activations it leads to reached "
            f"{before:.3g} (FP16 holds 65504), now {after:.3g}; the scale is taken out at "
            f"{', '.join(plan.absorbed_at) or 'no node (it cancels)'}; verified against the original in FP32: max "
            f"abs diff {check.max_abs_diff:.3g}",
            fix="nothing to do; --no-rescale keeps those nodes in FP32 instead (an EP computing in FP16 overflows "
                "there)"))
    return candidate


def convert_to_fp16(proto: ModelProto, options: ConvertOptions, feeds, reference, report: StepResult, activations=None):
    """FP16 with the range scans first (constants, activations), the EP's FP32-only ops kept, and
    the mixed-precision search; returns (converted model, verification, kept nodes).
    ``activations``: ``proto``'s intermediates (transforms/verify.py: Intermediates), reused when
    prefolding leaves the graph as it is."""
    fp16_step.ensure_node_names(proto)
    scan = fp16_step.scan_constants(proto)
    before = [(n.op_type, tuple(n.input), tuple(n.output)) for n in proto.graph.node]
    prefolded = prefold(proto, feeds, reference, report)
    unchanged = (
        prefolded is proto and [(n.op_type, tuple(n.input), tuple(n.output)) for n in proto.graph.node] == before
    )
    proto = prefolded
    if not unchanged:
        activations = None  # prefolding changed the graph: its intermediates are other tensors
    fp16_step.ensure_node_names(proto)
    remaining = scan.overflow if unchanged else fp16_step.scan_constants(proto).overflow
    overflow_names = {name for name, _ in remaining}
    if overflow_names:
        # what prefolding left: BNs reading such constants whose rank is unknown, and the like
        fp16_step.fold_batchnorms(proto, overflow_names)
        remaining = fp16_step.scan_constants(proto).overflow
        activations = None  # the graph changed in place: its intermediates are read again
    if reference is not None and options.rescale:
        if activations is None:
            activations = Intermediates(proto, feeds)
        scaled = rescale_inputs(proto, activations, feeds, reference, report)
        if scaled is not proto:
            proto, activations = scaled, None
    run = Fp16Search(proto, options, feeds, reference, report)
    for name, peak in scan.overflow:
        handled = (
            "folded away before conversion"
            if name not in {n for n, _ in remaining}
            else "kept in FP32 with its consumers"
        )
        report.add(
            Finding.of(
                "CNV001",
                f"constant '{name}' holds values up to {peak:.4g}, beyond FP16's 65504 (onnxconverter-common "
                f"would clamp it); {handled}",
                fix="nothing to do: ortprep handled it",
            )
        )
    for name, _ in remaining:
        for node in proto.graph.node:
            if name in node.input:
                run.keep(node.name, KeepReason.CONSTANT_RANGE, f"reads constant '{name}' beyond FP16's range")
    for name, tiny, total in scan.underflow:
        report.add(
            Finding.of(
                "CNV002",
                f"constant '{name}': {tiny} of {total} values are smaller than FP16 can hold (2^-24) and become zero",
                fix="usually harmless; if accuracy suffers, --block-node the consumer",
            )
        )
    for op, reason in fp32_op_types(ModelHandle(proto=proto, path=None), options, report).items():
        run.block_ops.setdefault(op, reason)
    if reference is not None:
        if activations is None:
            activations = Intermediates(proto, feeds)
        run.source_activations = activations
        peaks = activations.peaks()
        if getattr(options, "inputs", None) is None:
            # Made-up inputs say nothing of the range real ones reach: openwakeword's mel front end
            # verified at cosine 1 on random [0, 1) samples, then gave NaN on audio in int16's
            # scale (a Pow of its STFT beyond 65,504), where --inputs kept 12 nodes in FP32.
            reached = (f"the largest activation on them is {max(peaks.values(), default=0.0):.3g}"
                       if peaks is not None else "their activations could not be read")
            report.add(
                Finding.of(
                    "CNV017",
                    f"FP16 was verified on inputs ortprep made, not on yours: {reached} (FP16 holds up to 65504); "
                    "inputs of another range (audio in int16's scale, pixels in 0..255) can overflow where these "
                    "did not, and the nodes that must stay FP32 are chosen from what these inputs reach",
                    fix="pass a real sample: --inputs FILE.npz (one array per input)",
                )
            )
        if peaks is not None:
            flagged = fp16_step.activation_overflow_nodes(proto, peaks)
            for name, peak in flagged.items():
                run.keep(
                    name,
                    KeepReason.ACTIVATION_RANGE,
                    f"activations reach {peak:.4g}, beyond FP16's safe range",
                    replace=False,
                )
            if flagged:
                report.add(
                    Finding.of(
                        "CNV003",
                        f"{len(flagged)} node(s) produce or read activations beyond FP16's range on the test inputs "
                        f"({', '.join(sorted(flagged)[:5])}); they stay FP32",
                        fix="pass real inputs with --inputs FILE.npz to base this on your data",
                    )
                )
    converted, result = run.convert()
    for repair in run.repairs:
        log.info("repair: %s", repair)
    kept = run.kept(converted) if converted is not None else []
    for name, reason in run.block_nodes.items():
        if not any(k.name == name for k in kept):
            op_type = next((n.op_type for n in proto.graph.node if n.name == name), "?")
            kept.append(fp16_step.KeptNode(name, op_type, reason))
    localized = sum(1 for why in run.keep_reasons.values() if why == KeepReason.ERROR_STARTS)
    if result is not None and result.passed and localized:
        report.add(
            Finding.of(
                "CNV009",
                f"verification passed with mixed precision after {run.rounds} round(s): "
                f"{localized} node(s) kept in FP32",
                fix="see kept_fp32_nodes",
            )
        )
    return converted, result, kept


def blame(source: ModelProto, bad: set[str], kept: set[str], failure: str | None) -> dict[str, tuple[KeepReason, str]]:
    """The nodes to keep in FP32 next round, given the tensors whose FP16 values differ (``bad``),
    the nodes already kept, and why ORT could not run the FP16 model (``failure``), if it could not."""
    culprits: dict[str, tuple[KeepReason, str]] = {}
    first_bad = None
    for node in source.graph.node:
        if node.name in kept:
            continue
        outs_bad = any(o in bad for o in node.output)
        if not outs_bad:
            continue
        first_bad = first_bad or node
        if not any(i in bad for i in node.input):
            culprits[node.name] = (KeepReason.ERROR_STARTS, "its FP16 output differs from FP32 beyond the gate")
    if not culprits and first_bad is not None:
        culprits[first_bad.name] = (KeepReason.ERROR_STARTS, "first node whose FP16 output differs beyond the gate")
    if not culprits:
        # The error starts in nodes already kept in FP32: what feeds them (e.g. two FP16 weights
        # whose difference matters) goes to FP32 too.
        producers = {out: node for node in source.graph.node for out in node.output}
        for node in source.graph.node:
            if node.name in kept and any(o in bad for o in node.output):
                for name in node.input:
                    upstream = producers.get(name)
                    if upstream is not None and upstream.name not in kept:
                        culprits[upstream.name] = (KeepReason.FEEDS_KEPT,
                                                   f"feeds '{node.name}', whose output differs even in FP32")
    if not culprits and failure is not None:
        # Fails without a node to blame: keep every remaining float node of the main graph in FP32.
        for node in source.graph.node:
            if node.name not in kept:
                culprits[node.name] = (KeepReason.NO_RUN, f"ORT could not run the FP16 model ({failure[:120]})")
    return culprits
