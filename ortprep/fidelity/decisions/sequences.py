"""``argmax``: sequence logits, the argmax per position, what a CTC decoder or a frame tagger reads,
judged per position and as whole sequences (REQUIRED_SEQUENCES).

Inferred for [N, T, C] (C >= 2) made by a Softmax/LogSoftmax, or raw scores per position whose
lead stands out or whose name says classes; and for a 2-D [T, C] whose rows are the positions of
one input's sequence (rows_are_positions)."""

from __future__ import annotations

import numpy as np

from ortprep.fidelity.decisions.classes import (CLASS_GAP, class_agreement, class_gap, class_gated,
                                                expected_class_agreement, named_as_classes)
from ortprep.fidelity.decisions.decision import Decision, Kind, Output, register

# The share of sequences equal in every position the gate asks besides the positions' (at 99% per
# position, a 48-step sequence is whole on about 62% of inputs).
REQUIRED_SEQUENCES = 0.95


def rows_are_positions(proto, name: str, rows: int) -> bool:
    """Whether the rows of a 2-D output [R, C] are the positions of one input's sequence rather than
    a batch: its first dim shares a symbolic name with a non-leading dim of an input ("frames"), or
    every input is a batch of one and R is the length T of a sequence input [1, T, features]."""
    if rows < 2:
        return False
    initializers = {t.name for t in proto.graph.initializer}
    inputs = [v for v in proto.graph.input if v.name not in initializers and v.type.HasField("tensor_type")
              and v.type.tensor_type.HasField("shape")]
    output = next((v for v in proto.graph.output if v.name == name), None)
    first = None
    if output is not None and output.type.HasField("tensor_type") and output.type.tensor_type.HasField("shape"):
        dims = output.type.tensor_type.shape.dim
        first = dims[0].dim_param if dims and dims[0].HasField("dim_param") else None
    batch_of_one, sizes, names = bool(inputs), set(), set()
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if len(dims) < 2:
            continue
        batch_of_one = batch_of_one and dims[0].HasField("dim_value") and dims[0].dim_value == 1
        for dim in dims[1:]:
            if dim.HasField("dim_param"):
                names.add(dim.dim_param)
        if len(dims) == 3 and dims[1].HasField("dim_value"):
            sizes.add(dims[1].dim_value)  # a sequence input [1, T, features]: its T, not channels or sizes
    return bool(first and first in names) or (batch_of_one and rows in sizes)


def as_sequences(value: np.ndarray) -> np.ndarray:
    """The argmax of an [N, T, C] output as rows of T positions. A time-major [T, N, C] output (a
    CRNN's: [25, 1, 8210]) is told by its batch axis of 1 in the middle."""
    tags = np.argmax(value, axis=-1)
    if tags.ndim == 2 and tags.shape[1] == 1 and tags.shape[0] > 1:
        tags = tags.T
    return tags.reshape(-1, tags.shape[-1])


def sequence_agreement(reference: list[np.ndarray], candidate: list) -> float | None:
    """The share of sequences (over the samples) whose argmax is the same at every position."""
    same = total = 0
    for r, c in zip(reference, candidate):
        r, c = np.asarray(r), np.asarray(c) if c is not None else None
        if c is None or r.shape != c.shape or r.ndim < 2 or r.shape[-1] < 2:
            continue
        a, b = as_sequences(r), as_sequences(c)
        same += int(np.sum(np.all(a == b, axis=-1)))
        total += a.shape[0]
    return same / total if total else None


def expected_sequence_agreement(reference: list[np.ndarray], per_position: float | None) -> float | None:
    """Whole sequences equal on unseen inputs, positions taken as independent:
    (agreement per position) ** (positions per sequence)."""
    lengths = [as_sequences(np.asarray(r)).shape[-1] for r in reference if np.ndim(r) >= 2 and np.shape(r)[-1] >= 2]
    if per_position is None or not lengths:
        return None
    return float(per_position ** float(np.mean(lengths)))


class Argmax(Kind):
    name = "argmax"
    forms = ("argmax",)
    required = 0.99

    def infer(self, output: Output) -> Decision | None:
        shape, maker = output.shape, output.maker
        if len(shape) == 2 and shape[-1] >= 2 and maker != "Sigmoid" and rows_are_positions(
                output.proto, output.name, shape[0]):
            return Decision("argmax", gated=class_gated(output)[0])
        if len(shape) == 3 and shape[-1] >= 2 and maker in ("Softmax", "LogSoftmax"):
            return Decision("argmax")
        if len(shape) == 3 and shape[-1] >= 2 and maker != "Sigmoid" and (
                named_as_classes(output.name) or class_gap(output.values) >= CLASS_GAP):
            return Decision("argmax")  # raw scores per position (a frame tagger's, a token classifier's)
        return None

    def agreement(self, decision, reference, candidate):
        return class_agreement(reference, candidate)

    def expected(self, decision, reference, candidate, more=None):
        return expected_class_agreement(reference, candidate, self.usable(reference, more))

    def also(self, decision, record, reference, candidate, more, passed):
        whole = sequence_agreement(reference, candidate)
        whole_expected = expected_sequence_agreement(reference, record["expected_agreement"])
        record.update(sequence_agreement=whole, expected_sequence_agreement=whole_expected,
                      required_sequences=REQUIRED_SEQUENCES)
        return passed and all(value is None or value >= REQUIRED_SEQUENCES for value in (whole, whole_expected))


ARGMAX = register(Argmax())
