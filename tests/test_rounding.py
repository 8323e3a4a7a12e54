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


def test_halves_round_away_from_zero_as_orts_kernel_does():
    """np.round takes a half to the even level; ORT's kernel takes it away from zero. A block whose
    largest value sits at a half: the two disagree about the grid itself (review of session 27)."""
    weight = np.zeros((32, 1), np.float32)
    weight[:3, 0] = [-2.5, 12.5, 0.5]
    assert same_levels(nearest(weight, 4, 32, False), ort_blockwise(weight, 4, 32, False))


@pytest.mark.parametrize("symmetric", [False, True])
def test_partial_and_one_signed_blocks_survive_orts_quantizer(symmetric):
    rng = np.random.default_rng(21)
    k, n = 70, 8  # a last block of 6
    weight = rng.standard_normal((k, n)).astype(np.float32)
    weight[:32, 0] = np.abs(weight[:32, 0])
    weight[32:64, 1] = -np.abs(weight[32:64, 1])
    weight[:32, 2] = 0.0
    x = correlated_inputs(rng, 256, rng.standard_normal((6, k)))
    ours = compensated(weight, x.T @ x, 4, 32, symmetric)
    assert same_levels(ours, ort_blockwise(ours, 4, 32, symmetric))
    assert not ours[:32, 2].any()  # a block of zeros stays zeros


def test_a_non_finite_input_moment_gives_no_rounding():
    weight = np.ones((32, 2), np.float32)
    hessian = np.eye(32)
    hessian[3, 3] = np.inf
    assert compensated(weight, hessian, 4, 32, False) is None


def _two_readers(path, other: str):
    """mm1 = MatMul(x, W); mm2 = ``other``(relu(mm1), W): W read by two nodes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node(other, ["r", "W"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64] if other == "Add" else [1, 64])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return model


@pytest.mark.parametrize("other, excluded", [("MatMul", {"mm2"}), ("Add", set()), ("MatMul", set())])
def test_a_weight_read_elsewhere_is_left_alone(tmp_path, other, excluded):
    """W read by a MatMul left float (--exclude-node) or by another op: rounding it would change
    what that reader computes. Read by two MatMuls both rounded: rounded once, for both inputs."""
    from onnx import numpy_helper

    from ortprep.runtime.rounding import compensate_model

    path = tmp_path / "two.onnx"
    model = _two_readers(path, other)
    before = numpy_helper.to_array(model.graph.initializer[0]).copy()
    rng = np.random.default_rng(4)
    basis = rng.standard_normal((4, 64))

    def samples():
        return ({"x": correlated_inputs(np.random.default_rng(i), 1, basis).astype(np.float32)} for i in range(16))

    steps = []
    done = compensate_model(
        model, str(path), samples, 16, 4, 32, False, excluded, progress=lambda d, t: steps.append((d, t))
    )
    after = numpy_helper.to_array(model.graph.initializer[0])
    if steps:  # samples read, then each weight rounded: it counts up to its total and ends there
        assert [d for d, _ in steps] == list(range(1, len(steps) + 1)) and steps[-1][0] == steps[-1][1]
    if other == "MatMul" and not excluded:
        assert done["matmuls"] == 2 and not np.array_equal(after, before)
        assert same_levels(after, ort_blockwise(after, 4, 32, False))
    else:
        assert done["matmuls"] == 0 and np.array_equal(after, before)


def test_a_weight_no_better_than_nearest_is_not_touched(tmp_path):
    """Inputs with no correlation (H = I): the compensated rounding cannot beat nearest, and the
    initializer keeps its float values for ORT's quantizer to round once."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ortprep.runtime.rounding import compensate_model

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "one.onnx")
    before = numpy_helper.to_array(w).copy()
    done = compensate_model(model, str(tmp_path / "one.onnx"), lambda: iter([{"x": np.eye(32, dtype=np.float32)}]), 1,
                            4, 32, False, set())
    assert done["kept_nearest"] == ["mm"] and done["matmuls"] == 0
    assert np.array_equal(numpy_helper.to_array(model.graph.initializer[0]), before)
