"""The flash-attention backward with the key block split between the consumer warpgroups
(BackwardConfig.split == "keys"): FA3's Hopper layout at head_dim 128.

backward.py's kernel gives each consumer warpgroup a share of head_dim's COLUMNS of dK and
dV, so each needs P and dS for every key of the block: they go through shared memory
(both computed once between the warpgroups, each taking half the keys at wgmma N = 32),
and at head_dim 256 a second launch computes S and dP again. Here the BLOCK_N keys come
in bands of KEYS = 64 (one wgmma M), each band shared by CONSUMERS / bands warpgroups
that split its dK and dV in COLUMNS each (fp32 registers, for the whole walk): at head_dim
64 and 128 two bands of one warpgroup each (all its columns: 2 x 64 registers a thread
at 128), at 256 one band of two warpgroups (128 columns each, one launch). For each
query block each warpgroup computes, for its band only, the transposed scores (the
swapped operands):

    S^T = K Q^T,  dP^T = V dO^T          [KEYS, BLOCK_M], K and V A operands in shared memory
    P^T = exp2(S^T scale log2(e) - L log2(e)),  dS^T = P^T (dP^T - delta)   (L, delta by column)
    dV += P^T dO,  dK += dS^T Q          P^T, dS^T A operands from registers (the accumulator's
                                         layout is the operand's: no data moves)

so P never goes through shared memory (at 256 both warpgroups of the band compute its
S^T and dP^T: two more GEMMs a step than the five needed, in place of a second launch; or,
SPLIT_SCORES, one computes S^T and P^T and hands P^T over in shared memory, the other dP^T
and dS^T: `split_band_gradients`). dQ = dS K
needs every key's dS: the first warpgroup of each band writes its dS^T rows into one
shared [BLOCK_N, BLOCK_M] buffer, and once all bands are in (`scores_ready`) each
warpgroup computes dQ for HEAD_DIM / CONSUMERS columns over all BLOCK_N keys (dS the
buffer read transposed, an MN-major A operand; K's columns the B operand), or at head_dim
64 (one chunk of dQ for two warpgroups) the warpgroups take turns step by step, and adds
it into global memory as backward.py does (TMA reduce-add from its fp32 box, or atomics).
At head_dim 128 the dQ traffic per key is half of backward.py's (a box a warpgroup per 128
keys, not per 64).

The producer, the walk over query blocks and the dQ additions are backward.py's.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .backward import (DQ_CHUNK, THREAD_RELEASES, BackwardState, add_dq_chunks, part, producer, query_blocks,
                       reduce_dq_chunks, release, release_arrivals, unhoisted)
from .kernels import LOG2E
from .rings import ring_phase, ring_slot
from .steps import accumulator_layout

KEYS = 64  # of the block, a consumer warpgroup's: one wgmma M of S^T
CONSUMER_WARPS = 4  # a consumer warpgroup's


# compute-sanitizer's racecheck orders one thread's shared-memory access before another
# thread's through an mbarrier only when the accessing thread itself arrives: not through a
# named barrier over its warps followed by one thread's arrival (mbarrier.arrive's default).
# So a handoff of data written or read with ordinary loads and stores (not TMA or wgmma,
# which it does not watch) has, by default (RELEASES, backward.py's `release`), every thread
# arrive for its own accesses, and its barrier counts threads: the stats ring, and
# SPLIT_SCORES's P^T. BackwardConfig.releases (and p_releases, P^T's alone) picks fewer
# arrivals: a warp's, or a partition's one.


@ll.jit
def release_slot(state, slot):
    """Ring slot `slot` is read: back to the producer. With L and delta staged in it
    (STATS_IN_SHARED), read by ordinary loads, every consumer thread arrives; Q and dO
    alone, read by wgmma, take one arrival a warpgroup."""
    if state.STATS_IN_SHARED:
        release(state.empty.index(slot), state.RELEASES)
    else:
        mbarrier.arrive(state.empty.index(slot))


@ll.jit
def free_scores(state):
    """This warpgroup has read the step's shared scores: dS^T (by wgmma), and with
    SPLIT_SCORES P^T (by ordinary loads: `release`)."""
    if state.SPLIT_SCORES:
        release(state.scores_free, state.P_RELEASES)
    else:
        mbarrier.arrive(state.scores_free)


@ll.jit
def masked_transposed(state, pt, m, first_key, T_LAYOUT: ll.constexpr):
    """P^T of query block m ([keys, queries] from first_key on) with 0 where a query does
    not see a key: past seq_k, or (causal) right of the query's diagonal."""
    keys = first_key + ll.arange(0, pt.shape[0], ll.SliceLayout(1, T_LAYOUT))
    rows = m * state.BLOCK_M + ll.arange(0, state.BLOCK_M, ll.SliceLayout(0, T_LAYOUT))
    visible = keys[:, None] < state.seq_k
    if state.CAUSAL:
        visible = visible & (keys[:, None] <= rows[None, :] + (state.seq_k - state.seq_q))
    return ll.where(visible, pt, 0.0)


@ll.constexpr_function
def dq_box_rows(block_m, head_dim, consumers):
    """Rows of a consumer's dQ box: KEYS where the consumers split dQ's rows (head_dim 64,
    one chunk of columns, at block_m = KEYS * consumers), else all block_m."""
    return KEYS if head_dim == DQ_CHUNK and block_m == KEYS * consumers else block_m


@ll.constexpr_function
def key_groups(block_n):
    """Bands of 64 keys (one wgmma M) of a BLOCK_N block: one a consumer warpgroup."""
    return block_n // KEYS


@ll.jit
def keys_step(state, step, m, bh, key0, dk, dv, qk_scale, WG: ll.constexpr, MASKED: ll.constexpr):
    """Query block m (of head bh, at ring position `step`) for warpgroup WG: its keys'
    contributions to its columns of dK and dV (returned) and its share of dQ (added into
    global memory)."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    slot = ring_slot(step, state.STAGES)
    mbarrier.wait(state.ready.index(slot), ring_phase(step, state.STAGES))
    k = unhoisted(state.k_smem, m, state.heads)  # [BLOCK_N, HEAD_DIM]
    v = unhoisted(state.v_smem, m, state.heads)
    # [BLOCK_M, HEAD_DIM]. A one-slot ring's slot is 0 in every step: unhoisted as K is
    # (its descriptors, 80 registers at head_dim 256, were otherwise held through the walk).
    if state.STAGES == 1:
        slot = (m * state.heads) >> 31
    q = state.q_ring.index(slot).index(0).index(0)
    do = state.do_ring.index(slot).index(0).index(0)
    # [BLOCK_N, BLOCK_M]: dS^T, each band of keys written by one of its warpgroups.
    # Unhoisted as K and V are: dQ's A descriptors (two registers each) were otherwise
    # held through the walk.
    ds_buf = state.ds_smem.index((m * state.heads) >> 31)
    stats = None
    if state.STATS_IN_SHARED:
        stats = state.stats_ring.index(slot)  # [2, BLOCK_M]: L (log2 units) and delta
    if state.SPLIT_SCORES:
        dv, dk = split_band_gradients(state, step, m, bh, key0, q, do, k, v, ds_buf, stats, dk, dv, qk_scale, WG,
                                      MASKED)
    else:
        dv, dk = band_gradients(state, step, m, bh, key0, q, do, k, v, ds_buf, stats, dk, dv, qk_scale, WG, MASKED)
    ds = ds_buf.permute((1, 0))  # [BLOCK_M, BLOCK_N], MN-major
    CHUNKS: ll.constexpr = state.HEAD_DIM // DQ_CHUNK
    if CHUNKS >= state.CONSUMERS:  # WG's own DQ_COLUMNS of dQ, the first chunk beside dV and dK
        DQ_COLUMNS: ll.constexpr = state.HEAD_DIM // state.CONSUMERS
        q0: ll.constexpr = WG * DQ_COLUMNS
        dq = ll.warpgroup_mma(ds, k.slice(q0, DQ_CHUNK, 1),
                              ll.zeros([BLOCK_M, DQ_CHUNK], ll.float32, accumulator_layout(DQ_CHUNK)),
                              use_acc=False, is_async=True)
        dv, dk, dq = ll.warpgroup_mma_wait(0, deps=[dv, dk, dq])
        release_slot(state, slot)  # Q and dO are read
        # dS is read once dQ's last chunk is computed: the first, or (head_dim 256) the
        # second, whose GEMM runs between the first chunk's addition and its own.
        if DQ_COLUMNS == DQ_CHUNK:
            free_scores(state)
        add_dq(state, dq, ds, k, m, bh, q0, DQ_COLUMNS, WG)
        if DQ_COLUMNS > DQ_CHUNK:
            free_scores(state)
    elif BLOCK_M == KEYS * state.CONSUMERS:  # head_dim 64 at BLOCK_M 128: each consumer its 64 rows of dQ
        r0: ll.constexpr = WG * KEYS
        dq = ll.warpgroup_mma(ds.slice(r0, KEYS, 0), k,
                              ll.zeros([KEYS, DQ_CHUNK], ll.float32, accumulator_layout(DQ_CHUNK)),
                              use_acc=False, is_async=True)
        dv, dk, dq = ll.warpgroup_mma_wait(0, deps=[dv, dk, dq])
        release_slot(state, slot)
        free_scores(state)
        add_dq_rows(state, dq, m * BLOCK_M + r0, bh, WG)
    else:  # fewer chunks than consumers (head_dim 64, two): the whole of dQ, consumers in turn
        dv, dk = ll.warpgroup_mma_wait(0, deps=[dv, dk])
        release_slot(state, slot)
        if ring_slot(step, state.CONSUMERS) == WG:
            dq = ll.warpgroup_mma(ds, k, ll.zeros([BLOCK_M, DQ_CHUNK], ll.float32, accumulator_layout(DQ_CHUNK)),
                                  use_acc=False, is_async=True)
            dq = ll.warpgroup_mma_wait(0, deps=[dq])
            free_scores(state)
            add_dq(state, dq, ds, k, m, bh, 0, DQ_CHUNK, WG)
        else:
            free_scores(state)
    return dk, dv


@ll.jit
def band_gradients(state, step, m, bh, key0, q, do, k, v, ds_buf, stats, dk, dv, qk_scale, WG: ll.constexpr,
                   MASKED: ll.constexpr):
    """Warpgroup WG's S^T and dP^T of its band of keys, P^T and dS^T from them, dV and dK
    issued (async, returned) and dS^T in ds_buf once every band's is there (its band's
    first warpgroup writes it)."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    COLUMN_GROUPS: ll.constexpr = state.CONSUMERS // key_groups(state.BLOCK_N)
    T_LAYOUT: ll.constexpr = accumulator_layout(BLOCK_M)  # [KEYS, BLOCK_M]: S^T, P^T, dP^T, dS^T
    D_LAYOUT: ll.constexpr = accumulator_layout(state.COLUMNS)  # [KEYS, COLUMNS]: dK, dV
    COL: ll.constexpr = ll.SliceLayout(0, T_LAYOUT)
    rows = m * BLOCK_M + ll.arange(0, BLOCK_M, COL)
    inside = rows < state.seq_q
    first_key: ll.constexpr = (WG // COLUMN_GROUPS) * KEYS
    c0: ll.constexpr = (WG % COLUMN_GROUPS) * state.COLUMNS
    st = ll.warpgroup_mma(part(k, first_key, KEYS, 0), q.permute((1, 0)),
                          ll.zeros([KEYS, BLOCK_M], ll.float32, T_LAYOUT), use_acc=False, is_async=True)
    dpt = ll.warpgroup_mma(part(v, first_key, KEYS, 0), do.permute((1, 0)),
                           ll.zeros([KEYS, BLOCK_M], ll.float32, T_LAYOUT), use_acc=False, is_async=True)
    if state.STATS_IN_SHARED:
        st = ll.warpgroup_mma_wait(1, deps=[st])
        lse2 = stats.index(0).load(COL)  # read where used: never held beside S^T and dP^T
    else:
        # L (log2 units) of the block's query rows, by column, loaded while S^T is computed
        # (16 registers a thread, held only until P^T); rows past seq_q get +inf: P = 0.
        lse2 = ll.load(state.lse_ptr + bh * state.seq_q + rows, mask=inside, other=float("inf")) * LOG2E
        st = ll.warpgroup_mma_wait(1, deps=[st])
    pt = ll.exp2(ll.fma(st, qk_scale, -lse2[None, :]))
    if MASKED:
        pt = masked_transposed(state, pt, m, key0 + first_key, T_LAYOUT)
    dtype: ll.constexpr = state.q_desc.dtype
    dv = ll.warpgroup_mma(ll.convert_layout(pt.to(dtype), ll.DotOperandLayout(0, D_LAYOUT, 2)),
                          part(do, c0, state.COLUMNS, 1), dv, is_async=True)
    if state.STATS_IN_SHARED:
        dpt = ll.warpgroup_mma_wait(1, deps=[dpt])  # dV may run on
        delta = stats.index(1).load(COL)
    else:
        delta = ll.load(state.delta_ptr + bh * state.seq_q + rows, mask=inside, other=0.0)
        dpt = ll.warpgroup_mma_wait(1, deps=[dpt])  # dV may run on
    dst = (pt * (dpt - delta[None, :])).to(dtype)
    dk = ll.warpgroup_mma(ll.convert_layout(dst, ll.DotOperandLayout(0, D_LAYOUT, 2)),
                          part(q, c0, state.COLUMNS, 1), dk, is_async=True)
    if state.CONSUMERS > 1:  # every consumer has read the last step's dS
        mbarrier.wait(state.scores_free, ring_phase(step, 1) ^ 1)  # a fresh barrier counts as passed
    if WG % COLUMN_GROUPS == 0:
        part(ds_buf, first_key, KEYS, 0).store(dst)
        ll.fence_async_shared()
    if state.CONSUMERS > 1:  # and every band of dS is written
        mbarrier.arrive(state.scores_ready)
        mbarrier.wait(state.scores_ready, ring_phase(step, 1))
    return dv, dk


@ll.jit
def split_band_gradients(state, step, m, bh, key0, q, do, k, v, ds_buf, stats, dk, dv, qk_scale,
                         WG: ll.constexpr, MASKED: ll.constexpr):
    """band_gradients for one band shared by two warpgroups (SPLIT_SCORES) that split its
    scores in place of each computing all of them: warpgroup 0 computes S^T and P^T and
    hands fp32 P^T over in p_smem (`p_ready`, the second of the scores_ready pair),
    warpgroup 1 dP^T and from it and P^T dS^T, into ds_buf (`scores_ready`). Each then
    issues dV and dK for its columns: warpgroup 0 with dS^T from shared memory,
    warpgroup 1 with P^T and dS^T from registers."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    T_LAYOUT: ll.constexpr = accumulator_layout(BLOCK_M)  # [KEYS, BLOCK_M]
    D_LAYOUT: ll.constexpr = accumulator_layout(state.COLUMNS)  # [KEYS, COLUMNS]: dK, dV
    A_OPERAND: ll.constexpr = ll.DotOperandLayout(0, D_LAYOUT, 2)
    COL: ll.constexpr = ll.SliceLayout(0, T_LAYOUT)
    rows = m * BLOCK_M + ll.arange(0, BLOCK_M, COL)
    inside = rows < state.seq_q
    c0: ll.constexpr = WG * state.COLUMNS
    dtype: ll.constexpr = state.q_desc.dtype
    scores_ready = state.scores_ready.index(0)
    p_ready = state.scores_ready.index(1)
    p_buf = state.p_smem.index((m * state.heads) >> 31)  # [KEYS, BLOCK_M] fp32
    if WG == 0:
        st = ll.warpgroup_mma(k, q.permute((1, 0)), ll.zeros([KEYS, BLOCK_M], ll.float32, T_LAYOUT),
                              use_acc=False, is_async=True)
        if state.STATS_IN_SHARED:
            st = ll.warpgroup_mma_wait(0, deps=[st])
            lse2 = stats.index(0).load(COL)
        else:
            lse2 = ll.load(state.lse_ptr + bh * state.seq_q + rows, mask=inside, other=float("inf")) * LOG2E
            st = ll.warpgroup_mma_wait(0, deps=[st])
        pt = ll.exp2(ll.fma(st, qk_scale, -lse2[None, :]))
        if MASKED:
            pt = masked_transposed(state, pt, m, key0, T_LAYOUT)
        mbarrier.wait(state.scores_free, ring_phase(step, 1) ^ 1)  # the last P^T and dS^T are read
        p_buf.store(pt)
        release(p_ready, state.P_RELEASES)  # P^T's reader loads it (backward.py's `release`)
        mbarrier.arrive(scores_ready)
        dv = ll.warpgroup_mma(ll.convert_layout(pt.to(dtype), A_OPERAND), part(do, c0, state.COLUMNS, 1), dv,
                              is_async=True)
        mbarrier.wait(scores_ready, ring_phase(step, 1))  # and dS^T is written
        dk = ll.warpgroup_mma(ds_buf, part(q, c0, state.COLUMNS, 1), dk, is_async=True)
    else:
        dpt = ll.warpgroup_mma(v, do.permute((1, 0)), ll.zeros([KEYS, BLOCK_M], ll.float32, T_LAYOUT),
                               use_acc=False, is_async=True)
        if state.STATS_IN_SHARED:
            dpt = ll.warpgroup_mma_wait(0, deps=[dpt])
            delta = stats.index(1).load(COL)
        else:
            delta = ll.load(state.delta_ptr + bh * state.seq_q + rows, mask=inside, other=0.0)
            dpt = ll.warpgroup_mma_wait(0, deps=[dpt])
        mbarrier.wait(p_ready, ring_phase(step, 1))
        pt = p_buf.load(T_LAYOUT)
        dst = (pt * (dpt - delta[None, :])).to(dtype)
        mbarrier.wait(state.scores_free, ring_phase(step, 1) ^ 1)  # the last dS^T is read
        ds_buf.store(dst)
        ll.fence_async_shared()
        mbarrier.arrive(scores_ready)
        dv = ll.warpgroup_mma(ll.convert_layout(pt.to(dtype), A_OPERAND), part(do, c0, state.COLUMNS, 1), dv,
                              is_async=True)
        dk = ll.warpgroup_mma(ll.convert_layout(dst, A_OPERAND), part(q, c0, state.COLUMNS, 1), dk,
                              is_async=True)
    return dv, dk


@ll.jit
def add_dq(state, dq, ds, k, m, bh, q0: ll.constexpr, DQ_COLUMNS: ll.constexpr, WG: ll.constexpr):
    """dQ[m's rows, q0:q0 + DQ_COLUMNS] += dS K (dq its first chunk) as backward.py adds
    it, in a loop of its own so that its addresses are made there, not held through the
    step."""
    for _ in ll.range(0, 1, rematerialize=True):
        if state.DQ_TMA:
            reduce_dq_chunks(state, dq, ds, k, m, bh, q0, DQ_COLUMNS, WG)
        else:
            add_dq_chunks(state, dq, ds, k, m, bh, q0, DQ_COLUMNS)


@ll.jit
def add_dq_rows(state, dq, row0, bh, WG: ll.constexpr):
    """dQ[row0:row0 + 64, :] += dq (head_dim 64: all its columns; BLOCK_M 128, each
    consumer its 64 rows), by TMA reduce-add from WG's box or by atomics (rows past seq_q
    left out), in a loop of its own as add_dq."""
    for _ in ll.range(0, 1, rematerialize=True):
        if state.DQ_TMA:
            box = state.dq_smem.index(WG)  # [1, 1, KEYS, DQ_CHUNK]
            tma.store_wait(0)  # the box's last add has read it
            box.index(0).index(0).store(dq)
            ll.fence_async_shared()
            tma.async_reduce_add(state.dq_ptr, [0, bh, row0, 0], box)
        else:
            Q_LAYOUT: ll.constexpr = accumulator_layout(DQ_CHUNK)
            rows = row0 + ll.arange(0, KEYS, ll.SliceLayout(1, Q_LAYOUT))
            cols = ll.arange(0, DQ_CHUNK, ll.SliceLayout(0, Q_LAYOUT))
            pointers = state.dq_ptr + (bh * state.seq_q + rows[:, None]) * state.HEAD_DIM + cols[None, :]
            if row0 + KEYS <= state.seq_q:  # no mask: a masked atomic is a branch around each
                ll.atomic_add(pointers, dq, sem="relaxed")
            else:
                ll.atomic_add(pointers, dq, mask=rows[:, None] < state.seq_q, sem="relaxed")


@ll.jit
def keys_consumer(state, WG: ll.constexpr):
    """Warpgroup WG's keys and columns of dK and dV over the CTA's walk, then their store."""
    batch, kv_head, key0, first, unmasked, end = query_blocks(state)
    qk_scale = state.softmax_scale * LOG2E
    mbarrier.wait(state.kv_ready, 0)
    dk, dv = keys_walk(state, batch, kv_head, key0, first, unmasked, end, 0, qk_scale, WG)
    store_keys_gradients(state, dk, dv, batch, kv_head, key0, WG)
    if state.DQ_TMA:
        tma.store_wait(0)  # dQ's last box is read before the CTA's shared memory goes


@ll.jit
def keys_walk(state, batch, kv_head, key0, first, unmasked, end, step0, qk_scale, WG: ll.constexpr):
    """Warpgroup WG's dK and dV (fp32, its keys and columns) of one tile: query blocks
    [first, end) of each head of the group, at ring positions from step0 on."""
    D_LAYOUT: ll.constexpr = accumulator_layout(state.COLUMNS)
    dk = ll.zeros([KEYS, state.COLUMNS], ll.float32, D_LAYOUT)
    dv = ll.zeros([KEYS, state.COLUMNS], ll.float32, D_LAYOUT)
    per_head = end - first
    for g in range(0, state.kv_group):
        bh = batch * state.heads + kv_head * state.kv_group + g
        for m in ll.range(first, unmasked, rematerialize=True):
            dk, dv = keys_step(state, step0 + g * per_head + m - first, m, bh, key0, dk, dv, qk_scale, WG, True)
        for m in ll.range(unmasked, end, rematerialize=True):
            dk, dv = keys_step(state, step0 + g * per_head + m - first, m, bh, key0, dk, dv, qk_scale, WG, False)
    return dk, dv


@ll.jit
def store_keys_gradients(state, dk, dv, batch, kv_head, key0, WG: ll.constexpr):
    """Warpgroup WG's share of the tile's dK (scaled by softmax_scale) and dV, from
    registers into global memory (keys past seq_k left out)."""
    COLUMN_GROUPS: ll.constexpr = state.CONSUMERS // key_groups(state.BLOCK_N)
    D_LAYOUT: ll.constexpr = accumulator_layout(state.COLUMNS)
    keys = key0 + (WG // COLUMN_GROUPS) * KEYS + ll.arange(0, KEYS, ll.SliceLayout(1, D_LAYOUT))
    cols = (WG % COLUMN_GROUPS) * state.COLUMNS + ll.arange(0, state.COLUMNS, ll.SliceLayout(0, D_LAYOUT))
    sb, sh, ss = state.dkv_strides
    offsets = batch * sb + kv_head * sh + keys[:, None] * ss + cols[None, :]
    inside = keys[:, None] < state.seq_k
    ll.store(state.dk_ptr + offsets, (dk * state.softmax_scale).to(state.dk_ptr.dtype.element_ty), mask=inside)
    ll.store(state.dv_ptr + offsets, dv.to(state.dv_ptr.dtype.element_ty), mask=inside)


@ll.jit
def keys_consumer_0(state):
    keys_consumer(state, 0)


@ll.jit
def keys_consumer_1(state):
    keys_consumer(state, 1)


@ll.jit
def flash_attention_backward_keys_kernel(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dq_ptr, dk_ptr,
                                         dv_ptr, dkv_stride_b, dkv_stride_h, dkv_stride_s, softmax_scale, seq_q,
                                         seq_k, heads, kv_group, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                                         HEAD_DIM: ll.constexpr, STAGES: ll.constexpr, CONSUMERS: ll.constexpr,
                                         CAUSAL: ll.constexpr, PRODUCER_REGS: ll.constexpr,
                                         CONSUMER_REGS: ll.constexpr, COLUMNS: ll.constexpr,
                                         DQ_TMA: ll.constexpr = False, SPLIT_SCORES: ll.constexpr = False,
                                         STATS_IN_SHARED: ll.constexpr = False,
                                         RELEASES: ll.constexpr = THREAD_RELEASES,
                                         P_RELEASES: ll.constexpr = THREAD_RELEASES,
                                         PERSISTENT: ll.constexpr = False):
    """backward.py's kernel's arguments (grid (cdiv(seq_k, BLOCK_N), batch * kv_heads), or
    PERSISTENT, (CTAs,): each walks tiles, backward_persistent.py): BLOCK_N / 64 bands of
    keys, each shared by CONSUMERS / (BLOCK_N / 64) consumers that split its dK and dV in
    COLUMNS each."""
    BANDS: ll.constexpr = key_groups(BLOCK_N)
    ll.static_assert(CONSUMERS % BANDS == 0 and COLUMNS * CONSUMERS == HEAD_DIM * BANDS,
                     "each band of 64 keys is split in COLUMNS between the same number of consumers")
    dtype: ll.constexpr = q_desc.dtype
    k_smem = ll.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = ll.allocate_shared_memory(dtype, [1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
    # dS^T, [keys, queries]: 64 query columns, one 128-byte swizzle row of 16-bit elements.
    ds_smem = ll.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ll.NVMMASharedLayout(128, 16))
    dq_smem = None
    if DQ_TMA:
        DQ_ROWS: ll.constexpr = dq_box_rows(BLOCK_M, HEAD_DIM, CONSUMERS)
        dq_smem = ll.allocate_shared_memory(ll.float32, [CONSUMERS, 1, 1, DQ_ROWS, DQ_CHUNK], dq_ptr.layout)
    stats_ring = None
    if STATS_IN_SHARED:  # L and delta of each slot's query rows, staged by the producer
        stats_ring = ll.allocate_shared_memory(ll.float32, [STAGES, 2, BLOCK_M],
                                               ll.SwizzledSharedLayout(1, 1, 1, [1, 0]))  # STAGES: buffers
    p_smem = None
    if SPLIT_SCORES:  # P^T handed from one warpgroup of the band to the other; then scores_ready
        # is a pair: every consumer's scores are written, and P^T is
        ll.static_assert(CONSUMERS == 2 and BANDS == 1, "SPLIT_SCORES: one band of keys, two consumers")
        p_smem = ll.allocate_shared_memory(ll.float32, [1, BLOCK_N, BLOCK_M], ll.NVMMASharedLayout(128, 32))
        scores_ready = mbarrier.allocate_mbarrier(batch=2)
        mbarrier.init(scores_ready.index(0), count=CONSUMERS)
        mbarrier.init(scores_ready.index(1), count=release_arrivals(CONSUMER_WARPS, P_RELEASES))
    else:
        scores_ready = mbarrier.allocate_mbarrier()
        mbarrier.init(scores_ready, count=CONSUMERS)
    scores_free = mbarrier.allocate_mbarrier()  # SPLIT_SCORES: each consumer's `release` (free_scores)
    mbarrier.init(scores_free, count=CONSUMERS * release_arrivals(CONSUMER_WARPS, P_RELEASES) if SPLIT_SCORES
                  else CONSUMERS)
    kv_ready = mbarrier.allocate_mbarrier()
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    mbarrier.init(kv_ready, count=1)
    # STATS_IN_SHARED: the producer's expect, then its `release` for its stores of L and
    # delta; each consumer's `release` (release_slot).
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1 + release_arrivals(ll.num_warps(), RELEASES) if STATS_IN_SHARED
                      else 1)
        mbarrier.init(empty.index(s), count=CONSUMERS * release_arrivals(CONSUMER_WARPS, RELEASES)
                      if STATS_IN_SHARED else CONSUMERS)
    state = BackwardState(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_ring, do_ring, dq_smem, p_smem, ds_smem,
                          scores_ready, scores_free, kv_ready, ready, empty, lse_ptr, delta_ptr, dq_ptr, dk_ptr,
                          dv_ptr, (dkv_stride_b, dkv_stride_h, dkv_stride_s), softmax_scale, seq_q, seq_k, heads,
                          kv_group, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, CONSUMERS, COLUMNS, 0, CAUSAL, DQ_TMA,
                          False, SPLIT_SCORES, stats_ring, STATS_IN_SHARED, RELEASES, P_RELEASES)
    if PERSISTENT:
        backward_persistent.run_persistent(state, CONSUMERS, PRODUCER_REGS, CONSUMER_REGS)
    elif CONSUMERS == 1:
        ll.warp_specialize((state,), producer, (state,), [keys_consumer_0], worker_num_warps=[4],
                           worker_num_regs=[CONSUMER_REGS], default_num_regs=PRODUCER_REGS)
    else:
        ll.static_assert(CONSUMERS == 2, "one or two consumer warpgroups")
        ll.warp_specialize((state,), producer, (state,), [keys_consumer_0, keys_consumer_1],
                           worker_num_warps=[4, 4], worker_num_regs=[CONSUMER_REGS, CONSUMER_REGS],
                           default_num_regs=PRODUCER_REGS)
    mbarrier.invalidate(kv_ready)
    if SPLIT_SCORES:
        mbarrier.invalidate(scores_ready.index(0))
        mbarrier.invalidate(scores_ready.index(1))
    else:
        mbarrier.invalidate(scores_ready)
    mbarrier.invalidate(scores_free)
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


from . import backward_persistent  # noqa: E402  (its partitions are made of this module's)
