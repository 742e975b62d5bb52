"""hoist_copy_fences: a loop whose only shared-memory writes are cp.async copies keeps no
proxy fence inside it.

accelerate_dots fences each wgmma's operand stores (generic-proxy writes that the async
proxy then reads); pipeline_dot_loops turns a loop's operand stores into cp.async copies
and the fence stays in the body, run every iteration (ptxas: MEMBAR.ALL.CTA and
FENCE.VIEW.ASYNC.S, behind dummy loads, before the first wgmma). Bytes a cp.async wrote
reach wgmma through their wait_group and a barrier alone (the emulator's rule,
runtime/emulator/ordering.py; NVIDIA's cp.async wgmma mainloops and Triton's pipelined
loops fence them no more), so the fences of such a loop leave it: one fence before the
loop covers the stores made before it (attention's Q), which the fences inside covered.

A loop whose body (nested regions included) also stores to shared memory, copies by TMA
or bulk copy (async-proxy writes, which need fences after the generic reads they
overwrite), or holds a loop or warp_specialize, is left as it is: its inner
loops are looked at on their own.
"""

from __future__ import annotations

from ..ir import (AsyncBulkCopyGlobalToShared, Block, FenceAsyncShared, For, Kernel, Op, SharedStore,
                  TmaAsyncCopyGlobalToShared, TmaAsyncReduceAdd, WarpSpecialize)

NAME = "hoist_copy_fences"

# Ops that make a loop keep its fences: generic shared writes other than cp.async,
# async-proxy writes, and regions this pass does not see through.
_KEEPS_FENCES = (SharedStore, TmaAsyncCopyGlobalToShared, AsyncBulkCopyGlobalToShared, TmaAsyncReduceAdd, For,
                 WarpSpecialize)


def _without_fences(block: Block) -> Block:
    ops = tuple(op.map_regions(_without_fences) for op in block.ops if not isinstance(op, FenceAsyncShared))
    return Block(block.args, ops)


def _loop_without_fences(loop: For) -> For | None:
    """`loop` with its fences removed, or None when it keeps them (or has none)."""
    body = list(loop.body.walk())
    if not any(isinstance(op, FenceAsyncShared) for op in body):
        return None
    if any(isinstance(op, _KEEPS_FENCES) for op in body):
        return None
    return loop.map_regions(_without_fences)


def _block(block: Block) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        op = op.map_regions(_block)
        if isinstance(op, For):
            hoisted = _loop_without_fences(op)
            if hoisted is not None:
                if not (ops and isinstance(ops[-1], FenceAsyncShared)):
                    ops.append(FenceAsyncShared(loc=op.loc))
                op = hoisted
        ops.append(op)
    return Block(block.args, tuple(ops))


def hoist_copy_fences(kernel: Kernel) -> Kernel:
    return kernel.with_body(_block(kernel.body))
