"""Lowering of shape ops: no data moves, registers are renamed or gathered.

expand_dims, reshape and permute keep every register where it is (their result layouts,
from `layouts.rules`, describe the same registers with new coordinates). broadcast gathers
registers with `layout_rules.broadcast_register_map`: each thread already holds the
elements it needs, possibly several times.
"""

from __future__ import annotations

from ...layouts import LayoutError
from ..errors import CompilationError
from ..ir import AxisHint, Broadcast, ExpandDims, Permute, Reshape
from ...layouts.rules import broadcast_register_map
from ..types import TensorType
from . import llvm_types as T
from .context import Lowering, lowers


@lowers(ExpandDims, Reshape, Permute)
def lower_same_registers(ctx: Lowering, op) -> None:
    if not isinstance(op.operand.type, TensorType):
        # A scalar made into a one-element tensor: every register holds it.
        ctx.define(op.result, (ctx.scalar(op.operand),) * T.register_count(op.result.type))
        return
    registers = ctx.registers(op.operand)
    if len(registers) != T.register_count(op.result.type):
        raise CompilationError(
            f"{op.NAME} changes the register count ({len(registers)} -> "
            f"{T.register_count(op.result.type)}); its result layout must come from layouts.rules",
            op.loc)
    ctx.define(op.result, registers)


@lowers(Broadcast)
def lower_broadcast(ctx: Lowering, op: Broadcast) -> None:
    if not isinstance(op.operand.type, TensorType):
        ctx.define(op.result, (ctx.scalar(op.operand),) * T.register_count(op.result.type))
        return
    try:
        mapping = broadcast_register_map(op.operand.type.layout, op.result.type.layout)
    except LayoutError as error:
        raise CompilationError(f"broadcast cannot be done in registers: {error}", op.loc,
                               suggestion="convert the operand's layout first") from None
    registers = ctx.registers(op.operand)
    ctx.define(op.result, tuple(registers[source] for source in mapping))


@lowers(AxisHint)
def lower_axis_hint(ctx: Lowering, op: AxisHint) -> None:
    """The operand itself: the hint was for axis analysis, which has run."""
    ctx.define(op.result, ctx.get(op.operand))
