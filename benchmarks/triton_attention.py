"""The plain Triton flash-attention forward the attention benchmark compares against.

Written the way Triton's fused-attention tutorial writes it: one program per (query block,
batch * head), the query block held in registers while K/V blocks stream through an online
softmax (exp2, the scale folded into log2 units), both GEMMs as tl.dot. Causal attention
masks only the blocks that cross the diagonal and skips those above it; the diagonal is
aligned bottom-right (query i sees keys j <= i + seq_k - seq_q, as FlashAttention does).
Any sequence length (tails masked), head_dim 64/128/256, bf16/fp16, GQA/MQA by mapping a
query head to its K/V head. Autotuned per (seq lengths, head_dim, causal, dtype).

Only imported on the GPU machine, where Triton is installed.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634

_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
            for m in (64, 128) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3)]


def _prune(configs, named_args, **kwargs):
    """Drop configs that cannot run well: a 64-row block split over 8 warps (a warpgroup's
    wgmma covers 64 rows), more than 160 fp32 registers per thread for the O accumulator
    and the S tile (ptxas spills past that), or Q plus a K and V tile per stage over
    200 KiB of shared memory (the H200 has 227 KiB)."""
    head_dim = {**named_args, **kwargs}["HEAD_DIM"]

    def fits(config):
        m, n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
        registers = m * (head_dim + n) // (32 * config.num_warps)
        shared = 2 * head_dim * (m + 2 * config.num_stages * n)
        return not (m == 64 and config.num_warps == 8) and registers <= 160 and shared <= 200 * 1024

    return [config for config in configs if fits(config)]


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d, lo, hi,
            causal_offset, SEQ_K, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            BLOCK_N: tl.constexpr):
    """Fold keys [lo, hi) into the running (acc, l_i, m_i); m_i is the row max in log2
    units. MASKED blocks mask keys past SEQ_K and, if CAUSAL, keys right of the diagonal."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        k_ptrs = k_base + keys[:, None] * stride_ks + offs_d[None, :]
        v_ptrs = v_base + keys[:, None] * stride_vs + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=(keys < SEQ_K)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            visible = (keys < SEQ_K)[None, :]
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None] + causal_offset)
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_sub = m_new
        if MASKED:  # a row with no visible key so far keeps m = -inf: subtract 0, not -inf
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=(keys < SEQ_K)[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_CONFIGS, key=["SEQ_Q", "SEQ_K", "HEAD_DIM", "CAUSAL"],
                 prune_configs_by={"early_config_prune": _prune}, cache_results=True)
@triton.jit
def _attention_forward(q_ptr, k_ptr, v_ptr, o_ptr,
                       stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                       stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
                       heads, group, SEQ_Q, SEQ_K, qk_scale,
                       HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // heads).to(tl.int64)
    head = (batch_head % heads).to(tl.int64)
    kv_head = head // group
    q_base = q_ptr + batch * stride_qb + head * stride_qh
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh
    o_base = o_ptr + batch * stride_ob + head * stride_oh

    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < SEQ_Q
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=rows[:, None], other=0.0)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    # Keys below `unmasked_end` are visible to every row of the block and inside SEQ_K;
    # keys in [unmasked_end, hi) need masks; keys past hi are invisible to the whole block.
    unmasked_end = (SEQ_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        causal_offset = SEQ_K - SEQ_Q
        hi = tl.minimum(SEQ_K, tl.maximum((block + 1) * BLOCK_M + causal_offset, 0))
        first_row_sees = tl.maximum(block * BLOCK_M + causal_offset + 1, 0)
        unmasked_end = tl.minimum(unmasked_end, (first_row_sees // BLOCK_N) * BLOCK_N)
    else:
        causal_offset = 0
        hi = SEQ_K
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
                            0, unmasked_end, causal_offset, SEQ_K, qk_scale,
                            MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, offs_m, offs_d,
                            unmasked_end, hi, causal_offset, SEQ_K, qk_scale,
                            MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # rows that see no key (causal, seq_q > seq_k) give 0
    out = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=rows[:, None])


def attention(q, k, v, causal=False, softmax_scale=None):
    """softmax(q k^T * scale) v for (batch, heads, seq, head_dim) CUDA tensors; k and v may
    have fewer heads (dividing q's). Returns a tensor like q."""
    import torch

    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    if head_dim not in (64, 128, 256):
        raise ValueError(f"head_dim must be 64, 128 or 256, got {head_dim}")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must all be bf16 or all fp16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim or heads % kv_heads:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit q {tuple(q.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.empty_like(q)
    grid = lambda meta: (triton.cdiv(seq_q, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    _attention_forward[grid](q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                             *out.stride()[:3], heads, heads // kv_heads, seq_q, seq_k, scale * LOG2E,
                             HEAD_DIM=head_dim, CAUSAL=bool(causal))
    return out
