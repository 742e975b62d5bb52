"""Attention forward over tensor descriptors, as Triton's fused-attention tutorial now
writes it: Q, K, V and O are 2-D descriptors over [Z * H * n_ctx, HEAD_DIM] (the heads
stacked along the rows), each block a `desc.load([row, 0])`, and the key loop a helper
called once (all key blocks) or twice (causal: the blocks left of the diagonal, then the
masked diagonal blocks). Only the import differs from Triton, so
benchmarks/highlevel_attention.py compiles this same source with Triton too.

    attention_kernel[(cdiv(n_ctx, BLOCK_M), Z * H)](desc_q, desc_k, desc_v, desc_o, out, lse, sm_scale,
                                                    n_ctx, HEAD_DIM=..., BLOCK_M=..., BLOCK_N=..., CAUSAL=...,
                                                    EVEN=n_ctx % BLOCK_M == 0, WARP_SPECIALIZE=...)

The key loop's K and V boxes are read by wgmma where TMA put them: launched with
num_stages, the passes ring them (pipeline_tma_loops), and a producer partition fills
the rings (pipeline_tma_warp_specialize) where WARP_SPECIALIZE is True, or is None and
the boxes are large enough for the split to pay (head_dim 128 at 8 warps); False keeps
one partition. The rows of a head
end at n_ctx: past it a box holds the next head's rows, so the scores of key columns past
n_ctx are masked and, when n_ctx is not a multiple of BLOCK_M, O is stored through masked
pointers rather than the descriptor.
"""

from __future__ import annotations

import numpy as np

from .. import highlevel as tl
from .tools.tensor_descriptor import TensorDescriptor


@tl.jit
def _key_blocks(acc, l_i, m_i, q, desc_k, desc_v, head_row, start_m, qk_scale, n_ctx, offs_m, offs_n,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr, EVEN: tl.constexpr,
                WARP_SPECIALIZE: tl.constexpr):
    """acc, l_i, m_i updated by the key blocks of STAGE: 1 left of the diagonal, 2 on it
    (masked), 3 all of them. Key rows are read at head_row + start_n."""
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
        lo = tl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, n_ctx
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([head_row + start_n, 0]).T
        qk = tl.dot(q, k)
        if STAGE == 2:
            visible = offs_m[:, None] >= (start_n + offs_n)[None, :]
            qk = tl.where(visible, qk * qk_scale, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_ij[:, None])
        else:
            if not EVEN:  # key columns past n_ctx are the next head's
                qk = tl.where((start_n + offs_n)[None, :] < n_ctx, qk, -1.0e6)
            # The scale applied to the row max and inside the exponent: one fma an element.
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([head_row + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@tl.jit
def attention_kernel(desc_q, desc_k, desc_v, desc_o, Out, Lse, sm_scale, n_ctx, HEAD_DIM: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, EVEN: tl.constexpr,
                     WARP_SPECIALIZE: tl.constexpr):
    """Out[z, h] = softmax(Q K^T * sm_scale) V for one BLOCK_M block of query rows, and
    Lse = the rows' log2-sum-exp2 of the scaled scores. Out is the contiguous array
    desc_o describes (its rows written through pointers when n_ctx has a tail)."""
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    head_row = off_zh * n_ctx
    q_row = head_row + start_m * BLOCK_M
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504  # exp2 in place of exp: scale by 1 / ln(2)
    q = desc_q.load([q_row, 0])
    if CAUSAL:
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, desc_k, desc_v, head_row, start_m, qk_scale, n_ctx, offs_m,
                                    offs_n, BLOCK_M, BLOCK_N, 1, EVEN, WARP_SPECIALIZE)
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, desc_k, desc_v, head_row, start_m, qk_scale, n_ctx, offs_m,
                                    offs_n, BLOCK_M, BLOCK_N, 2, EVEN, WARP_SPECIALIZE)
    else:
        acc, l_i, m_i = _key_blocks(acc, l_i, m_i, q, desc_k, desc_v, head_row, start_m, qk_scale, n_ctx, offs_m,
                                    offs_n, BLOCK_M, BLOCK_N, 3, EVEN, WARP_SPECIALIZE)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    if EVEN:
        tl.store(Lse + off_zh * n_ctx + offs_m, m_i)
        desc_o.store([q_row, 0], acc.to(desc_o.dtype))
    else:  # rows past n_ctx belong to the next head: keep them out
        inside = offs_m < n_ctx
        tl.store(Lse + off_zh * n_ctx + offs_m, m_i, mask=inside)
        offs_d = tl.arange(0, HEAD_DIM)
        rows = Out + (head_row + offs_m).to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(rows, acc.to(Out.dtype.element_ty), mask=inside[:, None])


def attention(q, k, v, causal: bool = False, sm_scale: float | None = None, block=(128, 64), num_warps: int = 8,
              num_stages: int | None = 3, warp_specialize: bool | None = None, kernel=None, descriptor=None,
              **options):
    """softmax(q k^T * sm_scale) v over contiguous [Z, H, n_ctx, HEAD_DIM] arrays (fp16 or
    bf16), and the rows' log2-sum-exp2. `warp_specialize`: the key loops' tl.range flag
    (None: the compiler's default). `kernel`: another compiler's launchable
    attention_kernel (the benchmark passes Triton's) with `descriptor` its host
    TensorDescriptor class; `options`: further launch options (weft's `pingpong`...)."""
    z, h, n_ctx, head_dim = q.shape
    sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
    block_m, block_n = block
    if causal and block_m % block_n:
        raise ValueError(f"attention: causal blocks need BLOCK_M a multiple of BLOCK_N, found {block}")
    if any(not _contiguous(t) for t in (q, k, v)):
        raise ValueError("attention: q, k and v must be contiguous (the descriptors stack the heads' rows)")
    descriptor = descriptor or TensorDescriptor
    if isinstance(q, np.ndarray):  # the CPU emulator's host arrays
        out, lse = np.empty_like(q), np.empty((z, h, n_ctx), np.float32)
    else:
        import torch

        out = torch.empty_like(q)
        lse = torch.empty((z, h, n_ctx), device=q.device, dtype=torch.float32)
    rows = z * h * n_ctx

    def described(t, box_rows):
        return descriptor(t, [rows, head_dim], [head_dim, 1], [box_rows, head_dim])

    grid = (-(-n_ctx // block_m), z * h)
    launch = {"num_warps": num_warps, **({} if num_stages is None else {"num_stages": num_stages}), **options}
    (kernel or attention_kernel)[grid](described(q, block_m), described(k, block_n), described(v, block_n),
                                       described(out, block_m), out, lse, float(sm_scale), n_ctx,
                                       HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                                       EVEN=n_ctx % block_m == 0 and n_ctx % block_n == 0,
                                       WARP_SPECIALIZE=warp_specialize, **launch)
    return out, lse


def _contiguous(t) -> bool:
    return t.flags["C_CONTIGUOUS"] if isinstance(t, np.ndarray) else t.is_contiguous()
