"""Attention forward as a Triton user writes it (the fused-attention tutorial's structure:
online softmax over key blocks, a causal pass split into the blocks left of the diagonal
and the masked diagonal blocks), with a host wrapper. Only the import differs from Triton,
so benchmarks/highlevel_attention.py compiles this same source with Triton too.

    attention_kernel[(cdiv(n_ctx, BLOCK_M), Z * H)](q, k, v, out, lse, sm_scale, <q, k, v, out strides>,
                                                    H, n_ctx, HEAD_DIM=..., BLOCK_M=..., BLOCK_N=...,
                                                    CAUSAL=..., EVEN=n_ctx % BLOCK_M == 0)

Block pointers walk the key blocks (`tl.advance`); K is read as K^T, [HEAD_DIM, BLOCK_N]
blocks whose HEAD_DIM (the first dot's K) is contiguous. The passes load Q, K and V by
TMA (stage_block_pointers: K^T a box of K read through a transposed view), ring K and V
when launched with num_stages (split into a TMA producer and consumers where the default
split pays, head_dim 128 at 8 warps), and feed P to the second dot from the first dot's
registers; block_pointer_tma=False keeps the pointer loads, K and V then staged by cp.async.
"""

from __future__ import annotations

from .. import highlevel as tl
from ..runtime.host_arrays import element_strides, is_torch


@tl.jit
def _attention_blocks(acc, l_i, m_i, q, k_block, v_block, start_m, qk_scale, n_ctx, offs_m, offs_n,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr, EVEN: tl.constexpr):
    """acc, l_i, m_i updated by the key blocks of STAGE: 1 left of the diagonal, 2 on it
    (masked), 3 all of them. k_block is K^T: [HEAD_DIM, BLOCK_N] blocks."""
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
        lo = tl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, n_ctx
    k_block = tl.advance(k_block, (0, lo))
    v_block = tl.advance(v_block, (lo, 0))
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        if EVEN:
            k = tl.load(k_block)
        else:
            k = tl.load(k_block, boundary_check=(1,), padding_option="zero")
        qk = tl.dot(q, k)
        if STAGE == 2:
            qk = tl.where(offs_m[:, None] >= (start_n + offs_n)[None, :], qk * qk_scale, -1.0e6)
        else:
            qk = qk * qk_scale
            if not EVEN:
                qk = tl.where((start_n + offs_n)[None, :] < n_ctx, qk, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if EVEN:
            v = tl.load(v_block)
        else:
            v = tl.load(v_block, boundary_check=(0,), padding_option="zero")
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
        k_block = tl.advance(k_block, (0, BLOCK_N))
        v_block = tl.advance(v_block, (BLOCK_N, 0))
    return acc, l_i, m_i


@tl.jit
def attention_kernel(Q, K, V, Out, Lse, sm_scale,
                     stride_qz, stride_qh, stride_qm, stride_qd,
                     stride_kz, stride_kh, stride_kn, stride_kd,
                     stride_vz, stride_vh, stride_vn, stride_vd,
                     stride_oz, stride_oh, stride_om, stride_od,
                     H, n_ctx, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, EVEN: tl.constexpr):
    """Out[z, h] = softmax(Q K^T * sm_scale) V for one BLOCK_M block of query rows, and
    Lse = the rows' log2-sum-exp2 of the scaled scores (what a backward pass reads)."""
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    off_z = (off_zh // H).to(tl.int64)
    off_h = (off_zh % H).to(tl.int64)
    q_block = tl.make_block_ptr(Q + off_z * stride_qz + off_h * stride_qh, shape=(n_ctx, HEAD_DIM),
                                strides=(stride_qm, stride_qd), offsets=(start_m * BLOCK_M, 0),
                                block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    # K read transposed: [HEAD_DIM, BLOCK_N] blocks of K^T, HEAD_DIM contiguous.
    k_block = tl.make_block_ptr(K + off_z * stride_kz + off_h * stride_kh, shape=(HEAD_DIM, n_ctx),
                                strides=(stride_kd, stride_kn), offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N),
                                order=(0, 1))
    v_block = tl.make_block_ptr(V + off_z * stride_vz + off_h * stride_vh, shape=(n_ctx, HEAD_DIM),
                                strides=(stride_vn, stride_vd), offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM),
                                order=(1, 0))
    o_block = tl.make_block_ptr(Out + off_z * stride_oz + off_h * stride_oh, shape=(n_ctx, HEAD_DIM),
                                strides=(stride_om, stride_od), offsets=(start_m * BLOCK_M, 0),
                                block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # exp2 in place of exp: scale by 1 / ln(2)
    if EVEN:
        q = tl.load(q_block)
    else:
        q = tl.load(q_block, boundary_check=(0,), padding_option="zero")
    if CAUSAL:
        acc, l_i, m_i = _attention_blocks(acc, l_i, m_i, q, k_block, v_block, start_m, qk_scale, n_ctx, offs_m,
                                          offs_n, BLOCK_M, BLOCK_N, 1, EVEN)
        acc, l_i, m_i = _attention_blocks(acc, l_i, m_i, q, k_block, v_block, start_m, qk_scale, n_ctx, offs_m,
                                          offs_n, BLOCK_M, BLOCK_N, 2, EVEN)
    else:
        acc, l_i, m_i = _attention_blocks(acc, l_i, m_i, q, k_block, v_block, start_m, qk_scale, n_ctx, offs_m,
                                          offs_n, BLOCK_M, BLOCK_N, 3, EVEN)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    if EVEN:
        tl.store(Lse + off_zh * n_ctx + offs_m, m_i)
        tl.store(o_block, acc.to(Out.dtype.element_ty))
    else:
        tl.store(Lse + off_zh * n_ctx + offs_m, m_i, mask=offs_m < n_ctx)
        tl.store(o_block, acc.to(Out.dtype.element_ty), boundary_check=(0,))


def attention(q, k, v, causal: bool = False, sm_scale: float | None = None, block=(128, 64), num_warps: int = 8,
              num_stages: int | None = None, kernel=None, dot_ahead: bool | None = None, **options):
    """softmax(q k^T * sm_scale) v over [Z, H, n_ctx, HEAD_DIM] arrays (fp16 or bf16), and
    the rows' log2-sum-exp2; `kernel` another compiler's launchable attention_kernel (the
    benchmark passes Triton's), else this module's; `dot_ahead` weft's launch option
    (issue_dot_ahead: the next block's Q K^T issued before this block's softmax);
    `options` further weft launch options (block_pointer_tma=False: K and V by cp.async)."""
    z, h, n_ctx, head_dim = q.shape
    sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
    block_m, block_n = block
    if causal and block_m % block_n:
        raise ValueError(f"attention: causal blocks need BLOCK_M a multiple of BLOCK_N, found {block}")
    if is_torch(q):
        import torch

        out = torch.empty_like(q)
        lse = torch.empty((z, h, n_ctx), device=q.device, dtype=torch.float32)
    else:
        import numpy as np

        out = np.empty_like(q)
        lse = np.empty((z, h, n_ctx), np.float32)
    grid = (-(-n_ctx // block_m), z * h)
    options = {"num_warps": num_warps, **({} if num_stages is None else {"num_stages": num_stages}),
               **({} if dot_ahead is None else {"dot_ahead": dot_ahead}), **options}
    (kernel or attention_kernel)[grid](q, k, v, out, lse, float(sm_scale), *element_strides(q), *element_strides(k),
                                       *element_strides(v), *element_strides(out), h, n_ctx, HEAD_DIM=head_dim,
                                       BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                                       EVEN=n_ctx % block_m == 0 and n_ctx % block_n == 0, **options)
    return out, lse
