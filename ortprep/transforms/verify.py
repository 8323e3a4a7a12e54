"""Running a model held in memory for verification (in a worker process): the original and the
result run on the same inputs, and ortprep.fidelity.gate judges their outputs. Also intermediates
exposed in groups of bounded memory, and model sizes."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.graphops import intermediate_bytes
from ortprep.model import approx_serialized_bytes, iter_graphs
from ortprep.runtime.isolated import RunOutcome, run_isolated

log = logging.getLogger(__name__)

EXTERNAL_ABOVE = int(1.5 * 2**30)
# Models up to this size go to the worker as bytes; bigger ones through a file, which measured
# faster (a 200 MB model: 0.75 s through the pipe, 0.66 s written and read back).
BYTES_BELOW = 64 * 2**20


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


def run_model(proto: ModelProto, feeds: dict[str, np.ndarray] | list, *, outputs: list[str] | None = None,
              optimization: str = "default") -> RunOutcome:
    """Run a model held in memory in a worker: a small one sent as bytes (no temporary file), a
    big one through a temporary copy (with external data when protobuf could not hold it).
    ``feeds`` = []: only create the session. ``optimization``: ORT's graph optimization level."""
    external = any(
        t.data_location == onnx.TensorProto.EXTERNAL for _, g in iter_graphs(proto.graph) for t in g.initializer
    )
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


# Intermediate values one run exposes, at most (bytes, one sample): exposing every tensor at once
# holds a model's whole working set twice (docs/decisions/fidelity-verification.md).
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
        sizes = intermediate_bytes(
            proto, {name: list(np.shape(value)) for name, value in self.feeds.items()}, self.names
        )
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
            outcome = run_isolated(
                self.path, self.feeds, extra_outputs=list(dict.fromkeys(names)), once=not self.single
            )
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
