"""The warp-specialized matmul (kernels.py) with CTAs in clusters of two that share an
operand tile by TMA multicast (Config.cluster_m / cluster_n).

A cluster takes a pair of neighbouring output tiles: along M (CLUSTER_M 2: tiles
(off_m, off_n) and (off_m + BLOCK_M, off_n), which read the same B tile) or along N
(CLUSTER_N 2: the same A tile). Each K step, each CTA's producer loads its own
operand tile and half of the shared one's TMA boxes, multicast into both CTAs' ring
slots, so the shared tile leaves L2 once per pair. That pays most where a row stride
is not a multiple of 128 bytes (each box row then spans more L2 sectors): which shapes
config.py offers pairs for, and why, is at `PAIRED_TILES`.

Barriers: a slot's `ready` barrier expects the whole slot (the half its peer multicasts
completes on it too); its `empty` barrier counts the releases of the consumer warps of
both CTAs, since either producer writes into both CTAs' slot. Both CTAs walk the same pair
sequence and K steps, so their rings stay in step; where the partner tile lies past M
or N, that CTA still loads its half of the shared tile (TMA reads zeros for its own
operand and clips its stores), so the peer's barriers still complete.

Split (SPLIT_K > 1, long K): each pair's K range is cut into SPLIT_K parts, a cluster
taking (pair, part) units; both CTAs of the cluster multiply the same part of their own
tiles and add their fp32 partial tiles into a zeroed workspace by TMA reduce-add, as
split_k_tma.py's units do (its `finish_split` then writes C).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .kernels import allocate_rings, next_free_slot, tile_origin
from .split_k import unit_range
from .split_k_tma import add_tile, multiply_range
from .staged_halves import store_in_halves


@ll.jit
def pair_origin(pair, M, N, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, GROUP_M: ll.constexpr,
                CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr):
    """The (row, col) of this CTA's tile of the cluster's `pair`-th tile pair: pairs
    ([CLUSTER_M x BLOCK_M, CLUSTER_N x BLOCK_N] blocks) in grouped order (GROUP_M pair
    rows sweep the columns together), the CTA of cluster rank r taking tile r of it."""
    off_m, off_n = tile_origin(pair, M, N, BLOCK_M * CLUSTER_M, BLOCK_N * CLUSTER_N, GROUP_M)
    rank = ll.program_id(0) % 2
    if CLUSTER_M == 2:
        off_m += rank * BLOCK_M
    else:
        off_n += rank * BLOCK_N
    return off_m, off_n


@ll.jit
def load_boxes(desc, row, col, bar, dst, BOXES: ll.constexpr, DIM: ll.constexpr, SHARED: ll.constexpr):
    """TMA loads of a tile as BOXES boxes side by side along dimension DIM (0: rows, 1:
    columns), completing on `bar`. SHARED: both CTAs of the cluster need the tile, so the
    CTA of rank r loads the boxes j with j % 2 == r, multicast into both."""
    STEP: ll.constexpr = desc.block_shape[DIM]
    for j in ll.static_range(BOXES):
        box = dst.slice(j * STEP, STEP, DIM)
        if SHARED:
            mine = ll.program_id(0) % 2 == j % 2
            if DIM == 0:
                tma.async_copy_global_to_shared(desc, [row + j * STEP, col], bar, box, mine, multicast=3)
            else:
                tma.async_copy_global_to_shared(desc, [row, col + j * STEP], bar, box, mine, multicast=3)
        elif DIM == 0:
            tma.async_copy_global_to_shared(desc, [row + j * STEP, col], bar, box)
        else:
            tma.async_copy_global_to_shared(desc, [row, col + j * STEP], bar, box)


@ll.jit
def load_b_boxes(b_desc, off_n, off_k, bar, dst, BOXES: ll.constexpr, B_K_MAJOR: ll.constexpr,
                 SHARED: ll.constexpr):
    """`load_boxes` of B's [BLOCK_K, BOXES boxes] tile at column off_n, K step off_k: boxes
    of B^T's rows where B is K-major, else of B's columns."""
    if B_K_MAJOR:
        load_boxes(b_desc, off_n, off_k, bar, dst, BOXES, 0, SHARED)
    else:
        load_boxes(b_desc, off_k, off_n, bar, dst, BOXES, 1, SHARED)


@ll.jit
def first_unit(CLUSTERED: ll.constexpr):
    """The first work unit of this CTA's persistent walk: its own index, or in clusters of
    two, its cluster's (both CTAs of a cluster take the same units)."""
    if CLUSTERED:
        return ll.program_id(0) // 2
    return ll.program_id(0)


@ll.jit
def unit_stride(CLUSTERED: ll.constexpr):
    """How far the walk of `first_unit` steps: the CTAs, or the clusters, of the grid."""
    if CLUSTERED:
        return ll.num_programs(0) // 2
    return ll.num_programs(0)


@ll.jit
def unit_origin(unit, M, N, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, GROUP_M: ll.constexpr,
                CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr):
    """This CTA's tile of work unit `unit`: the tile itself (`tile_origin`) or, in
    clusters of two, its tile of the pair (`pair_origin`)."""
    if CLUSTER_M * CLUSTER_N == 1:
        return tile_origin(unit, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return pair_origin(unit, M, N, BLOCK_M, BLOCK_N, GROUP_M, CLUSTER_M, CLUSTER_N)


@ll.jit
def allocate_pair_barriers(STAGES: ll.constexpr, NUM_WARPS: ll.constexpr):
    """(ready, empty) of a ring shared by a cluster of two: per slot, a barrier its loads
    (its own and the peer's multicast) complete on, and one every consumer warp of both
    CTAs releases it on (`release_slot`); initialised before the peer may arrive on them."""
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2 * NUM_WARPS)
    ll.cluster_barrier()
    return ready, empty


@ll.jit
def load_cluster_stage(a_desc, b_desc, a_slot, b_slot, bar, off_m, off_n, off_k,
                       BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, B_K_MAJOR: ll.constexpr,
                       CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr):
    """One K step's loads into one ring slot of each CTA: A as BLOCK_M / box-rows boxes
    (shared along N), B as boxes along N (shared along M); the barrier expects the whole
    slot, whichever CTA loads each box."""
    A_BOXES: ll.constexpr = BLOCK_M // a_desc.block_shape[0]
    B_DIM: ll.constexpr = 0 if B_K_MAJOR else 1
    B_BOXES: ll.constexpr = BLOCK_N // b_desc.block_shape[B_DIM]
    mbarrier.expect(bar, a_desc.nbytes * A_BOXES + b_desc.nbytes * B_BOXES)
    load_boxes(a_desc, off_m, off_k, bar, a_slot, A_BOXES, 0, CLUSTER_N == 2)
    load_b_boxes(b_desc, off_n, off_k, bar, b_slot, B_BOXES, B_K_MAJOR, CLUSTER_M == 2)


@ll.jit
def cluster_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K,
                     BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                     STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                     CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr, SPLIT_K: ll.constexpr):
    """Fill ring slots (of both CTAs, for the shared operand) once both CTAs' consumers
    have released them, across the cluster's (pair, K part) units."""
    k_steps = ll.cdiv(K, BLOCK_K)
    units = ll.cdiv(M, BLOCK_M * CLUSTER_M) * ll.cdiv(N, BLOCK_N * CLUSTER_N) * SPLIT_K
    issued = 0
    for unit in range(ll.program_id(0) // 2, units, ll.num_programs(0) // 2):
        pair, begin, end = unit_range(unit, k_steps, SPLIT_K)
        off_m, off_n = pair_origin(pair, M, N, BLOCK_M, BLOCK_N, GROUP_M, CLUSTER_M, CLUSTER_N)
        for k in range(begin, end):
            slot = next_free_slot(empty, issued, STAGES)
            load_cluster_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                               off_m, off_n, k * BLOCK_K, BLOCK_M, BLOCK_N, B_K_MAJOR, CLUSTER_M, CLUSTER_N)
            issued += 1


@ll.jit
def cluster_consumer(c_desc, a_ring, b_ring, out_smem, ready, empty, M, N, K,
                     BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                     STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                     NUM_WARPS: ll.constexpr, CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr,
                     SPLIT_K: ll.constexpr):
    """Multiply each unit's K steps as they land, releasing each slot to both producers;
    write the tile (SPLIT_K 1) or add the partial tile into the workspace (SPLIT_K > 1),
    out_smem's columns at a time (the whole tile, or its halves: Config.staged_halves)."""
    PIECE: ll.constexpr = out_smem.shape[1]
    # Unsplit, one accumulator however wide out_smem is (store_in_halves takes it apart).
    WGMMA_N: ll.constexpr = BLOCK_N if SPLIT_K == 1 else PIECE
    k_steps = ll.cdiv(K, BLOCK_K)
    units = ll.cdiv(M, BLOCK_M * CLUSTER_M) * ll.cdiv(N, BLOCK_N * CLUSTER_N) * SPLIT_K
    consumed = 0
    for unit in range(ll.program_id(0) // 2, units, ll.num_programs(0) // 2):
        pair, begin, end = unit_range(unit, k_steps, SPLIT_K)
        off_m, off_n = pair_origin(pair, M, N, BLOCK_M, BLOCK_N, GROUP_M, CLUSTER_M, CLUSTER_N)
        acc, right, consumed = multiply_range(a_ring, b_ring, ready, empty, consumed, begin, end,
                                              BLOCK_M, BLOCK_N, WGMMA_N, STAGES, B_K_MAJOR, NUM_WARPS, 2)
        if SPLIT_K == 1:
            store_in_halves(c_desc, out_smem, acc, off_m, off_n, BLOCK_N, NUM_WARPS)
        else:
            add_tile(c_desc, out_smem, acc, off_m, off_n, PIECE)
            if PIECE < BLOCK_N:
                add_tile(c_desc, out_smem, right, off_m, off_n + PIECE, PIECE)
    tma.store_wait(0)


@ll.jit
def cluster_matmul(a_desc, b_desc, c_desc, M, N, K,
                   BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                   STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                   NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr,
                   CLUSTER_M: ll.constexpr, CLUSTER_N: ll.constexpr,
                   SPLIT_K: ll.constexpr = 1, STAGED_N: ll.constexpr = None):
    """Grid: an even count of CTAs, launched with cluster=(2, 1, 1), CLUSTER_M x CLUSTER_N
    = 2. Descriptors: A's boxes [BLOCK_M / CLUSTER_N, BLOCK_K]; B's [BLOCK_N / CLUSTER_M,
    BLOCK_K] (K-major) or [BLOCK_K, 64 or fewer columns] (an even count per tile where
    CLUSTER_M is 2); c_desc is C's (SPLIT_K 1) or, split, the fp32 workspace's (named
    c_desc either way: a prepared call rebinds C by that name), whose
    partial tiles are staged STAGED_N columns at a time (config.staged_columns). Unsplit,
    STAGED_N BLOCK_N / 2 stages the tile half at a time (Config.staged_halves)."""
    ll.static_assert(CLUSTER_M * CLUSTER_N == 2, "cluster_matmul pairs CTAs along M or along N")
    a_ring, b_ring = allocate_rings(a_desc, b_desc, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, B_K_MAJOR)
    if STAGED_N is None:
        STAGED_N = BLOCK_N
    out_smem = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_M, STAGED_N], c_desc.layout)
    ready, empty = allocate_pair_barriers(STAGES, NUM_WARPS)
    ll.warp_specialize(
        (c_desc, a_ring, b_ring, out_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, NUM_WARPS, CLUSTER_M, CLUSTER_N, SPLIT_K), cluster_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, CLUSTER_M, CLUSTER_N, SPLIT_K), [cluster_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    ll.cluster_barrier()  # the peer no longer arrives on, nor loads into, this CTA's shared memory
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
