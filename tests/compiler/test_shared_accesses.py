"""shared_accesses: the bytes of shared memory each op reads and writes, on hand-built IR
with offsets set by hand, so every range is computed here from shapes and element sizes.

Layout of the shared memory used below (bytes):
    0 .. 8          the mbarrier (i64 [1])
    1024 .. 17408   `ring`, fp16 [2, 64, 64] (2 * 64 * 64 * 2 bytes); views of it map to it whole
    17408 .. 33792  `tile`, fp32 [64, 64]
"""

from __future__ import annotations

import dataclasses

from weft.compiler import ir
from weft.compiler.ir import AllocateSharedMemory, Block, Kernel, Reduce, SharedIndex, SharedLoad, SharedStore, Value
from weft.compiler.passes.plan_data_movement import plan_data_movement
from weft.compiler.passes.shared_accesses import Access, BufferRanges, ByteRange, access_of, scratch_bytes_of
from weft.compiler.types import SharedType, TensorType, fp16, fp32, i32, i64
from weft.layouts import LinearLayout
from weft.layouts.rules import plan_reduction

from .backend_kernels import row_major_shared

RING = ByteRange(1024, 1024 + 2 * 64 * 64 * 2)
TILE = ByteRange(RING.end, RING.end + 64 * 64 * 4)
BARRIER = ByteRange(0, 8)
WARPS = 4


def ring_layout() -> LinearLayout:
    offset = [(0, 0, 1 << b) for b in range(6)] + [(0, 1 << b, 0) for b in range(6)] + [(1, 0, 0)]
    return LinearLayout({"offset": offset, "block": []}, {"dim0": 2, "dim1": 64, "dim2": 64})


class Buffers:
    """The allocations above, a stage of the ring, and a buffer not yet allocated."""

    def __init__(self):
        self.barrier = Value(SharedType((1,), i64, LinearLayout({"offset": [], "block": []}, {"dim0": 1})), "bar")
        self.ring = Value(SharedType((2, 64, 64), fp16, ring_layout()), "ring")
        self.tile = Value(SharedType((64, 64), fp32, row_major_shared(64, 64)), "tile")
        self.stage = Value(SharedType((64, 64), fp16, row_major_shared(64, 64)), "stage")
        self.unplaced = Value(SharedType((64, 64), fp32, row_major_shared(64, 64)), "unplaced")
        self.scalar = Value(i32, "i")
        self.ops = (AllocateSharedMemory(result=self.barrier, offset=0),
                    AllocateSharedMemory(result=self.ring, offset=RING.start),
                    AllocateSharedMemory(result=self.tile, offset=TILE.start),
                    SharedIndex(result=self.stage, buffer=self.ring, index=self.scalar),
                    AllocateSharedMemory(result=self.unplaced))
        self.ranges = BufferRanges()
        for op in self.ops:
            self.ranges.define(op)

    def access(self, op) -> Access:
        return access_of(op, self.ranges, WARPS)


def test_allocations_and_their_views_map_to_the_root_buffers_bytes():
    buffers = Buffers()
    assert buffers.ranges.of(buffers.barrier) == BARRIER
    assert buffers.ranges.of(buffers.ring) == ByteRange(1024, 17408)
    assert buffers.ranges.of(buffers.stage) == RING  # an index could be any stage
    assert buffers.ranges.of(buffers.tile) == ByteRange(17408, 33792)
    assert buffers.ranges.of(buffers.unplaced) is None


def test_byte_ranges_overlap_only_when_they_share_a_byte():
    assert RING.overlaps(ByteRange(17407, 17408)) and not RING.overlaps(TILE) and not TILE.overlaps(RING)
    assert ByteRange(0, 10).overlaps(ByteRange(3, 4)) and not ByteRange(0, 8).overlaps(ByteRange(8, 9))


def test_loads_stores_and_initialised_allocations():
    b = Buffers()
    value = Value(TensorType((64, 64), fp16, None), "x")
    assert b.access(SharedStore(buffer=b.stage, value=value)) == Access(writes=(RING,))
    assert b.access(SharedLoad(result=value, buffer=b.tile)) == Access(reads=(TILE,))
    assert b.access(AllocateSharedMemory(result=b.tile, init=value, offset=TILE.start)) == Access(writes=(TILE,))
    assert b.access(AllocateSharedMemory(result=b.tile, offset=TILE.start)) == Access()
    # a buffer with no offset yet has no bytes to report
    assert b.access(SharedStore(buffer=b.unplaced, value=value)) == Access()


def test_mbarrier_and_tma_ops_are_issued_by_one_thread():
    b = Buffers()
    desc, coords = Value(i32, "desc"), (Value(i32, "x"), Value(i32, "y"))
    assert b.access(ir.MBarrierInit(barrier=b.barrier, count=1)) == Access(writes=(BARRIER,), solo=True)
    assert b.access(ir.MBarrierArrive(barrier=b.barrier)) == Access(reads=(BARRIER,), solo=True)
    assert b.access(ir.MBarrierWait(barrier=b.barrier, phase=b.scalar)) == Access(reads=(BARRIER,))
    load = ir.TmaAsyncCopyGlobalToShared(descriptor=desc, coords=coords, barrier=b.barrier, buffer=b.stage)
    assert b.access(load) == Access(reads=(BARRIER,), writes=(RING,), solo=True, on_mbarrier=True)
    store = ir.TmaAsyncCopySharedToGlobal(descriptor=desc, coords=coords, buffer=b.tile)
    assert b.access(store) == Access(reads=(TILE,), solo=True, in_flight="tma_store")
    assert b.access(ir.TmaStoreWait(pending=1)) == Access(retires=("tma_store", 1))


def test_wgmma_and_cp_async_stay_in_flight_until_their_wait():
    b = Buffers()
    acc = Value(TensorType((64, 64), fp32, None), "acc")
    registers_a = Value(TensorType((64, 64), fp16, None), "a")
    mma = ir.WarpgroupMma(result=acc, a=registers_a, b=b.stage, acc=acc, is_async=True)
    assert b.access(mma) == Access(reads=(RING,), in_flight="wgmma")
    both_shared = ir.WarpgroupMma(result=acc, a=b.stage, b=b.tile, acc=acc)
    assert b.access(both_shared) == Access(reads=(RING, TILE))
    assert b.access(ir.WarpgroupMmaWait(results=(acc,), deps=(acc,), pending=0)) == Access(retires=("wgmma", 0))
    copy = ir.AsyncCopyGlobalToShared(buffer=b.tile, pointer=Value(i32, "ptrs"))
    assert b.access(copy) == Access(writes=(TILE,), in_flight="cp_async")
    assert b.access(ir.AsyncCopyCommitGroup()) == Access(commits=True)
    assert b.access(ir.AsyncCopyWaitGroup(pending=2)) == Access(retires=("cp_async", 2))


def _row_layout() -> LinearLayout:
    """fp32 [4, 64] over 4 warps: each row's 64 columns spread over 2 registers, 8 lanes, 4 warps."""
    return LinearLayout({"register": [(0, 1)], "lane": [(0, 2), (0, 4), (0, 8), (1, 0), (2, 0)],
                         "warp": [(0, 16), (0, 32)], "block": []}, {"dim0": 4, "dim1": 64})


def test_a_reduction_across_warps_writes_and_syncs_on_its_scratch():
    layout = _row_layout()
    x = Value(TensorType((4, 64), fp32, layout), "x")
    across = Value(TensorType((4,), fp32, plan_reduction(layout, 1).result_layout), "row_sum")
    within = Value(TensorType((64,), fp32, plan_reduction(layout, 0).result_layout), "col_sum")
    kernel = plan_data_movement(Kernel("r", (x,), Block((), (Reduce(result=across, operand=x, axis=1, kind="sum"),
                                                              Reduce(result=within, operand=x, axis=0, kind="sum"))),
                                       WARPS))
    row_sum, col_sum = kernel.body.ops
    # across warps: one fp32 per (warp, lane, result register), 4 warps * 32 lanes * 1 * 4 bytes
    assert scratch_bytes_of(row_sum, WARPS) == 4 * 32 * 4
    assert scratch_bytes_of(col_sum, WARPS) == 0  # within a warp: shuffles, no scratch
    placed = dataclasses.replace(row_sum, scratch_offset=40960)
    scratch = ByteRange(40960, 40960 + 4 * 32 * 4)
    assert access_of(placed, BufferRanges(), WARPS) == Access(writes=(scratch,), syncs=True, pending_reads=(scratch,))
    assert access_of(row_sum, BufferRanges(), WARPS) == Access()  # no offset yet: nothing to report
