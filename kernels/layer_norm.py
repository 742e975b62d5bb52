"""Layer norm forward: y = (x - mean) * rstd * w + b per row, with mean and rstd saved."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ._launch import float_bits, empty_like, is_torch, prefetch_distance, row_stride
from .softmax import Config as RowConfig


@dataclass(frozen=True)
class Config(RowConfig):
    """Same shape rules as softmax (the whole row in registers of one CTA), plus whether
    weight and bias load before the reductions."""

    early_weights: bool = False


@ll.jit
def layer_norm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, in_row_stride, out_row_stride,
                      n_rows, n_cols, eps, BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr,
                      ELEMENT_BYTES: ll.constexpr, STATS: ll.constexpr, EARLY_WEIGHTS: ll.constexpr,
                      EVEN: ll.constexpr, PREFETCH_ROWS: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    row = ll.program_id(0)
    if PREFETCH_ROWS > 0:  # a later CTA's row, pulled into L2 (see softmax)
        ahead = row + PREFETCH_ROWS
        if ahead < n_rows:
            ll.prefetch_l2(in_ptr + ahead * in_row_stride, n_cols * ELEMENT_BYTES)
    cols = ll.arange(0, BLOCK, layout=layout)
    # EVEN: the row fills the block exactly, so no mask, select or predicate is needed.
    in_bounds = None if EVEN else cols < n_cols
    x = ll.load(in_ptr + row * in_row_stride + cols, mask=in_bounds, other=0.0).to(ll.float32)
    # Loading the weights before the reductions hides their latency but keeps them live
    # (more registers, fewer CTAs per SM); which wins depends on the row (see Config).
    if EARLY_WEIGHTS:
        w_early = ll.load(w_ptr + cols, mask=in_bounds, other=0.0)
        b_early = ll.load(b_ptr + cols, mask=in_bounds, other=0.0)
    mean = ll.sum(x, axis=0) / n_cols
    centered = x - mean
    if not EVEN:
        centered = ll.where(in_bounds, centered, 0.0)
    rstd = ll.rsqrt(ll.sum(centered * centered, axis=0) / n_cols + eps)
    if EARLY_WEIGHTS:
        y = centered * rstd * w_early.to(ll.float32) + b_early.to(ll.float32)
    else:
        w = ll.load(w_ptr + cols, mask=in_bounds, other=0.0).to(ll.float32)
        b = ll.load(b_ptr + cols, mask=in_bounds, other=0.0).to(ll.float32)
        y = centered * rstd * w + b
    ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=in_bounds)
    if STATS:
        ll.store(mean_ptr + row, mean)
        ll.store(rstd_ptr + row, rstd)


def reference(x, w, b, eps):
    x, w, b = (np.asarray(a, dtype=np.float64) for a in (x, w, b))
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd * w + b, mean[:, 0], rstd[:, 0]


def layer_norm(x, w, b, eps=1e-5, return_stats=False, config: Config = None):
    """Layer norm over the last dim of a 2-D array; weights and bias of the row's length."""
    if len(x.shape) != 2:
        raise ValueError(f"layer_norm expects a 2-D array, got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    if tuple(w.shape) != (n_cols,) or tuple(b.shape) != (n_cols,):
        raise ValueError(f"layer_norm: weight and bias must have shape ({n_cols},), got "
                         f"{tuple(w.shape)} and {tuple(b.shape)}")
    bits = float_bits(x, "layer_norm")
    base = RowConfig.for_row(n_cols, bits)
    # From the H200 sweep (benchmarks/NOTES.md): 32-bit rows gain from early weight loads,
    # 16-bit rows lose (the extra live registers cost occupancy).
    config = config or Config(base.block, base.num_warps, base.vector, base.prefetch_rows,
                              early_weights=bits == 32)
    out = empty_like(x)
    if return_stats:
        if is_torch(x):
            import torch

            mean = torch.empty(n_rows, device=x.device, dtype=torch.float32)
            rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        else:
            mean = np.empty(n_rows, np.float32)
            rstd = np.empty(n_rows, np.float32)
    else:  # not written (STATS=False); any pointer of the right type will do
        mean = rstd = _fp32_placeholder(x)
    if n_rows == 0:
        return (out, mean, rstd) if return_stats else out
    layer_norm_kernel[(n_rows,)](out, x, w, b, mean, rstd, row_stride(x), row_stride(out), n_rows, n_cols,
                                 float(eps), BLOCK=config.block, VEC=config.vector, WARPS=config.num_warps,
                                 ELEMENT_BYTES=bits // 8, STATS=bool(return_stats),
                                 EARLY_WEIGHTS=config.early_weights, EVEN=n_cols == config.block,
                                 PREFETCH_ROWS=prefetch_distance(x, config),
                                 num_warps=config.num_warps)
    return (out, mean, rstd) if return_stats else out


_PLACEHOLDERS: dict = {}


def _fp32_placeholder(x):
    """A one-element fp32 array on x's device, passed for the statistics when they are
    not wanted (the kernel does not touch it); cached so calls do not allocate."""
    if is_torch(x):
        key = ("torch", str(x.device))
        if key not in _PLACEHOLDERS:
            import torch

            _PLACEHOLDERS[key] = torch.zeros(1, device=x.device, dtype=torch.float32)
        return _PLACEHOLDERS[key]
    return np.zeros(1, np.float32)
