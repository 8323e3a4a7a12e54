"""What makes a failing session work (``check --prove``): measured, not guessed.

:func:`find_fix` tries provider options first (QNN: other SoCs, then device-independent
options), then a graph change that keeps the culprit units off the EP
(:func:`~ortprep.transforms.off_ep.keep_off_ep`), verified by a session on the EP and by the
original's and the rewrite's outputs on the CPU EP (:func:`verify_on_cpu`). One
:class:`~ortprep.prove.reduction.Budget` bounds it; measurements: docs/decisions/reduce-prove-bounds.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ortprep.errors import OrtprepError
from ortprep.model import ModelHandle
from ortprep.prove.culprits import started
from ortprep.prove.reduction import Budget, Progress, Stopped
from ortprep.transforms.off_ep import QDQ_OPS, CutError, GraphCut, keep_off_ep

# The fix search: one session per candidate, four CPU sessions to verify a graph change, one per
# culprit set when pruning it.
MAX_FIX_SESSIONS = 40
MAX_FIX_SECONDS = 120.0

# QNN provider options tried in this order by find_fix (each: key, value, what it means). The
# first four move the session to another SoC; the others keep the device. Why these, in this
# order, and why enable_htp_graph_splitting is not among them: docs/decisions/reduce-prove-bounds.md.
QNN_OPTION_CANDIDATES: tuple[tuple[str, str, str], ...] = (
    ("soc_model", "60", "Snapdragon X Elite (another SoC)"),
    ("soc_model", "57", "Snapdragon 8 Gen 3 (another SoC)"),
    ("soc_model", "69", "Snapdragon 8 Elite (another SoC)"),
    ("soc_model", "43", "Snapdragon 8 Gen 2 (another SoC)"),
    ("htp_arch", "73", "HTP architecture v73"),
    ("vtcm_mb", "8", "8 MB of VTCM"),
    ("htp_graph_finalization_optimization_mode", "3", "the most thorough graph finalization"),
    ("enable_htp_fp16_precision", "0", "float models in fp32 precision"),
)
DEVICE_KEYS = ("soc_model", "htp_arch")
FLOAT_ONLY_KEYS = ("enable_htp_fp16_precision",)

# (created?, EP message) or (created?, EP message, ORT's assignment {node name: EP} when created)
Session = Callable[[str, dict[str, str]], tuple]


def _is_float_model(cut: GraphCut) -> bool:
    """No QDQ nodes outside constant work: the EP computes it in floating point."""
    return not any(node.op_type in QDQ_OPS for index, node in enumerate(cut.nodes) if index not in cut.free)


def option_candidates(provider: str, current: dict[str, str], *, float_model: bool, keep_device: bool
                      ) -> list[tuple[str, str, str]]:
    """The provider options find_fix tries for ``provider``, in order, without those the session
    already has."""
    if provider != "QNNExecutionProvider":
        return []
    candidates = []
    for key, value, meaning in QNN_OPTION_CANDIDATES:
        if keep_device and key in DEVICE_KEYS:
            continue
        if key in FLOAT_ONLY_KEYS and not float_model:
            continue
        if current.get(key) == value:
            continue
        candidates.append((key, value, meaning))
    return candidates


def find_fix(handle: ModelHandle, culprit: dict[str, Any], session: Session, *, provider: str,
             provider_options: dict[str, str], ep_label: str, workdir: str | Path | None = None,
             command_args: Sequence[str] = (), kinds: Sequence[str] = ("provider_option", "graph"),
             keep_device: bool = False, prune: bool = True, bound: Budget | None = None,
             progress: Progress | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """Measure what makes the session of ``handle`` on ``provider`` (created with
    ``provider_options``, which failed) work, within ``bound`` (default: MAX_FIX_SESSIONS
    sessions and MAX_FIX_SECONDS seconds; the four CPU sessions that verify a graph change count).

    ``session(model_path, provider_options)`` builds the session on a worker and answers
    (created?, EP message). ``kinds``, in order: "provider_option" (one session per candidate of
    :func:`option_candidates`; ``keep_device`` skips those that change the SoC), "graph" (the
    culprit units of ``culprit``, reduce_failure's record, kept off the EP by :func:`keep_off_ep`,
    written into ``workdir``; a fix only when its session is created and its outputs on the CPU
    EP match the original's). ``command_args``: what the user's ``ortprep check`` line had after
    the model besides ``--ep``/``--prove`` (e.g. ["--device", "888"]), for the command given back.

    The record: ``kind`` ("provider_option", "graph" or None), ``options`` or ``model`` (the
    rewritten file), ``moved_nodes`` and ``verified`` for a graph change, ``command``,
    ``sessions``, ``seconds``, ``tried`` (each candidate and its outcome), ``note``; ``reason``
    when nothing worked, ``stopped`` when the bound ended the search. With ``prune`` a graph change
    that works is pruned to the nodes the whole model needs off the EP (``kept_off``; ``pruned``
    the culprits it did not need: artifacts of the probes' cuts, one session each)."""
    budget = started(bound, Budget(MAX_FIX_SESSIONS, MAX_FIX_SECONDS), progress)
    cut = GraphCut(handle.proto, handle.folder)
    model_path = str(handle.path)
    record: dict[str, Any] = {"kind": None, "sessions": 0, "seconds": 0.0, "tried": [], "bound": budget.to_record()}
    found = None
    try:
        for kind in kinds:
            if kind == "provider_option":
                found = _try_options(record, budget, session, model_path, provider, provider_options,
                                     float_model=_is_float_model(cut), keep_device=keep_device)
            elif kind == "graph":
                found = _try_graph(record, budget, session, handle, culprit, provider, provider_options, workdir,
                                   timeout, prune)
            else:
                raise ValueError(f"unknown fix kind {kind!r}")
            if found is not None:
                break
    except Stopped as stop:
        record["stopped"] = str(stop)
    budget.finish()
    record["sessions"], record["seconds"] = budget.used, budget.elapsed
    if found is None:
        record["reason"] = record.get("stopped") or "no candidate made the session work: " + "; ".join(
            f"{t['candidate']}: {t['message']}" for t in record["tried"][-3:])
        return record
    record.update(found)
    record["command"] = _command(record, ep_label, list(command_args), model_path)
    return record


def _try_options(record, budget, session, model_path, provider, current, *, float_model, keep_device):
    for key, value, meaning in option_candidates(provider, current, float_model=float_model, keep_device=keep_device):
        budget.spend()
        created, message = session(model_path, {**current, key: value})[:2]
        budget.report()
        record["tried"].append({"kind": "provider_option", "candidate": f"{key}={value}", "created": bool(created),
                                "message": "" if created else message})
        if created:
            note = (f"{key}={value} builds the session for {meaning}: the model runs there, not on the device "
                    "you targeted" if key in DEVICE_KEYS else f"{key}={value}: {meaning}")
            return {"kind": "provider_option", "options": {key: value}, "note": note}
    return None


def _graph_candidates(culprit: dict[str, Any]) -> list[list[str]]:
    """Which nodes to keep off the EP, in the order find_fix tries them. A 1-minimal set no longer
    fails without any one of its nodes, so one node per set may be enough: the one with the
    smallest outputs (the CPU's share costs least), the last, the first; then every culprit node
    (in the whole model the rest of a set may fail with other nodes). Several are tried because
    QNN 2.7.0's capability is sometimes invalid around the Ifs ("set nodes that cannot be fused
    together"; ORT then gives every node to the CPU), for one choice and not another
    (docs/decisions/reduce-prove-bounds.md)."""
    described = {node["name"]: node for node in culprit.get("nodes", [])}

    def size(name: str) -> int:
        total = 0
        for text in described.get(name, {}).get("outputs", []):
            count = 1
            for dim in filter(None, text.partition("[")[2].rstrip("]").split(",")):
                count *= int(dim) if dim.isdigit() else 1 << 20
            total += count
        return total

    sets = [group["nodes"] for group in culprit.get("culprits", []) if group.get("nodes")] or [[n] for n in described]
    choices = [[min(reversed(names), key=size) for names in sets], [names[-1] for names in sets],
               [names[0] for names in sets], [name for names in sets for name in names]]
    unique: list[list[str]] = []
    for choice in choices:
        choice = list(dict.fromkeys(choice))
        if choice and not any(set(choice) == set(known) for known in unique):
            unique.append(choice)
    return unique


def _try_graph(record, budget, session, handle, culprit, provider, provider_options, workdir, timeout, prune):
    """Keep culprit nodes off the EP (the choices of _graph_candidates, in order) until one
    rewrite's session is created with the EP taking the rest, and its CPU outputs match; then,
    with ``prune``, drop the nodes the whole model does not need off the EP (see _prune)."""
    candidates = _graph_candidates(culprit)
    if not candidates:
        record["tried"].append({"kind": "graph", "candidate": "keep the culprit off the EP", "created": False,
                                "message": "no culprit nodes were named"})
        return None
    if workdir is None:
        raise ValueError("find_fix needs a workdir to write a graph change into")
    stem = Path(handle.path).stem if handle.path else "model"
    target = Path(workdir) / f"{stem}.off-ep.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    for number, names in enumerate(candidates):
        entry = {"kind": "graph", "candidate": f"keep {', '.join(names)} off the EP", "created": False}
        record["tried"].append(entry)
        # a file of its own per trial: a worker's session cache knows a file by path, size and mtime
        trial = target.with_suffix(f".trial{number}.onnx")
        created = _off_session(entry, budget, session, handle, names, trial, provider, provider_options)
        if trial.exists():
            os.replace(trial, target) if created else trial.unlink()
        entry["model"] = str(target) if created else None
        if not created:
            continue
        for _ in range(4):  # four CPU sessions: the original and the rewrite, optimized and not
            budget.spend()
        verified = verify_on_cpu(str(handle.path), str(target), timeout=timeout)
        budget.report()
        entry["verified"] = verified
        if not verified["cpu_outputs_match"]:
            entry["message"] = verified.get("message", "the rewrite's outputs differ from the original's on the CPU EP")
            continue
        found = {"kind": "graph", "model": str(target), "kept_off": names, "moved_nodes": entry["moved"],
                 "placement": entry.get("placement"), "verified": {"session": True, **verified}}
        if prune and len(names) > 1:
            found = _prune(found, record, budget, session, handle, provider, provider_options, timeout)
        found["note"] = (f"{len(found['moved_nodes'])} node(s) run on the CPU EP inside If nodes (both branches the "
                         "same), the rest on the EP")
        return found
    return None


def _off_session(entry, budget, session, handle, names, path: Path, provider, provider_options) -> bool:
    """Write ``handle`` with ``names`` kept off the EP to ``path`` and build its session (one):
    True when it is created and the EP takes something, but none of the moved nodes."""
    try:
        proto, moved = keep_off_ep(handle, names)
    except CutError as exc:
        entry["message"] = exc.message
        return False
    written = ModelHandle(proto=proto, path=None).save(path, force=True)
    entry["model"], entry["moved"] = str(written), moved
    budget.spend()
    outcome = session(str(written), dict(provider_options))
    budget.report()
    created, message = outcome[:2]
    entry.update(created=bool(created), message="" if created else message)
    if not created:
        return False
    assignment = outcome[2] if len(outcome) > 2 else None
    if assignment:
        # ORT's record names the nodes inside the Ifs' branches: the EP must have taken none of them,
        # and something else (else "the session works" only means "it all runs on the CPU")
        # (QNN's layout pass renames the nodes it takes: "dw" becomes "dw_token_5")
        on_ep = sorted({name for name in moved for node, ep in assignment.items()
                        if ep == provider and (node == name or node.startswith(f"{name}_token_"))})
        taken = sum(1 for ep in assignment.values() if ep == provider)
        entry["placement"] = {"moved_on_ep": on_ep, "nodes_on_ep": taken, "nodes_total": len(assignment)}
        if on_ep or not taken:
            entry["message"] = (f"the EP took moved node(s) {', '.join(on_ep)}" if on_ep else
                                "the EP took no node at all: the session works only because it all runs on the CPU")
            return False
    return True


def _prune(found, record, budget, session, handle, provider, provider_options, timeout):
    """Drop, one at a time, each node kept off the EP whose absence the whole model's session
    still survives (one session each); the rest are the culprits the model needs off the EP (a
    probe's culprit can be an artifact of the cut: a value the probe reads as its input, or
    exposes as its output, that the whole model keeps inside the EP's graph). The pruned rewrite
    is verified on the CPU EP again; where the bound ends the pruning first, the fix found stays."""
    kept, dropped = list(found["kept_off"]), []
    trial_path = Path(found["model"]).with_suffix(".pruned.onnx")
    last: dict[str, Any] = {}
    try:
        for number, name in enumerate(list(kept)):
            if len(kept) == 1:
                break
            trial = [n for n in kept if n != name]
            entry = {"kind": "graph", "candidate": f"without {name}", "created": False}
            record["tried"].append(entry)
            path = Path(found["model"]).with_suffix(f".without{number}.onnx")  # a file of its own, as above
            try:
                if _off_session(entry, budget, session, handle, trial, path, provider, provider_options):
                    kept, last = trial, entry
                    dropped.append(name)
            finally:
                path.unlink(missing_ok=True)
                entry.pop("model", None)
        if dropped:
            pruned, moved = _rewrite(handle, kept, trial_path)
            for _ in range(4):
                budget.spend()
            verified = verify_on_cpu(str(handle.path), pruned, timeout=timeout)
            budget.report()
            if verified["cpu_outputs_match"]:
                final = _rewrite(handle, kept, Path(found["model"]))[0]
                found = {**found, "model": final, "kept_off": kept, "moved_nodes": moved,
                         "placement": last.get("placement", found["placement"]),
                         "verified": {"session": True, **verified}}
            else:
                dropped = []
    except Stopped as stop:
        record["stopped"] = f"{stop} while pruning; the fix is the unpruned rewrite"
        dropped = []
    finally:
        for leftover in (trial_path, Path(f"{trial_path}.data")):
            leftover.unlink(missing_ok=True)
    found["pruned"] = dropped
    return found


def _rewrite(handle: ModelHandle, names: list[str], path: Path) -> tuple[str, list[str]]:
    proto, moved = keep_off_ep(handle, names)
    return str(ModelHandle(proto=proto, path=None).save(path, force=True)), moved


# Outputs of the rewrite on the CPU EP against the original's, with ORT's graph optimizations off
# (the same ops run, so the same values: this proves the rewrite computes the same function) and at
# the default level (reported only: ORT's fusions may differ once nodes sit in an If).
VERIFY_RTOL, VERIFY_ATOL = 1e-5, 1e-5


def verify_on_cpu(original: str, rewritten: str, *, timeout: float = 300.0, seed: int = 0) -> dict[str, Any]:
    """Both models on the CPU EP (a worker) on the same seeded random inputs, with graph
    optimizations off and at the default level. ``cpu_outputs_match``: with optimizations off,
    |a - b| <= atol + rtol * |a| everywhere; ``max_abs_diff`` (optimizations off) and
    ``max_abs_diff_default`` (default level); ``message`` where they could not run."""
    import onnx

    from ortprep.runtime.feeds import input_specs, random_feeds
    from ortprep.runtime.requests import RunModel
    from ortprep.runtime.worker import call

    try:
        feeds = random_feeds(input_specs(onnx.load(original, load_external_data=False)), seed=seed)
    except OrtprepError as exc:
        return {"cpu_outputs_match": False, "message": f"no inputs could be made: {exc.one_line()}"}
    result: dict[str, Any] = {"tolerance": {"rtol": VERIFY_RTOL, "atol": VERIFY_ATOL}}
    for level, key in (("disable", "max_abs_diff"), ("default", "max_abs_diff_default")):
        replies = [call(RunModel(model=path, feeds=[feeds], optimization=level), timeout=timeout)
                   for path in (original, rewritten)]
        for path, reply in zip((original, rewritten), replies):
            if not reply.ok:
                return {"cpu_outputs_match": False,
                        "message": f"{Path(path).name} did not run on the CPU EP: {reply.message}"}
        match, worst = _compare(replies[0].samples[0], replies[1].samples[0])
        result[key] = worst
        if level == "disable":
            result["cpu_outputs_match"] = match
            result["outputs"] = sorted(replies[0].samples[0])
    return result


def _compare(reference: dict[str, Any], candidate: dict[str, Any]) -> tuple[bool, float]:
    import numpy as np

    worst, match = 0.0, set(reference) == set(candidate)
    for name, value in reference.items():
        other = candidate.get(name)
        if other is None or np.shape(other) != np.shape(value):
            match = False
            continue
        a, b = np.asarray(value, dtype=np.float64), np.asarray(other, dtype=np.float64)
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b))))
            match = match and bool(np.allclose(b, a, rtol=VERIFY_RTOL, atol=VERIFY_ATOL, equal_nan=True))
    return match, worst


def _command(record: dict[str, Any], ep_label: str, command_args: list[str], model_path: str) -> str:
    """The `ortprep check` line that shows the fix working."""
    import shlex

    args = list(command_args)
    if record["kind"] == "provider_option":
        if any(key in DEVICE_KEYS for key in record["options"]):
            args = _without_device(args)
        args += [f"--provider-option={ep_label}:{key}={value}" for key, value in record["options"].items()]
        model = model_path
    else:
        model = record["model"]
    return shlex.join(["ortprep", "check", model, "--ep", ep_label, "--prove", *args])


def _without_device(args: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--device":
            skip = True
            continue
        if arg.startswith("--device="):
            continue
        kept.append(arg)
    return kept
