"""The addressing of every shared value, read off the IR before allocation.

A shared view's element at coordinates c sits at element offset `addressing(c) XOR xor`
from the view's base. Both are fixed by the ops that made the view (allocate_shared_memory, index,
slice, permute, reinterpret) and kept by loops, branches, partitions and waits (the
backend refuses a carried view whose addressing changes); only the base address is a
run-time value (a dynamic index moves it). Planning reads the static part here, so a
plan over a view's addressing (wgmma descriptors) is decided before any code exists;
the backend and the emulator derive the same addressing by the same rules
(layouts.rules) as they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ...layouts import LayoutError, LinearLayout
from ...layouts.rules import shared_addressing, shared_index_addressing, shared_slice_addressing
from ..ir import (AllocateSharedMemory, Block, Condition, For, If, Op, SharedIndex, SharedPermute, SharedReinterpret,
                  SharedSlice, Value, WarpSpecialize, WarpgroupMmaWait, While, Yield)


@dataclass(frozen=True)
class StaticView:
    """A shared view's addressing (dims -> element offset) and the offset XORed into it."""

    addressing: LinearLayout
    xor: int = 0


# A view, or the sentence saying why the IR does not fix one (the backend and the
# emulator refuse the op that made it with their own error).
Traced = Union[StaticView, str]


def trace_shared_views(block: Block) -> dict[Value, Traced]:
    """Every shared value defined or carried in `block` (and its regions)."""
    views: dict[Value, Traced] = {}
    _trace_block(block, views)
    return views


def _carry(views: dict[Value, Traced], targets, sources) -> None:
    for target, source in zip(targets, sources):
        if source in views:
            views[target] = views[source]


def _terminator_values(block: Block, kind) -> tuple[Value, ...]:
    last = block.ops[-1] if block.ops else None
    return last.values if isinstance(last, kind) else ()


def _trace_block(block: Block, views: dict[Value, Traced]) -> None:
    for op in block.ops:
        _trace_op(op, views)


def _trace_op(op: Op, views: dict[Value, Traced]) -> None:
    if isinstance(op, AllocateSharedMemory):
        views[op.result] = _root(op.result.type.layout)
    elif isinstance(op, (SharedIndex, SharedSlice, SharedPermute, SharedReinterpret)):
        parent = views.get(op.buffer)
        if parent is not None:
            views[op.result] = parent if isinstance(parent, str) else _view_of(op, parent)
    elif isinstance(op, WarpgroupMmaWait):
        _carry(views, op.results, op.deps)
    elif isinstance(op, For):
        _carry(views, op.body.args[1:], op.inits)
        _trace_block(op.body, views)
        _carry(views, op.results, op.inits)
    elif isinstance(op, While):
        _carry(views, op.before.args, op.inits)
        _trace_block(op.before, views)
        carried = _terminator_values(op.before, Condition)
        _carry(views, op.after.args, carried)
        _trace_block(op.after, views)
        _carry(views, op.results, carried)
    elif isinstance(op, If):
        _trace_block(op.then_body, views)
        _trace_block(op.else_body, views)
        _carry(views, op.results, _terminator_values(op.then_body, Yield))
    elif isinstance(op, WarpSpecialize):
        for region in (op.default, *op.workers):
            _carry(views, region.args, op.captures)
            _trace_block(region, views)
        _carry(views, op.results, _terminator_values(op.default, Yield))
    else:
        for region in op.nested_blocks():
            _trace_block(region, views)


def _root(layout: LinearLayout) -> Traced:
    try:
        return StaticView(shared_addressing(layout))
    except LayoutError as error:
        return f"shared layout cannot address every element: {error}"


def _view_of(op: Op, parent: StaticView) -> Traced:
    """The view `op` makes of `parent` (the rules lower_shared and the emulator apply)."""
    try:
        if isinstance(op, SharedIndex):
            shape = op.buffer.type.shape
            return StaticView(shared_index_addressing(parent.addressing, shape, parent.xor), parent.xor)
        if isinstance(op, SharedSlice):
            size = op.result.type.shape[op.dim]
            if op.start % size:
                return f"shared_slice start {op.start} is not a multiple of the window size {size}"
            addressing, start_offset = shared_slice_addressing(parent.addressing, op.dim, op.start, size)
            return StaticView(addressing, parent.xor ^ start_offset)
        if isinstance(op, SharedPermute):
            bases = parent.addressing.bases
            if sorted(op.order) != list(range(len(bases))):
                return f"shared_permute order {list(op.order)} is not a permutation"
            return StaticView(LinearLayout({f"dim{i}": bases[f"dim{d}"] for i, d in enumerate(op.order)},
                                           parent.addressing.out_dims), parent.xor)
        if parent.xor:
            return "shared_reinterpret of a slice that does not start the buffer"
        return _root(op.result.type.layout)
    except LayoutError as error:
        return str(error)
