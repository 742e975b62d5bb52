"""Split-K matmul whose parts add up by TMA bulk reduce-add, written in weft.lowlevel.

The work units are those of split_k.py (each output tile's K range cut into SPLIT_K
parts), but a unit hands its fp32 partial tile to the TMA unit: the consumer warpgroups
write it to shared memory once and one thread issues `tma.async_reduce_add` of the whole
tile into a zeroed fp32 workspace [M, N] (cp.reduce.async.bulk.tensor: the adds of
different CTAs into one box are atomic), instead of one `red.global.add` per element.
The consumers go on to their next unit while the unit adds; the tile's shared buffer is
rewritten only after `tma.store_wait` says the add has read it.

TMA's adds land in global memory by the kernel's end, not at the bulk group's read-wait,
so no unit of the same launch may read the sums back (the emulator reports such a read
as a race). A second, memory-bound launch, `finish_split`, converts the workspace to C's
dtype and writes zeros back, leaving the workspace ready for the next launch on the same
stream (host.py keeps one per stream and shape, as for the atomic split-K).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .kernels import allocate_rings, allocate_slot_barriers, b_operand, invalidate_slot_barriers, release_slot, tile_origin
from .split_k import split_producer, unit_range

# finish_split's blocks: 4 contiguous fp32 a thread (16-byte loads), 4 warps.
FINISH_LAYOUT = ll.BlockedLayout([4], [32], [4], [0])
FINISH_BLOCK = 2048
FINISH_WARPS = 4


@ll.jit
def add_tile(ws_desc, ws_smem, acc, off_m, off_n, BLOCK_N: ll.constexpr):
    """Add the fp32 tile `acc` into the workspace box at (off_m, off_n) by TMA reduce-add,
    one add per swizzle-wide column strip. The previous unit's adds must have read
    ws_smem first."""
    tma.store_wait(0)
    ws_smem.store(acc)
    ll.fence_async_shared()
    BOX_N: ll.constexpr = ws_desc.block_shape[1]
    for j in ll.static_range(BLOCK_N // BOX_N):
        tma.async_reduce_add(ws_desc, [off_m, off_n + j * BOX_N], ws_smem.slice(j * BOX_N, BOX_N, 1))


@ll.jit
def multiply_range(a_ring, b_ring, ready, empty, consumed, k_begin, k_end,
                   BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, PIECE: ll.constexpr, STAGES: ll.constexpr,
                   B_K_MAJOR: ll.constexpr, NUM_WARPS: ll.constexpr, CLUSTER: ll.constexpr = 1):
    """(left, right, consumed): one tile's K steps [k_begin, k_end) from the ring (`consumed`
    slots taken so far), releasing each slot once its wgmma has retired (to both CTAs'
    producers in a cluster of CLUSTER 2: `release_slot`). Where PIECE is narrower than the
    tile, left and right are its two column halves, each its own accumulator and wgmma;
    else both are the whole accumulator. Shared by the split-K, stream-K and CTA-pair
    (cluster.py) consumers."""
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, PIECE, 16])
    acc = ll.zeros([BLOCK_M, PIECE], ll.float32, acc_layout)
    if PIECE < BLOCK_N:
        right = ll.zeros([BLOCK_M, PIECE], ll.float32, acc_layout)
    previous = 0
    for k in range(k_begin, k_end):
        slot = consumed % STAGES
        mbarrier.wait(ready.index(slot), (consumed // STAGES) & 1)
        b = b_operand(b_ring.index(slot), B_K_MAJOR)
        if PIECE < BLOCK_N:
            acc = ll.warpgroup_mma(a_ring.index(slot), b.slice(0, PIECE, 1), acc, is_async=True)
            right = ll.warpgroup_mma(a_ring.index(slot), b.slice(PIECE, PIECE, 1), right, is_async=True)
            acc, right = ll.warpgroup_mma_wait(2, deps=[acc, right])
        else:
            acc = ll.warpgroup_mma(a_ring.index(slot), b, acc, is_async=True)
            acc = ll.warpgroup_mma_wait(1, deps=[acc])
        # The previous step's wgmma has retired: hand its slot back to the producer.
        release_slot(empty.index(previous), k > k_begin, CLUSTER)
        previous = slot
        consumed += 1
    if PIECE < BLOCK_N:
        acc, right = ll.warpgroup_mma_wait(0, deps=[acc, right])
    else:
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
        right = acc
    release_slot(empty.index(previous), k_end > k_begin, CLUSTER)
    return acc, right, consumed


@ll.jit
def reducing_consumer(ws_desc, a_ring, b_ring, ws_smem, ready, empty, M, N, K,
                      BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                      STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                      SPLIT_K: ll.constexpr, NUM_WARPS: ll.constexpr):
    """Multiply each unit's K range and add the partial tile into the workspace: in one
    piece, or (ws_smem narrower than the tile: 128x256 tiles, whose fp32 tile would
    leave room for 2 stages) as two column halves, each its own accumulator and wgmma."""
    PIECE: ll.constexpr = ws_smem.shape[1]
    k_steps = ll.cdiv(K, BLOCK_K)
    units = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N) * SPLIT_K
    consumed = 0
    for unit in range(ll.program_id(0), units, ll.num_programs(0)):
        tile, begin, end = unit_range(unit, k_steps, SPLIT_K)
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc, right, consumed = multiply_range(a_ring, b_ring, ready, empty, consumed, begin, end,
                                              BLOCK_M, BLOCK_N, PIECE, STAGES, B_K_MAJOR, NUM_WARPS)
        add_tile(ws_desc, ws_smem, acc, off_m, off_n, PIECE)
        if PIECE < BLOCK_N:
            add_tile(ws_desc, ws_smem, right, off_m, off_n + PIECE, PIECE)
    tma.store_wait(0)  # the last add has read ws_smem before the CTA's shared memory goes


@ll.jit
def reduce_add_split_k_matmul(a_desc, b_desc, ws_desc, M, N, K,
                              BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                              STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                              NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr, SPLIT_K: ll.constexpr,
                              STAGED_N: ll.constexpr):
    """workspace[M, N] += A @ B, each tile's K range in SPLIT_K units (ws_desc: fp32 boxes
    of [BLOCK_M, 128 bytes of columns]), STAGED_N columns of a partial tile at a time
    (config.staged_columns: BLOCK_N or half of it)."""
    a_ring, b_ring = allocate_rings(a_desc, b_desc, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, B_K_MAJOR)
    ws_smem = ll.allocate_shared_memory(ll.float32, [BLOCK_M, STAGED_N], ws_desc.layout)
    ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (ws_desc, a_ring, b_ring, ws_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, SPLIT_K, NUM_WARPS), reducing_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, SPLIT_K), [split_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    invalidate_slot_barriers(ready, empty, STAGES)


@ll.jit
def finish_split(ws_ptr, c_ptr, quads):
    """c[i] = workspace[i] in c's dtype and workspace[i] = 0, for the 4 x `quads` elements
    of two arrays of the same rows and row stride (C's padding columns included: the
    workspace's are zero); grid cdiv(4 x quads, FINISH_BLOCK). Counting in quads (rows
    are whole 16-byte units) tells the compiler the mask holds for 4 elements at a time,
    so each thread moves 16 bytes of fp32 per access."""
    offsets = ll.program_id(0) * FINISH_BLOCK + ll.arange(0, FINISH_BLOCK, FINISH_LAYOUT)
    inside = offsets < quads * 4
    sums = ll.load(ws_ptr + offsets, mask=inside, other=0.0, cache_modifier=".cg")
    ll.store(c_ptr + offsets, sums.to(c_ptr.dtype.element_ty), mask=inside)
    ll.store(ws_ptr + offsets, ll.zeros([FINISH_BLOCK], ll.float32, FINISH_LAYOUT), mask=inside)
