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

With the launch option sink_waits=True (Kernel.sink_waits; off by default, see the end),
a wait(0) also sinks to the next wait(0) of its block when nothing between reads its
results and only wgmmas and register-only ops or shared-memory views lie between (no
shared-memory access, barrier, copy, fence or region): attention backward's dK/dV loop
waited for dV += P^T dO before issuing dP^T = V dO^T, so the tensor cores idled between
two independent dots; now both are in flight and dP^T's wait retires the two (wgmma
groups complete in order), as Triton 3.6 issues them. dV's accumulator stays in flight
meanwhile: nothing reads it, and the next wgmma into it may chain on it. And a loop body's
last wait(0), for accumulators the body reads only as wgmma accumulators and only
yields (dK, dQ), is left to the next iteration's first wait, which retires every older
group: the accumulator crosses the back edge in flight and one wait(0) follows the loop
(Triton's loops wait twice an iteration, not four times). With both, the causal tutorial
backward spills 16 bytes outside its loops; the unmasked one does not spill.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import (Arange, Binary, Bitcast, Block, Broadcast, Cast, Compare, Constant, ExpandDims, For, Kernel, Op,
                  SharedIndex, SharedPermute, Splat, Unary, Value, WarpgroupMma, WarpgroupMmaWait, Where, Yield)

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


def _substituted(op: Op, mapping: dict) -> Op:
    """`op` (and the ops of its regions) reading `mapping`'s values in place of its keys."""
    changes = {}
    for field in dataclasses.fields(op):
        item = getattr(op, field.name)
        if field.name in ("result", "results"):
            continue
        if isinstance(item, Value) and item in mapping:
            changes[field.name] = mapping[item]
        elif isinstance(item, tuple) and any(isinstance(v, Value) and v in mapping for v in item):
            changes[field.name] = tuple(mapping.get(v, v) if isinstance(v, Value) else v for v in item)
    op = dataclasses.replace(op, **changes) if changes else op
    return op.map_regions(lambda b: Block(b.args, tuple(_substituted(o, mapping) for o in b.ops)))


def _deferred_end_wait(loop: For) -> Optional[tuple[For, tuple[int, ...]]]:
    """`loop` with its body's last wait(0) left to the next iteration's first wait, and the
    indices of the carried values it leaves in flight; None where that is not safe: the
    last wait's every result must be only yielded, each the next value of a carried
    accumulator that the body reads only as a wgmma's accumulator (chaining on it in
    flight), and the body's first wait must retire it (at least `pending` wgmmas issued
    before that wait)."""
    ops = list(loop.body.ops)
    waits = [k for k, op in enumerate(ops) if isinstance(op, WarpgroupMmaWait)]
    if len(waits) < 2 or ops[waits[-1]].pending != 0 or not isinstance(ops[-1], Yield):
        return None
    wait, first, yielded = ops[waits[-1]], ops[waits[0]], ops[-1]
    if sum(isinstance(op, WarpgroupMma) for op in ops[:waits[0]]) < first.pending + 1:
        return None
    if any(value in wait.results for op in ops[waits[-1] + 1:-1] for value in op.uses()):
        return None
    inner = list(loop.body.walk())
    carried = []
    for result, dep in zip(wait.results, wait.deps):
        if list(yielded.values).count(result) != 1:
            return None
        index = yielded.values.index(result)
        arg = loop.body.args[1 + index]
        readers = [op for op in inner if arg in op.uses()]
        if not readers or not all(isinstance(op, WarpgroupMma) and op.acc is arg and arg not in (op.a, op.b)
                                  for op in readers):
            return None
        carried.append((index, result, dep))
    mapping = {result: dep for _, result, dep in carried}
    body = Block(loop.body.args, tuple(_substituted(op, mapping) for k, op in enumerate(ops) if k != waits[-1]))
    return dataclasses.replace(loop, body=body), tuple(index for index, _, _ in carried)


def defer_loop_end_waits(block: Block) -> Block:
    """`block` with each loop whose last wait can be deferred (_deferred_end_wait) leaving
    those accumulators in flight across the back edge; one wait(0) after the loop."""
    out: list[Op] = []
    mapping: dict = {}
    for op in block.ops:
        op = _substituted(op, mapping) if mapping else op
        deferred = _deferred_end_wait(op) if isinstance(op, For) else None
        if deferred is None:
            out.append(op)
            continue
        loop, indices = deferred
        in_flight = tuple(loop.results[k] for k in indices)
        waited = tuple(Value(v.type, v.hint) for v in in_flight)
        out.extend((loop, WarpgroupMmaWait(results=waited, deps=in_flight, pending=0, loc=loop.loc)))
        mapping.update(zip(in_flight, waited))
    return Block(block.args, tuple(out))


def merge_wgmma_waits(kernel: Kernel) -> Kernel:
    """Adjacent waits merged; with the launch option sink_waits, waits sunk first."""
    if not kernel.sink_waits:
        return kernel.with_body(merge_block(kernel.body))

    def block(region: Block) -> Block:
        region = Block(region.args, tuple(op.map_regions(block) for op in region.ops))
        return merge_block(defer_loop_end_waits(sink_waits(region)))

    return kernel.with_body(block(kernel.body))
