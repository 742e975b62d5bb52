"""Fused row softmax: one program per row, the whole row in registers, any row length.

One row per CTA rather than a persistent loop with a prefetched next row: the prefetch
doubles the live registers, halves occupancy and loses more than the overlap gains
(docs/performance-journal.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ..runtime.host_arrays import (check_arrays, float_bits, new_array, next_power_of_two, row_stride,
                                   with_contiguous_rows)
from ._launch import persistent_grid, prefetch_distance
from .row_ring import ring_fits, start_ring, take_row

MAX_ROW = 32768  # elements held in registers by one CTA (16 warps x 32 lanes x 64 registers)


@dataclass(frozen=True)
class Config:
    block: int      # row length rounded up to a power of two
    num_warps: int
    vector: int     # elements per thread per access (128 bits when the row allows)
    prefetch_rows: int = 0  # rows ahead to prefetch into L2; -1: from the GPU's size, 0: off
    ring_stages: int = 0    # > 0: persistent CTAs stream rows through this many shared slots
    # Cache hints of the one-row-per-CTA kernels (ll.load's eviction_policy for the row,
    # ll.store's cache_modifier for the output).
    row_eviction: str = ""
    out_cache: str = ""

    def __post_init__(self):
        if self.block & (self.block - 1) or not 0 < self.block <= MAX_ROW:
            raise ValueError(f"softmax rows up to {MAX_ROW} elements are supported; block={self.block}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"Config.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.prefetch_rows < -1:
            raise ValueError(f"Config.prefetch_rows must be -1 (automatic), 0 (off) or positive, "
                             f"got {self.prefetch_rows}")
        if self.ring_stages not in (0, 1, 2, 4, 8):
            raise ValueError(f"Config.ring_stages must be 0 (no ring), 1, 2, 4 or 8 (shared layouts "
                             f"span powers of two), got {self.ring_stages}")
        if self.vector not in (1, 2, 4, 8, 16):
            raise ValueError(f"Config.vector must be a power of two up to 16, got {self.vector}")

    @staticmethod
    def for_row(n_cols: int, element_bits: int) -> "Config":
        block = next_power_of_two(n_cols)
        vector = max(1, min(128 // element_bits, block // 32))
        if n_cols != block and n_cols % 16:
            # The launch only specialises n_cols on divisibility by 16: below that the mask
            # is not provably uniform over a vector and loads go scalar, so one element per
            # thread keeps them coalesced (consecutive lanes, consecutive addresses).
            vector = 1
        # 16 fp32 or 32 16-bit elements per thread: the best of the row sweep at 4096
        # columns (docs/performance-journal.md), and few enough registers for full occupancy.
        per_thread = (16 if element_bits == 32 else 32) if vector > 1 else 8
        num_warps = max(1, min(16, block // (32 * per_thread)))
        # Rows that leave L1 first and outputs stored as streaming (evict-first in L2):
        # each row is read and written once, so keeping it cached only evicts what is
        # reused; the row sweep found it faster for 16-bit rows and short fp32 rows, and
        # slower for longer fp32 rows (docs/performance-journal.md).
        if vector > 1 and (element_bits == 16 or block <= 1024):
            if element_bits == 32:
                num_warps = max(num_warps, min(4, block // (32 * vector)))
            return Config(block, num_warps, vector, row_eviction="evict_first", out_cache=".cs")
        return Config(block, num_warps, vector)


@ll.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols,
                   BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr, ELEMENT_BYTES: ll.constexpr,
                   EVEN: ll.constexpr, PREFETCH_ROWS: ll.constexpr, ROW_EVICTION: ll.constexpr = "",
                   OUT_CACHE: ll.constexpr = ""):
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    row = ll.program_id(0)
    # Pull a later CTA's row into L2 now: the DRAM latency it would wait for overlaps this
    # CTA's work, without registers held for it.
    if PREFETCH_ROWS > 0:  # compiled in only when asked for: it costs registers
        ahead = row + PREFETCH_ROWS
        if ahead < n_rows:
            ll.prefetch_l2(in_ptr + ahead * in_row_stride, n_cols * ELEMENT_BYTES)
    cols = ll.arange(0, BLOCK, layout=layout)
    in_bounds = None if EVEN else cols < n_cols  # EVEN: the row fills the block, no mask
    x = ll.load(in_ptr + row * in_row_stride + cols, mask=in_bounds, other=-float("inf"),
                eviction_policy=ROW_EVICTION).to(ll.float32)
    numerator = ll.exp(x - ll.max(x, axis=0))
    # One division per row, then multiplies: IEEE division per element costs more.
    y = numerator * (1.0 / ll.sum(numerator, axis=0))
    ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=in_bounds,
             cache_modifier=OUT_CACHE)


@ll.jit
def softmax_ring_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols,
                        BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr, ELEMENT_BYTES: ll.constexpr,
                        EVEN: ll.constexpr, STAGES: ll.constexpr):
    """The same softmax over a persistent CTA's rows, streamed through a ring of STAGES
    shared-memory rows (row_ring.py)."""
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    row_bytes = n_cols * ELEMENT_BYTES
    ring, landed = start_ring(in_ptr, in_row_stride, n_rows, row_bytes, BLOCK, STAGES)
    cols = ll.arange(0, BLOCK, layout=layout)
    in_bounds = None if EVEN else cols < n_cols
    done = 0  # rows this CTA has finished
    for row in range(ll.program_id(0), n_rows, ll.num_programs(0)):
        x = take_row(in_ptr, in_row_stride, row, n_rows, row_bytes, ring, landed, done, cols, n_cols,
                     -float("inf"), layout, STAGES, EVEN)
        numerator = ll.exp(x - ll.max(x, axis=0))
        y = numerator * (1.0 / ll.sum(numerator, axis=0))
        ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=in_bounds)
        done += 1


def reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax(x, config: Config = None):
    """Softmax over the last dim of a 2-D array (fp32, fp16 or bf16) of any strides, into a
    new contiguous array. Rows whose last dim is not contiguous are copied first."""
    check_arrays("softmax", x=x)
    if len(x.shape) != 2:
        raise ValueError(f"softmax expects a 2-D array, got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    bits = float_bits(x, "softmax")
    out = new_array(x, (n_rows, n_cols))
    if n_rows == 0 or n_cols == 0:
        return out
    config = config or Config.for_row(n_cols, bits)
    x = with_contiguous_rows(x)
    args = (out, x, row_stride(x), row_stride(out), n_rows, n_cols)
    shape = dict(BLOCK=config.block, VEC=config.vector, WARPS=config.num_warps, ELEMENT_BYTES=bits // 8,
                 EVEN=n_cols == config.block)
    if config.ring_stages and ring_fits(x, n_cols, config.ring_stages):
        shape["STAGES"] = config.ring_stages
        grid = persistent_grid(softmax_ring_kernel, x, n_rows, args, shape, config.num_warps)
        softmax_ring_kernel[(grid,)](*args, **shape, num_warps=config.num_warps)
    else:
        softmax_kernel[(n_rows,)](*args, **shape, PREFETCH_ROWS=prefetch_distance(x, config),
                                  ROW_EVICTION=config.row_eviction, OUT_CACHE=config.out_cache,
                                  num_warps=config.num_warps)
    return out
