"""hoist_slot_loads: in a pipelined loop body, the shared loads that read only what the
iteration had before its first wgmma (a ring slot's rows) are issued before that wgmma.

pipeline_row_loads reads attention backward's lse and delta from their ring slots with a
shared load placed where the source loaded them, which the dots' waits come before: lse
after S^T's wait, delta after dP^T's. ptxas does not move an ld.shared above a
wgmma.wait_group, so each load's latency is paid, with the exponentials or dS that need
it waiting on it (short-scoreboard stalls), every iteration. Issued before the first
wgmma, right after the barrier that made the slot visible, the loads run under the
wgmma (Triton 3.6 issues its lse load there).

A SharedLoad moves when every value it reads is defined before the body's first
WarpgroupMma, and only register ops, wgmmas, wgmma waits and shared reads or views lie
between (no shared write, barrier, fence, copy or region): reads move past reads only.
Its result then lives from the first wgmma on (a row slice: a few registers a thread).
Off by default; the launch option `hoist_slot_loads=True` asks for it.
"""

from __future__ import annotations

import dataclasses

from ..ir import (Arange, Binary, Bitcast, Block, Broadcast, Cast, Compare, Constant, ExpandDims, For, Kernel,
                  SharedIndex, SharedLoad, SharedPermute, Splat, Unary, WarpgroupMma, WarpgroupMmaWait, Where)

NAME = "hoist_slot_loads"

# Ops a shared load may move above: they neither write shared memory nor sync.
PASSABLE = (WarpgroupMma, WarpgroupMmaWait, SharedLoad, SharedIndex, SharedPermute, Constant, Splat, Broadcast,
            ExpandDims, Arange, Binary, Unary, Compare, Where, Cast, Bitcast)


def hoist_body(block: Block) -> Block:
    """`block` with its movable shared loads right before its first wgmma."""
    ops = list(block.ops)
    first = next((k for k, op in enumerate(ops) if isinstance(op, WarpgroupMma)), None)
    if first is None:
        return block
    before = set(block.args)
    for op in ops[:first]:
        before.update(op.defines())
    moved = []
    for op in ops[first:]:
        if isinstance(op, SharedLoad) and all(value in before for value in op.uses()):
            moved.append(op)
        elif not isinstance(op, PASSABLE):
            break
    if not moved:
        return block
    rest = [op for op in ops if not any(op is load for load in moved)]
    return Block(block.args, tuple(rest[:first] + moved + rest[first:]))


def hoist_slot_loads(kernel: Kernel) -> Kernel:
    """Every loop body's slot loads hoisted (see the module docstring), when the launch asked."""
    if not kernel.hoist_slot_loads:
        return kernel

    def block(region: Block) -> Block:
        ops = []
        for op in region.ops:
            op = op.map_regions(block)
            if isinstance(op, For):
                op = dataclasses.replace(op, body=hoist_body(op.body))
            ops.append(op)
        return Block(region.args, tuple(ops))

    return kernel.with_body(block(kernel.body))
