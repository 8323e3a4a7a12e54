"""Keeping nodes off the target EP (``quantize --auto-exclude`` where the EP alone fails): the
nodes where the EP's run parts from the CPU EP's, and those alike to them, moved into If nodes the
CPU EP runs (:mod:`.off_target`). Kept float, the EP would still compute them in its own kernels.
Before the search (:func:`keep_off_ep_move`), after it (:func:`late_move`), and for a result whose
calibration samples fail on the EP (:func:`confirmation_move`). Measurements:
docs/decisions/reduce-quantize-search.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import onnx

from ortprep.options import QuantizeOptions
from ortprep.prove.reduction import Budget
from ortprep.steps.quantize.ep_gate import GateTarget, first_divergence
from ortprep.fidelity.evaluation import Judgement
from ortprep.steps.quantize.evaluate import confirm_on_target
from ortprep.steps.quantize.off_target import candidate_sets, movable
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.trials import Trial, change, improved, margin_aim, reaches_margin
from ortprep.transforms.off_ep import OFF_EP_PREFIX, QDQ_OPS
from ortprep.transforms.qdq.facts import output_writers

# A node kept off the EP takes its activations' QuantizeLinear and DequantizeLinear nodes along:
# a move of N nodes may take up to this many times N off the EP's share, no more.
MOVE_NODE_SLACK = 8


def placement_lost(trials: Trials, before: Trial, after: Trial, moved: int) -> str | None:
    """Why the EP's run of ``after`` (``before`` with ``moved`` more nodes kept off the EP) no longer
    shows what the EP computes: its session took fewer nodes than the move accounts for (an EP can
    drop a whole capability around the If nodes: docs/decisions/reduce-quantize-search.md). None
    where both placements keep the share, or either is unknown."""
    old = trials.evaluations.get(before.path) if before.path is not None else None
    new = trials.evaluations.get(after.path) if after.path is not None else None
    was = old.on_ep.placement if old is not None and old.on_ep is not None else None
    now = new.on_ep.placement if new is not None and new.on_ep is not None else None
    if not was or not now or was["nodes_on_ep"] - now["nodes_on_ep"] <= MOVE_NODE_SLACK * moved:
        return None
    return (f"the EP's session took {now['nodes_on_ep']} of {now['nodes_total']} nodes after the move, "
            f"{was['nodes_on_ep']} of {was['nodes_total']} before: its outputs are no longer the EP's")


def keep_off_ep_move(trials: Trials, source: Path, baseline: Trial, parted: list[dict], aim: float,
                     budget: Budget | None, accept: Callable[[Trial], tuple[bool, str | None]] | None = None,
                     starts: int = 1) -> tuple[Trial, list[dict], dict[str, str]]:
    """The trials of the move from ``baseline`` (whose EP side alone fails; ``parted``: where the
    EP first parts, ep_gate.first_divergence, or parting_points): the best trial (``baseline``
    where none improved on it), a record per trial, and why each node of the best was kept off.
    The candidate sets (off_target.candidate_sets) of the first ``starts`` entries of ``parted``
    are tried in turn, each on top of the best so far. ``accept``: a trial is taken only when it
    says so (confirmation_move: its calibration samples pass on the EP; with why not, where that is
    not the samples' verdict), and the first taken ends the move; otherwise a trial is taken where
    it improved on the best. ``budget``: its seconds (--search-seconds) bound the move, as the
    target EP's clock does."""
    if not parted or baseline.path is None or trials.target is None:
        return baseline, [], {}
    ep = trials.target.ep
    total = sum(1 for node in onnx.load(str(baseline.path), load_external_data=False).graph.node
                if node.op_type not in QDQ_OPS)
    limit = max(1, int(trials.options.max_float_share * total))
    best, records, reasons = baseline, [], {}
    tried: list[set[str]] = []
    taken: list[tuple[str, list[str]]] = []  # the sets kept, in order

    def done() -> bool:
        return best is not baseline and (accept is not None or reaches_margin(best, aim))

    usable = [entry for entry in parted if entry["node"] and not entry["node"].startswith(OFF_EP_PREFIX)]
    for first in usable[:starts]:
        for label, names in candidate_sets(baseline.path, first["node"], limit, where=first.get("where")):
            off = list(dict.fromkeys([*best.off, *names]))
            if set(off) in tried or set(off) == set(best.off) or len(off) - len(baseline.off) > limit:
                continue  # tried, nothing new, or more than the float share allows
            tried.append(set(off))
            clock = trials.target.clock
            if (budget is not None and budget.out_of_time()) or (clock is not None and clock.exhausted):
                spent = clock is not None and clock.exhausted
                why = "--ep-total-seconds" if spent else "the time bound (--search-seconds)"
                records.append({"nodes": len(names), "label": label, "skipped": why})
                return best, records, reasons
            outcome = trials.attempt(source, list(baseline.kept), f"off {ep}: {label}", off=off)
            lost = placement_lost(trials, baseline, outcome, len(off) - len(baseline.off))
            unconfirmed = None
            if lost:
                helped = False
            elif accept is not None:
                helped, unconfirmed = accept(outcome)
            else:
                helped = improved(outcome, best)
            records.append({"label": label, "nodes": len(off) - len(best.off), "cosine_before": best.cosine,
                            "cosine_after": outcome.cosine, "passed": outcome.passed, "error": outcome.error,
                            "kept": helped,
                            **({"confirmed": helped} if accept is not None else {}),
                            **({"not_confirmed": unconfirmed} if unconfirmed else {}),
                            **({"placement_lost": lost} if lost else {})})
            if helped:
                at = (f"first parting at {first['node']} ({first['op_type']}, cosine {first['cosine']:.4f} there)"
                      if "where" not in first else
                      f"seen at '{first['tensor']}' ({first['op_type']} {first['node']}, cosine {first['cosine']:.6f} "
                      "there)")
                why = f"computed otherwise on {ep} than on the CPU EP: {label}; {at}; judged {change(best, outcome)}"
                reasons = {**reasons, **{name: why for name in names}}
                best = outcome
                taken.append((label, names))
            if done():
                if accept is None and len(taken) > 1:
                    best, reasons = _without_needless(trials, source, baseline, best, taken, reasons, aim, records)
                return best, records, reasons
    return best, records, reasons


def _without_needless(trials: Trials, source: Path, baseline: Trial, best: Trial, taken: list[tuple[str, list[str]]],
                      reasons: dict[str, str], aim: float, records: list[dict]) -> tuple[Trial, dict[str, str]]:
    """The passing ``best`` of a move that took several sets (``taken``, in order), without each
    earlier set the result passes without (a set taken first can be needless once a later one
    mends the result). One trial per earlier set."""
    last = set(taken[-1][1])
    for label, names in taken[:-1]:
        dropped = (set(names) - last) & set(best.off)
        if not dropped:
            continue
        off = [name for name in best.off if name not in dropped]
        outcome = trials.attempt(source, list(baseline.kept), f"off {trials.target.ep}: without {label}", off=off)
        fine = (reaches_margin(outcome, aim)
                and not placement_lost(trials, baseline, outcome, len(off) - len(baseline.off)))
        records.append({"label": f"without {label}", "nodes": -len(dropped), "cosine_before": best.cosine,
                        "cosine_after": outcome.cosine, "passed": outcome.passed, "error": outcome.error, "kept": fine})
        if fine:
            best = outcome
            reasons = {name: why for name, why in reasons.items() if name not in dropped}
    return best, reasons


def parting_points(target: GateTarget, model: Path, feeds: list[dict], workdir: Path, side: Judgement) -> list[dict]:
    """Where the EP's run of ``model`` parts from the CPU EP's (ep_gate.first_divergence); else,
    each marked ``where``: the tensor farthest from it (ep_gate.APART_STEPS), then, for each output
    ``side`` (the EP's judgement of the model as it is) gets wrong, the float nodes on the way to it
    and the quantized node that writes it. Exposing tensors as outputs can change what the EP
    computes, so that no tensor parts (docs/decisions/reduce-quantize-search.md)."""
    parted = first_divergence(target, model, feeds, workdir, nearest=True)
    if (parted and "where" not in parted[0]) or side is None:
        return parted
    # then the nodes on the way to each output it gets wrong: the float ones the EP computes (in its
    # own precision: no tensor of theirs is exposed), then the quantized one that writes it
    proto = onnx.load(str(model), load_external_data=False)
    ops = {node.name: node.op_type for node in proto.graph.node}
    outputs = {o["name"]: o for o in side.outputs}
    for name in side.wrong_outputs():
        if name not in outputs:
            continue
        figures = outputs[name]
        quantized, computed = output_writers(proto, [name])
        for node, where in ([(n, "computed in float on the way to the output it gets wrong") for n in computed]
                            + [(n, "where the output it gets wrong is written") for n in quantized]):
            if node not in [entry["node"]
                            for entry in parted] and not node.startswith(OFF_EP_PREFIX):  # not a move's If
                parted.append({"tensor": name, "node": node, "op_type": ops.get(node, "?"), "where": where,
                               "cosine": figures.get("cosine") if figures.get("cosine") is not None else -1.0,
                               "norm_ratio": figures.get("norm_ratio")})
    return parted


# The move after the search starts from at most this many nodes (parting_points), each with its
# candidate sets, while the gate still fails.
LATE_STARTS = 3


def late_move(trials: Trials, source: Path, best: Trial, options: QuantizeOptions
              ) -> tuple[Trial, list[dict], dict[str, str]]:
    """The move (keep_off_ep_move) from the search's result ``best`` where it still fails on the
    EP alone and nothing parted below DIVERGED before the search (parting_points). Bound by
    --search-seconds (as the search) and --ep-total-seconds."""
    evaluation = trials.evaluations.get(best.path) if best.path is not None else None
    if (evaluation is None or trials.target is None or not evaluation.ep_only or evaluation.on_ep is None
            or evaluation.on_ep.error is not None
            or not movable(onnx.load(str(best.path), load_external_data=False))):
        return best, [], {}
    budget = Budget(seconds=options.search_seconds, started=trials.started)
    clock = trials.target.clock
    if budget.out_of_time() or (clock is not None and clock.exhausted):
        return best, [], {}
    parted = parting_points(trials.target, best.path, trials.eval_feeds[:2], trials.workdir, evaluation.on_ep)
    return keep_off_ep_move(trials, source, best, parted, margin_aim(options.min_cosine), budget, starts=LATE_STARTS)


def confirmation_move(trials: Trials, source: Path, best: Trial, options: QuantizeOptions
                      ) -> tuple[Trial, list[dict], dict[str, str]]:
    """The move (keep_off_ep_move) for a result that passed its held-back samples on both EPs and
    its calibration samples on the CPU EP, but whose calibration samples fail on the target EP
    (evaluate.confirm_on_target, which runs them only for the result chosen): where the EP first
    parts on the sample it did worst on, and each trial taken only when its own calibration
    samples pass there too (the held-back samples can all pass while a calibration sample fails
    on the EP, and then the search never ran). It runs after the search, so
    --search-seconds (spent there, or by --auto's earlier attempts) does not bound it: its few
    trials (off_target.candidate_sets: at most four a start; one start where a tensor parts, up to
    LATE_STARTS where none does and parting_points starts from the output's side) are bound by
    --ep-total-seconds."""
    evaluation = trials.evaluations.get(best.path) if best.path is not None else None
    confirmation = evaluation.confirmation if evaluation is not None else None
    side = confirmation.on_ep if confirmation is not None else None
    if (trials.target is None or side is None or side.passed or side.error is not None or not side.sample_cosines
            or not confirmation.cpu.passed or not evaluation.cpu_verdict):
        return best, [], {}
    # the held-back samples come first in the EP's judgement, then the calibration ones
    samples = trials.eval_feeds[:confirmation.held_back] + trials.margin_feeds()
    worst = side.sample_cosines.index(min(side.sample_cosines))
    if worst >= len(samples) or not movable(onnx.load(str(best.path), load_external_data=False)):
        return best, [], {}
    parted = parting_points(trials.target, best.path, [samples[worst]], trials.workdir, side)
    cache = trials.caches.setdefault(source, {})
    needed = len(side.sample_cosines)  # the EP runs the samples in one order: as many reach the one that failed

    def confirmed(outcome: Trial) -> tuple[bool, str | None]:
        judged = trials.evaluations.get(outcome.path) if outcome.path is not None else None
        if not outcome.passed or judged is None:
            return False, None
        confirm_on_target(judged, outcome.path, trials.margin_feeds, trials.target, cache)
        on_ep = judged.confirmation.on_ep if judged.confirmation is not None else None
        reached = len(on_ep.sample_cosines) if on_ep is not None else 0
        if reached < needed:
            # the EP's time left judged fewer samples than showed the error: not a confirmation
            judged.passed = False
            return False, (f"the EP judged {reached} of the {needed} samples that showed the error "
                           "(--ep-seconds, --ep-total-seconds)")
        # (a set that passes short of the decision margin would be refused: the next set may reach it)
        return bool(judged.passed) and reaches_margin(outcome, None), None

    return keep_off_ep_move(trials, source, best, parted, margin_aim(options.min_cosine), None, accept=confirmed,
                            starts=1 if parted and "where" not in parted[0] else LATE_STARTS)
