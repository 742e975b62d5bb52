"""The backward kernel's software-pipelined walk (BackwardConfig.pipelined): each step
issues the next query block's S = Q K^T and dP = dO V^T, then the previous block's
dV += P^T dO, dK += dS^T Q and dQ = dS K, and computes P and dS of the new block in
registers while the tensor cores run those GEMMs (FA3's order). The plain walk
(backward.py, `query_block_step`) waits for S and dP, computes P and dS, then issues the
gradients' GEMMs and waits for them: its exponentials and the GEMMs never overlap.

The previous block's Q and dO stay in their ring slot until its GEMMs are done, so a step
holds two slots: the ring needs two at least. P and dS go into the shared buffers only
after the previous block's GEMMs have read them (and, with two consumers, after both
have: `scores_free`), in q's dtype, so the registers held across the GEMMs are half of
fp32 P and dS. The walk's first step has no previous block and the last block's GEMMs
follow the walk. Every CTA walks one block at least (a key block of a non-empty launch
is seen by the last query row, causal or not).
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier
from .backward import DQ_CHUNK, add_dq_chunks, masked, part, reduce_dq_chunks, unhoisted
from .kernels import LOG2E
from .rings import ring_phase, ring_slot
from .steps import accumulator_layout


@ll.jit
def walk_position(state, step, batch, kv_head, first, per_head):
    """(query block, batch * heads + head) of the walk's step-th block."""
    g = step // per_head
    return first + step - g * per_head, batch * state.heads + kv_head * state.kv_group + g


@ll.jit
def issue_scores(state, slot, k, v, WG: ll.constexpr):
    """S = Q K^T and dP = dO V^T of the block in ring slot `slot`, for this warpgroup's
    keys: two async wgmma groups."""
    KEYS: ll.constexpr = state.BLOCK_N // state.CONSUMERS
    S_LAYOUT: ll.constexpr = accumulator_layout(KEYS)
    q = state.q_ring.index(slot).index(0).index(0)
    do = state.do_ring.index(slot).index(0).index(0)
    first_key: ll.constexpr = WG * KEYS
    s = ll.warpgroup_mma(q, part(k, first_key, KEYS, 0).permute((1, 0)),
                         ll.zeros([state.BLOCK_M, KEYS], ll.float32, S_LAYOUT), use_acc=False, is_async=True)
    dp = ll.warpgroup_mma(do, part(v, first_key, KEYS, 0).permute((1, 0)),
                          ll.zeros([state.BLOCK_M, KEYS], ll.float32, S_LAYOUT), use_acc=False, is_async=True)
    return s, dp


@ll.jit
def issue_gradients(state, slot, k, dk, dv, WG: ll.constexpr):
    """dV += P^T dO, dK += dS^T Q and dQ's first chunk dS K for this warpgroup's columns,
    from the shared P and dS and the block in ring slot `slot`: three async wgmma groups."""
    c0: ll.constexpr = state.FIRST_COLUMN + WG * state.COLUMNS
    q = state.q_ring.index(slot).index(0).index(0)
    do = state.do_ring.index(slot).index(0).index(0)
    Q_LAYOUT: ll.constexpr = accumulator_layout(DQ_CHUNK)
    dv = ll.warpgroup_mma(state.p_smem.permute((1, 0)), do.slice(c0, state.COLUMNS, 1), dv, is_async=True)
    dk = ll.warpgroup_mma(state.ds_smem.permute((1, 0)), q.slice(c0, state.COLUMNS, 1), dk, is_async=True)
    dq = ll.warpgroup_mma(state.ds_smem, k.slice(c0, DQ_CHUNK, 1),
                          ll.zeros([state.BLOCK_M, DQ_CHUNK], ll.float32, Q_LAYOUT), use_acc=False, is_async=True)
    return dv, dk, dq


@ll.jit
def retire_gradients(state, step, dq, k, batch, kv_head, first, per_head, WG: ll.constexpr):
    """Once step's gradient GEMMs are done: its ring slot and the shared P and dS go back,
    and its dQ is added into global memory."""
    mbarrier.arrive(state.empty.index(ring_slot(step, state.STAGES)))
    if state.CONSUMERS > 1:
        mbarrier.arrive(state.scores_free)
    c0: ll.constexpr = state.FIRST_COLUMN + WG * state.COLUMNS
    for _ in ll.range(0, 1, rematerialize=True):  # dQ's addresses made here, not held through the step
        m, bh = walk_position(state, step, batch, kv_head, first, per_head)
        if state.DQ_TMA:
            reduce_dq_chunks(state, dq, state.ds_smem, k, m, bh, c0, state.COLUMNS, WG)
        else:
            add_dq_chunks(state, dq, state.ds_smem, k, m, bh, c0, state.COLUMNS)


@ll.jit
def share_scores(state, step, p, ds, WG: ll.constexpr):
    """Write this warpgroup's keys of step's P and dS into the shared buffers once every
    consumer has read the last step's, then wait until every consumer has written its."""
    KEYS: ll.constexpr = state.BLOCK_N // state.CONSUMERS
    if state.CONSUMERS > 1:
        mbarrier.wait(state.scores_free, ring_phase(step, 1) ^ 1)  # a fresh barrier counts as passed
    part(state.p_smem, WG * KEYS, KEYS, 1).store(p)
    part(state.ds_smem, WG * KEYS, KEYS, 1).store(ds)
    ll.fence_async_shared()
    if state.CONSUMERS > 1:
        mbarrier.arrive(state.scores_ready)
        mbarrier.wait(state.scores_ready, ring_phase(step, 1))


@ll.jit
def pipelined_step(state, step, m, bh, batch, kv_head, key0, first, per_head, dk, dv, qk_scale,
                   WG: ll.constexpr, MASKED: ll.constexpr, PREVIOUS: ll.constexpr):
    """Query block m (of head bh) at walk position `step`: its S and dP, then (PREVIOUS)
    the gradients of the step before, then its P and dS, shared. Returns dK and dV."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    KEYS: ll.constexpr = state.BLOCK_N // state.CONSUMERS
    S_LAYOUT: ll.constexpr = accumulator_layout(KEYS)
    rows = m * BLOCK_M + ll.arange(0, BLOCK_M, ll.SliceLayout(1, S_LAYOUT))
    inside = rows < state.seq_q
    lse2 = ll.load(state.lse_ptr + bh * state.seq_q + rows, mask=inside, other=float("inf")) * LOG2E
    delta = ll.load(state.delta_ptr + bh * state.seq_q + rows, mask=inside, other=0.0)
    mbarrier.wait(state.ready.index(ring_slot(step, state.STAGES)), ring_phase(step, state.STAGES))
    k = unhoisted(state.k_smem, step, state.heads)
    v = unhoisted(state.v_smem, step, state.heads)
    s, dp = issue_scores(state, ring_slot(step, state.STAGES), k, v, WG)
    if PREVIOUS:
        dv, dk, dq = issue_gradients(state, ring_slot(step - 1, state.STAGES), k, dk, dv, WG)
        s = ll.warpgroup_mma_wait(4, deps=[s])
    else:
        s = ll.warpgroup_mma_wait(1, deps=[s])
    p = ll.exp2(ll.fma(s, qk_scale, -lse2[:, None]))
    if MASKED:
        p = masked(state, p, m, key0 + WG * KEYS, S_LAYOUT)
    dtype: ll.constexpr = state.q_desc.dtype
    if PREVIOUS:
        dp = ll.warpgroup_mma_wait(3, deps=[dp])
    else:
        dp = ll.warpgroup_mma_wait(0, deps=[dp])
    ds = (p * (dp - delta[:, None])).to(dtype)
    p = p.to(dtype)
    if PREVIOUS:
        dv, dk, dq = ll.warpgroup_mma_wait(0, deps=[dv, dk, dq])
        retire_gradients(state, step - 1, dq, k, batch, kv_head, first, per_head, WG)
    share_scores(state, step, p, ds, WG)
    return dk, dv


@ll.jit
def pipelined_walk(state, batch, kv_head, key0, first, unmasked, end, dk, dv, qk_scale, WG: ll.constexpr):
    """The consumer's walk (backward.py's `consumer` loops, pipelined): the first step
    alone, then every other, then the last step's gradients. Returns dK and dV."""
    per_head = end - first  # >= 1: see the module's docstring
    head0 = batch * state.heads + kv_head * state.kv_group
    dk, dv = pipelined_step(state, 0, first, head0, batch, kv_head, key0, first, per_head, dk, dv, qk_scale,
                            WG, True, False)
    for g in range(0, state.kv_group):
        bh = head0 + g
        start = first + 1 - ll.minimum(g, 1)  # the group's first head starts after step 0
        for m in ll.range(start, unmasked, rematerialize=True):
            dk, dv = pipelined_step(state, g * per_head + m - first, m, bh, batch, kv_head, key0, first, per_head,
                                    dk, dv, qk_scale, WG, True, True)
        for m in ll.range(ll.maximum(start, unmasked), end, rematerialize=True):
            dk, dv = pipelined_step(state, g * per_head + m - first, m, bh, batch, kv_head, key0, first, per_head,
                                    dk, dv, qk_scale, WG, False, True)
    last = state.kv_group * per_head - 1
    k = unhoisted(state.k_smem, last, state.heads)
    dv, dk, dq = issue_gradients(state, ring_slot(last, state.STAGES), k, dk, dv, WG)
    dv, dk, dq = ll.warpgroup_mma_wait(0, deps=[dv, dk, dq])
    retire_gradients(state, last, dq, k, batch, kv_head, first, per_head, WG)
    return dk, dv
