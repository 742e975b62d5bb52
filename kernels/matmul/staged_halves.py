"""The warp-specialized matmul of kernels.py with the output tile written half at a time
(Config.staged_halves), written in weft.lowlevel.

Why: a 128x256 tile of 16-bit C takes 64 KiB of shared memory to stage for its TMA
stores, and each ring stage (A's 128x64 and B's 64x256 slots) 48 KiB, so a whole-tile
buffer leaves room for 3 stages. Staged through a 32 KiB buffer, one column half after
the other, the ring gets 4 (4 x 48 + 32 KiB of 227): more bytes in flight, which is what
shapes with row strides off the 128-byte grid want (each box row then spans more L2
sectors; config.py's PAIRED_TILES).

Registers have no column split, so the consumer multiplies the tile as two halves, each
its own accumulator and wgmma per K step (split_k_tma.py's `multiply_range`), and writes
them through the buffer in turn (`store_halves`: the second waits until the first half's
TMA stores have read the buffer). The buffer is its own: the producer runs ahead into
the next tile's K steps while the consumer writes, so no ring slot is free to stage into.

CTA pairs (cluster.py) write their tiles the same way when given a half-wide buffer.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import tma
from .kernels import allocate_slot_barriers, invalidate_slot_barriers, store_tile, tile_origin, ws_producer
from .split_k_tma import multiply_range


@ll.jit
def store_halves(c_desc, c_smem, left, right, off_m, off_n, PIECE: ll.constexpr, BLOCK_N: ll.constexpr):
    """Write a tile held as `left` and `right` column halves (PIECE each; where PIECE is
    BLOCK_N, `left` is the whole tile) through c_smem, PIECE columns wide: `store_tile`
    waits for the previous stores to have read c_smem before each half overwrites it."""
    store_tile(c_desc, c_smem, left, off_m, off_n, PIECE)
    if PIECE < BLOCK_N:
        store_tile(c_desc, c_smem, right, off_m, off_n + PIECE, PIECE)


@ll.jit
def halves_consumer(c_desc, a_ring, b_ring, c_smem, ready, empty, M, N, K,
                    BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                    STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                    NUM_WARPS: ll.constexpr):
    """Multiply each tile as two column halves from whatever the producer has landed,
    releasing each slot, and write the halves through the half-wide c_smem."""
    PIECE: ll.constexpr = c_smem.shape[1]
    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    consumed = 0
    for tile in range(ll.program_id(0), num_tiles, ll.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        left, right, consumed = multiply_range(a_ring, b_ring, ready, empty, consumed, 0, k_steps,
                                               BLOCK_M, BLOCK_N, PIECE, STAGES, B_K_MAJOR, NUM_WARPS)
        store_halves(c_desc, c_smem, left, right, off_m, off_n, PIECE, BLOCK_N)
    tma.store_wait(0)  # the last stores have read c_smem before the CTA's shared memory goes


@ll.jit
def staged_halves_matmul(a_desc, b_desc, c_desc, M, N, K,
                         BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                         STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                         NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr):
    """C = A @ B as warp_specialized_matmul computes it (same descriptors and grid), the
    tile staged for its stores in a [BLOCK_M, BLOCK_N / 2] buffer."""
    PIECE: ll.constexpr = BLOCK_N // 2
    dtype: ll.constexpr = a_desc.dtype
    a_ring = ll.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_box: ll.constexpr = [BLOCK_N, BLOCK_K] if B_K_MAJOR else [BLOCK_K, BLOCK_N]
    b_ring = ll.allocate_shared_memory(dtype, [STAGES] + b_box, b_desc.layout)
    c_smem = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_M, PIECE], c_desc.layout)
    ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (c_desc, a_ring, b_ring, c_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, NUM_WARPS), halves_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR), [ws_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    invalidate_slot_barriers(ready, empty, STAGES)
