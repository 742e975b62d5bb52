"""stage_block_pointers: block-pointer loads that feed a dot go by TMA.

The frontend builds each block-pointer load whose block may be a TMA box both ways
(highlevel/block_pointer.py): masked pointer arithmetic, and `desc.load` of a tensor map
over the block pointer's tensor written where the block pointer is made. This pass keeps
the TMA load where

- the tile feeds dots only (as either operand, directly or through a permute): then
  accelerate_dots lets the wgmma read the box where TMA put it and the TMA pipeliner rings
  it (pipeline_tma_loops, pipeline_tma_warp_specialize); other loads gain nothing from
  the round trip through shared memory;
- axis analysis proves the base 16-byte aligned and the outer strides multiples of 16
  bytes (the TMA unit faults on other tensor maps; the pointer load has no such need);
- its coordinates, the block's offsets, are fixed in the loop around it or advance by a
  constant each iteration (tl.advance): they are rewritten as the loop's induction
  variable's, init + (iv - lower) // step * delta, which the TMA pipeliner recomputes for
  the iteration each copy is for. A block advanced otherwise keeps its pointer load, which
  the cp.async rings (pipeline_dot_loops) take.

and the pointer load otherwise; and the pointer loads of a loop of chained dots (attention)
that the split will not take (`_one_partition_chained_dots`: there the cp.async ring measured
faster); and the pointer loads of every dot operand in a loop where
one operand keeps its pointer load (pipeline_tma_loops rings a loop's boxes only when all
its dots' operands are boxes; the cp.async rings take pointer loads). The side not kept is
deleted, and so is a tensor map no kept load reads (its template parameter stays: the
workspace slots are numbered by it). A loop that asked for warp_specialize=True is told at
each dot operand that stays a pointer load why.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..errors import warn_at
from ..ir import (Binary, Block, Constant, Dot, For, Kernel, Op, Permute, TensormapFence, TmaAsyncCopyGlobalToShared,
                  Value, Yield)
from ..types import i32
from .axis_analysis import analyze_axes
from .pipeline_dot_loops import substitute
from .pipeline_tma_warp_specialize import computed_from, ring_split_by_default
from .rewrite import rewrite_kernel

# What the TMA unit needs of a tensor map's base address and outer strides, in bytes.
TMA_ALIGNMENT = 16


@dataclasses.dataclass(frozen=True, eq=False)
class BlockPointerLoad:
    """One block-pointer load built both ways by the frontend."""

    pointer_ops: tuple[Op, ...]      # addresses, mask and the load through pointers
    pointer_tile: Value
    box_ops: tuple[Op, ...]          # desc.load's ops (and the permute back to the block's dims)
    box_tile: Value
    descriptor: Value                # the tensor map the box is copied through
    descriptor_ops: tuple[Op, ...]   # the ops writing it (shared by the loads of one block pointer)
    base: Value                      # the block pointer's base address
    outer_strides: tuple[Value, ...]  # the strides of its dims but the contiguous one (elements)
    itemsize: int


def stage_block_pointers(kernel: Kernel, keep_pointers: bool = False) -> Kernel:
    """`keep_pointers`: every block-pointer load stays pointer arithmetic (the launch option
    block_pointer_tma=False)."""
    if not kernel.block_pointer_loads:
        return kernel
    readers = _readers(kernel.body)
    facts = analyze_axes(kernel)
    divisibility = dict(zip(kernel.params, kernel.param_divisibility or ()))
    loops = _enclosing_loops(kernel.body)
    definitions = {result: op for op in kernel.walk() for result in op.defines()}
    dropped: set[int] = set()
    replaced: dict[Value, Value] = {}
    before: dict[int, list[Op]] = {}   # new coordinate ops, by the copy they precede
    copies: dict[int, TmaAsyncCopyGlobalToShared] = {}
    kept_maps: set[int] = set()
    chosen = {}
    for load in kernel.block_pointer_loads:
        coords = None
        if not keep_pointers and _feeds_dots(load.pointer_tile, readers):
            aligned = _aligned(load, facts, divisibility)
            coords = _induction_coordinates(load, loops, definitions) if aligned else None
            chosen[id(load)] = coords
            if coords is None:
                _warn_if_split_asked(load, loops, "its base or a stride is not provably a multiple of 16 bytes"
                                     if not aligned else "its offsets do not advance by a constant each iteration")
    # A loop's dots read all their operands from TMA rings or none: one pointer operand
    # keeps the loop on cp.async rings (pipeline_tma_loops takes only boxes); and a loop of
    # chained dots that will not be warp-specialized stays on them too (see below).
    refused = {id(_loop_of(load, loops)) for load in kernel.block_pointer_loads
               if id(load) in chosen and chosen[id(load)] is None and _loop_of(load, loops) is not None}
    refused |= {id(loop) for loop in {id(_loop_of(load, loops)): _loop_of(load, loops)
                                      for load in kernel.block_pointer_loads if id(load) in chosen}.values()
                if loop is not None and _one_partition_chained_dots(kernel, loop, kernel.block_pointer_loads, loops)}
    for load in kernel.block_pointer_loads:
        coords = chosen.get(id(load))
        if _loop_of(load, loops) is not None and id(_loop_of(load, loops)) in refused:
            coords = None
        if coords is None:
            _drop_dead(load.box_ops, readers, dropped, replaced)
            continue
        copy, new_coords, ops = coords
        replaced[load.pointer_tile] = load.box_tile
        _drop_dead(load.pointer_ops, readers, dropped, replaced)
        kept_maps.add(id(load.descriptor))
        if ops:
            before[id(copy)] = ops
            copies[id(copy)] = dataclasses.replace(copy, coords=new_coords)
    for load in kernel.block_pointer_loads:
        if id(load.descriptor) not in kept_maps:
            _drop_dead(load.descriptor_ops, readers, dropped, replaced)

    def rule(op: Op):
        if id(op) in dropped:
            return []
        if id(op) in copies:
            return [*before[id(op)], copies[id(op)]]
        return substitute(op, replaced)

    fences = {id(op) for load in kernel.block_pointer_loads if id(load.descriptor) in kept_maps
              for op in load.descriptor_ops if isinstance(op, TensormapFence)}
    kernel = rewrite_kernel(kernel, rule, block_pointer_loads=())
    return kernel.with_body(_fences_at_first_use(kernel.body, fences))


def _one_partition_chained_dots(kernel: Kernel, loop: For, block_loads, loops) -> bool:
    """Whether `loop` is one of chained dots (attention: the second's A computed from the
    first's result) that the split will not take: warp_specialize=False, or not asked and
    its ring (its block-pointer boxes times the stages) below the default split's line
    (pipeline_tma_warp_specialize.ring_split_by_default). Such loops keep cp.async: in one H200
    run of the tutorial's block-pointer attention at head_dim 64 the one-partition TMA ring
    ran 0.92x-0.95x the cp.async ring (128 x 64 tiles, 8 warps and 4), where the split over
    TMA ran 1.01x-1.05x it (128 x 128, and every head_dim 128 config)."""
    dots = [op for op in loop.body.walk() if isinstance(op, Dot)]
    if len(dots) != 2 or not computed_from(dots[1].a, dots[0].result, loop.body):
        return False
    asked = loop.schedule.warp_specialize if loop.schedule is not None else None
    if asked is not None:
        return not asked
    stages = (loop.schedule.num_stages if loop.schedule is not None and loop.schedule.num_stages is not None
              else kernel.num_stages) or 1
    box_bytes = sum(math.prod(load.box_tile.type.shape) * load.itemsize for load in block_loads
                    if _loop_of(load, loops) is loop)
    return not ring_split_by_default(stages * box_bytes, True, kernel.num_warps)


def _fences_at_first_use(block: Block, fences: set[int]) -> Block:
    """`block` with each of `fences` (a tensor map's publication: a release, a CTA barrier
    and an acquire) moved down to the first op that reads its map there: the maps a kernel
    writes one after another (attention's Q, K and V) are then all written before the first
    release, which waits for their writes together."""
    ops = [op.map_regions(lambda region: _fences_at_first_use(region, fences)) for op in block.ops]
    moving = [op for op in ops if id(op) in fences]
    if not moving:
        return Block(block.args, tuple(ops))
    rest = [op for op in ops if id(op) not in fences]
    for fence in moving:
        end = len(rest) - (1 if rest and isinstance(rest[-1], Yield) else 0)
        rest.insert(next((i for i, op in enumerate(rest) if _reads(op, fence.descriptor)), end), fence)
    return Block(block.args, tuple(rest))


def _reads(op: Op, value: Value) -> bool:
    return value in op.uses() or any(value in inner.uses() for region in op.nested_blocks() for inner in region.walk())


def _drop_dead(ops: tuple[Op, ...], readers, dropped: set[int], replaced: dict) -> None:
    """Add to `dropped` each of `ops` (the side not kept, in program order) whose results
    nothing but dropped ops reads, last first; effects with no result go too."""
    for op in reversed(ops):
        if all(value in replaced or all(id(user) in dropped for user in readers.get(value, []))
               for value in op.defines()):
            dropped.add(id(op))


def _warn_if_split_asked(load: BlockPointerLoad, loops: dict, reason: str) -> None:
    """A CompilationWarning at the load when its loop asked for warp_specialize=True, which
    needs TMA boxes: say why this one stays a pointer load."""
    loop = _loop_of(load, loops)
    if loop is None or loop.schedule is None or loop.schedule.warp_specialize is not True:
        return
    warn_at(load.pointer_ops[-1].loc, f"this block-pointer load stays a pointer load, not a TMA box, so its loop "
            f"cannot be warp-specialized: {reason}",
            "specialize the base and the strides to multiples of 16 bytes (pass such tensors), and move the "
            "block with tl.advance by a constant")


def _loop_of(load: BlockPointerLoad, loops: dict) -> Optional[For]:
    return loops.get(id(next(op for op in load.box_ops if isinstance(op, TmaAsyncCopyGlobalToShared))))


def _readers(block: Block) -> dict[Value, list[Op]]:
    found: dict[Value, list[Op]] = {}
    for op in block.walk():
        for value in op.uses():
            found.setdefault(value, []).append(op)
    return found


def _feeds_dots(tile: Value, readers) -> bool:
    """True when every reader of `tile` is a dot's operand, or a permute only dots read."""
    users = readers.get(tile, [])
    if not users:
        return False
    for op in users:
        if isinstance(op, Permute):
            if not all(isinstance(user, Dot) and op.result in (user.a, user.b) for user in readers.get(op.result, [1])):
                return False
        elif not isinstance(op, Dot) or tile not in (op.a, op.b):
            return False
    return True


def _aligned(load: BlockPointerLoad, facts, divisibility) -> bool:
    def divides(value: Value) -> int:
        info = facts.get(value)
        if info is None:
            return divisibility.get(value, 1)
        return info.divisibility[0] if info.divisibility else 1

    return divides(load.base) % TMA_ALIGNMENT == 0 and \
        all(divides(stride) * load.itemsize % TMA_ALIGNMENT == 0 for stride in load.outer_strides)


def _enclosing_loops(block: Block, loop: Optional[For] = None, found: Optional[dict] = None) -> dict:
    """For each op, the For whose body holds it directly (None at the kernel's top level or
    inside another region: an If's, a partition's)."""
    found = {} if found is None else found
    for op in block.ops:
        found[id(op)] = loop
        for region in op.nested_blocks():
            _enclosing_loops(region, op if isinstance(op, For) and region is op.body else None, found)
    return found


def _induction_coordinates(load: BlockPointerLoad, loops: dict, definitions: dict):
    """(the box's copy, its coordinates as the loop's induction variable's, the ops computing
    them) when every coordinate is fixed in the loop around it or advanced by a constant,
    else None. No loop: the copy as it is."""
    copy = next(op for op in load.box_ops if isinstance(op, TmaAsyncCopyGlobalToShared))
    loop = loops.get(id(copy))
    carried_anywhere = _carried_values(loops)
    if loop is None:
        if any(coord in carried_anywhere for coord in copy.coords):
            return None  # inside a branch of a loop body: the pointer load keeps its rings
        return copy, copy.coords, []
    args = loop.body.args
    yields = loop.body.ops[-1]
    assert isinstance(yields, Yield)
    step = _constant(loop.step, definitions)
    ops: list[Op] = []
    coords = []
    for coord in copy.coords:
        if coord not in args[1:]:
            if coord in carried_anywhere:
                return None
            coords.append(coord)
            continue
        index = args.index(coord) - 1
        delta = _advance(yields.values[index], coord, definitions)
        if delta is None or step is None or step <= 0:
            return None
        coords.append(_affine(ops, loop, loop.inits[index], delta, step, copy.loc))
    return copy, tuple(coords), ops


def _carried_values(loops: dict) -> set:
    return {arg for loop in loops.values() if loop is not None for arg in loop.body.args}


def _constant(value: Value, definitions: dict) -> Optional[int]:
    op = definitions.get(value)
    return int(op.value) if isinstance(op, Constant) else None


def _advance(yielded: Value, arg: Value, definitions: dict) -> Optional[int]:
    """The constant d when the loop yields arg + d for `arg` (tl.advance), else None."""
    if yielded is arg:
        return 0
    op = definitions.get(yielded)
    if not isinstance(op, Binary) or op.kind != "add":
        return None
    for this, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
        if this is arg:
            return _constant(other, definitions)
    return None


def _affine(ops: list, loop: For, init: Value, delta: int, step: int, loc) -> Value:
    """init + (iv - lower) // step * delta, appended to `ops` (i32, as the offsets are)."""
    def emit(kind: str, lhs: Value, rhs: Value) -> Value:
        result = Value(i32)
        ops.append(Binary(result=result, kind=kind, lhs=lhs, rhs=rhs, loc=loc))
        return result

    def constant(number: int) -> Value:
        result = Value(i32)
        ops.append(Constant(result=result, value=number, loc=loc))
        return result

    if delta == 0:
        return init
    iv = loop.body.args[0]
    trips = emit("sub", iv, loop.lower)
    if delta % step == 0:
        scaled = trips if delta == step else emit("mul", trips, constant(delta // step))
    else:
        scaled = emit("mul", emit("div", trips, constant(step)), constant(delta))
    return emit("add", init, scaled)

