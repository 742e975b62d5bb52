"""Which bytes of shared memory each op reads and writes (after allocation).

Shared by insert_barriers and by tests. Views (index/slice) are conservatively taken as
their whole root buffer: a dynamic index could be any stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .. import atomics
from ..ir import (ATOMICS, AllocateSharedMemory, AsyncBulkCopyGlobalToShared, AsyncCopyCommitGroup,
                  AsyncCopyGlobalToShared, AsyncCopyMBarrierArrive, AsyncCopyWaitGroup, ConvertLayout, MBarrierArrive, MBarrierExpect,
                  MBarrierInit, MBarrierInvalidate, MBarrierWait, MmaV2, Op, Reduce, SharedIndex, SharedLoad,
                  SharedPermute, SharedReinterpret, SharedSlice, SharedStore, TmaAsyncCopyGlobalToShared,
                  TmaAsyncCopySharedToGlobal, TmaAsyncReduceAdd, TmaStoreWait, Value, WarpSpecialize, WarpgroupMma,
                  WarpgroupMmaWait, is_shared)


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int

    def overlaps(self, other: "ByteRange") -> bool:
        return self.start < other.end and other.start < self.end


# Async ops whose shared-memory accesses outlive the op, each retired by its own wait:
# wgmma (warpgroup_mma_wait), TMA stores (store_wait) and cp.async (wait_group).
ASYNC_KINDS = ("wgmma", "tma_store", "cp_async")


@dataclass(frozen=True)
class Access:
    """An op's shared-memory effect, as far as CTA barriers are concerned.

    `reads`/`writes` are done when the op returns, in the threads that run it (all of them,
    or the one elected thread when `solo`); other threads may touch the bytes only after a
    barrier. Scratch users write, sync inside (`syncs`), then leave `pending_reads`.

    `in_flight` names an async kind: the op only starts its reads/writes, which go on
    until a wait of that kind retires their group (`retires` = (kind, groups left in
    flight)); only then are they done in this thread, and only a barrier after that wait
    covers them for the others. `commits`: cp.async's commit_group makes a group of the
    copies issued so far.

    `on_mbarrier`: a TMA or bulk load. Its writes must not overtake other threads' pending
    accesses (a barrier first), but every reader waits on the load's mbarrier itself, so
    nothing is left pending for a barrier to settle.

    `hands_off_copies`: cp.async.mbarrier.arrive. Every thread's copies so far complete
    on the barrier, and whoever touches those bytes next waits for its phase (the ring's
    consumers, and the producer only after they released the slot): nothing is left
    pending for a CTA barrier, as with a TMA load's `on_mbarrier`.

    `releases`: an arrival from every warp (or thread) of the partition on this barrier,
    after their accesses so far. `settles_for_solo`: an elected wait on this barrier: the
    elected thread is ordered after every access released on it, so its next issue (a TMA
    refill of a slot the warps read) needs no CTA barrier for them.
    """

    reads: tuple[ByteRange, ...] = ()
    writes: tuple[ByteRange, ...] = ()
    syncs: bool = False
    pending_reads: tuple[ByteRange, ...] = ()
    solo: bool = False  # made by the one elected thread (mbarrier and TMA issue)
    in_flight: Optional[str] = None
    on_mbarrier: bool = False
    retires: Optional[tuple[str, int]] = None
    commits: bool = False
    releases: Optional[ByteRange] = None
    settles_for_solo: Optional[ByteRange] = None
    hands_off_copies: bool = False


class BufferRanges:
    """Maps shared values (allocations and their views) to the bytes of their root buffer."""

    def __init__(self):
        self.ranges: dict[Value, ByteRange] = {}

    def define(self, op: Op) -> None:
        if isinstance(op, AllocateSharedMemory) and op.offset is not None:
            self.ranges[op.result] = ByteRange(op.offset, op.offset + op.result.type.num_bytes)
        elif isinstance(op, (SharedIndex, SharedSlice, SharedPermute, SharedReinterpret)) and op.buffer in self.ranges:
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
        return op.recorded_plan().scratch_bytes
    return 0


def access_of(op: Op, buffers: BufferRanges, num_warps: int) -> Access:
    access = _raw_access_of(op, buffers, num_warps)
    # Buffers without an offset (before allocation) have no known bytes yet.
    return dataclasses.replace(access, reads=tuple(r for r in access.reads if r is not None),
                               writes=tuple(w for w in access.writes if w is not None))


def _raw_access_of(op: Op, buffers: BufferRanges, num_warps: int) -> Access:
    if isinstance(op, AllocateSharedMemory) and op.init is not None:
        return Access(writes=(buffers.of(op.result),))
    if isinstance(op, SharedStore):
        return Access(writes=(buffers.of(op.buffer),))
    if isinstance(op, SharedLoad):
        return Access(reads=(buffers.of(op.buffer),))
    # The Hopper async machinery. Ops one thread issues (mbarrier ops, TMA) touch memory
    # other threads may have touched or still read: a barrier must come first.
    if isinstance(op, (MBarrierInit, MBarrierInvalidate)):
        return Access(writes=(buffers.of(op.barrier),), solo=True)
    if isinstance(op, MBarrierArrive) and (op.per_warp or op.per_thread) and op.cta is None:
        return Access(reads=(buffers.of(op.barrier),), solo=True, releases=buffers.of(op.barrier))
    if isinstance(op, (MBarrierExpect, MBarrierArrive)):
        return Access(reads=(buffers.of(op.barrier),), solo=True)
    if isinstance(op, MBarrierWait) and op.elected:
        return Access(reads=(buffers.of(op.barrier),), solo=True, settles_for_solo=buffers.of(op.barrier))
    if isinstance(op, MBarrierWait):
        return Access(reads=(buffers.of(op.barrier),))
    if isinstance(op, (TmaAsyncCopyGlobalToShared, AsyncBulkCopyGlobalToShared)):
        # Overwrites what other warps may have read (a wgmma of the previous iteration).
        return Access(reads=(buffers.of(op.barrier),), writes=(buffers.of(op.buffer),), solo=True,
                      on_mbarrier=True)
    if isinstance(op, (TmaAsyncCopySharedToGlobal, TmaAsyncReduceAdd)):  # a bulk group each
        return Access(reads=(buffers.of(op.buffer),), solo=True, in_flight="tma_store")
    if isinstance(op, TmaStoreWait):
        return Access(retires=("tma_store", op.pending))
    if isinstance(op, WarpgroupMma):
        reads = tuple(buffers.of(v) for v in (op.a, op.b) if is_shared(v))
        return Access(reads=reads, in_flight="wgmma" if op.is_async else None)
    if isinstance(op, WarpgroupMmaWait):
        return Access(retires=("wgmma", op.pending))
    if isinstance(op, MmaV2):
        return Access(reads=tuple(buffers.of(v) for v in (op.a, op.b) if is_shared(v)))
    if isinstance(op, AsyncCopyGlobalToShared):
        # Each thread's wait_group covers only its own copies: other threads may read
        # (or overwrite) the bytes only after a barrier that follows the wait.
        return Access(writes=(buffers.of(op.buffer),), in_flight="cp_async")
    if isinstance(op, AsyncCopyCommitGroup):
        return Access(commits=True)
    if isinstance(op, AsyncCopyMBarrierArrive):
        # Every thread's copies so far land before its arrival: those who wait for the
        # phase see them, as a TMA load's readers do (no barrier left to settle).
        return Access(reads=(buffers.of(op.barrier),), hands_off_copies=True)
    if isinstance(op, AsyncCopyWaitGroup):
        return Access(retires=("cp_async", op.pending))
    if op.USES_SCRATCH and op.scratch_offset is not None:
        size = atomics.scratch_bytes(op) if isinstance(op, ATOMICS) else scratch_bytes_of(op, num_warps)
        scratch = ByteRange(op.scratch_offset, op.scratch_offset + size)
        return Access(writes=(scratch,), syncs=True, pending_reads=(scratch,))
    return Access()
