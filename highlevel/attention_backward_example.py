"""Attention backward as a Triton user writes it (the fused-attention tutorial's structure:
a preprocess kernel for delta = rowsum(dO * O), then one launch in which program i
computes dK and dV for key block i, walking the query blocks, and dQ for query block i,
walking the key blocks), with a host wrapper. Only the import differs from Triton, so
benchmarks/triton_attention_backward.py compiles this same source with Triton.

K is pre-scaled by scale * log2(e) on the host, so P = exp2(Q K'^T - LSE * log2(e)); dQ
is scaled back by ln(2) and dK by the softmax scale. The diagonal blocks of a causal
mask are walked in half-size masked steps, the rest unmasked. The tutorial's blocks and
launch: 32 x 128 for dK/dV, 128 x 32 for dQ, 4 warps, 5 stages. Its limits are the
tutorial's: seq_q == seq_k, a multiple of 128, as many K/V heads as query heads.
"""

from __future__ import annotations

from .. import highlevel as tl
from ..runtime.host_arrays import is_torch

LOG2E = 1.4426950408889634
BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2 = 32, 128, 128, 32
DIAGONAL_SPLIT = 2  # diagonal blocks are walked in steps this many times smaller
PREPROCESS_ROWS = 128


@tl.jit
def row_deltas(o_ptr, do_ptr, delta_ptr, seq, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    head = tl.program_id(1)
    offsets = head * seq * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(o_ptr + offsets).to(tl.float32)
    do = tl.load(do_ptr + offsets).to(tl.float32)
    tl.store(delta_ptr + head * seq + rows, tl.sum(o * do, axis=1))


@tl.jit
def _key_block_grads(dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, keys, first_query, steps,
                     ROWS: tl.constexpr, KEYS: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):
    """dK and dV of one key block over `steps` query blocks of ROWS from first_query."""
    cols = tl.arange(0, HEAD_DIM)
    queries = first_query + tl.arange(0, ROWS)
    q_t_ptrs = q_ptr + queries[None, :] * HEAD_DIM + cols[:, None]
    do_ptrs = do_ptr + queries[:, None] * HEAD_DIM + cols[None, :]
    for _ in range(steps):
        q_t = tl.load(q_t_ptrs)
        lse = tl.load(lse_ptr + queries)
        p_t = tl.math.exp2(tl.dot(k, q_t) - lse[None, :])
        if MASKED:
            p_t = tl.where(queries[None, :] >= keys[:, None], p_t, 0.0)
        do = tl.load(do_ptrs)
        dv += tl.dot(p_t.to(do.dtype), do)
        delta = tl.load(delta_ptr + queries)
        dp_t = tl.dot(v, tl.trans(do)).to(tl.float32)
        ds_t = (p_t * (dp_t - delta[None, :])).to(do.dtype)
        dk += tl.dot(ds_t, tl.trans(q_t))
        queries += ROWS
        q_t_ptrs += ROWS * HEAD_DIM
        do_ptrs += ROWS * HEAD_DIM
    return dk, dv


@tl.jit
def _query_block_grad(dq, q, do, lse, delta, k_ptr, v_ptr, queries, first_key, steps,
                      ROWS: tl.constexpr, KEYS: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):
    """dQ of one query block over `steps` key blocks of KEYS from first_key."""
    cols = tl.arange(0, HEAD_DIM)
    keys = first_key + tl.arange(0, KEYS)
    k_t_ptrs = k_ptr + keys[None, :] * HEAD_DIM + cols[:, None]
    v_t_ptrs = v_ptr + keys[None, :] * HEAD_DIM + cols[:, None]
    for _ in range(steps):
        k_t = tl.load(k_t_ptrs)
        v_t = tl.load(v_t_ptrs)
        p = tl.math.exp2(tl.dot(q, k_t) - lse)
        if MASKED:
            p = tl.where(queries[:, None] >= keys[None, :], p, 0.0)
        dp = tl.dot(do, v_t).to(tl.float32)
        ds = (p * (dp - delta)).to(k_t.dtype)
        dq += tl.dot(ds, tl.trans(k_t))
        keys += KEYS
        k_t_ptrs += KEYS * HEAD_DIM
        v_t_ptrs += KEYS * HEAD_DIM
    return dq


@tl.jit
def attention_backward_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, seq, scale,
                              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, ROWS_KV: tl.constexpr,
                              KEYS_KV: tl.constexpr, ROWS_Q: tl.constexpr, KEYS_Q: tl.constexpr,
                              SPLIT: tl.constexpr):
    """dK, dV of key block program_id(0) and dQ of query block program_id(0), head
    program_id(2). K pre-scaled by scale * log2(e), lse in base 2; dQ comes out scaled by
    ln(2) (the exp2's), dK by `scale`."""
    block = tl.program_id(0)
    head = tl.program_id(2)
    base = head.to(tl.int64) * seq * HEAD_DIM
    q_ptr += base
    k_ptr += base
    v_ptr += base
    do_ptr += base
    dq_ptr += base
    dk_ptr += base
    dv_ptr += base
    lse_ptr += head * seq
    delta_ptr += head * seq
    cols = tl.arange(0, HEAD_DIM)

    # dK and dV of key block `block`.
    first_key = block * KEYS_KV
    keys = first_key + tl.arange(0, KEYS_KV)
    k = tl.load(k_ptr + keys[:, None] * HEAD_DIM + cols[None, :])
    v = tl.load(v_ptr + keys[:, None] * HEAD_DIM + cols[None, :])
    dk = tl.zeros([KEYS_KV, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([KEYS_KV, HEAD_DIM], dtype=tl.float32)
    first_query = 0
    if CAUSAL:
        first_query = first_key
        dk, dv = _key_block_grads(dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, keys, first_query,
                                  KEYS_KV // (ROWS_KV // SPLIT), ROWS_KV // SPLIT, KEYS_KV, HEAD_DIM, MASKED=True)
        first_query += KEYS_KV
    dk, dv = _key_block_grads(dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, k, v, keys, first_query,
                              (seq - first_query) // ROWS_KV, ROWS_KV, KEYS_KV, HEAD_DIM, MASKED=False)
    tl.store(dv_ptr + keys[:, None] * HEAD_DIM + cols[None, :], dv.to(dv_ptr.dtype.element_ty))
    tl.store(dk_ptr + keys[:, None] * HEAD_DIM + cols[None, :], (dk * scale).to(dk_ptr.dtype.element_ty))

    # dQ of query block `block`.
    first_query = block * ROWS_Q
    queries = first_query + tl.arange(0, ROWS_Q)
    q = tl.load(q_ptr + queries[:, None] * HEAD_DIM + cols[None, :])
    do = tl.load(do_ptr + queries[:, None] * HEAD_DIM + cols[None, :])
    lse = tl.load(lse_ptr + queries)[:, None]
    delta = tl.load(delta_ptr + queries)[:, None]
    dq = tl.zeros([ROWS_Q, HEAD_DIM], dtype=tl.float32)
    key_end = seq
    if CAUSAL:
        key_end = first_query
        dq = _query_block_grad(dq, q, do, lse, delta, k_ptr, v_ptr, queries, first_query,
                               ROWS_Q // (KEYS_Q // SPLIT), ROWS_Q, KEYS_Q // SPLIT, HEAD_DIM, MASKED=True)
    dq = _query_block_grad(dq, q, do, lse, delta, k_ptr, v_ptr, queries, 0, key_end // KEYS_Q,
                           ROWS_Q, KEYS_Q, HEAD_DIM, MASKED=False)
    dq *= 0.6931471805599453  # ln(2): the scores were base-2 (a literal: the Triton copy has no globals)
    tl.store(dq_ptr + queries[:, None] * HEAD_DIM + cols[None, :], dq.to(dq_ptr.dtype.element_ty))


def attention_backward(q, k, v, out, lse, do, causal: bool = False, softmax_scale: float | None = None,
                       num_warps: int = 4, num_stages: int | None = 5, kernels=None, issue_dots_early: bool = True,
                       sink_waits: bool = False, fit_rings: bool = True, hoist_slot_loads: bool = False):
    """(dq, dk, dv) for [batch, heads, seq, head_dim] q, k, v (fp16 or bf16; torch or numpy),
    the forward's out and natural-log lse [batch, heads, seq] (fp32), and dO. `kernels` is
    another compiler's launchable (row_deltas, attention_backward_kernel) pair (the
    benchmark passes Triton's), else this module's. `issue_dots_early=False` launches
    weft's kernel with that option (compiler/passes/issue_dots_early.py) off, `sink_waits=True`
    with that one on (compiler/passes/merge_wgmma_waits.py), `fit_rings=False` with rings
    num_stages deep where shared memory then holds fewer CTAs an SM (compiler/ring_depth.py),
    `hoist_slot_loads=True` with lse and delta read before the first dot
    (compiler/passes/hoist_slot_loads.py)."""
    batch, heads, seq, head_dim = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError("the tutorial's backward needs q, k and v of one shape (no GQA, seq_q == seq_k)")
    if seq % max(BLOCK_N1, BLOCK_M2) != 0:
        raise ValueError(f"the tutorial's backward needs seq a multiple of {max(BLOCK_N1, BLOCK_M2)}")
    deltas, kernel = kernels or (row_deltas, attention_backward_kernel)
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    if is_torch(q):
        import torch

        q, v, out, do = (x.contiguous() for x in (q, v, out, do))
        k_scaled = k * (scale * LOG2E)
        lse_base2 = (lse * LOG2E).contiguous()
        delta = torch.empty_like(lse_base2)
        empty_like = torch.empty_like
    else:
        import numpy as np

        q, v, out, do = (np.ascontiguousarray(x) for x in (q, v, out, do))
        k_scaled = (k.astype(np.float32) * (scale * LOG2E)).astype(k.dtype)
        lse_base2 = np.ascontiguousarray(lse * LOG2E, np.float32)
        delta = np.empty_like(lse_base2)
        empty_like = np.empty_like
    deltas[(seq // PREPROCESS_ROWS, batch * heads)](out, do, delta, seq, ROWS=PREPROCESS_ROWS, HEAD_DIM=head_dim)
    dq, dk, dv = empty_like(q), empty_like(k_scaled), empty_like(v)
    options = {"num_warps": num_warps, **({} if num_stages is None else {"num_stages": num_stages})}
    if not issue_dots_early:
        options["issue_dots_early"] = False  # weft's own option: another compiler is never given it
    if sink_waits:
        options["sink_waits"] = True
    if not fit_rings:
        options["fit_rings"] = False
    if hoist_slot_loads:
        options["hoist_slot_loads"] = True
    kernel[(seq // BLOCK_N1, 1, batch * heads)](
        q, k_scaled, v, do, dq, dk, dv, lse_base2, delta, seq, float(scale), HEAD_DIM=head_dim, CAUSAL=bool(causal),
        ROWS_KV=BLOCK_M1, KEYS_KV=BLOCK_N1, ROWS_Q=BLOCK_M2, KEYS_Q=BLOCK_N2, SPLIT=DIAGONAL_SPLIT, **options)
    return dq, dk, dv
