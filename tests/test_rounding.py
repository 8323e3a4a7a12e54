"""Compensated rounding of weight-only blocks (runtime/rounding.py), held against ORT's own
block-wise kernel: the levels it chooses must be the integers ORT's quantizer writes when it is
run on the rewritten weights, and on correlated inputs the layer's output must come out closer."""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

from ortprep.runtime.rounding import block_grid, compensated, nearest, output_error


def ort_blockwise(weight: np.ndarray, bits: int, block_size: int, symmetric: bool) -> np.ndarray:
    """``weight`` ([K, N]) through ORT's MatMulNBits kernel, dequantized back to [K, N]."""
    k, n = weight.shape
    blocks, per_byte = -(-k // block_size), 8 // bits
    packed = np.zeros((n, blocks, block_size // per_byte), np.uint8)
    zeros = np.zeros((n, -(-blocks // per_byte)), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    (quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits)(
        packed, np.ascontiguousarray(weight, np.float32), scales, zeros, block_size, n, k, symmetric)
    if bits == 4:
        levels = np.stack([packed & 15, packed >> 4], -1).reshape(n, blocks, block_size)
        zero = np.stack([zeros & 15, zeros >> 4], -1).reshape(n, -1)[:, :blocks]
    else:
        levels, zero = packed.reshape(n, blocks, block_size), zeros[:, :blocks]
    if symmetric:
        zero = np.full((n, blocks), 2 ** (bits - 1))
    values = (levels.astype(np.float64) - zero[..., None]) * scales[..., None].astype(np.float64)
    return values.reshape(n, blocks * block_size)[:, :k].T


def correlated_inputs(rng, rows: int, basis: np.ndarray) -> np.ndarray:
    """Activations whose features move together (a few directions, ``basis``, dominate), as a
    layer's do."""
    return rng.standard_normal((rows, len(basis))) @ basis + 0.1 * rng.standard_normal((rows, basis.shape[1]))


def same_levels(ours: np.ndarray, theirs: np.ndarray) -> bool:
    """Equal up to float32 rounding of the scale (far below a level's step)."""
    return bool(np.abs(ours.astype(np.float64) - theirs).max() <= 1e-6 * max(np.abs(ours).max(), 1e-30))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
def test_the_grid_is_orts(bits, symmetric):
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((70, 6)).astype(np.float32)  # K = 70: a last block of 6
    weight[:32, 0] = np.abs(weight[:32, 0])  # a block all positive, one all negative
    weight[32:64, 1] = -np.abs(weight[32:64, 1])
    weight[:32, 2] = 0.0  # a block of zeros
    assert same_levels(nearest(weight, bits, 32, symmetric), ort_blockwise(weight, bits, 32, symmetric))
    scale, zero, _ = block_grid(weight[:32].T.astype(np.float64), bits, symmetric)
    assert scale[2] == 0 and (zero[2] == 2 ** (bits - 1) if symmetric else zero[2] == 0)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [False, True])
def test_compensated_levels_survive_orts_quantizer_and_cut_the_output_error(bits, symmetric):
    rng = np.random.default_rng(11)
    k, n = 96, 24
    weight = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    basis = rng.standard_normal((8, k))
    x = correlated_inputs(rng, 512, basis)
    hessian = x.T @ x
    ours = compensated(weight, hessian, bits, 32, symmetric)
    # ORT's quantizer, run on the rewritten weights, writes exactly these levels
    assert same_levels(ours, ort_blockwise(ours, bits, 32, symmetric))
    plain = nearest(weight, bits, 32, symmetric)
    ratio = output_error(weight, ours, hessian) / output_error(weight, plain, hessian)
    assert ratio < (0.5 if bits == 4 else 0.7), ratio
    # and on inputs it never saw, from the same distribution
    fresh = correlated_inputs(np.random.default_rng(12), 256, basis)
    assert np.linalg.norm(fresh @ (ours - weight)) < np.linalg.norm(fresh @ (plain - weight))


def test_a_singular_hessian_is_damped_and_dead_inputs_are_rounded_alone():
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((64, 4)).astype(np.float32)
    x = correlated_inputs(rng, 4, rng.standard_normal((8, 64)))  # 4 rows: H of rank 4
    x[:, :10] = 0.0  # inputs never seen non-zero
    ours = compensated(weight, x.T @ x, 4, 32, False)
    assert ours is not None and np.isfinite(ours).all()
    assert same_levels(ours, ort_blockwise(ours, 4, 32, False))
