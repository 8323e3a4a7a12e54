"""Model outputs in a form that crosses a process boundary without pickle and compares like a
tensor: sequences and maps (a ZipMap's list of {label: probability}) are flattened, keys in
order, into one float array; string tensors become fixed-width unicode arrays. Imports numpy
only, so every worker can use it under any environment's Python."""

from __future__ import annotations

import numpy as np


def portable(value) -> np.ndarray:
    """An ndarray that numpy.savez stores without pickle, for any ORT output value."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return np.asarray([str(v) for v in value.ravel()], dtype=str).reshape(value.shape)
        return value
    if isinstance(value, dict):
        parts = [portable(value[key]) for key in sorted(value, key=str)]
        return _concatenate(parts)
    if isinstance(value, (list, tuple)):
        return _concatenate([portable(item) for item in value])
    if value is None:
        return np.zeros(0, dtype=np.float64)
    return np.asarray(value) if not isinstance(value, str) else np.asarray([value], dtype=str)


def _concatenate(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.float64)
    if all(p.dtype.kind in "fiub" for p in parts):
        return np.concatenate([p.astype(np.float64).ravel() for p in parts])
    return np.concatenate([p.astype(str).ravel() for p in parts])


def is_tensor(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype != object
