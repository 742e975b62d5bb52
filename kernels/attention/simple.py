"""The simple flash-attention forward kernel (SimpleConfig): a baseline for
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
from .state import Rings
from .tiles import key_tiles


@ll.jit
def tile_coordinates(state):
    """(batch, head, kv head, first row) of this CTA's tile (`state`: a Simple); causal
    grids start with the bottom tiles, which see the most keys."""
    pid_m = ll.program_id(0)
    if state.CAUSAL:
        pid_m = state.num_m_tiles - 1 - pid_m
    bh = ll.program_id(1)
    head = bh % state.heads
    return bh // state.heads, head, head // state.kv_group, pid_m * state.BLOCK_M


@ll.constexpr_function
def accumulator_layout(warps, columns):
    """The wgmma accumulator layout of the consumers' [BLOCK_M, columns] tile (S, P or O):
    `warps` warps of 16 rows each."""
    return ll.NVMMADistributedLayout([3, 0], [warps, 1], [16, columns, 16])


@ll.aggregate
class Simple:
    """What the simple kernel's partitions share (flash_attention_forward's parameters,
    named as there): the descriptors, the Q buffer and its barrier, the K/V ring (no
    turns: one consumer partition) and the problem's sizes."""
    q_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    o_desc: tma.tensor_descriptor
    q_smem: ll.shared_memory_descriptor
    q_ready: ll.shared_memory_descriptor
    rings: Rings
    lse_ptr: ll.tensor
    softmax_scale: ll.tensor
    seq_q: ll.tensor
    seq_k: ll.tensor
    heads: ll.tensor
    kv_group: ll.tensor
    num_m_tiles: ll.tensor
    BLOCK_M: ll.constexpr
    BLOCK_N: ll.constexpr
    HEAD_DIM: ll.constexpr
    CAUSAL: ll.constexpr
    WRITE_LSE: ll.constexpr
    NUM_WARPS: ll.constexpr


@ll.aggregate
class QueryRows:
    """The CTA's query rows as each key step sees them (`attend_tile`): the Q tile, its
    first row and softmax_scale * log2(e)."""
    q: ll.shared_memory_descriptor
    off_m: ll.tensor
    qk_scale: ll.tensor


@ll.jit
def attention_producer(state):
    """Load Q, then every K/V tile the consumers need, as slots free up."""
    rings = state.rings
    HEAD_DIM: ll.constexpr = state.HEAD_DIM
    BLOCK_N: ll.constexpr = state.BLOCK_N
    batch, head, kv_head, off_m = tile_coordinates(state)
    mbarrier.expect(state.q_ready, state.q_desc.nbytes * (HEAD_DIM // state.q_desc.block_shape[3]))
    load_boxes(state.q_desc, batch, head, off_m, state.q_ready, state.q_smem, HEAD_DIM)
    full, count = key_tiles(state, off_m, state.BLOCK_M)
    tile_bytes: ll.constexpr = state.k_desc.nbytes * (HEAD_DIM // state.k_desc.block_shape[3])
    for n in range(0, count):
        slot = n % rings.STAGES
        phase = ((n // rings.STAGES) & 1) ^ 1  # a fresh `empty` barrier counts as released
        mbarrier.wait(rings.k_empty.index(slot), phase)
        mbarrier.expect(rings.k_ready.index(slot), tile_bytes)
        load_boxes(state.k_desc, batch, kv_head, n * BLOCK_N, rings.k_ready.index(slot), rings.k.index(slot),
                   HEAD_DIM)
        mbarrier.wait(rings.v_empty.index(slot), phase)
        mbarrier.expect(rings.v_ready.index(slot), tile_bytes)
        load_boxes(state.v_desc, batch, kv_head, n * BLOCK_N, rings.v_ready.index(slot), rings.v.index(slot),
                   HEAD_DIM)


@ll.jit
def attend_tile(state, query, n, acc, m_i, l_i, MASKED: ll.constexpr):
    """Key tile n of the online softmax for the CTA's rows (`query`, a QueryRows): S = Q K^T,
    rescale O (`acc`), m and l, then O += P V. Returns (O, m, l)."""
    q, off_m, qk_scale = query.q, query.off_m, query.qk_scale
    rings = state.rings
    BLOCK_M: ll.constexpr = state.BLOCK_M
    BLOCK_N: ll.constexpr = state.BLOCK_N
    S_LAYOUT: ll.constexpr = accumulator_layout(state.NUM_WARPS, BLOCK_N)
    O_LAYOUT: ll.constexpr = accumulator_layout(state.NUM_WARPS, state.HEAD_DIM)
    slot = n % rings.STAGES
    phase = (n // rings.STAGES) & 1
    mbarrier.wait(rings.k_ready.index(slot), phase)
    k = rings.k.index(slot).index(0).index(0)  # [BLOCK_N, HEAD_DIM], K-major for Q K^T
    s = ll.warpgroup_mma(q, k.permute((1, 0)), ll.zeros([BLOCK_M, BLOCK_N], ll.float32, S_LAYOUT),
                         use_acc=False, is_async=True)
    s = ll.warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(rings.k_empty.index(slot))
    if MASKED:
        cols = n * BLOCK_N + ll.arange(0, BLOCK_N, ll.SliceLayout(0, S_LAYOUT))
        visible = cols[None, :] < state.seq_k
        if state.CAUSAL:
            rows = off_m + ll.arange(0, BLOCK_M, ll.SliceLayout(1, S_LAYOUT))
            visible = visible & (cols[None, :] <= rows[:, None] + (state.seq_k - state.seq_q))
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
    mbarrier.wait(rings.v_ready.index(slot), phase)
    acc = ll.warpgroup_mma(p_op, rings.v.index(slot).index(0).index(0), acc, is_async=True)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    mbarrier.arrive(rings.v_empty.index(slot))
    return acc, m_new, l_i


@ll.jit
def attention_consumer(state):
    """Softmax(Q K^T * scale) V for this CTA's rows, online over the key tiles."""
    BLOCK_M: ll.constexpr = state.BLOCK_M
    BLOCK_N: ll.constexpr = state.BLOCK_N
    HEAD_DIM: ll.constexpr = state.HEAD_DIM
    NUM_WARPS: ll.constexpr = state.NUM_WARPS
    seq_q = state.seq_q
    S_LAYOUT: ll.constexpr = accumulator_layout(NUM_WARPS, BLOCK_N)
    O_LAYOUT: ll.constexpr = accumulator_layout(NUM_WARPS, HEAD_DIM)
    ROW: ll.constexpr = ll.SliceLayout(1, S_LAYOUT)
    batch, head, kv_head, off_m = tile_coordinates(state)
    full, count = key_tiles(state, off_m, BLOCK_M)
    qk_scale = state.softmax_scale * LOG2E
    m_i = ll.full([BLOCK_M], float("-inf"), ll.float32, ROW)
    l_i = ll.zeros([BLOCK_M], ll.float32, ROW)
    acc = ll.zeros([BLOCK_M, HEAD_DIM], ll.float32, O_LAYOUT)
    q = state.q_smem.index(0).index(0)
    mbarrier.wait(state.q_ready, 0)
    query = QueryRows(q, off_m, qk_scale)
    for n in range(0, full):
        acc, m_i, l_i = attend_tile(state, query, n, acc, m_i, l_i, False)
    for n in range(full, count):
        acc, m_i, l_i = attend_tile(state, query, n, acc, m_i, l_i, True)
    # Rows that saw no key (causal, seq_q > seq_k) output 0 with log-sum-exp +inf, as
    # FlashAttention does.
    seen = l_i > 0.0
    inv_l = ll.where(seen, 1.0 / ll.where(seen, l_i, 1.0), 0.0)
    out = acc * ll.convert_layout(inv_l, ll.SliceLayout(1, O_LAYOUT))[:, None]
    q.store(out.to(q.dtype))  # the Q tile is no longer read: reuse it for O
    ll.fence_async_shared()
    store_boxes(state.o_desc, batch, head, off_m, state.q_smem, HEAD_DIM)
    if state.WRITE_LSE:
        rows = off_m + ll.arange(0, BLOCK_M, ROW)
        lse = ll.where(seen, (m_i + ll.log2(ll.where(seen, l_i, 1.0))) * LN2, float("inf"))
        ll.store(state.lse_ptr + (batch * state.heads + head) * seq_q + rows, lse, mask=rows < seq_q)
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
    # One consumer partition: it takes no turns, and releases each slot once (no warps
    # apart, no cluster).
    rings = Rings(k_ring, v_ring, k_ready, k_empty, v_ready, v_empty, turns=None, STAGES=STAGES, CONSUMERS=1,
                  PER_WARP=False, CLUSTER=1)
    state = Simple(q_desc, k_desc, v_desc, o_desc, q_smem, q_ready, rings, lse_ptr, softmax_scale, seq_q, seq_k,
                   heads, kv_group, num_m_tiles, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, WRITE_LSE, NUM_WARPS)
    ll.warp_specialize((state,), attention_consumer, (state,), [attention_producer],
                       worker_num_warps=[4], worker_num_regs=[PRODUCER_REGS], default_num_regs=CONSUMER_REGS)
    mbarrier.invalidate(q_ready)
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(s))
        mbarrier.invalidate(k_empty.index(s))
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(v_empty.index(s))
