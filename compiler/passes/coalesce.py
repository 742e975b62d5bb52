"""coalesce: one blocked layout per global load/store, from the pointer's axis facts.

Triton's Coalesce pass, for the `tile` stage. For each access through a tensor of
pointers (axis analysis gives contiguity and divisibility per dim):

- `order`: dims sorted by contiguity, most contiguous first (ties: the last dim first,
  so an unknown 2-D access is row-major);
- elements per thread along order[0]: min(128 bits / element bits, contiguity, the
  alignment divisibility allows), so one thread moves one 128-bit vector where it can;
  loads of the same shape and order share the largest such count (Triton's rule: their
  layouts then agree, and a load with gaps is absorbed by L1), stores keep their own
  (a wider store would leave gaps in the warp's write); never more than the tile holds
  per thread;
- lanes, then warps, cover the tile along `order` (`fill_blocked`).

The access's operands are converted to that layout and a loaded value converted back,
so the IR stays valid while the rest is still without layouts; `propagate_layouts`
removes these conversions again (`strip_anchors`) and spreads the anchors' layouts.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

from ...layouts import BlockedLayout, DistributedLayout, LinearLayout, standard
from ...layouts import rules as layout_rules
from ..hardware import LANES, MAX_ACCESS_BITS
from ..ir import AsyncCopyGlobalToShared, Block, ConvertLayout, Kernel, Load, Op, Store, Value
from ..types import TensorType
from .axis_analysis import AxisInfo, analyze_axes
from .rewrite import rewrite_kernel

NAME = "coalesce"


def normalized(layout: LinearLayout) -> LinearLayout:
    """Every hardware in-dim listed, in the standard order: equal layouts compare equal."""
    bases = layout.bases
    return LinearLayout({d: bases.get(d, ()) for d in layout_rules.HARDWARE_DIMS}, layout.out_dims)


def map_operands(op: Op, fn: Callable[[Value, int], Value]) -> dict:
    """Field changes replacing each operand v (in `op.uses()` order, index i) by fn(v, i)."""
    changes, index = {}, 0
    for f in dataclasses.fields(op):
        if f.name in ("result", "results"):
            continue
        item = getattr(op, f.name)
        if isinstance(item, Value):
            changes[f.name] = fn(item, index)
            index += 1
        elif isinstance(item, tuple) and item and all(isinstance(v, Value) for v in item):
            changes[f.name] = tuple(fn(v, index + i) for i, v in enumerate(item))
            index += len(item)
    return changes


@dataclasses.dataclass(frozen=True)
class Placement:
    """A layout chosen for a tensor: the linear layout, and its description (BlockedLayout,
    SliceLayout, ... of layouts/; None while unnamed) for dumps and messages. Two
    placements are the same when their linear layouts are."""

    layout: LinearLayout
    encoding: Optional[DistributedLayout] = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "layout", normalized(self.layout))

    def on(self, type_: TensorType) -> TensorType:
        return type_.with_layout(self.layout, self.encoding)


def fill_blocked(shape: Sequence[int], size_per_thread: Sequence[int], order: Sequence[int],
                 num_warps: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(threads_per_warp, warps_per_cta) covering `shape` along `order`, minor dim first:
    each dim but the last in order takes the threads its extent needs, the last takes
    the rest (Triton's BlockedEncodingAttr builder)."""
    rank = len(shape)
    lanes, warps = [1] * rank, [1] * rank
    left_lanes, left_warps, left_threads = LANES, num_warps, LANES * num_warps
    for d in order[:-1]:
        threads = max(1, min(left_threads, max(1, shape[d] // size_per_thread[d])))
        lanes[d] = max(1, min(threads, left_lanes))
        warps[d] = max(1, min(threads // lanes[d], left_warps))
        left_lanes //= lanes[d]
        left_warps //= warps[d]
        left_threads //= threads
    lanes[order[-1]] = LANES // math.prod(lanes)
    warps[order[-1]] = num_warps // math.prod(warps)
    return tuple(lanes), tuple(warps)


def blocked(shape: Sequence[int], size_per_thread: Sequence[int], order: Sequence[int],
            num_warps: int) -> Placement:
    """The BlockedLayout with `size_per_thread` that covers `shape` with `num_warps` warps."""
    shape, size_per_thread, order = tuple(shape), tuple(size_per_thread), tuple(order)
    lanes, warps = fill_blocked(shape, size_per_thread, order, num_warps)
    layout = standard.blocked(shape, size_per_thread, lanes, warps, order)
    return Placement(layout, BlockedLayout(size_per_thread, lanes, warps, order))


def default_blocked(shape: Sequence[int], num_warps: int) -> Placement:
    """One element per thread, row-major: for tensors nothing else places."""
    rank = len(shape)
    return blocked(shape, (1,) * rank, tuple(reversed(range(rank))), num_warps)


def contiguity_order(info: AxisInfo) -> tuple[int, ...]:
    """Dims by decreasing contiguity; ties put the later dim first (row-major)."""
    dims = list(reversed(range(len(info.contiguity))))
    return tuple(sorted(dims, key=lambda d: -info.contiguity[d]))


def elements_per_access(pointer: Value, info: AxisInfo, order: Sequence[int]) -> int:
    """Elements one thread can move with one access along order[0]: limited by the
    128-bit vector, the contiguity, and the alignment (divisibility) of the address."""
    element_bits = max(pointer.type.element.pointee.bits, 8)  # i1 is stored as a byte
    dim = order[0]
    aligned = max(info.divisibility[dim] // (element_bits // 8), 1)
    contiguous = min(info.contiguity[dim], pointer.type.shape[dim])
    return max(1, min(aligned, contiguous, MAX_ACCESS_BITS // element_bits))


def access_placements(kernel: Kernel, infos: Optional[dict] = None) -> dict[int, Placement]:
    """The coalesced layout of every global access through a tensor of pointers without
    a layout, keyed by id(op)."""
    infos = analyze_axes(kernel) if infos is None else infos
    accesses = [op for op in kernel.walk() if isinstance(op, (Load, Store)) and
                isinstance(op.pointer.type, TensorType) and op.pointer.type.layout is None]
    orders, counts = {}, {}
    for op in accesses:
        info = infos.get(op.pointer) or _unknown(op.pointer)
        orders[id(op)] = contiguity_order(info)
        counts[id(op)] = elements_per_access(op.pointer, info, orders[id(op)])
    threads = LANES * kernel.num_warps
    placements = {}
    for op in accesses:
        shape, order = op.pointer.type.shape, orders[id(op)]
        count = counts[id(op)]
        if isinstance(op, Load):
            count = max(counts[id(other)] for other in accesses if isinstance(other, Load) and
                        other.pointer.type.shape == shape and orders[id(other)] == order)
        count = min(count, max(math.prod(shape) // threads, 1))
        size_per_thread = [1] * len(shape)
        size_per_thread[order[0]] = count
        placements[id(op)] = blocked(shape, size_per_thread, order, kernel.num_warps)
    return placements


def _unknown(value: Value) -> AxisInfo:
    ones = (1,) * len(value.type.shape)
    return AxisInfo(ones, ones, ones)


def coalesce(kernel: Kernel) -> Kernel:
    """Anchor every global access of a `tile` kernel in its coalesced layout (see above)."""
    placements = access_placements(kernel)

    def rule(op: Op):
        placement = placements.get(id(op))
        if placement is None:
            return op
        ops: list[Op] = []

        def convert(value: Optional[Value]) -> Optional[Value]:
            if value is None or not isinstance(value.type, TensorType):
                return value
            result = Value(placement.on(value.type))
            ops.append(ConvertLayout(result=result, operand=value, loc=op.loc))
            return result

        if isinstance(op, Store):
            ops.append(dataclasses.replace(op, pointer=convert(op.pointer), value=convert(op.value),
                                           mask=convert(op.mask)))
            return ops
        loaded = Value(placement.on(op.result.type))
        ops.append(dataclasses.replace(op, result=loaded, pointer=convert(op.pointer),
                                       mask=convert(op.mask), other=convert(op.other)))
        ops.append(ConvertLayout(result=op.result, operand=loaded, loc=op.loc))
        return ops

    return rewrite_kernel(kernel, rule)


def strip_anchors(kernel: Kernel) -> tuple[Kernel, dict[int, Placement]]:
    """Remove coalesce's conversions (and those accelerate_dots puts around a wgmma):
    accesses read their tile operands again, and the layouts they were converted to
    become anchors (keyed by id of the new access op); so does an op whose tensor result
    an earlier pass gave a layout."""
    into, back = {}, {}
    for op in kernel.walk():
        if isinstance(op, ConvertLayout) and op.operand.type.layout is None:
            into[op.result] = op.operand
        elif isinstance(op, ConvertLayout) and op.result.type.layout is None:
            back[op.operand] = op.result
    anchors: dict[int, Placement] = {}

    def strip(block: Block) -> Block:
        ops = []
        for op in block.ops:
            if isinstance(op, ConvertLayout) and (op.result in into or op.operand in back):
                continue
            op = op.map_regions(strip)  # worker partitions too (a cp.async producer's copies)
            changes = map_operands(op, lambda v, i: into.get(v, v))
            anchor = None
            accesses = (Load, Store, AsyncCopyGlobalToShared)  # cp.async: placed by pipeline_dot_loops
            if isinstance(op, accesses) and isinstance(op.pointer.type, TensorType) and \
                    op.pointer.type.layout is not None:
                anchor = Placement(op.pointer.type.layout, op.pointer.type.encoding)
            result = getattr(op, "result", None)
            if anchor is None and result is not None and isinstance(result.type, TensorType) and \
                    result.type.layout is not None:  # placed by an earlier pass (a dot's accumulator)
                anchor = Placement(result.type.layout, result.type.encoding)
            if result is not None and result in back:  # a load, or another op anchored in its result
                changes["result"] = back[op.result]
            elif any(r in back for r in getattr(op, "results", ())):
                changes["results"] = tuple(back.get(r, r) for r in op.results)
            op = dataclasses.replace(op, **changes)
            if anchor is not None:
                anchors[id(op)] = anchor
            ops.append(op)
        return Block(block.args, tuple(ops))

    return kernel.with_body(strip(kernel.body)), anchors


__all__ = ["coalesce", "strip_anchors", "access_placements", "blocked", "default_blocked", "fill_blocked",
           "contiguity_order", "elements_per_access", "map_operands", "normalized", "Placement", "NAME"]
