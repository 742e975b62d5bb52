"""Fused row softmax: the whole row in registers, any row length, persistent over rows.

Each program walks rows `pid, pid + programs, ...` and issues the loads of its next row
before reducing the current one, so the memory system always has a row in flight per
program while the reductions (which stop at CTA barriers) run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ._launch import element_name, empty_like, next_power_of_two, persistent_programs, row_stride

MAX_ROW = 32768  # elements held in registers by one CTA (16 warps x 32 lanes x 64 registers)


@dataclass(frozen=True)
class Config:
    block: int      # row length rounded up to a power of two
    num_warps: int
    vector: int     # elements per thread per access (128 bits when the row allows)
    programs_per_sm: int = 4

    def __post_init__(self):
        if self.block & (self.block - 1) or not 0 < self.block <= MAX_ROW:
            raise ValueError(f"softmax rows up to {MAX_ROW} elements are supported; block={self.block}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"Config.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.vector not in (1, 2, 4, 8, 16):
            raise ValueError(f"Config.vector must be a power of two up to 16, got {self.vector}")
        if self.programs_per_sm < 1:
            raise ValueError(f"Config.programs_per_sm must be at least 1, got {self.programs_per_sm}")

    @staticmethod
    def for_row(n_cols: int, element_bits: int) -> "Config":
        block = next_power_of_two(n_cols)
        vector = max(1, min(128 // element_bits, block // 32))
        # About 16 elements per thread keeps loads in flight without spilling.
        num_warps = max(1, min(8, block // (32 * 16)))
        return Config(block, num_warps, vector, programs_per_sm=max(1, 16 // num_warps))


@ll.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols,
                   BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    cols = ll.arange(0, BLOCK, layout=layout)
    in_bounds = cols < n_cols
    first = ll.program_id(0)
    step = ll.num_programs(0)
    x = ll.load(in_ptr + first * in_row_stride + cols, mask=in_bounds, other=-float("inf"))
    for row in range(first, n_rows, step):
        # Prefetch the next row before this one's reductions stop at their barriers.
        upcoming = row + step
        x_next = ll.load(in_ptr + upcoming * in_row_stride + cols, mask=in_bounds & (upcoming < n_rows),
                         other=-float("inf"))
        values = x.to(ll.float32)
        numerator = ll.exp(values - ll.max(values, axis=0))
        # One division per row, then multiplies: IEEE division per element costs more.
        y = numerator * (1.0 / ll.sum(numerator, axis=0))
        ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=in_bounds)
        x = x_next


def reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax(x, config: Config = None):
    """Softmax over the last dim of a 2-D array (fp32, fp16 or bf16)."""
    if len(x.shape) != 2:
        raise ValueError(f"softmax expects a 2-D array, got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    bits = {"fp32": 32, "fp16": 16, "bf16": 16}.get(element_name(x))
    if bits is None:
        raise TypeError(f"softmax supports fp32, fp16 and bf16, got {element_name(x)}")
    config = config or Config.for_row(n_cols, bits)
    out = empty_like(x)
    if n_rows == 0:
        return out
    grid = (persistent_programs(x, n_rows, config.programs_per_sm),)
    softmax_kernel[grid](out, x, row_stride(x), row_stride(out), n_rows, n_cols, BLOCK=config.block,
                         VEC=config.vector, WARPS=config.num_warps, num_warps=config.num_warps)
    return out
