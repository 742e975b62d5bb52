"""The wait schedule of a pipelined loop whose last dot accumulates into a value the body
reads itself (attention's loop, pipeline_dot_loops): the last wgmma stays in flight
across the back edge, and the next iteration's first wait(0) retires it.

Attention's body runs two dots, S = Q K^T and acc = P V + acc * alpha: the rescale reads
the accumulator before the second wgmma, so the single-dot scheme (wait(1) after the
wgmma, the accumulator read by nothing but the next wgmma) does not apply. Here the
second wgmma's wait(0) leaves the body: its result goes to the yield in flight, and right
after the first wgmma's wait(0) in the next iteration (which, waiting for every group,
retires the second wgmma of the iteration before) a wait on the carried accumulator
gives the rescale its registers:

    async_copy_wait_group; fence; barrier
    s = warpgroup_mma q, k_slot                   (issued while P V of i - 1 still runs)
    s = warpgroup_mma_wait 0 s                    (retires both)
    acc = warpgroup_mma_wait 0 acc                (already retired: the registers, in order;
                                                   merge_wgmma_waits makes the two one wait)
    ... softmax, acc * alpha ...
    acc' = warpgroup_mma p, v_slot, acc           (no wait: yielded in flight)
    barrier; async_copy <- iteration i + S - 1    (into the slot iteration i - 1 read)

The tensor cores run P V of one iteration and Q K^T of the next back to back. The refill
of iteration i - 1's slot comes after the wait that retired its last reader, as before
(the CTA barrier insert_barriers places before the copies covers the other warps).

`drop_repeated_fences` leaves one fence_async_shared per straight run of a body: a fence
orders this thread's earlier generic-proxy writes of shared memory before later wgmma
reads; a second one with no shared write between them orders nothing more (the rings'
copies land at their wait_group, which the first fence follows).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import (AsyncCopyGlobalToShared, AsyncCopyWaitGroup, Block, ConvertLayout, FenceAsyncShared, Op, SharedStore, Value,
                  WarpgroupMma, WarpgroupMmaWait)


@dataclasses.dataclass(frozen=True)
class ChainedWait:
    """`wait`: the body's wait(0) of its last async wgmma, whose result (directly or
    through one ConvertLayout) is the yield's value `carried` only; `earlier`: the body's
    wait(0) before the first read of that value's body argument, where the next iteration
    waits for it."""

    wait: WarpgroupMmaWait
    carried: int
    earlier: WarpgroupMmaWait


def _through_convert(value: Value, uses) -> tuple[Value, list[Op]]:
    readers = uses.readers[value]
    if len(readers) == 1 and isinstance(readers[0], ConvertLayout):
        value = readers[0].result
    return value, uses.readers[value]


def chained_wait(body: Block, last_read: int, uses) -> Optional[ChainedWait]:
    """The ChainedWait of a body whose last read of the rings is the async wgmma at
    `last_read`, or None (see the module docstring)."""
    ops = body.ops
    wgmma, wait = ops[last_read], ops[last_read + 1] if last_read + 1 < len(ops) else None
    if not (isinstance(wgmma, WarpgroupMma) and wgmma.is_async and isinstance(wait, WarpgroupMmaWait)
            and wait.pending == 0 and wait.deps == (wgmma.result,) and uses.only_by(wgmma.result, (wait,))):
        return None
    top_level = {id(op) for op in ops}
    if any(isinstance(op, (WarpgroupMma, WarpgroupMmaWait)) and id(op) not in top_level for op in body.walk()):
        return None  # a wgmma or wait inside a region: not counted here
    value, readers = _through_convert(wait.results[0], uses)
    yield_ = ops[-1]
    if readers != [yield_] or list(yield_.values).count(value) != 1:
        return None
    carried = yield_.values.index(value)
    arg = body.args[1 + carried]
    position = {id(op): index for index, op in enumerate(ops)}
    readers = uses.readers[arg]
    if not readers or any(id(reader) not in position for reader in readers):
        return None
    first_read = min(position[id(reader)] for reader in readers)
    earlier = [op for op in ops[:first_read] if isinstance(op, WarpgroupMmaWait) and op.pending == 0]
    if not earlier or first_read > last_read:
        return None
    return ChainedWait(wait, carried, earlier[-1])


def accumulator_wait(chained: ChainedWait, arg: Value, out: list[Op]) -> Value:
    """The carried accumulator `arg` waited for (in the wgmma's layout, as the wait it
    replaces had it) and converted back to `arg`'s type, appended to `out`."""
    placed = chained.wait.results[0].type
    loc = chained.wait.loc
    in_flight = Value(placed, arg.hint)
    waited = Value(placed, arg.hint)
    ready = Value(arg.type, arg.hint)
    out.extend((ConvertLayout(result=in_flight, operand=arg, loc=loc),
                WarpgroupMmaWait(results=(waited,), deps=(in_flight,), pending=0, loc=loc),
                ConvertLayout(result=ready, operand=waited, loc=loc)))
    return ready


# Ops after which this thread's generic-proxy writes of shared memory need a fence before a
# wgmma reads them: stores, cp.async copies, and the wait_group at which its copies land.
_SHARED_WRITES = (SharedStore, AsyncCopyGlobalToShared, AsyncCopyWaitGroup)


def drop_repeated_fences(ops: list[Op]) -> list[Op]:
    """`ops` without each fence_async_shared that follows another with no shared write
    (nor region, which could hold one) between them."""
    kept: list[Op] = []
    fenced = False
    for op in ops:
        if isinstance(op, FenceAsyncShared):
            if fenced:
                continue
            fenced = True
        elif isinstance(op, _SHARED_WRITES) or op.nested_blocks():
            fenced = False
        kept.append(op)
    return kept
