"""The simple flash-attention forward kernel (Config(variant="simple")): a baseline for
the FA3 kernel in kernels.py, with none of its overlaps.

One CTA computes O for BLOCK_M query rows of one (batch, head):

- a producer partition (4 warps at a few registers, one thread issuing TMA) loads the
  Q tile once, then streams K and V tiles through a ring of STAGES slots, each slot
  guarded by a `ready` mbarrier (the TMA bytes land on it) and an `empty` one (the
  consumers release it);
- the default partition, two consumer warpgroups of 64 rows each, computes S = Q K^T
  with async wgmma from shared memory, the online softmax in the wgmma accumulator's
  registers (row max and sum reduce over the 4 lanes holding a row; exp2 with
  log2(e) * scale folded into one FMA), and O += P V with P fed to wgmma from registers;
  then O / l goes out through shared memory (the Q buffer) by TMA, the log-sum-exp by
  plain stores.

Tensors are seen through 4-D TMA descriptors [batch, heads, seq, head_dim] whose boxes
are [1, 1, rows, 64]: a box never crosses a (batch, head) boundary, rows past the
sequence load as zeros and are not stored, and any strides work (both the bhsd and bshd
layouts). Head dims above 64 are several 64-wide boxes side by side in one buffer.

Causal attention is aligned bottom-right (query i sees keys j <= i + seq_k - seq_q):
K tiles wholly above the diagonal are never loaded, and only tiles crossing the
diagonal or the end of the keys pay for masks.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .kernels import LN2, LOG2E, load_boxes, store_boxes  # shared with the FA3 kernel
from .tiles import key_tiles


@ll.jit
def tile_coordinates(heads, kv_group, BLOCK_M: ll.constexpr, num_m_tiles, CAUSAL: ll.constexpr):
    """(batch, head, kv head, first row) of this CTA's tile; causal grids start with the
    bottom tiles, which see the most keys."""
    pid_m = ll.program_id(0)
    if CAUSAL:
        pid_m = num_m_tiles - 1 - pid_m
    bh = ll.program_id(1)
    head = bh % heads
    return bh // heads, head, head // kv_group, pid_m * BLOCK_M


@ll.jit
def attention_producer(q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_ready,
                       k_ready, k_empty, v_ready, v_empty, seq_q, seq_k, heads, kv_group,
                       num_m_tiles, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                       HEAD_DIM: ll.constexpr, STAGES: ll.constexpr, CAUSAL: ll.constexpr):
    """Load Q, then every K/V tile the consumers need, as slots free up."""
    batch, head, kv_head, off_m = tile_coordinates(heads, kv_group, BLOCK_M, num_m_tiles, CAUSAL)
    mbarrier.expect(q_ready, q_desc.nbytes * (HEAD_DIM // q_desc.block_shape[3]))
    load_boxes(q_desc, batch, head, off_m, q_ready, q_smem, HEAD_DIM)
    full, count = key_tiles(off_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    tile_bytes: ll.constexpr = k_desc.nbytes * (HEAD_DIM // k_desc.block_shape[3])
    for n in range(0, count):
        slot = n % STAGES
        phase = ((n // STAGES) & 1) ^ 1  # a fresh `empty` barrier counts as released
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), tile_bytes)
        load_boxes(k_desc, batch, kv_head, n * BLOCK_N, k_ready.index(slot), k_ring.index(slot), HEAD_DIM)
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), tile_bytes)
        load_boxes(v_desc, batch, kv_head, n * BLOCK_N, v_ready.index(slot), v_ring.index(slot), HEAD_DIM)


@ll.jit
def attend_tile(n, q, k_ring, v_ring, k_ready, k_empty, v_ready, v_empty, acc, m_i, l_i,
                qk_scale, off_m, seq_q, seq_k, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                STAGES: ll.constexpr, CAUSAL: ll.constexpr, MASKED: ll.constexpr,
                S_LAYOUT: ll.constexpr, O_LAYOUT: ll.constexpr):
    """One K/V tile of the online softmax: S = Q K^T, rescale, O += P V."""
    slot = n % STAGES
    phase = (n // STAGES) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    k = k_ring.index(slot).index(0).index(0)  # [BLOCK_N, HEAD_DIM], K-major for Q K^T
    s = ll.warpgroup_mma(q, k.permute((1, 0)), ll.zeros([BLOCK_M, BLOCK_N], ll.float32, S_LAYOUT),
                         use_acc=False, is_async=True)
    s = ll.warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(slot))
    if MASKED:
        cols = n * BLOCK_N + ll.arange(0, BLOCK_N, ll.SliceLayout(0, S_LAYOUT))
        visible = cols[None, :] < seq_k
        if CAUSAL:
            rows = off_m + ll.arange(0, BLOCK_M, ll.SliceLayout(1, S_LAYOUT))
            visible = visible & (cols[None, :] <= rows[:, None] + (seq_k - seq_q))
        s = ll.where(visible, s, float("-inf"))
    # Row maxima in log2 units; rows that have seen no key yet keep m = -inf, and
    # subtract 0 instead so that their (all masked) p and alpha come out 0, not NaN.
    m_new = ll.maximum(m_i, ll.max(s, axis=1) * qk_scale)
    m_use = ll.where(m_new == float("-inf"), 0.0, m_new)
    p = ll.exp2(ll.fma(s, qk_scale, -m_use[:, None]))
    alpha = ll.exp2(m_i - m_use)
    l_i = l_i * alpha + ll.sum(p, axis=1)
    acc = acc * ll.convert_layout(alpha, ll.SliceLayout(1, O_LAYOUT))[:, None]
    p_op = ll.convert_layout(p.to(q.dtype), ll.DotOperandLayout(0, O_LAYOUT, 2))
    mbarrier.wait(v_ready.index(slot), phase)
    acc = ll.warpgroup_mma(p_op, v_ring.index(slot).index(0).index(0), acc, is_async=True)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(v_empty.index(slot))
    return acc, m_new, l_i


@ll.jit
def attention_consumer(o_desc, q_smem, k_ring, v_ring, q_ready, k_ready, k_empty, v_ready,
                       v_empty, lse_ptr, softmax_scale, seq_q, seq_k, heads, kv_group,
                       num_m_tiles, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                       HEAD_DIM: ll.constexpr, STAGES: ll.constexpr, CAUSAL: ll.constexpr,
                       WRITE_LSE: ll.constexpr, NUM_WARPS: ll.constexpr):
    """Softmax(Q K^T * scale) V for this CTA's rows, online over the key tiles."""
    S_LAYOUT: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, BLOCK_N, 16])
    O_LAYOUT: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, HEAD_DIM, 16])
    ROW: ll.constexpr = ll.SliceLayout(1, S_LAYOUT)
    batch, head, kv_head, off_m = tile_coordinates(heads, kv_group, BLOCK_M, num_m_tiles, CAUSAL)
    full, count = key_tiles(off_m, seq_q, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    qk_scale = softmax_scale * LOG2E
    m_i = ll.full([BLOCK_M], float("-inf"), ll.float32, ROW)
    l_i = ll.zeros([BLOCK_M], ll.float32, ROW)
    acc = ll.zeros([BLOCK_M, HEAD_DIM], ll.float32, O_LAYOUT)
    q = q_smem.index(0).index(0)
    mbarrier.wait(q_ready, 0)
    for n in range(0, full):
        acc, m_i, l_i = attend_tile(n, q, k_ring, v_ring, k_ready, k_empty, v_ready, v_empty,
                                    acc, m_i, l_i, qk_scale, off_m, seq_q, seq_k, BLOCK_M,
                                    BLOCK_N, STAGES, CAUSAL, False, S_LAYOUT, O_LAYOUT)
    for n in range(full, count):
        acc, m_i, l_i = attend_tile(n, q, k_ring, v_ring, k_ready, k_empty, v_ready, v_empty,
                                    acc, m_i, l_i, qk_scale, off_m, seq_q, seq_k, BLOCK_M,
                                    BLOCK_N, STAGES, CAUSAL, True, S_LAYOUT, O_LAYOUT)
    # Rows that saw no key (causal, seq_q > seq_k) output 0 with log-sum-exp +inf, as
    # FlashAttention does.
    seen = l_i > 0.0
    inv_l = ll.where(seen, 1.0 / ll.where(seen, l_i, 1.0), 0.0)
    out = acc * ll.convert_layout(inv_l, ll.SliceLayout(1, O_LAYOUT))[:, None]
    q.store(out.to(q.dtype))  # the Q tile is no longer read: reuse it for O
    ll.fence_async_shared()
    store_boxes(o_desc, batch, head, off_m, q_smem, HEAD_DIM)
    if WRITE_LSE:
        rows = off_m + ll.arange(0, BLOCK_M, ROW)
        lse = ll.where(seen, (m_i + ll.log2(ll.where(seen, l_i, 1.0))) * LN2, float("inf"))
        ll.store(lse_ptr + (batch * heads + head) * seq_q + rows, lse, mask=rows < seq_q)
    tma.store_wait(0)


@ll.jit
def flash_attention_forward(q_desc, k_desc, v_desc, o_desc, lse_ptr, softmax_scale, seq_q,
                            seq_k, heads, kv_group, BLOCK_M: ll.constexpr, BLOCK_N: ll.constexpr,
                            HEAD_DIM: ll.constexpr, STAGES: ll.constexpr, CAUSAL: ll.constexpr,
                            WRITE_LSE: ll.constexpr, NUM_WARPS: ll.constexpr,
                            PRODUCER_REGS: ll.constexpr, CONSUMER_REGS: ll.constexpr):
    """Grid (cdiv(seq_q, BLOCK_M), batch * heads); descriptors over [batch, heads, seq, D]."""
    dtype: ll.constexpr = q_desc.dtype
    layout: ll.constexpr = q_desc.layout
    q_smem = ll.allocate_shared_memory(dtype, [1, 1, BLOCK_M, HEAD_DIM], layout)
    k_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = mbarrier.allocate_mbarrier()
    k_ready = mbarrier.allocate_mbarrier(batch=STAGES)
    k_empty = mbarrier.allocate_mbarrier(batch=STAGES)
    v_ready = mbarrier.allocate_mbarrier(batch=STAGES)
    v_empty = mbarrier.allocate_mbarrier(batch=STAGES)
    mbarrier.init(q_ready, count=1)
    for s in ll.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=1)
    num_m_tiles = ll.num_programs(0)
    ll.warp_specialize(
        (o_desc, q_smem, k_ring, v_ring, q_ready, k_ready, k_empty, v_ready, v_empty, lse_ptr,
         softmax_scale, seq_q, seq_k, heads, kv_group, num_m_tiles, BLOCK_M, BLOCK_N, HEAD_DIM,
         STAGES, CAUSAL, WRITE_LSE, NUM_WARPS), attention_consumer,
        (q_desc, k_desc, v_desc, q_smem, k_ring, v_ring, q_ready, k_ready, k_empty, v_ready,
         v_empty, seq_q, seq_k, heads, kv_group, num_m_tiles, BLOCK_M, BLOCK_N, HEAD_DIM,
         STAGES, CAUSAL), [attention_producer],
        worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS], default_num_regs=CONSUMER_REGS)
    mbarrier.invalidate(q_ready)
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(s))
        mbarrier.invalidate(k_empty.index(s))
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(v_empty.index(s))
