"""The flash-attention backward kernels in weft.lowlevel: a preprocess, the main kernel and
a postprocess (FlashAttention-2/3's split of the work).

Given O, the fp32 log-sum-exp L of each query row (natural log, +inf for rows that see no
key) and dO, with P = exp(S - L) for S = scale Q K^T:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  dQ = scale dS K,  dK = scale dS^T Q

where delta = rowsum(dO * O) (the preprocess, `row_deltas`).

The main kernel (`flash_attention_backward_kernel`) gives one CTA a block of BLOCK_N keys
of one (batch, kv head) and walks the query blocks that see it, for every q head of the
kv head's group (GQA/MQA: dK and dV sum over the group in registers, no atomics):

- a producer partition (4 warps at a few registers, one thread issuing TMA) loads the K
  and V block once, then each query block's Q and dO through a ring of STAGES slots
  guarded by `ready` (TMA bytes) and `empty` (each consumer's release) mbarriers;
- CONSUMERS warpgroups, each owning COLUMNS columns of dK, dV and dQ (64: fp32 dK and dV
  of 128 columns, 128 registers a thread, beside S, dP and a step's addresses leave
  ptxas too few of 240 registers). For each query block, each computes S = Q K^T and
  dP = dO V^T for its share of the block's keys (BLOCK_N / CONSUMERS) by async wgmma
  from shared memory (L and delta by plain loads, two rows a thread),
  P = exp2(S scale log2(e) - L log2(e)) and dS = P (dP - delta) in the accumulator's
  registers, and writes P and dS in q's dtype into one shared buffer of each (one
  swizzle row of columns a consumer: a plain view); once all have (`scores_ready`), each
  computes dV += P^T dO and dK += dS^T Q (P^T and dS^T the buffers read transposed,
  MN-major A operands; dO and Q MN-major B operands) and dQ = dS K for its columns, dQ
  added into an fp32 buffer in global memory by atomics, and releases the buffers for
  the next block's P and dS (`scores_free`). dK and dV stay in fp32 registers for the
  whole walk and are stored at the end (dK scaled by softmax_scale).

Two variants (BackwardConfig): DQ_TMA (the host's default), where each consumer writes its
dQ chunk into its own fp32 box in shared memory and one thread adds the box into the
accumulator by TMA reduce-add (`reduce_dq_chunks`; rows past seq_q are clipped by the
descriptor), instead of every thread's atomics; and PIPELINED, the software-pipelined walk
of backward_pipeline.py.

Head_dim 256 runs as two launches of 128 columns each (FIRST_COLUMN), each computing S
and dP again.

Causal attention is aligned bottom-right (query i sees key j <= i + seq_k - seq_q): the
query blocks wholly above the diagonal are never loaded, and only the blocks crossing it
(and every block of a key block cut by seq_k) pay for the mask. Query rows past seq_q
load as zeros with L = +inf, so their P is 0 without a mask.

The postprocess (`convert_dq`) converts the fp32 dQ to q's dtype, scaled by the caller's
softmax_scale (whatever sign the host folded into q: backward_host.py).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .kernels import LOG2E, load_boxes  # shared with the forward kernels
from .rings import ring_phase, ring_slot
from .steps import accumulator_layout

# Who arrives on the mbarrier of a handoff whose data is written or read by ordinary shared
# loads and stores (backward_keys.py: the staged stats, SPLIT_SCORES's P^T), a partition's
# warps having made their accesses (BackwardConfig.releases): every thread for itself; one
# lane of each warp after its warp's sync; or one thread after the partition's named
# barrier. compute-sanitizer's racecheck follows the first only (backward_keys.py); fewer
# arrivals on one barrier word cost less (head_dim 256 causal: docs/attention-journal.md).
THREAD_RELEASES, WARP_RELEASES, PARTITION_RELEASES = 0, 1, 2


@ll.constexpr_function
def release_arrivals(warps, releases):
    """Arrivals a partition of `warps` warps makes on a `release` of kind `releases`."""
    return {THREAD_RELEASES: warps * 32, WARP_RELEASES: warps, PARTITION_RELEASES: 1}[releases]


@ll.jit
def release(bar, RELEASES: ll.constexpr):
    """Arrive on `bar` for the calling partition's accesses, release_arrivals(...) times."""
    if RELEASES == THREAD_RELEASES:
        mbarrier.arrive(bar, per_thread=True)
    elif RELEASES == WARP_RELEASES:
        mbarrier.arrive(bar, per_warp=True)
    else:
        mbarrier.arrive(bar)

# Plain-load tiles of the preprocess and postprocess: 8 contiguous elements a thread.
ROW_TILE = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
ROW_TILE_ROWS = 32
DQ_CHUNK = 64  # dQ columns a consumer computes and adds at a time


@ll.jit
def row_deltas(o_ptr, do_ptr, delta_ptr, seq_q, heads, o_strides_b, o_strides_h, o_strides_s,
               do_strides_b, do_strides_h, do_strides_s, HEAD_DIM: ll.constexpr):
    """delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] in fp32, for ROW_TILE_ROWS
    rows a program; grid (cdiv(seq_q, ROW_TILE_ROWS), batch * heads)."""
    bh = ll.program_id(1)
    batch = bh // heads
    head = bh % heads
    rows = ll.program_id(0) * ROW_TILE_ROWS + ll.arange(0, ROW_TILE_ROWS, ll.SliceLayout(1, ROW_TILE))
    cols = ll.arange(0, HEAD_DIM, ll.SliceLayout(0, ROW_TILE))
    inside = rows[:, None] < seq_q
    o = ll.load(o_ptr + batch * o_strides_b + head * o_strides_h + rows[:, None] * o_strides_s + cols[None, :],
                mask=inside, other=0.0)
    do = ll.load(do_ptr + batch * do_strides_b + head * do_strides_h + rows[:, None] * do_strides_s
                 + cols[None, :], mask=inside, other=0.0)
    delta = ll.sum(o.to(ll.float32) * do.to(ll.float32), axis=1)
    ll.store(delta_ptr + bh * seq_q + rows, delta, mask=rows < seq_q)


@ll.jit
def convert_dq(accum_ptr, dq_ptr, dq_scale, seq_q, heads, strides_b, strides_h, strides_s,
               HEAD_DIM: ll.constexpr):
    """dq[b, h, i, :] = dq_scale * accum[b, h, i, :] (fp32, contiguous [b, h, seq_q, d])
    in dq's dtype and strides; grid (cdiv(seq_q, ROW_TILE_ROWS), batch * heads)."""
    bh = ll.program_id(1)
    rows = ll.program_id(0) * ROW_TILE_ROWS + ll.arange(0, ROW_TILE_ROWS, ll.SliceLayout(1, ROW_TILE))
    cols = ll.arange(0, HEAD_DIM, ll.SliceLayout(0, ROW_TILE))
    inside = rows[:, None] < seq_q
    accum = ll.load(accum_ptr + (bh * seq_q + rows[:, None]) * HEAD_DIM + cols[None, :], mask=inside, other=0.0)
    offsets = (bh // heads) * strides_b + (bh % heads) * strides_h + rows[:, None] * strides_s + cols[None, :]
    ll.store(dq_ptr + offsets, (accum * dq_scale).to(dq_ptr.dtype.element_ty), mask=inside)


@ll.aggregate
class BackwardState:
    """What the producer and the consumers of one CTA share: the operands' descriptors and
    pointers, the shared buffers and their barriers, the problem's sizes and the CTA's
    walk over query blocks (`query_blocks`), and the kernel's compile-time choices."""

    q_desc: ll.tensor_descriptor
    k_desc: ll.tensor_descriptor
    v_desc: ll.tensor_descriptor
    do_desc: ll.tensor_descriptor
    k_smem: ll.shared_memory_descriptor
    v_smem: ll.shared_memory_descriptor
    q_ring: ll.shared_memory_descriptor
    do_ring: ll.shared_memory_descriptor
    dq_smem: ll.shared_memory_descriptor  # DQ_TMA: a [BLOCK_M, DQ_CHUNK] fp32 box a consumer
    p_smem: ll.shared_memory_descriptor
    ds_smem: ll.shared_memory_descriptor
    scores_ready: ll.shared_memory_descriptor  # every consumer's P and dS are written
    scores_free: ll.shared_memory_descriptor   # every consumer has read them
    kv_ready: ll.shared_memory_descriptor
    ready: ll.shared_memory_descriptor
    empty: ll.shared_memory_descriptor
    lse_ptr: ll.tensor
    delta_ptr: ll.tensor
    dq_ptr: ll.tensor  # the fp32 dQ: a pointer (atomics) or a descriptor (DQ_TMA)
    dk_ptr: ll.tensor
    dv_ptr: ll.tensor
    dkv_strides: tuple  # (batch, head, seq) element strides of dk and dv
    softmax_scale: ll.tensor
    seq_q: ll.tensor
    seq_k: ll.tensor
    heads: ll.tensor
    kv_group: ll.tensor
    BLOCK_M: ll.constexpr
    BLOCK_N: ll.constexpr
    HEAD_DIM: ll.constexpr
    STAGES: ll.constexpr
    CONSUMERS: ll.constexpr
    COLUMNS: ll.constexpr  # of dK, dV and dQ, a consumer's
    FIRST_COLUMN: ll.constexpr  # the first consumer's
    CAUSAL: ll.constexpr
    DQ_TMA: ll.constexpr  # dQ added by TMA reduce-add from shared memory, not by atomics
    PIPELINED: ll.constexpr  # the walk of backward_pipeline.py
    SPLIT_SCORES: ll.constexpr  # backward_keys.py: a band's two consumers compute S^T and dP^T, one each
    stats_ring: ll.shared_memory_descriptor  # STATS_IN_SHARED: [STAGES, 2, BLOCK_M] fp32, L (log2 units), delta
    STATS_IN_SHARED: ll.constexpr  # backward_keys.py: the producer stages L and delta beside Q and dO
    RELEASES: ll.constexpr  # backward_keys.py: who arrives on a handoff of ordinary shared loads and stores
    P_RELEASES: ll.constexpr  # the same for SPLIT_SCORES's P^T


@ll.jit
def query_blocks(state):
    """(batch, kv head, first key, first query block, first unmasked one, end) of this
    CTA: the query blocks [first, end) see its keys, those before `unmasked` need a mask
    (they cross the causal diagonal, or the key block is cut by seq_k)."""
    return tile_query_blocks(state, ll.program_id(0), ll.program_id(1))


@ll.jit
def tile_query_blocks(state, key_block, bkv):
    """query_blocks of the tile of key block `key_block` and (batch * kv_heads + kv head)
    `bkv`: a CTA's own (program ids), or one of a persistent CTA's tiles."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    BLOCK_N: ll.constexpr = state.BLOCK_N
    key0 = key_block * BLOCK_N
    kv_heads = state.heads // state.kv_group
    end = ll.cdiv(state.seq_q, BLOCK_M)
    first = 0
    unmasked = 0
    if state.CAUSAL:
        shift = state.seq_k - state.seq_q  # query i sees keys j <= i + shift
        first = ll.minimum(ll.maximum(key0 - shift, 0) // BLOCK_M, end)
        unmasked = ll.cdiv(ll.maximum(key0 + BLOCK_N - 1 - shift, 0), BLOCK_M)
    unmasked = ll.where(key0 + BLOCK_N > state.seq_k, end, unmasked)
    unmasked = ll.minimum(ll.maximum(unmasked, first), end)
    return bkv // kv_heads, bkv % kv_heads, key0, first, unmasked, end


@ll.jit
def producer(state):
    """Load the CTA's K and V block, then Q and dO of every query block it walks, head by
    head of the group, as ring slots free up."""
    batch, kv_head, key0, first, unmasked, end = query_blocks(state)
    HEAD_DIM: ll.constexpr = state.HEAD_DIM
    BOXES: ll.constexpr = HEAD_DIM // state.k_desc.block_shape[3]
    mbarrier.expect(state.kv_ready, 2 * state.k_desc.nbytes * BOXES)
    load_boxes(state.k_desc, batch, kv_head, key0, state.kv_ready, state.k_smem, HEAD_DIM)
    load_boxes(state.v_desc, batch, kv_head, key0, state.kv_ready, state.v_smem, HEAD_DIM)
    per_head = end - first
    for g in range(0, state.kv_group):
        head = kv_head * state.kv_group + g
        for m in range(first, end):
            load_query_block(state, batch, head, m, g * per_head + m - first)


@ll.jit
def load_query_block(state, batch, head, m, step):
    """Q and dO of query block m (of `head`) into the ring slot of position `step` once it
    is released (STATS_IN_SHARED: with L and delta beside them)."""
    HEAD_DIM: ll.constexpr = state.HEAD_DIM
    STAGES: ll.constexpr = state.STAGES
    BOXES: ll.constexpr = HEAD_DIM // state.k_desc.block_shape[3]
    slot = ring_slot(step, STAGES)
    if state.STATS_IN_SHARED:  # loaded before the wait, which hides their latency
        lse2, delta = row_stats(state, batch * state.heads + head, m)
    mbarrier.wait(state.empty.index(slot), ring_phase(step, STAGES) ^ 1)  # fresh: released
    bar = state.ready.index(slot)
    mbarrier.expect(bar, 2 * state.q_desc.nbytes * BOXES)
    load_boxes(state.q_desc, batch, head, m * state.BLOCK_M, bar, state.q_ring.index(slot), HEAD_DIM)
    load_boxes(state.do_desc, batch, head, m * state.BLOCK_M, bar, state.do_ring.index(slot), HEAD_DIM)
    if state.STATS_IN_SHARED:  # once Q and dO are on their way: then each thread arrives
        state.stats_ring.index(slot).index(0).store(lse2)
        state.stats_ring.index(slot).index(1).store(delta)
        release(bar, state.RELEASES)  # its threads' rows are in (backward_keys.py)


@ll.jit
def row_stats(state, bh, m):
    """(L in log2 units, delta) of query block m's rows (head bh), a row a producer thread
    (STATS_IN_SHARED: staged in the ring slot beside Q and dO); rows past seq_q get L =
    +inf (P = 0) and delta 0."""
    ROWS: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
    rows = m * state.BLOCK_M + ll.arange(0, state.BLOCK_M, ROWS)
    inside = rows < state.seq_q
    lse = ll.load(state.lse_ptr + bh * state.seq_q + rows, mask=inside, other=float("inf"))
    delta = ll.load(state.delta_ptr + bh * state.seq_q + rows, mask=inside, other=0.0)
    return lse * LOG2E, delta


@ll.jit
def part(buffer, start: ll.constexpr, length: ll.constexpr, dim: ll.constexpr):
    """buffer.slice(start, length, dim), or the buffer itself where that is all of it."""
    if buffer.shape[dim] == length:
        return buffer
    return buffer.slice(start, length, dim)


@ll.jit
def masked(state, p, m, key0, S_LAYOUT: ll.constexpr):
    """P of query block m with 0 for the keys its rows do not see: past seq_k, or
    (causal) right of a row's diagonal."""
    rows = m * state.BLOCK_M + ll.arange(0, state.BLOCK_M, ll.SliceLayout(1, S_LAYOUT))
    keys = key0 + ll.arange(0, p.shape[1], ll.SliceLayout(0, S_LAYOUT))
    visible = keys[None, :] < state.seq_k
    if state.CAUSAL:
        visible = visible & (keys[None, :] <= rows[:, None] + (state.seq_k - state.seq_q))
    return ll.where(visible, p, 0.0)


@ll.jit
def unhoisted(buffer, m, heads):
    """The [rows, HEAD_DIM] tile of a [1, 1, rows, HEAD_DIM] buffer (K or V), addressed
    through an index that is 0 at run time but that LLVM cannot prove constant (m * heads
    >> 31, for a block index m >= 0): the wgmma descriptors of a tile read in every step
    are otherwise hoisted out of the walk, two registers each (24 at head_dim 128 for K
    and V, 48 at 256), which made the consumers spill."""
    return buffer.index((m * heads) >> 31).index(0)


@ll.jit
def query_block_step(state, step, m, bh, key0, dk, dv, qk_scale, WG: ll.constexpr, MASKED: ll.constexpr):
    """One query block m (of head bh, at ring position `step`) for warpgroup WG: its
    contributions to dK and dV (returned) and to dQ (added into global memory)."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    BLOCK_N: ll.constexpr = state.BLOCK_N
    COLUMNS: ll.constexpr = state.COLUMNS
    # Each consumer computes S and dP for KEYS of the block's keys, and all of them read
    # the whole of P and dS from shared memory.
    KEYS: ll.constexpr = BLOCK_N // state.CONSUMERS
    S_LAYOUT: ll.constexpr = accumulator_layout(KEYS)
    ROW: ll.constexpr = ll.SliceLayout(1, S_LAYOUT)
    slot = ring_slot(step, state.STAGES)
    rows = m * BLOCK_M + ll.arange(0, BLOCK_M, ROW)
    inside = rows < state.seq_q
    # L (in log2 units) and delta of the block's rows: two registers a thread, loaded
    # while the slot fills. Rows past seq_q get L = +inf: P = 0 there, as for rows that
    # see no key.
    lse2 = ll.load(state.lse_ptr + bh * state.seq_q + rows, mask=inside, other=float("inf")) * LOG2E
    delta = ll.load(state.delta_ptr + bh * state.seq_q + rows, mask=inside, other=0.0)
    mbarrier.wait(state.ready.index(slot), ring_phase(step, state.STAGES))
    k = unhoisted(state.k_smem, m, state.heads)
    v = unhoisted(state.v_smem, m, state.heads)
    q = state.q_ring.index(slot).index(0).index(0)    # [BLOCK_M, HEAD_DIM]
    do = state.do_ring.index(slot).index(0).index(0)
    first_key: ll.constexpr = WG * KEYS
    s = ll.warpgroup_mma(q, part(k, first_key, KEYS, 0).permute((1, 0)),
                         ll.zeros([BLOCK_M, KEYS], ll.float32, S_LAYOUT), use_acc=False, is_async=True)
    dp = ll.warpgroup_mma(do, part(v, first_key, KEYS, 0).permute((1, 0)),
                          ll.zeros([BLOCK_M, KEYS], ll.float32, S_LAYOUT), use_acc=False, is_async=True)
    s = ll.warpgroup_mma_wait(1, deps=[s])
    p = ll.exp2(ll.fma(s, qk_scale, -lse2[:, None]))
    if MASKED:
        p = masked(state, p, m, key0 + first_key, S_LAYOUT)
    dtype: ll.constexpr = state.q_desc.dtype
    p_buf = state.p_smem  # [BLOCK_M, BLOCK_N]
    ds_buf = state.ds_smem
    if state.CONSUMERS > 1:  # every consumer has read the last step's P and dS
        mbarrier.wait(state.scores_free, ring_phase(step, 1) ^ 1)  # a fresh barrier counts as passed
    part(p_buf, first_key, KEYS, 1).store(p.to(dtype))
    dp = ll.warpgroup_mma_wait(0, deps=[dp])
    part(ds_buf, first_key, KEYS, 1).store((p * (dp - delta[:, None])).to(dtype))
    ll.fence_async_shared()
    if state.CONSUMERS > 1:  # and every consumer has written its keys' P and dS
        mbarrier.arrive(state.scores_ready)
        mbarrier.wait(state.scores_ready, ring_phase(step, 1))
    # P^T and dS^T are the MN-major A operands (the buffers read transposed), dO and Q
    # the MN-major B operands, of dV += P^T dO and dK += dS^T Q for this warpgroup's columns.
    c0: ll.constexpr = state.FIRST_COLUMN + WG * COLUMNS
    dv = ll.warpgroup_mma(p_buf.permute((1, 0)), do.slice(c0, COLUMNS, 1), dv, is_async=True)
    dk = ll.warpgroup_mma(ds_buf.permute((1, 0)), q.slice(c0, COLUMNS, 1), dk, is_async=True)
    Q_LAYOUT: ll.constexpr = accumulator_layout(DQ_CHUNK)
    dq = ll.warpgroup_mma(ds_buf, k.slice(c0, DQ_CHUNK, 1), ll.zeros([BLOCK_M, DQ_CHUNK], ll.float32, Q_LAYOUT),
                          use_acc=False, is_async=True)
    dv, dk, dq = ll.warpgroup_mma_wait(0, deps=[dv, dk, dq])
    # Q and dO are read: the producer may refill the slot while dQ goes out.
    mbarrier.arrive(state.empty.index(slot))
    if state.CONSUMERS > 1:
        mbarrier.arrive(state.scores_free)
    # dQ = dS K into global memory, in a loop of its own (of one iteration) whose thread
    # positions (the atomics' columns) are computed there, not held from the step's start
    # through its GEMMs.
    for _ in ll.range(0, 1, rematerialize=True):
        if state.DQ_TMA:
            reduce_dq_chunks(state, dq, ds_buf, k, m, bh, c0, COLUMNS, WG)
        else:
            add_dq_chunks(state, dq, ds_buf, k, m, bh, c0, COLUMNS)
    return dk, dv


@ll.jit
def dq_chunk(state, first, ds_buf, k, c0: ll.constexpr, j: ll.constexpr):
    """dQ's j-th DQ_CHUNK columns from c0 on (dS K): `first` for j = 0 (computed already
    beside dV and dK), else a GEMM of dS (in ds_buf) and K's columns."""
    if j == 0:
        return first
    Q_LAYOUT: ll.constexpr = accumulator_layout(DQ_CHUNK)
    dq = ll.warpgroup_mma(ds_buf, k.slice(c0 + j * DQ_CHUNK, DQ_CHUNK, 1),
                          ll.zeros([state.BLOCK_M, DQ_CHUNK], ll.float32, Q_LAYOUT), use_acc=False, is_async=True)
    return ll.warpgroup_mma_wait(0, deps=[dq])


@ll.jit
def reduce_dq_chunks(state, first, ds_buf, k, m, bh, c0: ll.constexpr, COLUMNS: ll.constexpr, WG: ll.constexpr):
    """dQ[m's rows, c0:c0 + COLUMNS] += dS K by TMA reduce-add, DQ_CHUNK columns at a time
    through this consumer's fp32 box in shared memory: one thread adds the box into
    global memory while the warpgroup goes on (the box's rows past seq_q are not added)."""
    box = state.dq_smem.index(WG)  # [1, 1, BLOCK_M, DQ_CHUNK]
    for j in ll.static_range(COLUMNS // DQ_CHUNK):
        dq = dq_chunk(state, first, ds_buf, k, c0, j)
        tma.store_wait(0)  # the box's last add has read it
        box.index(0).index(0).store(dq)
        ll.fence_async_shared()
        tma.async_reduce_add(state.dq_ptr, [0, bh, m * state.BLOCK_M, c0 + j * DQ_CHUNK], box)


@ll.jit
def add_dq_chunks(state, first, ds_buf, k, m, bh, c0: ll.constexpr, COLUMNS: ll.constexpr):
    """dQ[m's rows, c0:c0 + COLUMNS] += dS K by atomic adds in fp32, DQ_CHUNK columns at a
    time: `first` (the first chunk, computed already), then dS (in ds_buf) times K's
    further columns."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    Q_LAYOUT: ll.constexpr = accumulator_layout(DQ_CHUNK)
    q_rows = m * BLOCK_M + ll.arange(0, BLOCK_M, ll.SliceLayout(1, Q_LAYOUT))
    row_offsets = (bh * state.seq_q + q_rows[:, None]) * state.HEAD_DIM
    for j in ll.static_range(COLUMNS // DQ_CHUNK):
        dq = dq_chunk(state, first, ds_buf, k, c0, j)
        cols = c0 + j * DQ_CHUNK + ll.arange(0, DQ_CHUNK, ll.SliceLayout(0, Q_LAYOUT))
        pointers = state.dq_ptr + row_offsets + cols[None, :]
        if m * BLOCK_M + BLOCK_M <= state.seq_q:  # no mask: a masked atomic is a branch around each
            ll.atomic_add(pointers, dq, sem="relaxed")
        else:
            ll.atomic_add(pointers, dq, mask=q_rows[:, None] < state.seq_q, sem="relaxed")


@ll.jit
def consumer(state, WG: ll.constexpr):
    """Warpgroup WG's columns of dK and dV over the CTA's walk, then their store."""
    batch, kv_head, key0, first, unmasked, end = query_blocks(state)
    BLOCK_N: ll.constexpr = state.BLOCK_N
    COLUMNS: ll.constexpr = state.COLUMNS
    D_LAYOUT: ll.constexpr = accumulator_layout(COLUMNS)
    qk_scale = state.softmax_scale * LOG2E
    dk = ll.zeros([BLOCK_N, COLUMNS], ll.float32, D_LAYOUT)
    dv = ll.zeros([BLOCK_N, COLUMNS], ll.float32, D_LAYOUT)
    mbarrier.wait(state.kv_ready, 0)
    if state.PIPELINED:
        dk, dv = backward_pipeline.pipelined_walk(state, batch, kv_head, key0, first, unmasked, end, dk, dv,
                                                  qk_scale, WG)
    else:
        per_head = end - first
        for g in range(0, state.kv_group):
            bh = batch * state.heads + kv_head * state.kv_group + g
            for m in ll.range(first, unmasked, rematerialize=True):
                dk, dv = query_block_step(state, g * per_head + m - first, m, bh, key0, dk, dv, qk_scale,
                                          WG, True)
            for m in ll.range(unmasked, end, rematerialize=True):
                dk, dv = query_block_step(state, g * per_head + m - first, m, bh, key0, dk, dv, qk_scale,
                                          WG, False)
    keys = key0 + ll.arange(0, BLOCK_N, ll.SliceLayout(1, D_LAYOUT))
    cols = state.FIRST_COLUMN + WG * COLUMNS + ll.arange(0, COLUMNS, ll.SliceLayout(0, D_LAYOUT))
    sb, sh, ss = state.dkv_strides
    offsets = batch * sb + kv_head * sh + keys[:, None] * ss + cols[None, :]
    inside = keys[:, None] < state.seq_k
    ll.store(state.dk_ptr + offsets, (dk * state.softmax_scale).to(state.dk_ptr.dtype.element_ty), mask=inside)
    ll.store(state.dv_ptr + offsets, dv.to(state.dv_ptr.dtype.element_ty), mask=inside)
    if state.DQ_TMA:
        tma.store_wait(0)  # dQ's last box is read before the CTA's shared memory goes


@ll.jit
def consumer_0(state):
    consumer(state, 0)


@ll.jit
def consumer_1(state):
    consumer(state, 1)


@ll.jit
def flash_attention_backward_kernel(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr,
                                    dkv_stride_b, dkv_stride_h, dkv_stride_s, softmax_scale, seq_q, seq_k,
                                    heads, kv_group, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                                    HEAD_DIM: ll.constexpr, STAGES: ll.constexpr, CONSUMERS: ll.constexpr,
                                    CAUSAL: ll.constexpr, PRODUCER_REGS: ll.constexpr,
                                    CONSUMER_REGS: ll.constexpr, COLUMNS: ll.constexpr = None,
                                    FIRST_COLUMN: ll.constexpr = 0, DQ_TMA: ll.constexpr = False,
                                    PIPELINED: ll.constexpr = False):
    """Grid (cdiv(seq_k, BLOCK_N), batch * kv_heads); descriptors over [batch, heads, seq,
    head_dim] with [1, 1, rows, 64] boxes; dq_ptr an fp32 [batch, heads, seq_q, head_dim]
    buffer that starts at zero (DQ_TMA: a descriptor over it as [1, batch * heads, seq_q,
    head_dim] with [1, 1, BLOCK_M, 64] boxes); dk_ptr and dv_ptr in k's dtype, strided as given. The
    CONSUMERS warpgroups take COLUMNS columns each (default: all of head_dim between
    them) from FIRST_COLUMN on: a launch covers head_dim's columns, or (head_dim 256) one
    of the launches that split them."""
    if COLUMNS is None:
        COLUMNS = HEAD_DIM // CONSUMERS
    ll.static_assert(FIRST_COLUMN + CONSUMERS * COLUMNS <= HEAD_DIM, "the consumers' columns lie in head_dim")
    dtype: ll.constexpr = q_desc.dtype
    k_smem = ll.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = ll.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    # P and dS, each consumer writing its keys' columns: one swizzle row of them (64 bytes
    # for two consumers), so that each consumer's columns are a plain view.
    ps_layout: ll.constexpr = ll.NVMMASharedLayout(128 // CONSUMERS, 16)
    p_smem = ll.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], ps_layout)
    ds_smem = ll.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], ps_layout)
    dq_smem = None
    if DQ_TMA:
        dq_smem = ll.allocate_shared_memory(ll.float32, [CONSUMERS, 1, 1, BLOCK_M, DQ_CHUNK], dq_ptr.layout)
    scores_ready = mbarrier.allocate_mbarrier()
    scores_free = mbarrier.allocate_mbarrier()
    mbarrier.init(scores_ready, count=CONSUMERS)
    mbarrier.init(scores_free, count=CONSUMERS)
    kv_ready = mbarrier.allocate_mbarrier()
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    mbarrier.init(kv_ready, count=1)
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)
    state = BackwardState(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_ring, do_ring, dq_smem, p_smem, ds_smem,
                          scores_ready, scores_free, kv_ready,
                          ready, empty, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr,
                          (dkv_stride_b, dkv_stride_h, dkv_stride_s), softmax_scale, seq_q, seq_k, heads,
                          kv_group, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CONSUMERS, COLUMNS, FIRST_COLUMN, CAUSAL,
                          DQ_TMA, PIPELINED, False, None, False, THREAD_RELEASES, THREAD_RELEASES)
    if CONSUMERS == 1:
        ll.warp_specialize((state,), producer, (state,), [consumer_0], worker_num_warps=[4],
                           worker_num_regs=[CONSUMER_REGS], default_num_regs=PRODUCER_REGS)
    else:
        ll.static_assert(CONSUMERS == 2, "one or two consumer warpgroups")
        ll.warp_specialize((state,), producer, (state,), [consumer_0, consumer_1], worker_num_warps=[4, 4],
                           worker_num_regs=[CONSUMER_REGS, CONSUMER_REGS], default_num_regs=PRODUCER_REGS)
    mbarrier.invalidate(kv_ready)
    mbarrier.invalidate(scores_ready)
    mbarrier.invalidate(scores_free)
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


from . import backward_pipeline  # noqa: E402  (its steps are made of this module's)
