"""Lowering of mbarriers (Gluon's `mbarrier` module: init, expect, arrive, wait, invalidate).

Init, expect, arrive and invalidate are issued by one thread (async_common.issuer). An
arrive first syncs the threads that run it (the partition's named barrier, bar.sync 0
outside warp_specialize, bar.warp.sync for one warp), so their earlier work is ordered
before the single arrival; a per-warp arrive syncs each warp alone (bar.warp.sync) and
its lane 0 arrives. A wait is executed by every thread.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import MBarrierArrive, MBarrierExpect, MBarrierInit, MBarrierInvalidate, MBarrierWait
from . import llvm_types as T
from . import ptx_asm
from .async_common import as_i32, barrier_address, elected, issuer
from .context import Lowering, lowers


def _lane_zero(ctx: Lowering) -> ir.Value:
    """i1: this thread is lane 0 of its warp. A per-warp arrive runs after bar.warp.sync
    over the whole warp, so lane 0 is there to arrive for it: elect.sync would pick the
    same lane, at an instruction per arrive (five a key step in the attention kernel),
    where this predicate is computed once."""
    return ctx.cached("lane0", lambda b: b.icmp_unsigned("==", ctx.hardware_index("lane"), ir.Constant(T.I32, 0)))


def _running_warps(ctx: Lowering) -> int:
    if ctx.partition is not None:
        return ctx.partition.num_warps
    if ctx.barrier_threads is not None:
        return ctx.barrier_threads // 32
    return ctx.kernel.total_warps


@lowers(MBarrierInit)
def lower_mbarrier_init(ctx: Lowering, op: MBarrierInit) -> None:
    ctx.inline_asm(ptx_asm.mbarrier_init(op.count), [barrier_address(ctx, op.barrier), elected(ctx)])


@lowers(MBarrierExpect)
def lower_mbarrier_expect(ctx: Lowering, op: MBarrierExpect) -> None:
    operands = [barrier_address(ctx, op.barrier), issuer(ctx, op.pred)]
    if isinstance(op.nbytes, int):
        ctx.inline_asm(ptx_asm.mbarrier_expect(op.nbytes), operands)
    else:
        ctx.inline_asm(ptx_asm.mbarrier_expect(None), operands + [as_i32(ctx, ctx.scalar(op.nbytes))])


@lowers(MBarrierArrive)
def lower_mbarrier_arrive(ctx: Lowering, op: MBarrierArrive) -> None:
    address = barrier_address(ctx, op.barrier)
    if op.per_warp or op.per_thread:
        if ctx.partition is None and ctx.kernel.total_warps > ctx.kernel.num_warps:
            which = "per-warp" if op.per_warp else "per-thread"
            raise CompilationError(
                f"a {which} mbarrier arrive outside warp_specialize, in a kernel with worker warps: "
                "those warps run this code too and would arrive as well", op.loc,
                suggestion="arrive per warp or per thread inside a partition, or arrive once")
        if op.per_warp:
            _warp_sync(ctx)
            pred = issuer(ctx, op.pred, _lane_zero(ctx))
        else:
            pred = ir.Constant(T.I1, 1) if op.pred is None else ctx.scalar(op.pred)
    else:
        if _running_warps(ctx) > 1:
            ctx.barrier()
        else:
            _warp_sync(ctx)
        pred = issuer(ctx, op.pred)
    count, counted = op.count, []  # a run-time count is the asm's last operand
    if not isinstance(count, int):
        count, counted = None, [as_i32(ctx, ctx.scalar(op.count))]
    if op.cta is not None:  # on the barrier at the same offset in the CTA of cluster rank `cta`
        rank = as_i32(ctx, ctx.scalar(op.cta))
        ctx.inline_asm(ptx_asm.mbarrier_arrive_remote(count, op.scope), [address, pred, rank] + counted)
    else:
        ctx.inline_asm(ptx_asm.mbarrier_arrive(count), [address, pred] + counted)


def _warp_sync(ctx: Lowering) -> None:
    ctx.intrinsic("llvm.nvvm.bar.warp.sync", ir.VoidType(), [ir.Constant(T.I32, -1)])


@lowers(MBarrierWait)
def lower_mbarrier_wait(ctx: Lowering, op: MBarrierWait) -> None:
    parity = ctx.builder.and_(as_i32(ctx, ctx.scalar(op.phase)), ir.Constant(T.I32, 1))
    address = barrier_address(ctx, op.barrier)
    if not op.elected:
        ctx.inline_asm(ptx_asm.mbarrier_wait(), [address, parity])
        return
    with ctx.builder.if_then(elected(ctx)):  # the other threads go on
        ctx.inline_asm(ptx_asm.mbarrier_wait(), [address, parity])


@lowers(MBarrierInvalidate)
def lower_mbarrier_invalidate(ctx: Lowering, op: MBarrierInvalidate) -> None:
    ctx.inline_asm(ptx_asm.mbarrier_invalidate(), [barrier_address(ctx, op.barrier), elected(ctx)])
