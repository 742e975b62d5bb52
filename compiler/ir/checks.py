"""Checks the ops' `verify` methods share: elementwise agreement, the layout a shape op's
rule gives, and a region's terminator matching the values it feeds."""

from __future__ import annotations

from ...layouts import LayoutError
from ...layouts import rules as layout_rules
from ..types import TensorType
from .core import Block, Op, Value


def check_elementwise(op: Op, tensor_only: bool = False) -> None:
    """Tensor operands and results agree on shape and layout; `tensor_only`: the op works
    on tensors here, so a scalar operand is a mistake (it must be splat first)."""
    tensors = [v for v in op.uses() + op.defines() if isinstance(v.type, TensorType)]
    if not tensors:
        return
    first = tensors[0].type
    for value in tensors[1:]:
        if value.type.shape != first.shape:
            raise op.invalid(f"shapes differ: {list(first.shape)} and {list(value.type.shape)}")
        if value.type.layout != first.layout:
            raise op.invalid("operands and result have different layouts")
    if tensor_only and any(not isinstance(v.type, TensorType) for v in op.uses()):
        raise op.invalid("mixes scalar and tensor operands; splat the scalar first")


def strip(layout):
    """Compare layouts without caring whether an empty `block` dim is listed."""
    bases = {k: v for k, v in layout.bases.items() if v or k != "block"}
    return (tuple(sorted(bases.items())), tuple(layout.out_dims.items()))


def check_result_layout(op: Op, rule) -> None:
    """The result's layout is what `rule()` (a layout rule) gives for the operand's."""
    src, dst = op.operand.type, op.result.type
    if src.layout is None or dst.layout is None:
        return
    try:
        expected = rule()
    except LayoutError as error:
        raise op.invalid(str(error)) from None
    if expected is not None and strip(expected) != strip(dst.layout):
        raise op.invalid(f"result layout should be {expected}, found {dst.layout}")


def check_broadcast(op: Op) -> None:
    src, dst = op.operand.type, op.result.type
    if src.layout is None or dst.layout is None:
        return
    try:
        layout_rules.broadcast_register_map(src.layout, dst.layout)
    except LayoutError as error:
        raise op.invalid(str(error)) from None


def check_yield(op: Op, block: Block, expected: tuple[Value, ...], what: str) -> None:
    terminator = block.ops[-1] if block.ops else None
    if terminator is None or not terminator.TERMINATOR:
        raise op.invalid(f"{what} does not end with yield")
    values = terminator.values
    if len(values) != len(expected):
        raise op.invalid(f"{what} yields {len(values)} values for {len(expected)}")
    for got, want in zip(values, expected):
        if got.type != want.type:
            raise op.invalid(f"{what} yields {got.type} where {want.type} is carried")
