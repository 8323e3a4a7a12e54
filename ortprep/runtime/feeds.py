"""Input feeds for test runs: seeded random data from the model's inputs, or the user's files.

One input policy for every step that runs a model (load, convert, simplify, optimize, compile):
:func:`choose_feeds` takes the user's data first; then what the model says (named dims, sizes the
user gave for a dim name, sizes its Reshape/Expand/Resize/Slice constants imply); then common
sizes, keeping the first the original model runs on. The choice says how it was made."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto

from ortprep.errors import UsageError

# Symbolic dimensions get these sizes unless the user says otherwise (--shape / --fix-dim).
BATCH_LIKE = re.compile(r"batch|^n$|^N$|^b$", re.IGNORECASE)
SEQUENCE_LIKE = re.compile(r"seq|len|time|token|step", re.IGNORECASE)
DEFAULT_BATCH = 1
DEFAULT_SEQUENCE = 16
DEFAULT_OTHER = 8


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype | None  # None for non-tensor inputs (sequences, maps)
    shape: tuple[int | str | None, ...] | None


def input_specs(proto: ModelProto) -> list[InputSpec]:
    initializers = {t.name for t in proto.graph.initializer}
    specs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type if value.type.WhichOneof("value") == "tensor_type" else None
        if tensor is None or not tensor.elem_type:
            specs.append(InputSpec(value.name, None, None))
            continue
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = None
        if tensor.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, dtype, shape))
    return specs


def concrete_shape(
    spec: InputSpec, shapes: dict[str, list[int]] | None = None, dims: dict[str, int] | None = None,
    other: int | None = None,
) -> tuple[int, ...]:
    if shapes and spec.name in shapes:
        return tuple(shapes[spec.name])
    if spec.shape is None:
        raise UsageError(
            f"input '{spec.name}' has no known shape", hint=f"give it: --shape {spec.name}=1,3,224,224"
        )
    result = []
    for index, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0:
            result.append(dim)
        elif isinstance(dim, str) and dims and dim in dims:
            result.append(dims[dim])
        elif isinstance(dim, str) and SEQUENCE_LIKE.search(dim) and other is None:
            result.append(DEFAULT_SEQUENCE)
        elif (isinstance(dim, str) and BATCH_LIKE.search(dim)) or index == 0:
            result.append(DEFAULT_BATCH)
        else:
            result.append(other or DEFAULT_OTHER)
    return tuple(result)


# Sizes tried, in order, for dynamic dims a model does not name (after the defaults): common
# image and audio sizes that are multiples of 32, as detectors and strided front-ends need.
GUESSES = (None, 64, 224, 640)


def has_guessed_dims(specs: list[InputSpec], shapes: dict[str, list[int]] | None = None) -> bool:
    """Whether random feeds for these inputs would have to guess a dimension."""
    return any(spec.shape is not None and spec.name not in (shapes or {})
               and any(not (isinstance(d, int) and d > 0) for d in spec.shape) for spec in specs)


def random_feeds(
    specs: list[InputSpec],
    *,
    seed: int = 0,
    shapes: dict[str, list[int]] | None = None,
    dims: dict[str, int] | None = None,
    other: int | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random inputs: normal floats, small non-negative integers (safe as indices), bools.
    An integer input named as an attention mask is all ones (every token attended) and one named as
    token types or segments all zeros: a MiniLM fed a mask of 0..3 gave NaN, and every transform
    of it was refused as if it had changed the model's results (an unseen-model sweep)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if spec.dtype is None:
            raise UsageError(
                f"input '{spec.name}' is not a tensor; random inputs cannot be made for it",
                hint="pass real inputs with --inputs FILE.npz",
            )
        shape = concrete_shape(spec, shapes, dims, other)
        if spec.dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype.kind in "iu":
            lowered = spec.name.lower()
            if "mask" in lowered:
                feeds[spec.name] = np.ones(shape, spec.dtype)
            elif "token_type" in lowered or "segment" in lowered:
                feeds[spec.name] = np.zeros(shape, spec.dtype)
            else:
                feeds[spec.name] = rng.integers(0, 4, size=shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise UsageError(
                f"input '{spec.name}' has dtype {spec.dtype}, for which random data is not made",
                hint="pass real inputs with --inputs FILE.npz",
            )
    return feeds


def load_feeds(path: Path, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    """Inputs from a .npz whose keys are the input names; checked against the model."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"inputs file not found: {path}", hint="pass a .npz with one array per model input")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as exc:  # noqa: BLE001 - numpy raises several types for bad files
        raise UsageError(f"cannot read inputs file {path}: {exc}", hint="save it with numpy.savez") from exc
    feeds = {}
    for spec in specs:
        if spec.name not in arrays:
            raise UsageError(
                f"inputs file {path.name} has no array for input '{spec.name}' (has: {', '.join(arrays) or 'none'})",
                hint="name each array after a model input",
            )
        array = arrays[spec.name]
        if spec.dtype is not None and array.dtype != spec.dtype:
            raise UsageError(
                f"input '{spec.name}' is {spec.dtype} in the model but {array.dtype} in {path.name}",
                hint=f"save it as {spec.dtype}",
            )
        if spec.shape is not None:
            fixed = [(i, d) for i, d in enumerate(spec.shape) if isinstance(d, int) and d > 0]
            if len(array.shape) != len(spec.shape) or any(array.shape[i] != d for i, d in fixed):
                raise UsageError(
                    f"input '{spec.name}' has shape {list(array.shape)} in {path.name}; the model wants "
                    f"{['?' if not isinstance(d, int) else d for d in spec.shape]}",
                    hint="fix the array's shape",
                )
        feeds[spec.name] = array
    return feeds


@dataclass
class FeedChoice:
    """The inputs a step runs the model on, and how they were chosen."""

    feeds: dict[str, np.ndarray]
    how: str  # for the report: "your inputs (FILE)", "random (seed 0)", "random (seed 0), dims guessed: ..."
    tried: int = 0  # runs of the original spent on choosing (0: no choice to make)
    runs: bool | None = None  # whether the original ran on them (None: not tried here)
    error: str | None = None  # the original's failure on the last size tried, when none ran
    outcome: Any = field(default=None, repr=False)  # the successful run, for a caller that can reuse it

    @property
    def shapes(self) -> dict[str, list[int]]:
        return {name: list(value.shape) for name, value in self.feeds.items()}

    def record(self) -> dict[str, Any]:
        return {"source": self.how, "shapes": self.shapes, "tried": self.tried, "original_runs": self.runs,
                **({"error": self.error} if self.error else {})}


# Ops whose integer constants say what sizes the model works with (a Reshape to [1, -1, 320], an
# Expand to a fixed width, a Resize to fixed sizes, a Slice end).
_SIZE_OPS = {"Reshape": 1, "Expand": 1, "Resize": 3, "Slice": 2}


def implied_sizes(proto: ModelProto, limit: int = 3) -> list[int]:
    """Sizes the model's own constants imply for its dynamic dims: the most frequent values between
    8 and 4096 in the shape inputs of Reshape, Expand, Resize (sizes) and Slice (ends)."""
    from onnx import numpy_helper

    constants = {t.name: t for t in proto.graph.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in proto.graph.node
                      if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value"})
    counts: Counter = Counter()
    for node in proto.graph.node:
        position = _SIZE_OPS.get(node.op_type)
        if position is None or len(node.input) <= position or node.input[position] not in constants:
            continue
        tensor = constants[node.input[position]]
        if tensor.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) or tensor.data_location:
            continue
        try:
            values = numpy_helper.to_array(tensor).ravel().tolist()
        except Exception:  # noqa: BLE001 - a constant onnx cannot read is no evidence
            continue
        counts.update(v for v in values if 8 <= v <= 4096)
    return [size for size, _ in counts.most_common(limit)]


def choose_feeds(specs: list[InputSpec], *, proto: ModelProto | None = None, inputs: Path | None = None,
                 shapes: dict[str, list[int]] | None = None, dims: dict[str, int] | None = None,
                 runs: Callable[[dict[str, np.ndarray]], Any] | None = None) -> FeedChoice:
    """Inputs for running the model (the module's policy). ``runs(feeds)`` runs the original and
    answers an outcome with ``ok``, ``stage`` and ``message``; it is asked only when a dimension
    must be guessed, and a failure while creating the session (not a matter of inputs) stops there."""
    if inputs is not None:
        return FeedChoice(load_feeds(inputs, specs), f"your inputs ({Path(inputs).name})")
    if not has_guessed_dims(specs, shapes) or runs is None:
        named = "" if not has_guessed_dims(specs, shapes) else ", dims guessed (not tried)"
        return FeedChoice(random_feeds(specs, seed=0, shapes=shapes, dims=dims), f"random (seed 0){named}")
    candidates: list[tuple[int | None, str]] = [(None, "the dims' names")]
    candidates += [(size, "the model's constants") for size in implied_sizes(proto)] if proto is not None else []
    candidates += [(size, "common sizes") for size in GUESSES if size is not None]
    seen: set = set()
    first: FeedChoice | None = None
    tried = 0
    for other, reason in candidates:
        if other in seen:
            continue
        seen.add(other)
        feeds = random_feeds(specs, seed=0, shapes=shapes, dims=dims, other=other)
        shown = ", ".join(f"{name}={'x'.join(map(str, value.shape))}" for name, value in feeds.items())
        choice = FeedChoice(feeds, f"random (seed 0), dims guessed from {reason}: {shown}")
        first = first or choice
        outcome = runs(feeds)
        tried += 1
        if outcome.ok:
            choice.tried, choice.runs, choice.outcome = tried, True, outcome
            return choice
        first.error = outcome.message
        if outcome.stage != "run":
            break  # the session itself fails: not a matter of inputs
    first.tried, first.runs = tried, False
    return first
