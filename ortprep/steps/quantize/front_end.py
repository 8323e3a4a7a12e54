"""Keeping a whole subgraph off the target EP where it computes it wrongly (``quantize
--auto-exclude``, after the moves of :mod:`.moves`).

The moves keep off one node and the nodes alike to it; where the EP computes several different
ops of one region wrongly (an audio front end: STFT as Conv, Pow, Log, a dB floor: QNN's HTP
comes out near zero in every precision, FP16 included), no such set mends the output. This move
keeps off the region itself, each set one trial judged like every other, on top of the best so far:

1. the front end: the node where the EP's run first parts from the CPU EP's and every node before
   it (an error that only a Log shows, of small values a Pow computed otherwise, starts there);
2. the span: that node and every node after it on the way to the outputs the EP gets wrong;
3. both together;
4. where none reaches the aim, the front end again with nothing else float (the float nodes the
   search chose for the front end's error stay float on the EP past it), then the EP's own moves
   from there, the region growing to where the EP parts past it (region_restart).

A set over --max-float-share of the graph's nodes is not tried (the EP is meant to run most of
the model), nor one after which the EP's session holds fewer nodes than the set accounts for
(moves.placement_lost). Measurement: docs/decisions/mend52-failing-sessions.md.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from ortprep.options import QuantizeOptions
from ortprep.prove.reduction import Budget
from ortprep.steps.quantize.ep_gate import first_divergence
from ortprep.steps.quantize.moves import keep_off_ep_move, placement_lost
from ortprep.steps.quantize.off_target import movable
from ortprep.steps.quantize.runner import Trials
from ortprep.steps.quantize.trials import Trial, change, ep_only, improved, margin_aim, reaches_margin
from ortprep.transforms.off_ep import OFF_EP_PREFIX, QDQ_OPS

# Tensors where the EP's run parts, looked for (first_divergence's limit); the first counts.
PARTED_LIMIT = 2
# Region sets restarted from (region_restart), in the order tried, where none reached the aim.
RESTARTS = 1
# Times a restarted region grows to where the EP parts past it (region_restart).
GROWTHS = 2


def region_sets(proto: onnx.ModelProto, parted: list[str], wrong_outputs: list[str]) -> list[tuple[str, list[str]]]:
    """(label, compute node names) of the move's sets in the QDQ graph ``proto``: ``parted``, the
    nodes where the EP's run parts, in graph order; ``wrong_outputs``, the graph outputs it gets
    wrong. Q/DQ nodes and the If nodes of earlier moves are not named (a node kept off takes its
    Q/DQ nodes along)."""
    graph = proto.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    users: dict[str, list] = {}
    for node in graph.node:
        for name in _reads(node):
            users.setdefault(name, []).append(node)
    order = {node.name: index for index, node in enumerate(graph.node)}

    def computes(node) -> bool:
        return node.op_type not in QDQ_OPS and not node.name.startswith(OFF_EP_PREFIX)

    def before(names: list[str], values: list[str]) -> set[str]:
        seen, stack = set(names), [v for v in values]
        while stack:
            node = producer.get(stack.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            stack.extend(_reads(node))
        return seen

    def after(name: str) -> set[str]:
        nodes = {node.name: node for node in graph.node}
        seen, stack = set(), [name]
        while stack:
            current = stack.pop()
            if current in seen or current not in nodes:
                continue
            seen.add(current)
            stack.extend(user.name for out in nodes[current].output for user in users.get(out, []))
        return seen

    named = [n for n in parted if n in order and n in {node.name for node in graph.node if computes(node)}]
    if not named:
        return []
    kept = {node.name for node in graph.node if computes(node)}
    span = after(named[0]) & before([], list(wrong_outputs)) & kept if wrong_outputs else set()
    first = next(node for node in graph.node if node.name == named[0])
    front = before([first.name], list(_reads(first))) & kept
    ranked = lambda names: sorted(names, key=order.__getitem__)  # noqa: E731 - graph order
    sets = [(f"the front end: the {len(front)} node(s) from the inputs to {first.name}, where it first parts", front),
            (f"the {len(span)} node(s) from {first.name}, where it first parts, to the outputs it gets wrong", span),
            ("the front end and the span together", span | front)]
    chosen: list[tuple[str, list[str]]] = []
    for label, names in sets:
        if names and all(set(names) != set(other) for _, other in chosen):
            chosen.append((label, ranked(names)))
    return chosen


def _reads(node) -> list[str]:
    """The values ``node`` reads, its subgraphs' outer values included (an If of an earlier move)."""
    names = [name for name in node.input if name]
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            inner = {out for n in attribute.g.node for out in n.output} | {t.name for t in attribute.g.initializer}
            names += [name for n in attribute.g.node for name in n.input if name and name not in inner]
    return names


def region_move(trials: Trials, source: Path, best: Trial, options: QuantizeOptions
                ) -> tuple[Trial, list[dict], dict[str, str]]:
    """The sets of :func:`region_sets` kept off the EP from ``best`` (the search's result, failing
    on the EP alone), each one trial, taken where it improved on the best; until one reaches the
    search's aim. Bound by --search-seconds and --ep-total-seconds. Returns the best trial, a record
    per set, and why each node of it was kept off."""
    evaluation = trials.evaluations.get(best.path) if best.path is not None else None
    target = trials.target
    if (evaluation is None or target is None or evaluation.on_ep is None or evaluation.on_ep.error is not None
            or not ep_only(best)):
        return best, [], {}
    proto = onnx.load(str(best.path), load_external_data=False)
    budget = Budget(seconds=options.search_seconds, started=trials.started)
    if not movable(proto) or budget.out_of_time() or (target.clock is not None and target.clock.exhausted):
        return best, [], {}
    parted = first_divergence(target, best.path, trials.eval_feeds[:2], trials.workdir, limit=PARTED_LIMIT,
                              nearest=True)
    names = [entry["node"] for entry in parted if entry.get("node")]
    total = sum(1 for node in proto.graph.node if node.op_type not in QDQ_OPS)
    limit = max(1, int(options.max_float_share * total))
    aim = margin_aim(options.min_cosine)
    start, records, reasons = best, [], {}
    admissible: list[tuple[str, list[str]]] = []  # sets whose trial ran with the EP's placement kept
    for label, nodes in region_sets(proto, names, evaluation.on_ep.wrong_outputs()):
        off = list(dict.fromkeys([*best.off, *nodes]))
        if set(off) == set(best.off):
            continue
        if len(off) - len(start.off) > limit:
            records.append({"label": label, "nodes": len(nodes), "skipped": f"more than --max-float-share "
                            f"({options.max_float_share:g}) of the graph's {total} nodes"})
            continue
        if budget.out_of_time() or (target.clock is not None and target.clock.exhausted):
            records.append({"label": label, "nodes": len(nodes), "skipped": "the time bound"})
            break
        outcome = trials.attempt(source, list(best.kept), f"off {target.ep}: {label}", off=off)
        lost = placement_lost(trials, start, outcome, len(off) - len(start.off))
        helped = not lost and improved(outcome, best)
        placed = trials.evaluations.get(outcome.path) if outcome.path is not None else None
        if (not lost and outcome.error is None and placed is not None and placed.on_ep is not None
                and placed.on_ep.placement):
            admissible.append((label, nodes))
        records.append({"label": label, "nodes": len(off) - len(best.off), "cosine_before": best.cosine,
                        "cosine_after": outcome.cosine, "passed": outcome.passed, "error": outcome.error,
                        "kept": helped, **({"placement_lost": lost} if lost else {})})
        if helped:
            why = f"a region {target.ep} computes otherwise than the CPU EP: {label}; judged {change(best, outcome)}"
            reasons.update({name: why for name in nodes if name not in best.off})
            best = outcome
        if reaches_margin(best, aim):
            break
    for label, nodes in admissible[:RESTARTS]:
        if reaches_margin(best, aim) or budget.out_of_time() or (target.clock is not None and target.clock.exhausted):
            break
        restarted, more, why = region_restart(trials, source, start, best, label, nodes, aim, budget)
        if restarted is not best:
            for record in records:  # the region move's sets it replaces
                if record.get("kept"):
                    record["superseded"] = True
            best = restarted
        records += more
        reasons.update(why)
    return best, records, reasons


def region_restart(trials: Trials, source: Path, start: Trial, best: Trial, label: str, nodes: list[str],
                   aim: float, budget: Budget) -> tuple[Trial, list[dict], dict[str, str]]:
    """The region ``nodes`` kept off the EP (and float) with nothing else kept float, then the EP's
    own moves (moves.keep_off_ep_move) from there. The search's float nodes were chosen for the
    error the region made; past the region they stay float on the EP, which computes them in its own
    float precision, and the region's error hid where the EP parts next. Where it parts again past
    the region, the region grows to the last node found parting (GROWTHS times at most, within
    --max-float-share) and the restart runs again. Regions are read from the float graph (their
    upstream closure); one over the share is not restarted. A trial after which the EP's session
    holds fewer nodes than the region accounts for (moves.placement_lost, against ``start``, the
    search's result) is never taken. The best result is taken where it improved on ``best``
    (openWakeWord's mel front end and embedding as one model: docs/decisions/mend52-failing-sessions.md).
    Records of a growth superseded by a later one say so."""
    target = trials.target
    float_graph = onnx.load(str(source), load_external_data=False).graph
    total = sum(1 for node in float_graph.node if node.op_type != "Constant")
    limit = max(1, int(trials.options.max_float_share * total))

    def stopped() -> bool:
        return budget.out_of_time() or (target.clock is not None and target.clock.exhausted)

    # the region as the float graph has it: a node the quantizer fused away (a Relu into its Conv's
    # output) is named in no QDQ graph, and left out it would sit on the EP between two Ifs
    region = upstream(float_graph, nodes)
    if len(region) > limit:
        return best, [{"label": f"{label}; the rest quantized afresh", "nodes": len(region), "restart": True,
                       "skipped": f"more than --max-float-share ({trials.options.max_float_share:g}) of the "
                                  f"graph's {total} nodes with the nodes it reads from"}], {}
    records: list[dict] = []
    found, found_reasons, taken = best, {}, None  # taken: the records of the growth found
    for grown in range(GROWTHS + 1):
        if stopped():
            break
        what = label if not grown else f"{label}, grown to {len(region)} node(s) where {target.ep} parts past it"
        off = list(dict.fromkeys([*trials.off, *region]))
        kept = list(dict.fromkeys([*trials.fixed, *region]))
        fresh = trials.attempt(source, kept, f"off {target.ep}: {what}; the rest quantized afresh", off=off)
        lost = placement_lost(trials, start, fresh, len(set(off) - set(start.off)))
        entry = {"label": f"{what}; the rest quantized afresh", "nodes": len(region), "restart": True,
                 "cosine_before": best.cosine, "cosine_after": fresh.cosine, "passed": fresh.passed,
                 "error": fresh.error, "kept": False, **({"placement_lost": lost} if lost else {})}
        these = [entry]
        if lost or fresh.path is None:
            records += these
            break
        result, reasons, parted = fresh, {}, []
        if ep_only(fresh) and not stopped():
            parted = first_divergence(target, fresh.path, trials.eval_feeds[:2], trials.workdir)
            result, moved, reasons = keep_off_ep_move(trials, source, fresh, parted, aim, budget,
                                                      starts=len(parted))
            these += [{**record, "restart": True} for record in moved]
        records += these
        if improved(result, found):
            entry["kept"] = True  # this restart, or the moves from it, improved on what came before
            if taken is not None:
                for record in taken:
                    if record.get("kept"):
                        record["superseded"] = True
            why = (f"a region {target.ep} computes otherwise than the CPU EP, kept off with the rest quantized "
                   f"afresh: {what}; judged {change(best, result)}")
            found, found_reasons, taken = result, {**{name: why for name in region}, **reasons}, these
        else:
            for record in these[1:]:  # moves from a restart not taken
                if record.get("kept"):
                    record["superseded"] = True
        if reaches_margin(found, aim) or not parted:
            break
        wider = upstream(float_graph, [*region, parted[-1]["node"]])
        if len(wider) == len(region) or len(wider) > limit:
            break
        region = wider
    return found, records, found_reasons


def upstream(graph: onnx.GraphProto, names: list[str]) -> list[str]:
    """``names`` and every compute node of the float ``graph`` they read from, in graph order
    (Constant nodes left out: they move with their readers)."""
    producer = {out: node for node in graph.node for out in node.output if out}
    seen: set[str] = set()
    wanted = set(names)
    stack = [node for node in graph.node if node.name in wanted]
    while stack:
        node = stack.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        stack.extend(producer[name] for name in _reads(node) if name in producer)
    return [node.name for node in graph.node if node.name in seen and node.op_type != "Constant"]
