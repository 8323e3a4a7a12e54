"""Error-compensating rounding of block-wise int4/int8 MatMul weights (quantize --weight-only
--rounding gptq), in numpy: no gradient library.

Rounding each weight to its nearest level (what ORT's MatMulNBitsQuantizer does) minimises each
weight's own error. What the application sees is the layer's output, ``X @ W``, and there the
errors of a column's weights add up along the inputs that move together. The method of Frantar et
al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers" (2022),
rounds the weights of one input row at a time and moves the error it made onto the rows not yet
rounded, weighted by the inverse of the inputs' second moments ``H = X^T X`` (measured on the
calibration samples), so that the output's error is what is minimised.

The result is written as float weights that sit exactly on the grid ORT's own quantizer computes
(``block_grid``: its scale and zero point per block, from the block's min/max or signed largest
magnitude). The weight that sets a block's grid is given the extreme level, so ORT's quantizer,
run on the result, recomputes the same grid and the same integers: the file is ORT's MatMulNBits,
with levels chosen by this module. ``tests/test_rounding.py`` holds both against ORT's kernel.
"""

from __future__ import annotations

import numpy as np

DAMP = 0.01  # added to H's diagonal, as a share of its mean: H from few samples is near singular


def block_grid(
    block: np.ndarray, bits: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int]]]:
    """The scale and zero point per row of ``block`` ([rows, weights of one block]) as ORT's
    MatMulNBits quantizer computes them, in float32 as it does (onnxruntime's MLAS blockwise
    quantizer: range2scalezp and range2scale, read in its source and held against its kernel in the
    tests), and the anchors: (per row, the column that sets the grid, the level it must take)."""
    values = block.astype(np.float32)
    levels = 2 ** bits - 1
    low, high = values.min(axis=1), values.max(axis=1)
    if symmetric:
        upper = np.abs(high) > np.abs(low)  # a tie goes to the minimum, as MLAS breaks it
        largest = np.where(upper, high, low)
        scale = (largest / np.float32(-(2 ** (bits - 1)))).astype(np.float32)  # the largest magnitude maps to level 0
        zero = np.full(block.shape[0], 2 ** (bits - 1), np.float32)
        return scale, zero, [(np.where(upper, values.argmax(axis=1), values.argmin(axis=1)), 0)]
    low, high = np.minimum(low, np.float32(0)), np.maximum(high, np.float32(0))
    scale = ((high - low) / np.float32(levels)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    point = np.where(scale == 0, low, np.float32(0) - low / safe).astype(np.float32)
    zero = np.clip(_round_half_away(point), 0, levels).astype(np.float32)
    anchors = []
    # where a block is all of one sign, 0 is its other end and needs no anchor
    for at, level, present in ((values.argmin(axis=1), 0, low < 0), (values.argmax(axis=1), levels, high > 0)):
        anchors.append((np.where(present, at, -1), level))
    return scale, zero, anchors


def _round_half_away(values: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (np.round takes them to the even integer)."""
    return np.sign(values) * np.floor(np.abs(values) + 0.5)


def _levels(values: np.ndarray, scale: np.ndarray, zero: np.ndarray, bits: int) -> np.ndarray:
    """Nearest levels as ORT's kernel computes them: roundf(value * (1 / scale) + zero) in
    float32, clamped to the grid (a scale of 0 puts every value at the zero point)."""
    scale = np.asarray(scale, np.float32)
    reciprocal = np.where(scale == 0, np.float32(0), np.float32(1) / np.where(scale == 0, np.float32(1), scale))
    shifted = (np.asarray(values, np.float32) * reciprocal.astype(np.float32) + np.asarray(zero, np.float32))
    return np.clip(_round_half_away(shifted.astype(np.float32)), 0, 2 ** bits - 1)


def nearest(weight: np.ndarray, bits: int, block_size: int, symmetric: bool) -> np.ndarray:
    """``weight`` ([K, N]) rounded to its nearest levels, block by block along K, as float: what
    ORT's quantizer writes, dequantized."""
    out = np.empty(weight.shape, np.float64)
    rows = weight.T.astype(np.float64)
    for start in range(0, rows.shape[1], block_size):
        block = rows[:, start:start + block_size]
        scale, zero, _ = block_grid(block, bits, symmetric)
        out[start:start + block.shape[1]] = ((_levels(block, scale[:, None], zero[:, None], bits) - zero[:, None])
                                             * scale[:, None]).T
    return out.astype(np.float32)


def _inverse_factor(hessian: np.ndarray) -> np.ndarray | None:
    """The upper Cholesky factor of H's inverse, H damped until it factors (None: it never did)."""
    h = np.array(hessian, np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0  # an input never seen non-zero: its weights are rounded on their own
    mean = float(np.mean(np.diag(h)))
    for damp in (DAMP, DAMP * 10, DAMP * 100):
        try:
            inverse = np.linalg.inv(h + damp * mean * np.eye(h.shape[0]))
            return np.linalg.cholesky(inverse).T
        except np.linalg.LinAlgError:
            continue
    return None


def compensated(
    weight: np.ndarray, hessian: np.ndarray, bits: int, block_size: int, symmetric: bool
) -> np.ndarray | None:
    """``weight`` ([K, N], the MatMul's B) rounded block by block along K with each row's rounding
    error moved onto the rows not yet rounded (GPTQ), as float weights on ORT's grid; ``hessian``
    is ``X^T X`` ([K, K]) of the MatMul's input rows. None where H cannot be factored."""
    if not np.isfinite(hessian).all():
        return None  # an activation overflowed or was not finite on a sample: nothing to weigh by
    factor = _inverse_factor(hessian)
    if factor is None:
        return None
    work = weight.T.astype(np.float64)  # [N, K]: one output per row, rounded one input column at a time
    count = work.shape[1]
    out = np.empty_like(work)
    for start in range(0, count, block_size):
        end = min(start + block_size, count)
        block = work[:, start:end].copy()
        scale, zero, anchors = block_grid(block, bits, symmetric)
        errors = np.empty_like(block)
        for j in range(end - start):
            column = block[:, j]
            level = _levels(column, scale, zero, bits)
            for at, fixed in anchors:
                level = np.where(at == j, fixed, level)  # the weight that sets the grid keeps it
            rounded = (level - zero) * scale
            out[:, start + j] = rounded
            error = (column - rounded) / factor[start + j, start + j]
            block[:, j + 1:] -= np.outer(error, factor[start + j, start + j + 1:end])
            errors[:, j] = error
        work[:, end:] -= errors @ factor[start:end, end:]
    return out.T.astype(np.float32)


def output_error(weight: np.ndarray, rounded: np.ndarray, hessian: np.ndarray) -> float:
    """The summed squared error the rounding adds to ``X @ W`` over the samples H was measured on:
    trace((W - Q)^T H (W - Q))."""
    delta = (weight.astype(np.float64) - rounded.astype(np.float64))
    return float(np.sum(delta * (hessian @ delta)))  # one BLAS product (einsum's loop took seconds at K=3072)


# --- on a model: which MatMuls, their inputs' second moments, the weights rewritten ----------------

HESSIAN_BUDGET = 128 * 2 ** 20  # bytes of H (float64) gathered at once; more inputs take another pass (a 226 MB
# stack of 12 768->3072->768 MLPs: peak RSS 1.70 GB at 256 MB a pass, within 3x the model + 1 GB at 128)


def _takes(weight) -> bool:
    """Whether ORT's weight-only quantizer takes this MatMul B (2-D, or leading dimensions of 1)
    and it is float32: from its metadata, no weights read."""
    import onnx

    return (
        weight.data_type == onnx.TensorProto.FLOAT and len(weight.dims) >= 2 and all(d == 1 for d in weight.dims[:-2])
    )


def _b_matrix(weight) -> np.ndarray:
    """A MatMul's constant B (one ``_takes``) as [K, N]."""
    from onnx import numpy_helper

    return numpy_helper.to_array(weight).reshape(weight.dims[-2], weight.dims[-1])


def eligible(model, excluded: set[str]) -> list:
    """The main graph's MatMuls whose B ORT's MatMulNBits quantizer rewrites, read by float32
    activations: (node, B initializer). A B that anything else reads (a node excluded, another op,
    a node in a subgraph, a graph output) is left out: its rewritten values would reach that reader."""
    from ortprep.model import iter_graphs

    inits = {i.name: i for i in model.graph.initializer}
    chosen = [node for node in model.graph.node
              if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and node.name not in excluded
              and len(node.input) == 2 and node.input[1] in inits and node.input[0] not in inits
              and _takes(inits[node.input[1]])]
    readers: dict[str, int] = {}
    for _, graph in iter_graphs(model.graph):
        for node in graph.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        for output in graph.output:
            readers[output.name] = readers.get(output.name, 0) + 1
    ours: dict[str, int] = {}
    for node in chosen:
        ours[node.input[1]] = ours.get(node.input[1], 0) + 1
    return [(node, inits[node.input[1]]) for node in chosen if readers.get(node.input[1], 0) == ours[node.input[1]]]


class Moments:
    """``X^T X`` of named activations (each: its rows are every position but the last axis, of
    length ``names[name]``), read from one session of a copy of the graph that exposes them all as
    outputs. ``read`` sums the moments of some of them over the samples: a caller reads a few at a
    time (HESSIAN_BUDGET), so that one session serves every pass (a session per pass, reloading the
    weights, grew the worker's peak). ``cache``: a folder where read moments are kept between
    trials of one run (the same model and samples)."""

    def __init__(self, model_path: str, names: dict[str, int], count: int, inputs: set[str],
                 cache: str | None = None) -> None:
        """``inputs``: the graph's input names (fed, not exposed)."""
        import hashlib
        import os

        self.names, self.count, self.stored = names, count, None
        if cache is not None:
            stat = os.stat(model_path)
            key = f"{os.path.abspath(model_path)}|{stat.st_size}|{stat.st_mtime_ns}|{count}"
            self.stored = os.path.join(cache, f"rounding-moments-{hashlib.sha256(key.encode()).hexdigest()[:16]}")
            os.makedirs(self.stored, exist_ok=True)
        self.model_path, self.inputs, self._session = model_path, inputs, None

    @property
    def session(self):
        """The probe session, built on first use (a trial whose moments are all cached needs none)."""
        if self._session is None:
            import os
            import tempfile

            import onnx
            import onnxruntime as ort
            from onnx import helper

            graph_only = onnx.load(self.model_path, load_external_data=False)
            have = {o.name for o in graph_only.graph.output}
            graph_only.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                           for n in self.names if n not in have and n not in self.inputs)
            folder = os.path.dirname(os.path.abspath(self.model_path))  # beside it: its external data resolves
            handle, path = tempfile.mkstemp(suffix=".onnx", prefix="ortprep-rounding-", dir=folder)
            os.close(handle)
            try:
                onnx.save(graph_only, path)
                options = ort.SessionOptions()
                options.log_severity_level = 3
                self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            finally:
                os.unlink(path)
        return self._session

    def _file(self, name: str) -> str | None:
        import hashlib
        import os

        return (
            None
            if self.stored is None
            else os.path.join(self.stored, hashlib.sha256(name.encode()).hexdigest()[:16] + ".npy")
        )

    def read(self, wanted: list[str], samples, progress=None) -> dict[str, np.ndarray]:
        import os

        result = {}
        for name in wanted:
            path = self._file(name)
            if path is not None and os.path.exists(path):
                result[name] = np.load(path)
        left = [name for name in wanted if name not in result]
        if not left:
            return result
        fetch = [n for n in left if n not in self.inputs]
        sums = {n: np.zeros((self.names[n], self.names[n])) for n in left}
        for done, feed in enumerate(samples(), start=1):
            values = dict(zip(fetch, self.session.run(fetch, feed))) if fetch else {}
            for name in left:
                rows = np.asarray(feed[name] if name in self.inputs else values[name], np.float64).reshape(
                    -1, self.names[name]
                )
                sums[name] += rows.T @ rows
            if progress is not None:
                progress(done, self.count)
        for name, value in sums.items():
            path = self._file(name)
            if path is not None:  # written whole or not at all: a later trial reads it
                with open(path + ".tmp", "wb") as out:
                    np.save(out, value)
                os.replace(path + ".tmp", path)
        return {**result, **sums}


def compensate_model(model, model_path: str, samples, count: int, bits: int, block_size: int, symmetric: bool,
                     excluded: set[str], progress=None, cache: str | None = None) -> dict:
    """Rewrite ``model``'s eligible MatMul weights (in place, float) with compensated rounding, from
    the second moments of their inputs on ``samples`` (``model_path``: the same model on disk).
    Returns what was done: MatMuls rewritten, and the output error on those samples against
    nearest rounding's (summed over the MatMuls, trace((W-Q)^T H (W-Q))). ``cache``: a folder
    where the second moments are kept between calls on the same model and samples (a search's
    trials differ only in the MatMuls they leave out)."""
    from onnx import numpy_helper

    targets = eligible(model, excluded)
    if not targets:
        return {"matmuls": 0, "kept_nearest": [], "error_vs_nearest": None}
    by_weight: dict[str, tuple] = {}
    for node, init in targets:  # a B read by several MatMuls: weighed by all their inputs together
        first, inputs, nodes = by_weight.get(init.name, (init, [], []))
        by_weight[init.name] = (first, inputs + [node.input[0]], nodes + [node.name])
    # weights in passes whose inputs' moments fit HESSIAN_BUDGET: a pass's moments are gathered,
    # its weights rounded, and the moments dropped before the next (peak: one pass's, not all)
    passes: list[list[tuple]] = [[]]
    held: dict[str, int] = {}  # the current pass's inputs -> bytes of their moments
    for entry in by_weight.values():
        k = entry[0].dims[-2]
        need = {name: 8 * k * k for name in entry[1] if name not in held}
        if passes[-1] and sum(held.values()) + sum(need.values()) > HESSIAN_BUDGET:
            passes.append([])
            held = {}
            need = {name: 8 * k * k for name in entry[1]}
        passes[-1].append(entry)
        held.update(need)
    done, kept, ours, theirs = 0, [], 0.0, 0.0
    reader = Moments(model_path, {name: init.dims[-2] for init, inputs, _ in by_weight.values() for name in inputs},
                     count, {i.name for i in model.graph.input}, cache)
    # progress: each sample read in each pass, then each weight rounded (a K of 3,072 takes seconds)
    total, base = len(passes) * count + len(by_weight), 0
    for group in passes:
        names = list(dict.fromkeys(name for _, inputs, _ in group for name in inputs))
        step = (lambda d, t, at=base: progress(at + d, total)) if progress is not None else None
        moments = reader.read(names, samples, step)
        base += count
        for init, inputs, nodes in group:
            base += 1
            if progress is not None:
                progress(base, total)
            weight = _b_matrix(init)
            hessian = sum(moments[name] for name in inputs)
            rounded = compensated(weight, hessian, bits, block_size, symmetric)
            plain = output_error(weight, nearest(weight, bits, block_size, symmetric), hessian)
            error = output_error(weight, rounded, hessian) if rounded is not None else np.inf
            if not (np.isfinite(error) and np.isfinite(plain)) or error >= plain:
                kept += nodes  # nearest rounding is no worse on these samples: the initializer is left as it is
                ours, theirs = (
                    ours + (plain if np.isfinite(plain) else 0.0),
                    theirs + (plain if np.isfinite(plain) else 0.0),
                )
                continue
            ours, theirs = ours + error, theirs + plain
            done += len(nodes)
            init.CopyFrom(numpy_helper.from_array(rounded.reshape(tuple(init.dims)), init.name))
        del moments
    del reader
    return {"matmuls": done, "kept_nearest": kept, "error_vs_nearest": (ours / theirs) if theirs > 0 else None}
