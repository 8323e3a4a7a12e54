"""``argmax``: sequence logits, the argmax per position, what a CTC decoder or a frame tagger reads,
judged per position and as whole sequences (REQUIRED_SEQUENCES); logits over a vocabulary at each
position (a language model's, ``per_position``) per position alone: its application decodes one
position at a time (vocabulary_logits; docs/decisions/gate-evidence.md).

Inferred for [N, T, C] (C >= 2) made by a Softmax/LogSoftmax, or raw scores per position whose
lead stands out or whose name says classes; and for a 2-D [T, C] whose rows are the positions of
one input's sequence (rows_are_positions). ``--metric OUTPUT=argmax:positions`` names the
per-position rule, ``argmax`` the whole sequences too."""

from __future__ import annotations

import numpy as np

from ortprep.fidelity.decisions.classes import (CLASS_GAP, class_agreement, class_counts, class_gap, class_gated,
                                                expected_class_agreement, form_of, named_as_classes)
from ortprep.fidelity.decisions.decision import Decision, Kind, Output, register
from ortprep.fidelity.decisions.evidence import by_evidence, hold

# The share of sequences equal in every position the gate asks besides the positions' (at 99% per
# position, a 48-step sequence is whole on about 62% of inputs).
REQUIRED_SEQUENCES = 0.95
# A last axis of at least this many classes at each position is a vocabulary (a language model's:
# 256-384 for byte-level ones, 30522 for BERT, 32000-256000 for decoders); a frame tagger's or a token
# classifier's labels number in the tens.
VOCABULARY = 256
_INTEGERS = (2, 3, 4, 5, 6, 7, 12, 13)  # onnx's integer element types: token ids


def reads_tokens(proto) -> bool:
    """Whether the model reads token ids: an integer input of two or more axes ([batch, positions])."""
    initializers = {t.name for t in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        if tensor.elem_type in _INTEGERS and (not tensor.HasField("shape") or len(tensor.shape.dim) >= 2):
            return True
    return False


def vocabulary_logits(output: Output) -> bool:
    """Logits over a vocabulary at each position, [batch, positions, V] with V >= VOCABULARY, read
    by an application one position at a time (greedy or sampled decoding, a masked token's fill),
    rather than a CTC head's string: the model reads token ids (a CTC head reads an image or a
    sound), the output is batch-major (a CRNN's time-major [T, 1, C] is a CTC head's) and not
    named as CTC. A language model fed embeddings instead of ids keeps the whole-sequence rule."""
    shape = output.shape
    if len(shape) != 3 or shape[-1] < VOCABULARY or (shape[1] == 1 and shape[0] > 1):
        return False
    return "ctc" not in output.name.lower() and reads_tokens(output.proto)


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


def sequence_count(reference: list[np.ndarray], candidate: list) -> int:
    """How many sequences sequence_agreement compares."""
    return sum(as_sequences(np.asarray(r)).shape[0] for r, c in zip(reference, candidate)
               if c is not None and np.shape(r) == np.shape(c) and np.ndim(r) >= 2 and np.shape(r)[-1] >= 2)


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

    forms = ("argmax", "argmax:positions")
    takes_value = True

    def parse(self, value, text):
        if value not in ("", "positions"):
            raise ValueError(f"{text!r}: after 'argmax:' only 'positions' (each position judged alone, no "
                             "whole-sequence rule)")
        return Decision("argmax", None, "--metric", per_position=value == "positions")

    def label(self, decision):
        return "argmax:positions" if decision.per_position else "argmax"

    def infer(self, output: Output) -> Decision | None:
        shape, maker = output.shape, output.maker
        because = form_of(output)
        if len(shape) == 2 and shape[-1] >= 2 and maker != "Sigmoid" and rows_are_positions(
                output.proto, output.name, shape[0]):
            return Decision("argmax", gated=class_gated(output)[0], because=because + ", rows a sequence's")
        if len(shape) == 3 and shape[-1] >= 2 and maker != "Sigmoid" and vocabulary_logits(output):
            return Decision("argmax", per_position=True, because=because + ", logits over a vocabulary")
        if len(shape) == 3 and shape[-1] >= 2 and maker in ("Softmax", "LogSoftmax"):
            return Decision("argmax", because=because)
        if len(shape) == 3 and shape[-1] >= 2 and maker != "Sigmoid" and (
                named_as_classes(output.name) or class_gap(output.values) >= CLASS_GAP):
            # raw scores per position (a frame tagger's, a token classifier's)
            return Decision("argmax", because=because)
        return None

    def agreement(self, decision, reference, candidate):
        return class_agreement(reference, candidate)

    def units(self, decision, reference, candidate):
        return class_counts(reference, candidate)[1] or None

    def expected(self, decision, reference, candidate, more=None):
        return expected_class_agreement(reference, candidate, self.usable(reference, more))

    def also(self, decision, record, reference, candidate, more, passed):
        whole = sequence_agreement(reference, candidate)
        whole_expected = expected_sequence_agreement(reference, record["expected_agreement"])
        if decision.per_position:  # reported, not held: the application reads one position at a time
            record.update(sequence_agreement=whole, expected_sequence_agreement=whole_expected,
                          required_sequences=None)
            return passed
        record.update(sequence_agreement=whole, expected_sequence_agreement=whole_expected,
                      required_sequences=REQUIRED_SEQUENCES)
        if whole is None:
            return passed and (whole_expected is None or whole_expected >= REQUIRED_SEQUENCES)
        return passed and hold(record, "sequence_agreement", whole, sequence_count(reference, candidate),
                               whole_expected, REQUIRED_SEQUENCES, by_evidence(decision))


ARGMAX = register(Argmax())
