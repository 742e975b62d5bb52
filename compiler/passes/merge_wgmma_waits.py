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
"""

from __future__ import annotations

from ..ir import Block, Kernel, Op, WarpgroupMmaWait

NAME = "merge_wgmma_waits"


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
    return kernel.with_body(merge_block(kernel.body))
