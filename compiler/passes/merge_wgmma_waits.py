"""merge_wgmma_waits: two wgmma waits in a row become one.

pipeline_dot_loops leaves attention's loop a wait(0) for the first dot's result followed
by a wait(0) for the accumulator the second dot left in flight across the back edge
(pipeline_chained_dots): the first retires every group, so the second would be one more
wgmma.wait_group that waits for nothing. propagate_layouts places one result per wait;
once the layouts are final, one wait passes any number of deps through, so

    %s = warpgroup_mma_wait [pending=p] %s_in
    %acc = warpgroup_mma_wait [pending=q] %acc_in

becomes `%s, %acc = warpgroup_mma_wait [pending=min(p, q)] %s_in, %acc_in`: no fewer
groups retired than by the two, and nothing runs between them that could read a result
before its wait.

With the launch option sink_waits=True (Kernel.sink_waits; off by default: in the causal
tutorial backward, at 255 registers, it costs an 8-byte spill outside the loops), a
wait(0) also sinks to the next wait(0) of its block when nothing between reads its
results and only wgmmas and register-only ops or shared-memory views lie between (no
shared-memory access, barrier, copy, fence or region): attention backward's dK/dV loop
waited for dV += P^T dO before issuing dP^T = V dO^T, so the tensor cores idled between
two independent dots; now both are in flight and dP^T's wait retires the two (wgmma
groups complete in order), as Triton 3.6 issues them. dV's accumulator stays in flight
meanwhile: nothing reads it, and the next wgmma into it may chain on it.
"""

from __future__ import annotations

from ..ir import (Arange, Binary, Bitcast, Block, Broadcast, Cast, Compare, Constant, ExpandDims, Kernel, Op,
                  SharedIndex, SharedPermute, Splat, Unary, WarpgroupMma, WarpgroupMmaWait, Where)

NAME = "merge_wgmma_waits"

# Ops a wait(0) may sink past: wgmmas (the next wait retires them too) and ops that touch
# no shared memory and do not sync.
SINKS_PAST = (WarpgroupMma, SharedIndex, SharedPermute, Constant, Splat, Broadcast, ExpandDims, Arange, Binary,
              Unary, Compare, Where, Cast, Bitcast)


def sink_waits(block: Block) -> Block:
    """`block` with each wait(0) moved into the next wait(0) where the ops between allow it
    (see the module docstring)."""
    ops = list(block.ops)
    position = 0
    while position < len(ops):
        wait = ops[position]
        if not (isinstance(wait, WarpgroupMmaWait) and wait.pending == 0):
            position += 1
            continue
        results = set(wait.results)
        later = next((k for k in range(position + 1, len(ops)) if not isinstance(ops[k], SINKS_PAST)
                      or any(value in results for value in ops[k].uses())), None)
        target = ops[later] if later is not None else None
        if not (isinstance(target, WarpgroupMmaWait) and target.pending == 0
                and not any(value in results for value in target.uses())
                and any(isinstance(op, WarpgroupMma) for op in ops[position + 1:later])):
            position += 1
            continue
        ops[later] = WarpgroupMmaWait(results=wait.results + target.results, deps=wait.deps + target.deps,
                                      pending=0, anchor=target.anchor or wait.anchor, loc=target.loc)
        del ops[position]
    return Block(block.args, tuple(ops))


def merge_block(block: Block) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        op = op.map_regions(merge_block)
        last = ops[-1] if ops else None
        if isinstance(op, WarpgroupMmaWait) and isinstance(last, WarpgroupMmaWait):
            ops[-1] = WarpgroupMmaWait(results=last.results + op.results, deps=last.deps + op.deps,
                                       pending=min(last.pending, op.pending), anchor=last.anchor or op.anchor,
                                       loc=last.loc)
            continue
        ops.append(op)
    return Block(block.args, tuple(ops))


def merge_wgmma_waits(kernel: Kernel) -> Kernel:
    """Adjacent waits merged; with the launch option sink_waits, waits sunk first."""
    if not kernel.sink_waits:
        return kernel.with_body(merge_block(kernel.body))

    def block(region: Block) -> Block:
        return merge_block(sink_waits(Block(region.args, tuple(op.map_regions(block) for op in region.ops))))

    return kernel.with_body(block(kernel.body))
