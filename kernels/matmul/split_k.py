"""Split-K matmul, written in weft.lowlevel: the warp-specialized kernel of kernels.py with
each output tile's K range cut into SPLIT_K parts, one work unit each.

A problem with fewer output tiles than SMs (decode, M <= 64; small M x N with a long K)
leaves most SMs idle under one-CTA-per-tile; splitting K gives tiles x SPLIT_K units for
the persistent CTAs to share. Each unit adds its fp32 partial tile into a zeroed fp32
workspace [M, N] with atomics (red.global.add: no unit waits for another), then counts
itself in the tile's arrival counter (int32). The unit that arrives last, having
acquired every other unit's adds through the counter, reads the finished sums back,
writes the tile in C's dtype through shared memory and TMA as the unsplit kernel does,
and puts zeros back in the workspace tile and its counter. One launch, with no
reduction kernel and no memsets: the workspace the kernel leaves is ready for its next
launch on the same stream (host.py keeps one per stream and shape).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .kernels import (allocate_operands, allocate_slot_barriers, b_operand, invalidate_slot_barriers,
                      load_stage, next_free_slot, store_tile, tile_origin)


@ll.jit
def unit_range(unit, k_steps, SPLIT_K: ll.constexpr):
    """(tile, first K step, end K step) of work unit `unit`: part unit % SPLIT_K of tile
    unit // SPLIT_K. The last parts may be shorter, or empty where SPLIT_K does not
    divide the steps evenly."""
    per_part = ll.cdiv(k_steps, SPLIT_K)
    begin = (unit % SPLIT_K) * per_part
    return unit // SPLIT_K, begin, ll.minimum(begin + per_part, k_steps)


@ll.jit
def split_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K,
                   BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                   STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                   SPLIT_K: ll.constexpr):
    """Fill ring slots with each unit's K steps as soon as the consumers release them."""
    k_steps = ll.cdiv(K, BLOCK_K)
    units = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N) * SPLIT_K
    issued = 0
    for unit in range(ll.program_id(0), units, ll.num_programs(0)):
        tile, begin, end = unit_range(unit, k_steps, SPLIT_K)
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for k in range(begin, end):
            slot = next_free_slot(empty, issued, STAGES)
            load_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                       off_m, off_n, k * BLOCK_K, BLOCK_N, B_K_MAJOR)
            issued += 1


@ll.jit
def split_consumer(c_desc, a_ring, b_ring, c_smem, ready, empty, partial_ptr, arrivals_ptr, M, N, K,
                   BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                   STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                   SPLIT_K: ll.constexpr, NUM_WARPS: ll.constexpr):
    """Multiply each unit's K range, add it into the workspace; the tile's last unit
    writes the tile."""
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, BLOCK_N, 16])
    k_steps = ll.cdiv(K, BLOCK_K)
    units = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N) * SPLIT_K
    consumed = 0
    for unit in range(ll.program_id(0), units, ll.num_programs(0)):
        tile, begin, end = unit_range(unit, k_steps, SPLIT_K)
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = ll.zeros([BLOCK_M, BLOCK_N], ll.float32, acc_layout)
        previous = 0
        for k in range(begin, end):
            slot = consumed % STAGES
            mbarrier.wait(ready.index(slot), (consumed // STAGES) & 1)
            acc = ll.warpgroup_mma(a_ring.index(slot), b_operand(b_ring.index(slot), B_K_MAJOR),
                                   acc, is_async=True)
            acc = ll.warpgroup_mma_wait(1, deps=[acc])
            mbarrier.arrive(empty.index(previous), pred=k > begin)
            previous = slot
            consumed += 1
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(previous), pred=end > begin)
        rows = off_m + ll.arange(0, BLOCK_M, ll.SliceLayout(1, acc_layout))
        cols = off_n + ll.arange(0, BLOCK_N, ll.SliceLayout(0, acc_layout))
        at = partial_ptr + rows[:, None] * N + cols[None, :]
        inside = (rows[:, None] < M) & (cols[None, :] < N)
        ll.atomic_add(at, acc, mask=inside, sem="relaxed")
        # Every thread's adds are issued before the partition's one release below.
        ll.barrier()
        arrived = ll.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = ll.load(at, mask=inside, other=0.0, cache_modifier=".cg")
            ll.store(at, ll.zeros([BLOCK_M, BLOCK_N], ll.float32, acc_layout), mask=inside)
            ll.atomic_xchg(arrivals_ptr + tile, 0, sem="relaxed")
            store_tile(c_desc, c_smem, total, off_m, off_n, BLOCK_N)
    tma.store_wait(0)


@ll.jit
def split_k_matmul(a_desc, b_desc, c_desc, partial_ptr, arrivals_ptr, M, N, K,
                   BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                   STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                   NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr, SPLIT_K: ll.constexpr):
    a_ring, b_ring, c_smem = allocate_operands(a_desc, b_desc, c_desc, BLOCK_M, BLOCK_N, BLOCK_K,
                                               STAGES, B_K_MAJOR)
    ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (c_desc, a_ring, b_ring, c_smem, ready, empty, partial_ptr, arrivals_ptr, M, N, K, BLOCK_M, BLOCK_N,
         BLOCK_K, STAGES, GROUP_M, B_K_MAJOR, SPLIT_K, NUM_WARPS), split_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, SPLIT_K), [split_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    invalidate_slot_barriers(ready, empty, STAGES)
