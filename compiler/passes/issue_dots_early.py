"""issue_dots_early: in a loop body, a dot that does not depend on the one before it is
issued right after it, so the tensor cores run it while the warps work on the first's
result.

Attention backward's dQ loop waits for each wgmma before the next: S = Q K^T, then P =
exp2(S - lse), then dP = dO V^T, then dS = P (dP - delta), then dQ += dS K. dP reads
only operands in shared memory, not P: issued right after S's wgmma, it runs while the
warps compute P (its dK/dV loop likewise issues dP = V dO^T right after S = K Q^T where
the registers allow). For an async wgmma `first` in a loop body whose warpgroup_mma_wait(0)
comes before any other wgmma, the first later async wgmma `moved` that reads nothing
computed after `first` (except constants, views and conversions of values from before
it, which move with it) is moved to right after `first`, and `first`'s wait becomes
wait(1): at most one group, `moved`'s, is left in flight, so `first` retired. `moved`'s
own wait stays where it was. Only register and shared-read ops may lie between the two
(no shared-memory writes, barriers, fences, copies or nested regions), so no shared
hazard moves.

Both results are then live together: a body is left alone when its loop-carried fp32
tensors and the two results would take more than MAX_LIVE_REGISTERS registers a thread
(attention backward's dK and dV take 128 at head_dim 64, 256 at 128: ptxas would spill).
The launch option `issue_dots_early=False` keeps every dot where the source put it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import (AddPtr, Arange, Binary, Bitcast, Block, Broadcast, Cast, Compare, Constant, ConvertLayout,
                  ExpandDims, For, Kernel, Op, Permute, Reshape, SharedIndex, SharedLoad, SharedPermute, Splat, Unary,
                  Value, WarpgroupMma, WarpgroupMmaWait, Where)
from ..types import TensorType, fp32

NAME = "issue_dots_early"

# Registers a thread may give to carried fp32 tensors and the two results in flight; the
# rest of the 255 is left to operands, addresses and temporaries. (At 192 attention
# backward's unmasked dK/dV loop at head_dim 64 qualifies too, and its causal kernel
# spills.)
MAX_LIVE_REGISTERS = 160

# Ops that move with `moved` when it reads them: they compute from values before `first`.
MOVABLE = (Constant, Splat, ConvertLayout, SharedPermute, SharedIndex, Broadcast, ExpandDims)
# Ops that may lie between `first` and `moved`: they neither write shared memory nor sync.
BETWEEN = MOVABLE + (Arange, Binary, Unary, Compare, Where, Cast, Bitcast, AddPtr, Reshape, Permute, SharedLoad,
                     WarpgroupMma, WarpgroupMmaWait)


def _registers(value: Value, threads: int) -> int:
    type_ = value.type
    if not isinstance(type_, TensorType):
        return 0
    count = 1
    for size in type_.shape:
        count *= size
    return -(-count // threads)


def _is_async_dot(op: Op) -> bool:
    return isinstance(op, WarpgroupMma) and op.is_async


def _producers(moved: Op, ops: list[Op], start: int, end: int) -> Optional[list[int]]:
    """Positions in (start, end) of the ops `moved` reads, transitively, or None when one
    of them cannot move (it is not MOVABLE, or reads something computed after `start`)."""
    defined_at = {value: position for position, op in enumerate(ops) for value in op.defines()}
    needed: set[int] = set()
    pending = list(moved.uses())
    while pending:
        position = defined_at.get(pending.pop())
        if position is None or position <= start or position in needed:
            continue  # from before `first` (or from outside the body)
        if position >= end or not isinstance(ops[position], MOVABLE):
            return None
        needed.add(position)
        pending.extend(ops[position].uses())
    return sorted(needed)


def schedule_body(block: Block, threads: int) -> Block:
    """`block` with each independent dot issued right after the dot before it (see the
    module docstring)."""
    ops = list(block.ops)
    carried = sum(_registers(arg, threads) for arg in block.args[1:]
                  if isinstance(arg.type, TensorType) and arg.type.element == fp32)
    position = 0
    while position < len(ops):
        first = ops[position]
        position += 1
        if not _is_async_dot(first):
            continue
        later = ops[position:]
        wait_at = next((position + k for k, op in enumerate(later)
                        if isinstance(op, (WarpgroupMma, WarpgroupMmaWait))), None)
        wait = ops[wait_at] if wait_at is not None else None
        if not (isinstance(wait, WarpgroupMmaWait) and wait.pending == 0 and first.result in wait.deps
                and all(isinstance(op, BETWEEN) for op in ops[position:wait_at])):
            continue
        for index in range(wait_at + 1, len(ops)):
            if not isinstance(ops[index], BETWEEN):
                break
            moved = ops[index]
            if not _is_async_dot(moved):
                continue
            live = carried + _registers(first.result, threads) + _registers(moved.result, threads)
            if live > MAX_LIVE_REGISTERS:
                continue
            producers = _producers(moved, ops, position - 1, index)
            if producers is None:
                continue
            taking = producers + [index]
            taken = [ops[k] for k in taking]
            rest = [op for k, op in enumerate(ops) if k not in set(taking)]
            at = rest.index(first) + 1
            ops = rest[:at] + taken + rest[at:]
            ops[ops.index(wait)] = dataclasses.replace(wait, pending=1)
            break
    return Block(block.args, tuple(ops))


def issue_dots_early(kernel: Kernel) -> Kernel:
    """Every loop body scheduled by schedule_body, unless the launch asked not to."""
    if not kernel.issue_dots_early:
        return kernel
    threads = kernel.num_warps * 32

    def block(region: Block) -> Block:
        ops = []
        for op in region.ops:
            op = op.map_regions(block)
            if isinstance(op, For):
                op = dataclasses.replace(op, body=schedule_body(op.body, threads))
            ops.append(op)
        return Block(region.args, tuple(ops))

    return kernel.with_body(block(kernel.body))
