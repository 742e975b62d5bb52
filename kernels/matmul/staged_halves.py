"""The warp-specialized matmul of kernels.py with the output tile written half at a time
(Config.staged_halves), written in weft.lowlevel.

Why: a 128x256 tile of 16-bit C takes 64 KiB of shared memory to stage for its TMA
stores, and each ring stage (A's 128x64 and B's 64x256 slots) 48 KiB, so a whole-tile
buffer leaves room for 3 stages. Staged through a 32 KiB buffer, one column half after
the other, the ring gets 4 (4 x 48 + 32 KiB of 227): more bytes in flight, which is what
shapes with row strides off the 128-byte grid want (each box row then spans more L2
sectors; config.py's PAIRED_TILES).

The consumer multiplies the whole tile, one wgmma a K step (two wgmmas of half the
width, one per half, cost more than the 4th stage gains), then takes the accumulator's
column halves apart in registers (`column_half`) and writes them through the buffer in
turn (`store_in_halves`: the second waits until the first half's TMA stores have read
the buffer). The buffer is its own: the producer runs ahead into
the next tile's K steps while the consumer writes, so no ring slot is free to stage into.

CTA pairs (cluster.py) write their tiles the same way when given a half-wide buffer.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import tma
from .kernels import allocate_rings, allocate_slot_barriers, invalidate_slot_barriers, store_tile, tile_origin, ws_producer
from .split_k_tma import multiply_range


@ll.jit
def column_half(acc, RIGHT: ll.constexpr, NUM_WARPS: ll.constexpr):
    """The left (RIGHT False) or right column half of a wgmma accumulator, in the layout of
    an accumulator half as wide. The column halves differ in one register bit: the tile
    reshaped to [rows, 2, half] and summed over the middle dim with the other half masked
    to zero moves nothing between threads, and the mask (a column index against a
    constant) folds away, leaving an add per element."""
    BLOCK_M: ll.constexpr = acc.shape[0]
    HALF: ll.constexpr = acc.shape[1] // 2
    cols = ll.arange(0, 2 * HALF, ll.SliceLayout(0, acc.layout))
    index = ll.zeros([BLOCK_M, 2 * HALF], ll.int32, acc.layout) + cols[None, :]
    mine = (ll.reshape(index, [BLOCK_M, 2, HALF]) >= HALF) == RIGHT
    half = ll.sum(ll.where(mine, ll.reshape(acc, [BLOCK_M, 2, HALF]), 0.0), axis=1)
    half_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, HALF, 16])
    return ll.convert_layout(half, half_layout, assert_trivial=True)


@ll.jit
def store_in_halves(c_desc, c_smem, acc, off_m, off_n, BLOCK_N: ll.constexpr, NUM_WARPS: ll.constexpr):
    """Write the accumulator tile through c_smem: whole where c_smem is as wide as the tile,
    else one column half after the other (`store_tile` waits for the previous stores to
    have read c_smem before each half overwrites it)."""
    PIECE: ll.constexpr = c_smem.shape[1]
    if PIECE == BLOCK_N:
        store_tile(c_desc, c_smem, acc, off_m, off_n, BLOCK_N)
    else:
        store_tile(c_desc, c_smem, column_half(acc, False, NUM_WARPS), off_m, off_n, PIECE)
        store_tile(c_desc, c_smem, column_half(acc, True, NUM_WARPS), off_m, off_n + PIECE, PIECE)


@ll.jit
def halves_consumer(c_desc, a_ring, b_ring, c_smem, ready, empty, M, N, K,
                    BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                    STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                    NUM_WARPS: ll.constexpr):
    """Multiply each tile from whatever the producer has landed, releasing each slot, and
    write it through the half-wide c_smem."""
    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    consumed = 0
    for tile in range(ll.program_id(0), num_tiles, ll.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc, _, consumed = multiply_range(a_ring, b_ring, ready, empty, consumed, 0, k_steps,
                                          BLOCK_M, BLOCK_N, BLOCK_N, STAGES, B_K_MAJOR, NUM_WARPS)
        store_in_halves(c_desc, c_smem, acc, off_m, off_n, BLOCK_N, NUM_WARPS)
    tma.store_wait(0)  # the last stores have read c_smem before the CTA's shared memory goes


@ll.jit
def staged_halves_matmul(a_desc, b_desc, c_desc, M, N, K,
                         BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                         STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                         NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr):
    """C = A @ B as warp_specialized_matmul computes it (same descriptors and grid), the
    tile staged for its stores in a [BLOCK_M, BLOCK_N / 2] buffer."""
    PIECE: ll.constexpr = BLOCK_N // 2
    a_ring, b_ring = allocate_rings(a_desc, b_desc, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, B_K_MAJOR)
    c_smem = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_M, PIECE], c_desc.layout)
    ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (c_desc, a_ring, b_ring, c_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, NUM_WARPS), halves_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR), [ws_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    invalidate_slot_barriers(ready, empty, STAGES)
