"""Which bytes of shared memory each op reads and writes (after allocation).

Shared by insert_barriers and by tests. Views (index/slice) are conservatively taken as
their whole root buffer: a dynamic index could be any stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import atomics
from ..ir import (ATOMICS, AllocShared, AsyncCopy, BulkCopyLoad, ConvertLayout, MBarrierArrive, MBarrierExpect,
                  MBarrierInit, MBarrierInvalidate, MBarrierWait, Op, Reduce, SharedIndex, SharedLoad, SharedPermute,
                  SharedSlice, SharedStore, TmaLoad, TmaStore, Value, WarpDot, WarpGroupDot, WarpSpecialize,
                  is_shared)


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int

    def overlaps(self, other: "ByteRange") -> bool:
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True)
class Access:
    """An op's shared-memory effect: `before` ranges written, then (if `syncs`) an internal
    CTA barrier, then `after` ranges left read-pending."""

    reads: tuple[ByteRange, ...] = ()
    writes: tuple[ByteRange, ...] = ()
    syncs: bool = False
    pending_reads: tuple[ByteRange, ...] = ()
    solo: bool = False  # made by the one elected thread (mbarrier and TMA issue)


class BufferRanges:
    """Maps shared values (allocations and their views) to the bytes of their root buffer."""

    def __init__(self):
        self.ranges: dict[Value, ByteRange] = {}

    def define(self, op: Op) -> None:
        if isinstance(op, AllocShared) and op.offset is not None:
            self.ranges[op.result] = ByteRange(op.offset, op.offset + op.result.type.num_bytes)
        elif isinstance(op, (SharedIndex, SharedSlice, SharedPermute)) and op.buffer in self.ranges:
            self.ranges[op.result] = self.ranges[op.buffer]
        elif isinstance(op, WarpSpecialize):  # partitions see captured buffers as block args
            for region in op.nested_blocks():
                for arg, captured in zip(region.args, op.captures):
                    if captured in self.ranges:
                        self.ranges[arg] = self.ranges[captured]

    def of(self, value: Value) -> Optional[ByteRange]:
        return self.ranges.get(value)


def scratch_bytes_of(op: Op, num_warps: int, mirrored: bool = False) -> int:
    """Bytes of scratch an op needs while it runs (0 when it needs none). `mirrored`: the
    op runs outside partitions in a kernel whose worker warps copy that code."""
    if isinstance(op, ATOMICS):
        return atomics.scratch_bytes(op) if atomics.needs_scratch(op, num_warps, mirrored) else 0
    if isinstance(op, ConvertLayout) and op.plan is not None:
        return int(getattr(op.plan, "scratch_bytes", 0) or 0)
    if isinstance(op, Reduce):
        from ..layout_rules import plan_reduction

        plan = plan_reduction(op.operand.type.layout, op.axis)
        elements = plan.scratch_elements(num_warps)
        # Values are combined in at least 32 bits; argmax/argmin also keep an i32 index.
        bits = max(op.operand.type.element.bits, 32)
        per_element = bits // 8 + (4 if op.kind in ("argmax", "argmin") else 0)
        return elements * per_element
    return 0


def access_of(op: Op, buffers: BufferRanges, num_warps: int) -> Access:
    access = _raw_access_of(op, buffers, num_warps)
    # Buffers without an offset (before allocation) have no known bytes yet.
    return Access(
        reads=tuple(r for r in access.reads if r is not None),
        writes=tuple(w for w in access.writes if w is not None),
        syncs=access.syncs,
        pending_reads=access.pending_reads,
        solo=access.solo,
    )


def _raw_access_of(op: Op, buffers: BufferRanges, num_warps: int) -> Access:
    if isinstance(op, AllocShared) and op.init is not None:
        return Access(writes=(buffers.of(op.result),))
    if isinstance(op, SharedStore):
        return Access(writes=(buffers.of(op.buffer),))
    if isinstance(op, SharedLoad):
        return Access(reads=(buffers.of(op.buffer),))
    # Async ops, as far as CTA barriers are concerned. Ops one thread issues (TMA store,
    # mbarrier ops) and wgmma read memory other threads wrote: a barrier must come first.
    # TMA loads are ordered by mbarrier waits, not by bar.sync, so they are not writes
    # here; the emulator checks that protocol.
    if isinstance(op, (MBarrierInit, MBarrierInvalidate)):
        return Access(writes=(buffers.of(op.barrier),), solo=True)
    if isinstance(op, (MBarrierExpect, MBarrierArrive, TmaLoad, BulkCopyLoad)):
        return Access(reads=(buffers.of(op.barrier),), solo=True)
    if isinstance(op, MBarrierWait):
        return Access(reads=(buffers.of(op.barrier),))
    if isinstance(op, TmaStore):
        return Access(reads=(buffers.of(op.buffer),), solo=True)
    if isinstance(op, (WarpGroupDot, WarpDot)):
        return Access(reads=tuple(buffers.of(v) for v in (op.a, op.b) if is_shared(v)))
    if isinstance(op, AsyncCopy):
        # Each thread's wait_group covers only its own copies: other threads may read
        # (or overwrite) the bytes only after a barrier, so the copy counts as a write.
        return Access(writes=(buffers.of(op.buffer),))
    if isinstance(op, (ConvertLayout, Reduce) + ATOMICS) and op.scratch_offset is not None:
        size = atomics.scratch_bytes(op) if isinstance(op, ATOMICS) else scratch_bytes_of(op, num_warps)
        scratch = ByteRange(op.scratch_offset, op.scratch_offset + size)
        return Access(writes=(scratch,), syncs=True, pending_reads=(scratch,))
    return Access()
