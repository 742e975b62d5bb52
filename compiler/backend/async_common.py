"""What the lowerings of the async ops share (lower_mbarrier, lower_tma, lower_async_copy).

"One thread issues" ops (mbarrier init/expect/arrive/invalidate, TMA load/store) are
predicated on thread 0 of the partition running them (of the CTA outside
warp_specialize), and on the op's `pred` when it has one; the other threads skip them.
Their PTX takes shared addresses as 32-bit integers and counts as i32.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import Value
from . import llvm_types as T
from .context import Lowering, SharedView


def elected(ctx: Lowering) -> ir.Value:
    """i1: this thread is thread 0 of the partition (of the CTA outside partitions)."""
    return ctx.cached("thread0", lambda b: b.icmp_unsigned("==", ctx.thread_id, ir.Constant(T.I32, 0)))


def issuer(ctx: Lowering, pred, thread: ir.Value | None = None) -> ir.Value:
    """i1: `thread` (thread 0 of the partition: `elected`) where the op's `pred` holds."""
    thread = elected(ctx) if thread is None else thread
    return thread if pred is None else ctx.builder.and_(thread, ctx.scalar(pred))


def shared_address(ctx: Lowering, view: SharedView) -> ir.Value:
    """32-bit shared address of the view's element at coordinates 0."""
    b = ctx.builder
    pointer = view.base
    if view.xor:
        pointer = b.gep(pointer, [ir.Constant(T.I32, view.xor)], source_etype=T.memory_type(view.type.element))
    return b.ptrtoint(pointer, T.I32)


def barrier_address(ctx: Lowering, value: Value) -> ir.Value:
    return shared_address(ctx, ctx.shared(value))


def as_i32(ctx: Lowering, value: ir.Value) -> ir.Value:
    width = value.type.width
    if width == 32:
        return value
    return ctx.builder.trunc(value, T.I32) if width > 32 else ctx.builder.zext(value, T.I32)
