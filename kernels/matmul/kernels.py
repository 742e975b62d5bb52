"""The matmul kernels, written in weft.lowlevel: C[M, N] = A[M, K] @ B[K, N], fp32 accumulate.

Both are persistent (one CTA per SM walks output tiles strided by the grid, in grouped
order so neighbouring CTAs share A rows and B columns in L2) and stream K through a ring
of STAGES shared-memory slots filled by TMA, each slot guarded by a `ready` mbarrier that
its loads complete on. Tails in M, N and K need no masks: TMA loads zeros outside the
tensors and clips stores.

- `pipelined_matmul`: one partition. The CTA keeps STAGES - 1 loads in flight ahead of
  the wgmma it issues; an async wgmma may read a slot until the next wait retires it,
  so a slot is refilled only after `warpgroup_mma_wait(1)` and a CTA barrier (both
  warpgroups are done with it).
- `warp_specialized_matmul`: a producer partition (4 warps at 40 registers, one thread
  issuing TMA) fills slots as soon as the consumers free them (`empty` mbarriers); the
  consumer partition (the kernel's warps, 232 registers) only waits, multiplies and
  writes the tile, so loads run ahead across tile boundaries and under the epilogue.

B arrives either MN-major ([K, N] row-major: boxes [BLOCK_K, 64] / swizzle width, several
per slot) or K-major (B^T given as [N, K]: one box [BLOCK_N, BLOCK_K], read through a
permuted view). fp8 operands must be K-major (wgmma cannot transpose 8-bit tiles).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma


@ll.jit
def tile_origin(tile, M, N, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, GROUP_M: ll.constexpr):
    """The (row, col) of output tile `tile` in grouped order: GROUP_M tile rows sweep
    the columns together, so their A rows stay in L2 while B columns stream past."""
    tiles_m = ll.cdiv(M, BLOCK_M)
    tiles_n = ll.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    group = tile // per_group
    first_m = group * GROUP_M
    rows_in_group = ll.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows_in_group
    pid_n = (tile % per_group) // rows_in_group
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@ll.jit
def load_stage(a_desc, b_desc, a_slot, b_slot, bar, off_m, off_n, off_k,
               BLOCK_N: ll.constexpr, B_K_MAJOR: ll.constexpr):
    """Issue the TMA loads of one K step into one ring slot; they complete on `bar`."""
    mbarrier.expect(bar, a_desc.nbytes + b_desc.nbytes * (1 if B_K_MAJOR else BLOCK_N // b_desc.block_shape[1]))
    tma.async_copy_global_to_shared(a_desc, [off_m, off_k], bar, a_slot)
    if B_K_MAJOR:
        tma.async_copy_global_to_shared(b_desc, [off_n, off_k], bar, b_slot)
    else:
        BOX_N: ll.constexpr = b_desc.block_shape[1]
        for j in ll.static_range(BLOCK_N // BOX_N):
            tma.async_copy_global_to_shared(b_desc, [off_k, off_n + j * BOX_N], bar,
                                            b_slot.slice(j * BOX_N, BOX_N, 1))


@ll.jit
def b_operand(b_slot, B_K_MAJOR: ll.constexpr):
    """The [BLOCK_K, BLOCK_N] view wgmma reads from a B slot."""
    if B_K_MAJOR:
        return b_slot.permute((1, 0))
    return b_slot


@ll.jit
def release_slot(bar, pred, CLUSTER: ll.constexpr = 1):
    """Hand a ring slot back to its producer once the consumer partition's wgmmas reading
    it have retired (where `pred`). CLUSTER 1: one arrival, after the partition's named
    barrier. CLUSTER 2 (cluster.py: either CTA's producer multicasts into both CTAs'
    slot): every warp arrives on its own CTA's barrier and on its peer's, as soon as its
    own wait has retired the reads, with no named barrier (the barrier counts every
    consumer warp of both CTAs). The peer's arrival releases at CTA scope: the slot was
    only read, so nothing of it needs ordering before the peer's next load."""
    if CLUSTER == 1:
        mbarrier.arrive(bar, pred=pred)
    else:
        mbarrier.arrive(bar, pred=pred, per_warp=True)
        mbarrier.arrive(bar, pred=pred, per_warp=True, cta=ll.program_id(0) % 2 ^ 1, scope="cta")


@ll.jit
def store_tile(c_desc, c_smem, acc, off_m, off_n, BLOCK_N: ll.constexpr):
    """Write the accumulator tile through shared memory with TMA stores (one per swizzle-
    wide column block). The previous tile's stores must have finished reading c_smem."""
    tma.store_wait(0)
    c_smem.store(acc.to(c_desc.dtype))
    ll.fence_async_shared()
    BOX_N: ll.constexpr = c_desc.block_shape[1]
    for j in ll.static_range(BLOCK_N // BOX_N):
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n + j * BOX_N],
                                        c_smem.slice(j * BOX_N, BOX_N, 1))


@ll.jit
def allocate_operands(a_desc, b_desc, c_desc, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                      BLOCK_K: ll.constexpr, STAGES: ll.constexpr, B_K_MAJOR: ll.constexpr):
    """(a_ring, b_ring, c_smem): STAGES shared-memory slots of A and B tiles (B's as the
    TMA box lies: [BLOCK_N, BLOCK_K] K-major, else [BLOCK_K, BLOCK_N]) and the output tile
    that `store_tile` stages through."""
    a_ring, b_ring = allocate_rings(a_desc, b_desc, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, B_K_MAJOR)
    c_smem = ll.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
    return a_ring, b_ring, c_smem


@ll.jit
def allocate_rings(a_desc, b_desc, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                   STAGES: ll.constexpr, B_K_MAJOR: ll.constexpr):
    """(a_ring, b_ring): STAGES shared-memory slots of A and B tiles, B's as the TMA box
    lies ([BLOCK_N, BLOCK_K] K-major, else [BLOCK_K, BLOCK_N])."""
    dtype: ll.constexpr = a_desc.dtype
    a_ring = ll.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_box: ll.constexpr = [BLOCK_N, BLOCK_K] if B_K_MAJOR else [BLOCK_K, BLOCK_N]
    b_ring = ll.allocate_shared_memory(dtype, [STAGES] + b_box, b_desc.layout)
    return a_ring, b_ring


@ll.jit
def allocate_slot_barriers(STAGES: ll.constexpr):
    """(ready, empty): per ring slot, an initialised mbarrier its loads complete on and one
    its consumers release it on (the warp-specialized kernels)."""
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return ready, empty


@ll.jit
def invalidate_slot_barriers(ready, empty, STAGES: ll.constexpr):
    """Invalidate the barriers of `allocate_slot_barriers` once every partition is done."""
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


@ll.jit
def pipelined_matmul(a_desc, b_desc, c_desc, M, N, K,
                     BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                     STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                     NUM_WARPS: ll.constexpr):
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, BLOCK_N, 16])
    a_ring, b_ring, c_smem = allocate_operands(a_desc, b_desc, c_desc, BLOCK_M, BLOCK_N, BLOCK_K,
                                               STAGES, B_K_MAJOR)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)

    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    issued = 0     # loads issued so far (slot = issued % STAGES)
    consumed = 0   # K steps multiplied so far (phase = consumed // STAGES & 1)
    for tile in range(ll.program_id(0), num_tiles, ll.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        ahead = ll.minimum(k_steps, STAGES - 1)
        for k in range(0, ahead):
            slot = issued % STAGES
            load_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                       off_m, off_n, k * BLOCK_K, BLOCK_N, B_K_MAJOR)
            issued += 1
        acc = ll.zeros([BLOCK_M, BLOCK_N], ll.float32, acc_layout)
        for k in range(0, k_steps):
            slot = consumed % STAGES
            mbarrier.wait(ready.index(slot), (consumed // STAGES) & 1)
            acc = ll.warpgroup_mma(a_ring.index(slot), b_operand(b_ring.index(slot), B_K_MAJOR),
                                   acc, is_async=True)
            # Retire the previous step's wgmma: its slot is free once every warpgroup has.
            acc = ll.warpgroup_mma_wait(1, deps=[acc])
            consumed += 1
            ll.barrier()
            if k + ahead < k_steps:
                slot = issued % STAGES
                load_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                           off_m, off_n, (k + ahead) * BLOCK_K, BLOCK_N, B_K_MAJOR)
                issued += 1
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
        store_tile(c_desc, c_smem, acc, off_m, off_n, BLOCK_N)
    tma.store_wait(0)
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))


@ll.jit
def next_free_slot(empty, issued, STAGES: ll.constexpr):
    """The ring slot a producer's `issued`-th K step loads into, once its consumers have
    released it (a fresh `empty` barrier counts as released: phase 1 is "before the start")."""
    slot = issued % STAGES
    mbarrier.wait(empty.index(slot), ((issued // STAGES) & 1) ^ 1)
    return slot


@ll.jit
def ws_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K,
                BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr):
    """Fill ring slots as soon as the consumers release them, across tiles."""
    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    issued = 0
    for tile in range(ll.program_id(0), num_tiles, ll.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for k in range(0, k_steps):
            slot = next_free_slot(empty, issued, STAGES)
            load_stage(a_desc, b_desc, a_ring.index(slot), b_ring.index(slot), ready.index(slot),
                       off_m, off_n, k * BLOCK_K, BLOCK_N, B_K_MAJOR)
            issued += 1


@ll.jit
def ws_consumer(c_desc, a_ring, b_ring, c_smem, ready, empty, M, N, K,
                BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                NUM_WARPS: ll.constexpr):
    """Multiply whatever the producer has landed, release each slot, write each tile."""
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, BLOCK_N, 16])
    k_steps = ll.cdiv(K, BLOCK_K)
    num_tiles = ll.cdiv(M, BLOCK_M) * ll.cdiv(N, BLOCK_N)
    consumed = 0
    for tile in range(ll.program_id(0), num_tiles, ll.num_programs(0)):
        off_m, off_n = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = ll.zeros([BLOCK_M, BLOCK_N], ll.float32, acc_layout)
        previous = 0
        for k in range(0, k_steps):
            slot = consumed % STAGES
            mbarrier.wait(ready.index(slot), (consumed // STAGES) & 1)
            acc = ll.warpgroup_mma(a_ring.index(slot), b_operand(b_ring.index(slot), B_K_MAJOR),
                                   acc, is_async=True)
            acc = ll.warpgroup_mma_wait(1, deps=[acc])
            # The previous step's wgmma has retired: hand its slot back to the producer.
            mbarrier.arrive(empty.index(previous), pred=k > 0)
            previous = slot
            consumed += 1
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(previous))
        store_tile(c_desc, c_smem, acc, off_m, off_n, BLOCK_N)
    tma.store_wait(0)


@ll.jit
def warp_specialized_matmul(a_desc, b_desc, c_desc, M, N, K,
                            BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr, BLOCK_K: ll.constexpr,
                            STAGES: ll.constexpr, GROUP_M: ll.constexpr, B_K_MAJOR: ll.constexpr,
                            NUM_WARPS: ll.constexpr, PRODUCER_REGS: ll.constexpr):
    a_ring, b_ring, c_smem = allocate_operands(a_desc, b_desc, c_desc, BLOCK_M, BLOCK_N, BLOCK_K,
                                               STAGES, B_K_MAJOR)
    ready, empty = allocate_slot_barriers(STAGES)
    ll.warp_specialize(
        (c_desc, a_ring, b_ring, c_smem, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR, NUM_WARPS), ws_consumer,
        (a_desc, b_desc, a_ring, b_ring, ready, empty, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
         STAGES, GROUP_M, B_K_MAJOR), [ws_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS])
    invalidate_slot_barriers(ready, empty, STAGES)
