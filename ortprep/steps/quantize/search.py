"""The accuracy search of ``quantize --auto-exclude``, wired to a model: which nodes to keep in
float, and which to keep off the target EP.

Each trial quantizes (in the quantizer's child) with a set of nodes kept in float and is judged
on the held-back samples (:mod:`.runner`). Where the baseline fails the gate and the target EP
alone fails, nodes are first kept off the EP (:mod:`.moves`); then the search (:mod:`.strategy`:
rules, the ranked bisection, where the error starts, the 16-bit rung and the float end) runs on
one :class:`~ortprep.prove.reduction.Budget` of trials and seconds; where it did not pass, the
move again from its result. Remedies tried before the search live in :mod:`.remedies`.

Judged on the target EP too (ep_gate.py), the search accepts, rejects and compares trials on the
worse of the two sides; only the EP's final outputs are visible, so the ranking stays the CPU
side's per-tensor quantization noise.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import onnx
from onnx import ModelProto

from ortprep.options import QuantizeOptions
from ortprep.prove.reduction import Budget
from ortprep.runtime.budget import step_left
from ortprep.steps.quantize.engines import Exclusion
from ortprep.steps.quantize.ep_gate import first_divergence
from ortprep.steps.quantize.diagnose import tensor_noise, worst_nodes
from ortprep.steps.quantize.mend import mend_session
from ortprep.steps.quantize.front_end import region_move
from ortprep.steps.quantize.moves import keep_off_ep_move, late_move
from ortprep.steps.quantize.presets import quantizer_op_types
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.sensitivity import tensor_sensitivity
from ortprep.steps.quantize.strategy import NOISE_FLOOR, Search
from ortprep.steps.quantize.trials import Trial, margin_aim
from ortprep.transforms.qdq.facts import output_writers
from ortprep.transforms.verify import model_bytes

# EPs for which the search's 16-bit rung is tried: ORT's CPU EP, which runs QDQ models whose
# activations mix 8 and 16 bits (its Q/DQ kernels take 16-bit types). QNN's HTP runs 8-bit
# activations only where asked for (its preset is 16-bit); mixed widths were not measured there
# (docs/decisions/reduce-quantize-search.md).
MIXED_WIDTH_EPS = (None, "cpu")
# the share of --search-seconds the 16-bit rung's ranking by the outputs' change may take
SENSITIVITY_SHARE = 0.25


def wide_rung(options: QuantizeOptions, settings: dict) -> bool:
    """Whether the search has a 16-bit rung: static QDQ with 8-bit activations, for an EP that runs
    mixed widths."""
    return (options.mode == "static" and settings.get("format") == "qdq"
            and settings.get("activation_type") in ("uint8", "int8") and options.ep in MIXED_WIDTH_EPS)


def run_search(trials: Trials, source: Path, baseline: Trial, options: QuantizeOptions, proto: ModelProto
               ) -> tuple[Trial, dict, dict[str, str]]:
    """The search from ``baseline`` on the float model ``source`` (``proto``: its graph): the best
    trial, the search's record for the report, and why each node it kept float was kept."""
    float_graph = proto.graph
    producers = {out: node.name for node in float_graph.node for out in node.output}
    consumers: dict[str, list[str]] = {}
    for node in float_graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.name)

    def worst_sample(trial: Trial) -> int:
        """The evaluation sample the trial did worst on (its lowest cosine over both sides)."""
        cosines = trials.evaluations[trial.path].worst_sample_cosines if trial.path in trials.evaluations else []
        return cosines.index(min(cosines)) if cosines else 0

    def focus(trial: Trial) -> tuple[list, int, str]:
        """The samples the search looks at for ``trial``, the index of its worst there, and their
        name: the held-back samples, or, where only the calibration samples fail it (the held-back
        ones pass: evaluate.confirm), those, since the error the search must remove shows there."""
        evaluation = trials.evaluations.get(trial.path)
        confirmed = evaluation is not None and evaluation.confirmation is not None
        side = evaluation.confirmation.failing if confirmed else None
        if side is not None and side.sample_cosines and evaluation.cpu_verdict and (
                evaluation.on_ep is None or evaluation.on_ep.passed):
            # the confirmation judged the held-back samples first, then the calibration samples
            worst = side.sample_cosines.index(min(side.sample_cosines))
            held = evaluation.confirmation.held_back
            if worst >= held:
                return trials.margin_feeds(), worst - held, "calibration"
            return trials.eval_feeds, worst, "held-back"
        return trials.eval_feeds, worst_sample(trial), "held-back"

    def rank(trial: Trial, kept: list[str], floor: float = NOISE_FLOOR) -> list[tuple[str, list[str], float]]:
        if trial.path is None:
            return []
        # the sample the trial did worst on (where calibration's ranges clip, say) and one more
        feeds, worst, _ = focus(trial)
        picked = [feeds[worst]] + [f for i, f in enumerate(feeds[:2]) if i != worst][:1]
        noise = tensor_noise(source, trial.path, picked, cache=trials.caches.setdefault(source, {}))
        # a tensor stays float only when the node writing it and every node reading it are float
        return [(tensor, ([producers[tensor]] if tensor in producers else []) + consumers.get(tensor, []), score)
                for tensor, score in noise if score > floor]

    def sensitivity(trial: Trial, kept: list[str], first: list[str]) -> list[tuple[str, list[str], float]]:
        """The quantized tensors by how much each alone moves the outputs (sensitivity.py), on the
        samples rank reads, ``first`` (the rung's noise order) measured first; those it did not
        reach in its time are left to that order."""
        if trial.path is None:
            return []
        feeds, worst, _ = focus(trial)
        picked = [feeds[worst]] + [f for i, f in enumerate(feeds[:2]) if i != worst][:1]
        # within its share of --search-seconds, of what the search has left, and of the step's bound
        seconds = min(SENSITIVITY_SHARE * options.search_seconds,
                      options.search_seconds - (time.monotonic() - trials.started), step_left() or math.inf)
        if seconds <= 0:
            return []
        moved = tensor_sensitivity(source, trial.path, picked, seconds=seconds, first=first)
        # a change under 1 - --min-cosine leads nothing (a relative change of 0.01 costs the cosine
        # about 0.00005): the noise order places those tensors
        floor = 1.0 - options.min_cosine
        return [(tensor, ([producers[tensor]] if tensor in producers else []) + consumers.get(tensor, []), change)
                for tensor, change in moved if change > floor]

    ops = set(trials.settings["op_types"] or quantizer_op_types(options.mode, trials.settings["format"]))
    # the share is of the nodes the quantizer would quantize
    quantizable = {node.name for node in proto.graph.node if node.op_type in ops}
    first_rules = []
    off_records: list[dict] = []
    off_reasons: dict[str, str] = {}
    # a session the target EP cannot build: its culprits kept off it first (mend.py); where nothing
    # mends it, no float set can, and the search ends with the reduction's result
    baseline, mended, off_reasons = mend_session(trials, source, baseline, options)
    if mended is not None and not mended["mended"]:
        return baseline, {"aim": margin_aim(options.min_cosine), "trials": [], "rules": [], "ranked": [],
                          "sensitivity": [],
                          "stopped": f"{mended.get('reason')} (search.mend)",
                          "off_ep": [], "off_ep_reasons": {}, "mend": mended}, {}
    if mended is not None:
        trials.off = list(baseline.off)  # every later trial keeps them off too
    evaluation = trials.evaluations.get(baseline.path) if baseline.path is not None else None
    if evaluation is not None and evaluation.ep_only and evaluation.on_ep.error is None and trials.target is not None:
        # the EP alone gets some outputs wrong: the nodes where its run first parts from the CPU EP's,
        # kept off the EP first (off_target.py: kept float, the EP would still compute them), then kept float
        parted = first_divergence(trials.target, baseline.path, trials.eval_feeds[:2], trials.workdir)
        budget = Budget(seconds=options.search_seconds, started=trials.started)
        moved, off_records, moved_reasons = keep_off_ep_move(trials, source, baseline, parted,
                                                              margin_aim(options.min_cosine), budget)
        off_reasons = {**off_reasons, **moved_reasons}
        if moved is not baseline:
            trials.off = list(moved.off)  # every later trial keeps them off too
            baseline = moved
        names = list(dict.fromkeys(entry["node"] for entry in parted[:3]))
        if names:
            first_rules.append((f"the nodes where {evaluation.on_ep.ep} first parts from the CPU EP "
                                f"({', '.join(names)})",
                                names))
    if evaluation is not None and evaluation.ep_only and evaluation.on_ep.error is None:
        # then the nodes writing the outputs it gets wrong (their encoding, their precision)
        wrong = evaluation.on_ep.wrong_outputs()
        names, _ = output_writers(onnx.load(str(baseline.path), load_external_data=False), wrong)
        if names:
            first_rules.append((f"the nodes that write the outputs {evaluation.on_ep.ep} gets wrong "
                                f"({', '.join(wrong[:4])})",
                                names))
    def blame(trial: Trial, kept: list[str]) -> list[tuple[str, str, float]]:
        if trial.path is None or not trials.eval_feeds:
            return []
        feeds, worst, which = focus(trial)
        return worst_nodes(source, trial.path, feeds[worst], set(kept), limit=None,
                           cache=trials.caches.setdefault(("blame", which, str(source), worst), {}))

    search = Search(proto, lambda kept, label: trials.attempt(source, kept, label), rank, quantizable_nodes=quantizable,
                    max_float_share=options.max_float_share, fixed=list(trials.fixed),
                    budget=Budget(probes=options.max_exclude_rounds + 1, seconds=options.search_seconds,
                                  started=trials.started),
                    aim=margin_aim(options.min_cosine), first_rules=first_rules, blame=blame,
                    fine_rank=lambda trial, kept: rank(trial, kept, floor=0.0),
                    clock=trials.target.clock if trials.target is not None else None,
                    attempt_wide=(lambda kept, wide, label: trials.attempt(source, kept, label, wide=wide))
                    if wide_rung(options, trials.settings) and trials.engine.supports(
                        options.mode, trials.settings, Exclusion(wide_tensors=("",))) is None else None,
                    sensitivity=sensitivity)
    result = search.run(baseline)
    if not off_records and not search.ok(result.best):
        # nothing parted below DIVERGED before the search, and the search did not pass: the move
        # again from its result, where the EP's run is farthest from the CPU EP's or, where no
        # exposed tensor is apart, from the node that writes what it gets wrong
        late, off_records, late_reasons = late_move(trials, source, result.best, options)
        off_reasons = {**off_reasons, **late_reasons}
        if late is not result.best:
            result.best = late
            result.stopped += ("; then nodes kept off the EP "
                               + ("passed the gate" if search.ok(late) else "improved it")
                               + " (search.off_ep)")
    if not search.ok(result.best):
        # several ops of one region computed wrongly on the EP (an audio front end): the region itself
        region, region_records, region_reasons = region_move(trials, source, result.best, options)
        off_records = [*off_records, *region_records]
        if region is not result.best:
            result.best, off_reasons = region, {**off_reasons, **region_reasons}
            result.stopped += ("; then a region kept off the EP " + ("passed the gate" if search.ok(region)
                                                                     else "improved it") + " (search.front_end)")
    size_before = max(model_bytes(source), 1)
    record = {"aim": search.aim, "trials": [t.to_record(size_before) for t in result.trials], "rules": result.rules,
              "ranked": result.ranked[:50],
              "sensitivity": [{"tensor": tensor, "change": round(change, 6)}
                              for tensor, change in search.sensitive[:20]],
              "stopped": result.stopped, "off_ep": off_records,
              "off_ep_reasons": {name: off_reasons.get(name, "kept off the EP") for name in result.best.off},
              "mend": mended}
    return result.best, record, result.reasons
