"""allocate_shared_memory: give every buffer and scratch area a byte offset.

Live ranges come from program order (a use inside a loop keeps the buffer alive for the
whole loop, since the next iteration reads it again; an async access, a wgmma's or a TMA
store's read or a cp.async's or TMA load's write, until the op that completes it:
async_completion.py); buffers whose live ranges do not
overlap share bytes. The partitions of a warp_specialize run at the same time, so
whatever is allocated or used inside one lives for the whole warp_specialize. Offsets are aligned for the strictest user (1024 bytes for a
128-byte swizzle atom: HOPPER.md's NVMMA table).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import CompilationError
from ..hardware import SHARED_LIMIT
from ..ir import (AllocateSharedMemory, Block, Kernel, Op, SharedIndex, SharedPermute, SharedReinterpret, SharedSlice,
                  Value, WarpSpecialize)
from .async_completion import completion_positions
from .rewrite import rewrite_kernel
from .shared_accesses import scratch_bytes_of

NAME = "allocate_shared_memory"


@dataclass
class _Interval:
    key: object
    size: int
    align: int
    start: int
    end: int
    loops: tuple = ()  # the loops enclosing the definition
    offset: int = -1


def _alignment(size: int) -> int:
    align = 16
    while align < size and align < 1024:
        align *= 2
    return align


def _number_ops(block: Block, loops: tuple, positions: dict, loop_ends: dict, counter: list,
                warps: int, partition=None, replicas: int = 1):
    """positions[id(op)] = (program position, enclosing loops, the outermost enclosing
    warp_specialize or None, the warps running the op, copies of the worker running it)."""
    for op in block.ops:
        positions[id(op)] = (counter[0], loops, partition, warps, replicas)
        counter[0] += 1
        inner = loops + (id(op),) if op.LOOP else loops
        if isinstance(op, WarpSpecialize):
            owner = partition or id(op)
            for region, region_warps, copies in zip(op.nested_blocks(), (warps,) + tuple(op.worker_num_warps),
                                                    (1,) + op.replicas()):
                _number_ops(region, inner, positions, loop_ends, counter, region_warps, owner, copies)
        else:
            for region in op.nested_blocks():
                _number_ops(region, inner, positions, loop_ends, counter, warps, partition, replicas)
        loop_ends[id(op)] = counter[0] - 1


def allocate_shared_memory(kernel: Kernel) -> Kernel:
    positions: dict = {}
    loop_ends: dict = {}
    _number_ops(kernel.body, (), positions, loop_ends, [0], kernel.num_warps)

    roots = view_roots(kernel)
    completed = completion_positions(kernel, positions, lambda view: roots.get(view, view))
    copied_by_workers = kernel.total_warps > kernel.num_warps  # code outside partitions
    intervals: dict[object, _Interval] = {}
    for op in kernel.walk():
        position, loops, partition, warps, replicas = positions[id(op)]
        # Inside a warp_specialize, "now" is the whole op: other partitions run alongside.
        start, here = (position, position) if partition is None else \
            (positions[partition][0], loop_ends[partition])
        if isinstance(op, AllocateSharedMemory):
            size = op.result.type.num_bytes
            intervals[op.result] = _Interval(op.result, size, _alignment(size), start, here, loops)
        scratch = scratch_bytes_of(op, warps, mirrored=partition is None and copied_by_workers)
        if scratch and replicas > 1:
            raise CompilationError(
                f"`{op.NAME}` needs {scratch} bytes of shared scratch memory, which a replicated "
                f"warp_specialize worker ({replicas} copies of one block) does not get", op.loc,
                suggestion="keep the worker's reductions and layout conversions inside a warp, or "
                           "give each copy its own worker partition")
        if scratch:
            intervals[id(op)] = _Interval(id(op), scratch, 16, start, here)
        for value in op.uses():
            root = roots.get(value)
            if root is None or root not in intervals:
                continue
            interval = intervals[root]
            end = here
            # A use inside a loop that the buffer was created outside of lasts the loop.
            for loop in loops:
                if loop not in interval.loops:
                    end = max(end, loop_ends[loop])
            if id(op) in completed:  # an async access runs on until completed, maybe past the loop
                end = max(end, completed[id(op)])
            interval.end = max(interval.end, end)

    _separate_small_scratch(intervals, kernel.num_warps)
    total = _pack(list(intervals.values()))
    if total > SHARED_LIMIT:
        allocations = sorted((op for op in kernel.walk() if isinstance(op, AllocateSharedMemory)),
                             key=lambda op: -op.result.type.num_bytes)
        notes = tuple(f"{op.result.type.num_bytes} bytes: {op.result.type} at {op.loc}"
                      for op in allocations[:6])
        raise CompilationError(
            f"kernel {kernel.name!r} needs {total} bytes of shared memory, over the "
            f"{SHARED_LIMIT} bytes one CTA can use on sm_90",
            allocations[0].loc if allocations else None,
            suggestion="use smaller tiles, fewer pipeline stages, or narrower element types",
            notes=notes,
        )
    offsets = {iv.key: iv.offset for iv in intervals.values()}

    def rule(op: Op) -> Op:
        if isinstance(op, AllocateSharedMemory):
            return dataclasses.replace(op, offset=offsets[op.result])
        if op.USES_SCRATCH and id(op) in offsets:
            return dataclasses.replace(op, scratch_offset=offsets[id(op)])
        return op

    # Scratch keys are ids of the ops before rewriting; rewrite_kernel calls the rule on
    # ops whose nested blocks were rebuilt, which only happens for region ops (not these).
    return rewrite_kernel(kernel, rule, shared_bytes=total)


def view_roots(kernel: Kernel) -> dict[Value, Value]:
    """Each shared buffer value (an allocation, a view of one, a partition's captured
    buffer) -> the allocation it is part of."""
    roots: dict[Value, Value] = {}
    for op in kernel.walk():
        if isinstance(op, AllocateSharedMemory):
            roots[op.result] = op.result
        elif isinstance(op, (SharedIndex, SharedSlice, SharedPermute, SharedReinterpret)):
            roots[op.result] = roots.get(op.buffer, op.buffer)
        elif isinstance(op, WarpSpecialize):  # partitions see captured buffers as block args
            for region in op.nested_blocks():
                for arg, captured in zip(region.args, op.captures):
                    if captured in roots:
                        roots[arg] = roots[captured]
    return roots


# Scratch areas (reductions across warps, conversions through shared memory) that
# together fit in this many bytes each get their own bytes instead of sharing them.
SEPARATE_SCRATCH_BYTES = 8 * 1024


def _separate_small_scratch(intervals: dict, num_warps: int) -> None:
    """Make small scratch areas live for the whole kernel, so packing never overlaps them.

    Two reductions in a row that share scratch bytes need a CTA barrier between them
    (the second's writes must wait for every warp's reads of the first): one more
    barrier per row in a softmax or layer norm. A few hundred bytes each buys it back.
    """
    scratch = [iv for key, iv in intervals.items() if isinstance(key, int)]
    if not scratch or sum(iv.size for iv in scratch) > SEPARATE_SCRATCH_BYTES:
        return
    last = max(iv.end for iv in intervals.values())
    for interval in scratch:
        interval.start, interval.end = 0, last


def _pack(intervals: list[_Interval]) -> int:
    """First fit, largest first, among buffers whose live ranges overlap."""
    placed: list[_Interval] = []
    for interval in sorted(intervals, key=lambda iv: (-iv.size, iv.start)):
        offset = 0
        conflicts = sorted(
            (p for p in placed if p.start <= interval.end and interval.start <= p.end),
            key=lambda p: p.offset,
        )
        for other in conflicts:
            aligned = -(-offset // interval.align) * interval.align
            if aligned + interval.size <= other.offset:
                break
            offset = max(offset, other.offset + other.size)
        interval.offset = -(-offset // interval.align) * interval.align
        placed.append(interval)
    return max((iv.offset + iv.size for iv in placed), default=0)
