"""Layer norm forward: y = (x - mean) * rstd * w + b per row, with mean and rstd saved."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ..runtime.host_arrays import (check_arrays, contiguous, float_bits, is_torch, new_array, row_stride,
                                   with_contiguous_rows)
from ._launch import persistent_grid, prefetch_distance
from .row_ring import ring_fits, start_ring, take_row
from .softmax import Config as RowConfig


@dataclass(frozen=True)
class Config(RowConfig):
    """Same shape rules as softmax (the whole row in registers of one CTA), plus whether
    weight and bias load before the reductions, and with a ring (`ring_stages` > 0,
    row_ring.py) whether a persistent CTA holds them in registers across its rows."""

    early_weights: bool = False
    hold_weights: bool = False
    # More cache hints of the register kernel (beside RowConfig's row_eviction, out_cache).
    row_cache: str = ""
    weight_eviction: str = ""

    @staticmethod
    def for_row(n_cols: int, element_bits: int) -> "Config":
        """From the row sweep (docs/performance-journal.md): 32-bit rows gain from loading the
        weights before the reductions, with at most 8 warps (at 16 the early weights cost
        too many registers); 16-bit rows lose from it (registers), but gain from at
        least 4 warps. The cache hints are softmax's (RowConfig.for_row)."""
        base = RowConfig.for_row(n_cols, element_bits)
        hints = dict(row_eviction=base.row_eviction, out_cache=base.out_cache)
        if element_bits == 32:
            return Config(base.block, min(base.num_warps, 8), base.vector, early_weights=True, **hints)
        warps = max(base.num_warps, min(4, base.block // (32 * base.vector)))
        return Config(base.block, warps, base.vector, **hints)


@ll.jit
def row_statistics(x, cols, n_cols, eps, EVEN: ll.constexpr):
    """(mean, x - mean with columns past n_cols at 0, 1 / std) of an fp32 row whose
    columns past n_cols hold 0."""
    mean = ll.sum(x, axis=0) / n_cols
    centered = x - mean
    if not EVEN:
        centered = ll.where(cols < n_cols, centered, 0.0)
    rstd = ll.rsqrt(ll.sum(centered * centered, axis=0) / n_cols + eps)
    return mean, centered, rstd


@ll.jit
def layer_norm_kernel(out_ptr, in_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, in_row_stride, out_row_stride,
                      n_rows, n_cols, eps, BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr,
                      ELEMENT_BYTES: ll.constexpr, STATS: ll.constexpr, EARLY_WEIGHTS: ll.constexpr,
                      EVEN: ll.constexpr, PREFETCH_ROWS: ll.constexpr, ROW_CACHE: ll.constexpr = "",
                      ROW_EVICTION: ll.constexpr = "", WEIGHT_EVICTION: ll.constexpr = "",
                      OUT_CACHE: ll.constexpr = ""):
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    row = ll.program_id(0)
    if PREFETCH_ROWS > 0:  # a later CTA's row, pulled into L2 (see softmax)
        ahead = row + PREFETCH_ROWS
        if ahead < n_rows:
            ll.prefetch_l2(in_ptr + ahead * in_row_stride, n_cols * ELEMENT_BYTES)
    cols = ll.arange(0, BLOCK, layout=layout)
    # EVEN: the row fills the block exactly, so no mask, select or predicate is needed.
    in_bounds = None if EVEN else cols < n_cols
    # Cache hints (Config): a row is read once, weight and bias by every CTA; keeping the
    # rows from pushing them out of L1 pays on 16-bit rows (docs/performance-journal.md).
    x = ll.load(in_ptr + row * in_row_stride + cols, mask=in_bounds, other=0.0, cache_modifier=ROW_CACHE,
                eviction_policy=ROW_EVICTION).to(ll.float32)
    # Loading the weights before the reductions hides their latency but keeps them live
    # (more registers, fewer CTAs per SM); which wins depends on the row (see Config).
    if EARLY_WEIGHTS:
        w_early = ll.load(w_ptr + cols, mask=in_bounds, other=0.0, eviction_policy=WEIGHT_EVICTION)
        b_early = ll.load(b_ptr + cols, mask=in_bounds, other=0.0, eviction_policy=WEIGHT_EVICTION)
    mean, centered, rstd = row_statistics(x, cols, n_cols, eps, EVEN)
    if EARLY_WEIGHTS:
        y = centered * rstd * w_early.to(ll.float32) + b_early.to(ll.float32)
    else:
        w = ll.load(w_ptr + cols, mask=in_bounds, other=0.0, eviction_policy=WEIGHT_EVICTION).to(ll.float32)
        b = ll.load(b_ptr + cols, mask=in_bounds, other=0.0, eviction_policy=WEIGHT_EVICTION).to(ll.float32)
        y = centered * rstd * w + b
    ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=in_bounds,
             cache_modifier=OUT_CACHE)
    if STATS:
        ll.store(mean_ptr + row, mean)
        ll.store(rstd_ptr + row, rstd)


@ll.jit
def layer_norm_ring_kernel(out_ptr, in_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, in_row_stride, out_row_stride,
                           n_rows, n_cols, eps, BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr,
                           ELEMENT_BYTES: ll.constexpr, STATS: ll.constexpr, EVEN: ll.constexpr,
                           STAGES: ll.constexpr, HOLD_WEIGHTS: ll.constexpr):
    """The same layer norm over a persistent CTA's rows, streamed through a ring of STAGES
    shared-memory rows (row_ring.py): STAGES - 1 later rows are in flight while one is
    normalised."""
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    row_bytes = n_cols * ELEMENT_BYTES
    ring, landed = start_ring(in_ptr, in_row_stride, n_rows, row_bytes, BLOCK, STAGES)
    cols = ll.arange(0, BLOCK, layout=layout)
    in_bounds = None if EVEN else cols < n_cols
    if HOLD_WEIGHTS:  # loaded and converted once per CTA, at the cost of registers
        w_held = ll.load(w_ptr + cols, mask=in_bounds, other=0.0).to(ll.float32)
        b_held = ll.load(b_ptr + cols, mask=in_bounds, other=0.0).to(ll.float32)
    done = 0  # rows this CTA has finished
    for row in range(ll.program_id(0), n_rows, ll.num_programs(0)):
        x = take_row(in_ptr, in_row_stride, row, n_rows, row_bytes, ring, landed, done, cols, n_cols, 0.0,
                     layout, STAGES, EVEN)
        mean, centered, rstd = row_statistics(x, cols, n_cols, eps, EVEN)
        if HOLD_WEIGHTS:
            y = centered * rstd * w_held + b_held
        else:
            w = ll.load(w_ptr + cols, mask=in_bounds, other=0.0).to(ll.float32)
            b = ll.load(b_ptr + cols, mask=in_bounds, other=0.0).to(ll.float32)
            y = centered * rstd * w + b
        ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=in_bounds)
        if STATS:
            ll.store(mean_ptr + row, mean)
            ll.store(rstd_ptr + row, rstd)
        done += 1


def reference(x, w, b, eps):
    x, w, b = (np.asarray(a, dtype=np.float64) for a in (x, w, b))
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd * w + b, mean[:, 0], rstd[:, 0]


def layer_norm(x, w, b, eps=1e-5, return_stats=False, config: Config = None):
    """Layer norm over the last dim of a 2-D array of any strides, into a new contiguous
    array; weight and bias (any strides) of the row's length. Rows whose last dim is not
    contiguous, and weights or bias that are not, are copied first. With return_stats,
    also each row's fp32 mean and 1 / std (NaN for rows of no columns, as numpy's mean)."""
    check_arrays("layer_norm", x=x, w=w, b=b)
    if len(x.shape) != 2:
        raise ValueError(f"layer_norm expects a 2-D array, got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    if tuple(w.shape) != (n_cols,) or tuple(b.shape) != (n_cols,):
        raise ValueError(f"layer_norm: weight and bias must have shape ({n_cols},), got "
                         f"{tuple(w.shape)} and {tuple(b.shape)}")
    bits = float_bits(x, "layer_norm")
    out = new_array(x, (n_rows, n_cols))
    if return_stats:
        mean, rstd = new_array(x, (n_rows,), "float32"), new_array(x, (n_rows,), "float32")
    else:  # not written (STATS=False); any pointer of the right type will do
        mean = rstd = _fp32_placeholder(x)
    if n_rows == 0 or n_cols == 0:
        if return_stats:
            mean[...] = float("nan")
            rstd[...] = float("nan")
        return (out, mean, rstd) if return_stats else out
    config = config or Config.for_row(n_cols, bits)
    x, w, b = with_contiguous_rows(x), contiguous(w), contiguous(b)
    args = (out, x, w, b, mean, rstd, row_stride(x), row_stride(out), n_rows, n_cols, float(eps))
    shape = dict(BLOCK=config.block, VEC=config.vector, WARPS=config.num_warps, ELEMENT_BYTES=bits // 8,
                 STATS=bool(return_stats), EVEN=n_cols == config.block)
    if config.ring_stages and ring_fits(x, n_cols, config.ring_stages):
        shape.update(STAGES=config.ring_stages, HOLD_WEIGHTS=config.hold_weights)
        grid = persistent_grid(layer_norm_ring_kernel, x, n_rows, args, shape, config.num_warps)
        layer_norm_ring_kernel[(grid,)](*args, **shape, num_warps=config.num_warps)
    else:
        layer_norm_kernel[(n_rows,)](*args, **shape, EARLY_WEIGHTS=config.early_weights, ROW_CACHE=config.row_cache,
                                     ROW_EVICTION=config.row_eviction, WEIGHT_EVICTION=config.weight_eviction,
                                     OUT_CACHE=config.out_cache,
                                     PREFETCH_ROWS=prefetch_distance(x, config), num_warps=config.num_warps)
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
