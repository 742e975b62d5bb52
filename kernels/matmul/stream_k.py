"""Stream-K matmul, written in weft.lowlevel: the warp-specialized kernel of kernels.py on
a persistent grid whose CTAs share the tiles of the last, partial wave by K step.

Where the output tiles do not fill whole waves of SMs (1000 x 3000 in 128 x 256 tiles:
96 tiles on 132 SMs), one CTA per tile leaves SMs idle for a whole tile's time. Here
whole waves of tiles run as in kernels.py, and the partial wave's tiles are shared
K-aligned (stream_k_plan.py has the split, mirrored here): each tile's K range starts
as chunks of the CTAs' equal share, one CTA each, the CTAs of a chunk in step as
unsplit tiles are (CTAs of one tile row or column read the same A and B blocks at once,
from L2); the remaining CTAs cut what is left of each tile, its tail, into equal
contiguous ranges (or, where those would be many short pieces, the chunks split K
evenly and those CTAs idle). (Equal contiguous ranges over whole
tiles, the plain stream-K split, put every CTA at a different K offset: A and B then
stream from DRAM once per tile, which measured twice as slow as the unsplit tiles.)

A shared tile is finished in the same launch, by whichever of its pieces ends last, and
no CTA ever waits for another: each piece writes its fp32 partial tile to a slot of its
own (plain stores, no zeroing needed), then counts itself in the tile's arrival counter
(acq_rel: its stores are released, the earlier pieces' acquired). The piece that brings
the count to the tile's piece count adds the pieces up in a fixed order (`sum_pieces`:
the bits of C do not depend on which piece came last), writes the tile, and puts the
counter back to zero, so the counters are ready for the next launch (and a graph's next
replay) with no memset; the slots need none. Nothing spins, so the result does not
depend on which CTAs are resident at once.

A 128 x 256 tile is accumulated as two 128-column halves (each its own wgmma and
accumulator, as split_k_tma.py does): their partial loads and stores then hold half a
tile of addresses at a time.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import tma
from .kernels import allocate_rings, allocate_slot_barriers, invalidate_slot_barriers, load_stage, next_free_slot, tile_origin
from .split_k_tma import multiply_range
from .stream_k_plan import PIECE_COST, TAIL_TILES

PIECE_N = 128  # the widest accumulator a consumer warpgroup holds at once


@ll.jit
def shared_split(sk_tiles, k_steps, programs):
    """(chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces)
    (stream_k_plan.split)."""
    head = sk_tiles * k_steps // programs
    chunks = programs // ll.maximum(sk_tiles, 1)
    if head == 0:
        chunks = 0
    else:
        head = ll.minimum(sk_tiles * (k_steps + PIECE_COST) // programs, k_steps // chunks)
    numer = head
    denom = 1
    tail_len = k_steps - chunks * head
    tail_total = sk_tiles * tail_len
    tail_ctas = ll.maximum(ll.minimum(programs - sk_tiles * chunks, tail_total), 1)
    if (head > 0) & (tail_len > 0):
        if (programs == sk_tiles * chunks) | (ll.cdiv(tail_total, tail_ctas) > TAIL_TILES * tail_len):
            numer = k_steps
            denom = chunks
            tail_len = 0
            tail_total = 0
            tail_ctas = 1
    heads = sk_tiles * chunks
    max_pieces = ll.cdiv(ll.cdiv(tail_total, tail_ctas), ll.maximum(tail_len, 1)) + 1
    return chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces


@ll.jit
def cta_region(pid, sk_tiles, k_steps, programs):
    """(length, offset, begin, end, slot_base): the CTA's shared work, iterations
    [begin, end) over units of `length` K steps from `offset` (stream_k_plan.cta_region)."""
    chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces = shared_split(
        sk_tiles, k_steps, programs)
    j = pid - heads
    length = ll.maximum(tail_len, 1)
    offset = k_steps - tail_len
    begin = j * tail_total // tail_ctas
    end = (j + 1) * tail_total // tail_ctas
    slot_base = heads + j * max_pieces
    if (j >= tail_ctas) | (tail_total == 0):
        begin = 0
        end = 0
    if pid < heads:
        chunk = pid // sk_tiles
        offset = chunk * numer // denom
        length = (chunk + 1) * numer // denom - offset
        begin = (pid % sk_tiles) * length
        end = begin + length
        slot_base = pid
    return length, offset, begin, end, slot_base


@ll.jit
def iteration_owner(iteration, ctas, total):
    """The CTA whose share holds `iteration` (stream_k_plan.iteration_owner)."""
    return ((iteration + 1) * ctas - 1) // total


@ll.jit
def tail_owners(u, tail_len, tail_total, tail_ctas):
    """(lowest, highest): the tail CTAs holding shared tile u's tail; none (lowest >
    highest) where there are no tails."""
    lowest = 0
    highest = -1
    if tail_total > 0:
        lowest = iteration_owner(u * tail_len, tail_ctas, tail_total)
        highest = iteration_owner((u + 1) * tail_len - 1, tail_ctas, tail_total)
    return lowest, highest


@ll.jit
def stream_k_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, dp_tiles,
                      BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                      STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr):
    """Fill ring slots with the CTA's whole tiles, then its shared pieces, as soon as the
    consumers release them."""
    k_steps = ll.cdiv(K, BLOCK_K)
    tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    pid = ll.program_id(0)
    programs = ll.num_programs(0)
    issued = 0
    for tile in range(pid, dp_tiles, programs):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for k in range(0, k_steps):
            slot = next_free_slot(empty, issued, STAGES)
            load_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                       off_m, off_n, k * BLOCK_K, BLOCK_N, B_K_MAJOR)
            issued += 1
    length, offset, begin, end, slot_base = cta_region(pid, tiles - dp_tiles, k_steps, programs)
    for u in range(begin // length, ll.cdiv(end, length)):
        off_m, off_n = tile_origin(dp_tiles + u, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for k in range(offset + ll.maximum(begin - u * length, 0), offset + ll.minimum(end - u * length, length)):
            slot = next_free_slot(empty, issued, STAGES)
            load_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                       off_m, off_n, k * BLOCK_K, BLOCK_N, B_K_MAJOR)
            issued += 1


@ll.jit
def partial_slot(partial_ptr, slot, rows_left, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                 PIECE: ll.constexpr, NUM_WARPS: ll.constexpr):
    """(pointers, mask): the first PIECE columns of workspace slot `slot` (slots are whole
    [BLOCK_M, BLOCK_N] fp32 tiles) in the accumulator's layout, and its first `rows_left`
    rows: rows past M are zeros in every piece, so they are neither written nor read
    (a decode tile's 64 rows may hold a few of C's)."""
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, PIECE, 16])
    rows = ll.arange(0, BLOCK_M, ll.SliceLayout(1, acc_layout))
    cols = ll.arange(0, PIECE, ll.SliceLayout(0, acc_layout))
    at = partial_ptr + slot * (BLOCK_M * BLOCK_N) + rows[:, None] * BLOCK_N + cols[None, :]
    inside = (rows[:, None] < rows_left) & (cols[None, :] < PIECE)
    return at, inside


@ll.jit
def store_output(c_desc, c_pieces, left, right, off_m, off_n, BLOCK_N: ll.constexpr, PIECE: ll.constexpr):
    """Write the tile (one accumulator, or `left` and `right` halves where PIECE < BLOCK_N)
    through shared memory with TMA stores, one per swizzle-wide column block; the
    previous tile's stores must have read the buffers first."""
    tma.store_wait(0)
    c_pieces.index(0).store(left.to(c_desc.dtype))
    if PIECE < BLOCK_N:
        c_pieces.index(1).store(right.to(c_desc.dtype))
    ll.fence_async_shared()
    BOX_N: ll.constexpr = c_desc.block_shape[1]
    for p in ll.static_range(BLOCK_N // PIECE):
        for j in ll.static_range(PIECE // BOX_N):
            tma.async_copy_shared_to_global(c_desc, [off_m, off_n + p * PIECE + j * BOX_N],
                                            c_pieces.index(p).slice(j * BOX_N, BOX_N, 1))


@ll.jit
def add_piece(partial_ptr, total, own, slot, mine, rows_left, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
              PIECE: ll.constexpr, NUM_WARPS: ll.constexpr):
    """total + the piece in `slot`, or + `own` (the registers) where it is this CTA's."""
    if mine:
        total += own
    else:
        at, inside = partial_slot(partial_ptr, slot, rows_left, BLOCK_M, BLOCK_N, PIECE, NUM_WARPS)
        total += ll.load(at, mask=inside, other=0.0, cache_modifier=".cg")
    return total


@ll.jit
def sum_pieces(partial_ptr, left, right, u, pid, sk_tiles, k_steps, programs, rows_left,
               BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, PIECE: ll.constexpr, NUM_WARPS: ll.constexpr):
    """(left, right): shared tile u's pieces, its chunks then its tail CTAs', added in that
    order whichever arrived last, so C's bits do not depend on timing. This CTA's own
    piece (left, right) joins from registers where the tile is one accumulator; a
    two-half tile's is read back from its slot like the others (both halves' sums and
    the own piece would not fit in registers together)."""
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, PIECE, 16])
    chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces = shared_split(
        sk_tiles, k_steps, programs)
    sum_left = ll.zeros([BLOCK_M, PIECE], ll.float32, acc_layout)
    sum_right = ll.zeros([BLOCK_M, PIECE], ll.float32, acc_layout)
    for chunk in range(0, heads // ll.maximum(sk_tiles, 1)):  # the chunks: CTA and slot u + chunk x sk_tiles
        slot = u + chunk * sk_tiles
        if PIECE < BLOCK_N:
            sum_left = add_piece(partial_ptr, sum_left, left, slot, False, rows_left, BLOCK_M, BLOCK_N, PIECE,
                                 NUM_WARPS)
            sum_right = add_piece(partial_ptr + PIECE, sum_right, right, slot, False, rows_left,
                                  BLOCK_M, BLOCK_N, PIECE, NUM_WARPS)
        else:
            sum_left = add_piece(partial_ptr, sum_left, left, slot, slot == pid, rows_left, BLOCK_M, BLOCK_N,
                                 PIECE, NUM_WARPS)
    lowest, highest = tail_owners(u, tail_len, tail_total, tail_ctas)
    for j in range(lowest, highest + 1):
        # Tail CTA j's pieces start at its first unit.
        slot = heads + j * max_pieces + u - j * tail_total // tail_ctas // tail_len
        if PIECE < BLOCK_N:
            sum_left = add_piece(partial_ptr, sum_left, left, slot, False, rows_left, BLOCK_M, BLOCK_N, PIECE,
                                 NUM_WARPS)
            sum_right = add_piece(partial_ptr + PIECE, sum_right, right, slot, False, rows_left,
                                  BLOCK_M, BLOCK_N, PIECE, NUM_WARPS)
        else:
            sum_left = add_piece(partial_ptr, sum_left, left, slot, heads + j == pid, rows_left, BLOCK_M,
                                 BLOCK_N, PIECE, NUM_WARPS)
    if PIECE < BLOCK_N:
        return sum_left, sum_right
    return sum_left, sum_left


@ll.jit
def stream_k_consumer(c_desc, a_ring, b_ring, c_pieces, ready, empty, partial_ptr, arrivals_ptr, M, N, K,
                      dp_tiles, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                      STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                      NUM_WARPS: ll.constexpr):
    """Multiply the CTA's whole tiles and its stream-K range; write whole tiles, and of
    shared ones the partial, or (the last piece to arrive) the finished tile."""
    PIECE: ll.constexpr = BLOCK_N if BLOCK_N < PIECE_N else PIECE_N
    k_steps = ll.cdiv(K, BLOCK_K)
    tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    pid = ll.program_id(0)
    programs = ll.num_programs(0)
    consumed = 0
    for tile in range(pid, dp_tiles, programs):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        left, right, consumed = multiply_range(a_ring, b_ring, ready, empty, consumed, 0, k_steps,
                                               BLOCK_M, BLOCK_N, PIECE, STAGES, B_K_MAJOR, NUM_WARPS)
        store_output(c_desc, c_pieces, left, right, off_m, off_n, BLOCK_N, PIECE)
    sk_tiles = tiles - dp_tiles
    length, offset, begin, end, slot_base = cta_region(pid, sk_tiles, k_steps, programs)
    chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces = shared_split(
        sk_tiles, k_steps, programs)
    first = begin // length
    for u in range(first, ll.cdiv(end, length)):
        tile = dp_tiles + u
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        k_begin = offset + ll.maximum(begin - u * length, 0)
        k_end = offset + ll.minimum(end - u * length, length)
        left, right, consumed = multiply_range(a_ring, b_ring, ready, empty, consumed, k_begin, k_end,
                                               BLOCK_M, BLOCK_N, PIECE, STAGES, B_K_MAJOR, NUM_WARPS)
        lowest, highest = tail_owners(u, tail_len, tail_total, tail_ctas)
        pieces = heads // ll.maximum(sk_tiles, 1) + highest - lowest + 1
        if pieces == 1:  # one CTA holds the whole tile
            store_output(c_desc, c_pieces, left, right, off_m, off_n, BLOCK_N, PIECE)
        else:
            at, inside = partial_slot(partial_ptr, slot_base + u - first, M - off_m, BLOCK_M, BLOCK_N, PIECE,
                                      NUM_WARPS)
            ll.store(at, left, mask=inside)
            if PIECE < BLOCK_N:
                ll.store(at + PIECE, right, mask=inside)
            # Every thread's stores are issued before the partition's one release below.
            ll.barrier()
            arrived = ll.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
            if arrived == pieces - 1:  # the other pieces are all in their slots
                left, right = sum_pieces(partial_ptr, left, right, u, pid, sk_tiles, k_steps, programs,
                                         M - off_m, BLOCK_M, BLOCK_N, PIECE, NUM_WARPS)
                ll.atomic_xchg(arrivals_ptr + tile, 0, sem="relaxed")
                store_output(c_desc, c_pieces, left, right, off_m, off_n, BLOCK_N, PIECE)
    tma.store_wait(0)


@ll.jit
def stream_k_matmul(a_desc, b_desc, c_desc, partial_ptr, arrivals_ptr, M, N, K, dp_tiles,
                    BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                    STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                    NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr):
    """C = A @ B: tiles [0, dp_tiles) whole (a multiple of the grid), the rest stream-K.
    partial_ptr: fp32 [stream_k_plan.slot_count, BLOCK_M, BLOCK_N], any contents; arrivals_ptr: int32
    [tiles], zero (and left zero)."""
    PIECE: ll.constexpr = BLOCK_N if BLOCK_N < PIECE_N else PIECE_N
    a_ring, b_ring = allocate_rings(a_desc, b_desc, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, B_K_MAJOR)
    c_pieces = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_N // PIECE, BLOCK_M, PIECE], c_desc.layout)
    ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (c_desc, a_ring, b_ring, c_pieces, ready, empty, partial_ptr, arrivals_ptr, M, N, K, dp_tiles,
         BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M, B_K_MAJOR, NUM_WARPS), stream_k_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, dp_tiles, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR), [stream_k_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    invalidate_slot_barriers(ready, empty, STAGES)
