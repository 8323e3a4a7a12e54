"""Einsum of two operands that is a (batched) matrix product, as Transpose + MatMul + Transpose:
"bij,bjk->bik", "bhqd,bhkd->bhqk", "ij,jk->ik". Other equations (a sum over one operand, a diagonal,
an ellipsis, several contracted letters) stay Einsum."""

from __future__ import annotations

from onnx import NodeProto

from ortprep.transforms.decompose.base import Decomposition, Emitter, attr


def matmul_plan(equation: str) -> tuple[list[int], list[int], list[int]] | None:
    """(A's permutation to (batch..., i, k), B's to (batch..., k, j), the product's permutation to
    the output's order), or None where the equation is not a single-contraction matrix product."""
    text = equation.replace(" ", "")
    if "..." in text or text.count(",") != 1:
        return None
    left, _, out = text.partition("->")
    a, b = left.split(",")
    if not _arrow(text):
        out = "".join(sorted(c for c in a + b if (a + b).count(c) == 1))
    if any(len(set(s)) != len(s) for s in (a, b, out)) or not (a + b + out).isalpha():
        return None
    batch = [c for c in out if c in a and c in b]
    contracted = [c for c in a if c in b and c not in out]
    free_a = [c for c in a if c not in b]
    free_b = [c for c in b if c not in a]
    if len(contracted) != 1 or len(free_a) != 1 or len(free_b) != 1 or set(out) != set(batch + free_a + free_b):
        return None
    order_a = batch + free_a + contracted
    order_b = batch + contracted + free_b
    product = batch + free_a + free_b
    return [a.index(c) for c in order_a], [b.index(c) for c in order_b], [product.index(c) for c in out]


def _arrow(text: str) -> bool:
    return "->" in text


def _einsum(node: NodeProto, emit: Emitter) -> bool:
    plan = matmul_plan(attr(node, "equation", ""))
    if plan is None or len(node.input) != 2:
        return False
    perm_a, perm_b, perm_out = plan

    def arranged(name: str, perm: list[int]) -> str:
        return name if perm == sorted(perm) else emit.node("Transpose", [name], perm=perm)

    identity = perm_out == sorted(perm_out)
    product = emit.node("MatMul", [arranged(node.input[0], perm_a), arranged(node.input[1], perm_b)],
                        out=node.output[0] if identity else None)
    if not identity:
        emit.node("Transpose", [product], out=node.output[0], perm=perm_out)
    return True


EINSUMS = (
    Decomposition("einsum-matmul", "Einsum", ("Transpose", "MatMul"), (12, None), _einsum,
                  "a two-operand, one-contraction Einsum as Transpose + MatMul (+ Transpose)"),
)
