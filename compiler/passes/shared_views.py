"""The addressing of every shared value, read off the IR before allocation.

A shared view's element at coordinates c sits at element offset `addressing(c) XOR xor`
from the view's base. Both are fixed by the ops that made the view (allocate_shared_memory, index,
slice, permute, reinterpret) and kept by loops, branches, partitions and waits: a view
carried through a loop or out of an if must keep its addressing on every path (the
backend gives it one base-address phi), and the trace refuses one that does not, at the
line that made the other view; only the base address is a
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
from ..errors import CompilationError, Loc
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
    _trace_block(block, views, {})
    return views


def _carry(views: dict[Value, Traced], targets, sources, made: dict[Value, Loc]) -> None:
    for target, source in zip(targets, sources):
        if source in views:
            views[target] = views[source]
            made[target] = made.get(source)


def _check_carried(op: Op, targets, sources, others, views: dict[Value, Traced],
                   made: dict[Value, Loc], where: str) -> None:
    """Each view in `others` (what the body or the else branch yields) addresses its
    elements as the one in `sources` (what the loop starts with, or the then branch) does."""
    for target, source, other in zip(targets, sources, others):
        first, second = views.get(source), views.get(other)
        if isinstance(first, StaticView) and isinstance(second, StaticView) and first != second:
            name = f"'{target.hint}'" if target.hint else "a shared view"
            first_line = made[source].line if made.get(source) else op.loc.line
            raise CompilationError(
                f"{name} is carried {where} (line {op.loc.line}) as views that address "
                f"their elements differently: another slice window, permutation, or layout",
                made.get(other) or op.loc,
                expected="one addressing on every path: the same view op of the same buffer "
                         "(an index may differ: `bufs.index(i % 2)`)",
                found=f"the view made at line {first_line} and the one made here",
                suggestion="carry the index (or the multi-buffered allocation) and make the "
                           "view where it is used")


def _terminator_values(block: Block, kind) -> tuple[Value, ...]:
    last = block.ops[-1] if block.ops else None
    return last.values if isinstance(last, kind) else ()


def _trace_block(block: Block, views: dict[Value, Traced], made: dict[Value, Loc]) -> None:
    """`made`: the line that made each traced view (a carried one keeps its source's)."""
    for op in block.ops:
        _trace_op(op, views, made)


def _trace_op(op: Op, views: dict[Value, Traced], made: dict[Value, Loc]) -> None:
    if isinstance(op, AllocateSharedMemory):
        views[op.result] = _root(op.result.type.layout)
        made[op.result] = op.loc
    elif isinstance(op, (SharedIndex, SharedSlice, SharedPermute, SharedReinterpret)):
        parent = views.get(op.buffer)
        if parent is not None:
            views[op.result] = parent if isinstance(parent, str) else _view_of(op, parent)
            made[op.result] = op.loc
    elif isinstance(op, WarpgroupMmaWait):
        _carry(views, op.results, op.deps, made)
    elif isinstance(op, For):
        _carry(views, op.body.args[1:], op.inits, made)
        _trace_block(op.body, views, made)
        _check_carried(op, op.results, op.inits, _terminator_values(op.body, Yield), views, made,
                       "through this loop")
        _carry(views, op.results, op.inits, made)
    elif isinstance(op, While):
        _carry(views, op.before.args, op.inits, made)
        _trace_block(op.before, views, made)
        carried = _terminator_values(op.before, Condition)
        _check_carried(op, op.results, op.inits, carried, views, made, "through this loop")
        _carry(views, op.after.args, carried, made)
        _trace_block(op.after, views, made)
        _check_carried(op, op.results, op.inits, _terminator_values(op.after, Yield), views, made,
                       "through this loop")
        _carry(views, op.results, carried, made)
    elif isinstance(op, If):
        _trace_block(op.then_body, views, made)
        _trace_block(op.else_body, views, made)
        then_values = _terminator_values(op.then_body, Yield)
        _check_carried(op, op.results, then_values, _terminator_values(op.else_body, Yield), views,
                       made, "out of this if")
        _carry(views, op.results, then_values, made)
    elif isinstance(op, WarpSpecialize):
        for region in (op.default, *op.workers):
            _carry(views, region.args, op.captures, made)
            _trace_block(region, views, made)
        _carry(views, op.results, _terminator_values(op.default, Yield), made)
    else:
        for region in op.nested_blocks():
            _trace_block(region, views, made)


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
