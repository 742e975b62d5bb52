"""The warp-specialized matmul of kernels.py with 192-column output tiles, written in
weft.lowlevel.

Why 192: a shape such as 1000 x 3000 makes 8 x 12 = 96 tiles of 128 x 256 (a wave 73%
full on 132 SMs) and 8 x 24 = 192 of 128 x 128 (1.45 waves), but 8 x 16 = 128 of
128 x 192: one wave, nearly full. wgmma takes N = 192, but register and shared layouts
have power-of-two shapes, so each tile is two column pieces, LEFT_N = 128 and
RIGHT_N = 64 wide: per K step each consumer warpgroup issues two wgmmas (one per piece,
each its own accumulator) on the same A slot, and B arrives in two rings of those
widths. Everything else (persistent CTAs in grouped tile order, the producer partition
with its `ready`/`empty` barriers, TMA zeros past the edges) is kernels.py's.

B's TMA box is 64 columns wide in both layouts (for K-major B, [64, BLOCK_K] rows of
B^T: host.py builds it so), so each piece takes whole boxes.

CLUSTER_M or CLUSTER_N 2: CTA pairs sharing B or A tiles by multicast, as cluster.py's
(Config.cluster_m / cluster_n); a pair along M shares B's three boxes, the CTA of rank 0
loading two of them (`load_boxes`).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .cluster import allocate_pair_barriers, first_unit, load_b_boxes, load_boxes, unit_origin, unit_stride
from .kernels import allocate_slot_barriers, b_operand, invalidate_slot_barriers, next_free_slot, release_slot

LEFT_N = 128
RIGHT_N = 64
B_BOX_N = 64  # B's box width along N in both layouts


@ll.jit
def load_two_piece_stage(a_desc, b_desc, a_ring, left_ring, right_ring, ready, slot, off_m, off_n, k,
                         BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr, B_K_MAJOR: ll.constexpr,
                         CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr):
    """K step k's loads into ring slot `slot` of A and of B's left and right pieces, as
    `load_cluster_stage` loads a slot of one B piece: A as BLOCK_M / box-rows boxes (one
    unpaired; shared along N), each piece of B as whole 64-column boxes (shared along M)."""
    bar = ready.index(slot)
    A_BOXES: ll.constexpr = BLOCK_M // a_desc.block_shape[0]
    mbarrier.expect(bar, a_desc.nbytes * A_BOXES + b_desc.nbytes * (BLOCK_N // B_BOX_N))
    off_k = k * BLOCK_K
    load_boxes(a_desc, off_m, off_k, bar, a_ring.index(slot), A_BOXES, 0, CLUSTER_N == 2)
    load_b_boxes(b_desc, off_n, off_k, bar, left_ring.index(slot), LEFT_N // B_BOX_N, B_K_MAJOR, CLUSTER_M == 2)
    load_b_boxes(b_desc, off_n + LEFT_N, off_k, bar, right_ring.index(slot), RIGHT_N // B_BOX_N, B_K_MAJOR,
                 CLUSTER_M == 2)


@ll.jit
def two_piece_producer(a_desc, b_desc, a_ring, left_ring, right_ring, ready, empty, M, N, K,
                       BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                       STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                       CLUSTER_M: ll.constexpr = 1, CLUSTER_N: ll.constexpr = 1):
    """Fill ring slots (A, B's left and right pieces) as soon as the consumers free them
    (in a pair, those of both CTAs)."""
    CLUSTERED: ll.constexpr = CLUSTER_M * CLUSTER_N > 1
    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M * CLUSTER_M) * ll.cdiv(N, BLOCK_N * CLUSTER_N)  # or tile pairs
    issued = 0
    for tile in range(first_unit(CLUSTERED), num_tiles, unit_stride(CLUSTERED)):
        off_m, off_n = unit_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M, CLUSTER_M, CLUSTER_N)
        for k in range(0, k_steps):
            slot = next_free_slot(empty, issued, STAGES)
            load_two_piece_stage(a_desc, b_desc, a_ring, left_ring, right_ring, ready, slot, off_m, off_n,
                                 k, BLOCK_M, BLOCK_N, BLOCK_K, B_K_MAJOR, CLUSTER_M, CLUSTER_N)
            issued += 1


@ll.jit
def store_pieces(c_desc, c_left, c_right, left, right, off_m, off_n):
    """Write the tile's two accumulator pieces through shared memory with TMA stores; the
    previous tile's stores must have read both buffers first."""
    tma.store_wait(0)
    c_left.store(left.to(c_desc.dtype))
    c_right.store(right.to(c_desc.dtype))
    ll.fence_async_shared()
    BOX_N: ll.constexpr = c_desc.block_shape[1]
    for j in ll.static_range(LEFT_N // BOX_N):
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n + j * BOX_N], c_left.slice(j * BOX_N, BOX_N, 1))
    for j in ll.static_range(RIGHT_N // BOX_N):
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n + LEFT_N + j * BOX_N],
                                        c_right.slice(j * BOX_N, BOX_N, 1))


@ll.jit
def two_piece_consumer(c_desc, a_ring, left_ring, right_ring, c_left, c_right, ready, empty, M, N, K,
                       BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                       STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                       NUM_WARPS: ll.constexpr, CLUSTER_M: ll.constexpr = 1, CLUSTER_N: ll.constexpr = 1):
    """Multiply both pieces of whatever has landed, release each slot (in a pair, to both
    CTAs' producers), write each tile."""
    CLUSTER: ll.constexpr = CLUSTER_M * CLUSTER_N
    left_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, LEFT_N, 16])
    right_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, RIGHT_N, 16])
    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M * CLUSTER_M) * ll.cdiv(N, BLOCK_N * CLUSTER_N)  # or tile pairs
    consumed = 0
    for tile in range(first_unit(CLUSTER > 1), num_tiles, unit_stride(CLUSTER > 1)):
        off_m, off_n = unit_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M, CLUSTER_M, CLUSTER_N)
        left = ll.zeros([BLOCK_M, LEFT_N], ll.float32, left_layout)
        right = ll.zeros([BLOCK_M, RIGHT_N], ll.float32, right_layout)
        previous = 0
        for k in range(0, k_steps):
            slot = consumed % STAGES
            mbarrier.wait(ready.index(slot), (consumed // STAGES) & 1)
            a = a_ring.index(slot)
            left = ll.warpgroup_mma(a, b_operand(left_ring.index(slot), B_K_MAJOR), left, is_async=True)
            right = ll.warpgroup_mma(a, b_operand(right_ring.index(slot), B_K_MAJOR), right, is_async=True)
            # The previous step's two wgmmas have retired: hand its slot back.
            left, right = ll.warpgroup_mma_wait(2, deps=[left, right])
            release_slot(empty.index(previous), k > 0, CLUSTER)
            previous = slot
            consumed += 1
        left, right = ll.warpgroup_mma_wait(0, deps=[left, right])
        release_slot(empty.index(previous), True, CLUSTER)
        store_pieces(c_desc, c_left, c_right, left, right, off_m, off_n)
    tma.store_wait(0)


@ll.jit
def two_piece_matmul(a_desc, b_desc, c_desc, M, N, K,
                     BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                     STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                     NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr,
                     CLUSTER_M: ll.constexpr = 1, CLUSTER_N: ll.constexpr = 1):
    """C = A @ B in BLOCK_M x (LEFT_N + RIGHT_N) tiles (BLOCK_N must be their sum); with
    CLUSTER_M or CLUSTER_N 2, in CTA pairs launched as cluster_matmul's are (A's boxes
    [BLOCK_M / CLUSTER_N, BLOCK_K])."""
    ll.static_assert(BLOCK_N == LEFT_N + RIGHT_N, "two_piece_matmul's tiles are LEFT_N + RIGHT_N wide")
    dtype: ll.constexpr = a_desc.dtype
    a_ring = ll.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    left_box: ll.constexpr = [LEFT_N, BLOCK_K] if B_K_MAJOR else [BLOCK_K, LEFT_N]
    right_box: ll.constexpr = [RIGHT_N, BLOCK_K] if B_K_MAJOR else [BLOCK_K, RIGHT_N]
    left_ring = ll.allocate_shared_memory(dtype, [STAGES] + left_box, b_desc.layout)
    right_ring = ll.allocate_shared_memory(dtype, [STAGES] + right_box, b_desc.layout)
    c_left = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_M, LEFT_N], c_desc.layout)
    c_right = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_M, RIGHT_N], c_desc.layout)
    CLUSTERED: ll.constexpr = CLUSTER_M * CLUSTER_N > 1
    if CLUSTERED:
        ready, empty = allocate_pair_barriers(STAGES, NUM_WARPS)
    else:
        ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (c_desc, a_ring, left_ring, right_ring, c_left, c_right, ready, empty, M, N, K, BLOCK_M, BLOCK_N,
         BLOCK_K, STAGES, GROUP_M, B_K_MAJOR, NUM_WARPS, CLUSTER_M, CLUSTER_N), two_piece_consumer,
        (a_desc, b_desc, a_ring, left_ring, right_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, CLUSTER_M, CLUSTER_N), [two_piece_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    if CLUSTERED:  # the peer no longer arrives on, nor loads into, this CTA's shared memory
        ll.cluster_barrier()
    invalidate_slot_barriers(ready, empty, STAGES)
