"""The row loads of a dot loop (attention backward's `tl.load(lse_ptr + queries)`), staged
through shared memory so that pipeline_dot_loops copies them ahead with the tiles.

A rank-1 load in a dot loop's body, read every iteration, costs twice as a plain load:
its latency is paid where its value is first needed, and the layout coalesce gives it
(its elements spread over the lanes of each warp) is not the one its reader needs (the
slice of a wgmma accumulator), so a conversion through shared memory, with its barriers,
follows it every iteration. Stored to a buffer and read back with a shared load, it
becomes an operand like the tiles: the pipeliner copies it by cp.async `num_stages - 1`
iterations ahead into a ring, behind the same wait_group and barrier as the tiles, and
the shared load reads its slot straight into the layout its reader needs (a shared load
takes its layout from its consumers).

`stage_row_loads` only rewrites; pipeline_dot_loops keeps the rewrite only when the
loop, row loads included, is then pipelined, so a loop left as it was never gains a
round trip through shared memory.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ...layouts import SwizzledSharedLayout
from ..ir import AllocateSharedMemory, ConvertLayout, For, Load, SharedLoad, SharedStore, Value
from ..types import SharedType, TensorType

NAME = "pipeline_row_loads"

# Rank-1 buffers hold their elements in order: nothing to swizzle.
ROW_LAYOUT = SwizzledSharedLayout(1, 1, 1, (0,))


@dataclasses.dataclass(frozen=True)
class StagedRows:
    """A loop whose row loads go through shared memory: `allocations` (to put before the
    loop), the rewritten `loop`, and what each new or changed op reads, for `Uses`."""

    allocations: tuple[AllocateSharedMemory, ...]
    loop: For
    readers: dict  # value -> the ops that now read it, in place of what Uses had


def row_loads(loop: For, uses) -> list[tuple[Load, ConvertLayout]]:
    """The body's rank-1 loads of at least 4-byte elements read only through the one
    conversion coalesce put after them (the load and that conversion)."""
    body = loop.body
    found = []
    for op in body.ops:
        if not (isinstance(op, Load) and isinstance(op.result.type, TensorType) and len(op.result.type.shape) == 1
                and op.result.type.element.bits >= 32):
            continue
        readers = uses.readers[op.result]
        if len(readers) == 1 and isinstance(readers[0], ConvertLayout) and any(r is readers[0] for r in body.ops):
            found.append((op, readers[0]))
    return found


def unanchored(load: Load, loop: For) -> Load:
    """`load` reading its pointer, mask and `other` from before coalesce's conversions:
    its copies then take the layout of the values they are computed from (the queries a
    causal mask also reads), in place of coalesce's, so no conversion of those values
    comes with them. Copying a row costs a few 4-byte copies in any layout."""
    defining = {op.result: op for op in loop.body.ops if isinstance(op, ConvertLayout)}

    def raw(value):
        convert = defining.get(value)
        if convert is None or convert.operand.type.layout is not None:
            return value
        return convert.operand

    return dataclasses.replace(load, pointer=raw(load.pointer), mask=raw(load.mask), other=raw(load.other))


def stage_row_loads(loop: For, uses) -> Optional[StagedRows]:
    """`loop` with each row load stored to a buffer of its own and read back from it (in
    place of the conversion after the load), or None when it has none or no tile that
    cp.async would copy."""
    if not any(isinstance(op, SharedStore) for op in loop.body.ops):
        return None  # no tiles for cp.async (desc.load boxes come by TMA): rows alone gain nothing
    loads = row_loads(loop, uses)
    if not loads:
        return None
    staged = {id(load): unanchored(load, loop) for load, _ in loads}
    replaced = {id(convert): staged[id(load)] for load, convert in loads}
    allocations, readers, ops = [], {}, []
    pending: dict[Value, SharedLoad] = {}  # reads placed right before their first reader
    for op in loop.body.ops:
        for value in op.uses():
            if value in pending:
                ops.append(pending.pop(value))
        load = replaced.get(id(op))
        if load is None:
            ops.append(staged.get(id(op), op))
            continue
        type_: TensorType = load.result.type
        buffer = Value(SharedType(type_.shape, type_.element, ROW_LAYOUT.to_linear(type_.shape), ROW_LAYOUT),
                       f"{op.result.hint or 'row'}_smem")
        allocations.append(AllocateSharedMemory(result=buffer, loc=load.loc))
        store = SharedStore(buffer=buffer, value=load.result, loc=load.loc)
        # The read defines the conversion's result, so its readers stay as they are. Placed
        # late, it comes after the fence and barrier that the dot before it needs anyway.
        pending[op.result] = SharedLoad(result=op.result, buffer=buffer, loc=load.loc)
        ops.append(store)
        readers[load.result] = [store]
        readers[buffer] = [store, pending[op.result]]
    body = dataclasses.replace(loop.body, ops=tuple(ops))
    return StagedRows(tuple(allocations), dataclasses.replace(loop, body=body), readers)


def plan_with_row_loads(loop: For, outer: dict, uses, plan):
    """(loop, its pipeliner from `plan`, allocations to put before it): the loop with its
    row loads staged when `plan` pipelines that, else the loop as it is (and its plan,
    maybe None). `outer` and `uses` describe whichever loop is returned."""
    staged = stage_row_loads(loop, uses)
    if staged is not None:
        saved_readers = {value: uses.readers.get(value, []) for value in staged.readers}
        defined = {allocation.result: allocation for allocation in staged.allocations}
        defined.update({op.result: op for op in staged.loop.body.ops if isinstance(op, SharedLoad)})
        saved_definitions = {value: outer.get(value) for value in defined}
        uses.readers.update(staged.readers)
        outer.update(defined)
        pipeliner = plan(staged.loop)
        if pipeliner is not None:
            return staged.loop, pipeliner, staged.allocations
        uses.readers.update(saved_readers)
        outer.update(saved_definitions)
    return loop, plan(loop), ()
