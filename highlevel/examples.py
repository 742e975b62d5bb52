"""Highlevel versions of the reference kernels, written as Triton code (only the import
differs), with host wrappers. Runtime arguments come in the order of the lowlevel kernels
in `weft.kernels` (minus what only explicit code can use: L2 prefetch distances and
layout parameters), so the two can be benchmarked side by side.

    add_kernel[grid](x_ptr, y_ptr, out_ptr, n, BLOCK=...)
    softmax_kernel[(rows,)](out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK=...,
                            EVEN=n_cols == BLOCK)
    layer_norm_kernel[(rows,)](out_ptr, in_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, in_row_stride,
                               out_row_stride, n_rows, n_cols, eps, BLOCK=..., STATS=True,
                               EARLY_WEIGHTS=False, EVEN=n_cols == BLOCK)
    argmax_kernel[(cdiv(rows, ROWS),)](out_ptr, in_ptr, in_row_stride, n_rows, n_cols, ROWS=..., BLOCK=...)
    transpose_kernel[(cdiv(rows, TILE), cdiv(cols, TILE))](out_ptr, in_ptr, n_rows, n_cols, in_stride,
                                                          out_stride, TILE=...)
    matmul_kernel[(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)](a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak,
                                                         stride_bk, stride_bn, stride_cm, stride_cn,
                                                         BLOCK_M=..., BLOCK_N=..., BLOCK_K=..., GROUP_M=...,
                                                         ACTIVATION="" or "leaky_relu", ACC_IN_DOT=True)
"""

from __future__ import annotations

import numpy as np

from .. import highlevel as tl
from ..runtime.host_arrays import (element_strides, empty_like, float_bits, is_torch, new_array, next_power_of_two,
                                  row_stride)


@tl.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@tl.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK: tl.constexpr,
                   EVEN: tl.constexpr = False):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = None if EVEN else cols < n_cols  # EVEN: the row fills the block, no mask
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    numerator = tl.exp(x - tl.max(x, axis=0))
    # One division per row, then multiplies (as the lowlevel kernel does).
    y = numerator * (1.0 / tl.sum(numerator, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@tl.jit
def layer_norm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, in_row_stride, out_row_stride,
                      n_rows, n_cols, eps, BLOCK: tl.constexpr, STATS: tl.constexpr = True,
                      EARLY_WEIGHTS: tl.constexpr = False, EVEN: tl.constexpr = False):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = None if EVEN else cols < n_cols  # EVEN: the row fills the block, no mask
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if EARLY_WEIGHTS:  # as the lowlevel kernel: hides the weights' latency, costs registers
        w_early = tl.load(w_ptr + cols, mask=mask, other=0.0)
        b_early = tl.load(b_ptr + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    centered = x - mean
    if not EVEN:
        centered = tl.where(mask, centered, 0.0)
    rstd = tl.rsqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
    if EARLY_WEIGHTS:
        y = centered * rstd * w_early.to(tl.float32) + b_early.to(tl.float32)
    else:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = centered * rstd * w + b
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    if STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


@tl.jit
def argmax_kernel(out_ptr, in_ptr, in_row_stride, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(in_ptr + rows[:, None] * in_row_stride + cols[None, :], mask=mask, other=-float("inf"))
    tl.store(out_ptr + rows, tl.argmax(x, axis=1), mask=rows < n_rows)


@tl.jit
def transpose_kernel(out_ptr, in_ptr, n_rows, n_cols, in_stride, out_stride, TILE: tl.constexpr):
    rows = tl.program_id(0) * TILE + tl.arange(0, TILE)
    cols = tl.program_id(1) * TILE + tl.arange(0, TILE)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tile = tl.load(in_ptr + rows[:, None] * in_stride + cols[None, :], mask=mask)
    # out[c, r] = in[r, c]: the same tile, stored through transposed addresses.
    tl.store(out_ptr + cols[None, :] * out_stride + rows[:, None], tile, mask=mask)


@tl.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  ACTIVATION: tl.constexpr, ACC_IN_DOT: tl.constexpr):
    """c = activation(a @ b) for one [BLOCK_M, BLOCK_N] tile of c; programs walk the tiles in
    groups of GROUP_M rows of tiles, so the tiles of a and b they share stay in L2."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group_first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
    group_rows = tl.minimum(tiles_m - group_first_m, GROUP_M)
    pid_m = group_first_m + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        if ACC_IN_DOT:
            acc = tl.dot(a, b, acc)
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if ACTIVATION == "leaky_relu":
        acc = tl.where(acc >= 0, acc, 0.01 * acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# ------------------------------------------------------------------ host wrappers
def _row_warps(block: int, element_bits: int) -> int:
    """As the lowlevel row kernels: 16 fp32 or 32 16-bit elements per thread, 1-16 warps."""
    per_thread = 16 if element_bits == 32 else 32
    return max(1, min(16, block // (32 * per_thread)))


def add(x, y, block: int = 4096, num_warps: int = 4):
    """x + y for two same-shaped contiguous arrays."""
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"add: shapes differ: {tuple(x.shape)} and {tuple(y.shape)}")
    out = empty_like(x)
    n = int(np.prod(x.shape))
    add_kernel[(max(1, -(-n // block)),)](x, y, out, n, BLOCK=block, num_warps=num_warps)
    return out


def softmax(x):
    """Softmax over the last dim of a 2-D array (fp32, fp16 or bf16)."""
    n_rows, n_cols = x.shape
    block = next_power_of_two(n_cols)
    out = empty_like(x)
    softmax_kernel[(n_rows,)](out, x, row_stride(x), row_stride(out), n_rows, n_cols, BLOCK=block,
                              EVEN=n_cols == block, num_warps=_row_warps(block, float_bits(x, "softmax")))
    return out


def layer_norm(x, w, b, eps: float = 1e-5, return_stats: bool = False):
    """Layer norm over the last dim of a 2-D array, and (mean, rstd) with return_stats;
    weights loaded early for 32-bit rows, as the lowlevel kernel does."""
    n_rows, n_cols = x.shape
    block = next_power_of_two(n_cols)
    bits = float_bits(x, "layer_norm")
    out = empty_like(x)
    mean, rstd = _statistics(x, n_rows if return_stats else 1)
    layer_norm_kernel[(n_rows,)](out, x, w, b, mean, rstd, row_stride(x), row_stride(out), n_rows, n_cols,
                                 float(eps), BLOCK=block, STATS=bool(return_stats), EARLY_WEIGHTS=bits == 32,
                                 EVEN=n_cols == block, num_warps=_row_warps(block, bits))
    return (out, mean, rstd) if return_stats else out


def _statistics(x, n: int):
    """Two fp32 arrays of n elements where x lives (n = 1: not written, kept for reuse)."""
    key = (str(x.device) if is_torch(x) else "host", n)
    if n == 1 and key in _UNUSED_STATISTICS:
        return _UNUSED_STATISTICS[key]
    if is_torch(x):
        import torch

        arrays = tuple(torch.empty(n, device=x.device, dtype=torch.float32) for _ in range(2))
    else:
        arrays = (np.empty(n, np.float32), np.empty(n, np.float32))
    if n == 1:
        _UNUSED_STATISTICS[key] = arrays
    return arrays


_UNUSED_STATISTICS: dict = {}


def argmax(x, rows_per_program: int = 4):
    """The column of each row's maximum (the first one on ties), as int32."""
    n_rows, n_cols = x.shape
    block = next_power_of_two(n_cols)
    if is_torch(x):
        import torch

        out = torch.empty(n_rows, device=x.device, dtype=torch.int32)
    else:
        out = np.empty(n_rows, np.int32)
    grid = (-(-n_rows // rows_per_program),)
    argmax_kernel[grid](out, x, row_stride(x), n_rows, n_cols, ROWS=rows_per_program, BLOCK=block,
                        num_warps=4)
    return out


def transpose(x, tile: int = 64, num_warps: int = 4):
    """A contiguous transpose of a 2-D array."""
    n_rows, n_cols = x.shape
    if is_torch(x):
        import torch

        out = torch.empty((n_cols, n_rows), dtype=x.dtype, device=x.device)
    else:
        out = np.empty((n_cols, n_rows), dtype=x.dtype)
    grid = (-(-n_rows // tile), -(-n_cols // tile))
    transpose_kernel[grid](out, x, n_rows, n_cols, row_stride(x), row_stride(out), TILE=tile,
                           num_warps=num_warps)
    return out


def matmul(a, b, activation: str = "", block=(64, 64, 32), num_warps: int = 4, group_m: int = 8,
           acc_in_dot: bool = True, out_dtype: str = "float32", num_stages: int | None = None):
    """activation(a @ b) for 2-D arrays (fp16, bf16, fp32, fp8 or int8; int8 gives int32),
    `block` = (BLOCK_M, BLOCK_N, BLOCK_K); `activation` "" or "leaky_relu"; `num_stages`
    K steps in flight (the K loop pipelined by cp.async), None: not pipelined."""
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"matmul: shapes do not chain: {tuple(a.shape)} @ {tuple(b.shape)}")
    integer = str(a.dtype).endswith("int8")
    out = new_array(a, (m, n), "int32" if integer else out_dtype)
    block_m, block_n, block_k = block
    grid = (-(-m // block_m) * -(-n // block_n),)
    (am, ak), (bk, bn), (cm, cn) = element_strides(a), element_strides(b), element_strides(out)
    matmul_kernel[grid](a, b, out, m, n, k, am, ak, bk, bn, cm, cn, BLOCK_M=block_m, BLOCK_N=block_n,
                        BLOCK_K=block_k, GROUP_M=group_m, ACTIVATION=activation, ACC_IN_DOT=acc_in_dot,
                        num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}))
    return out
