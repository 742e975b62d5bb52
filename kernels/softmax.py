"""Fused row softmax: one program per row, the whole row in registers, any row length."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ._launch import element_name, empty_like, next_power_of_two, row_stride

MAX_ROW = 32768  # elements held in registers by one CTA (16 warps x 32 lanes x 64 registers)


@dataclass(frozen=True)
class Config:
    block: int      # row length rounded up to a power of two
    num_warps: int
    vector: int     # elements per 128-bit access

    def __post_init__(self):
        if self.block & (self.block - 1) or not 0 < self.block <= MAX_ROW:
            raise ValueError(f"softmax rows up to {MAX_ROW} elements are supported; block={self.block}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"Config.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")

    @staticmethod
    def for_row(n_cols: int, element_bits: int) -> "Config":
        block = next_power_of_two(n_cols)
        vector = max(1, min(128 // element_bits, block // 32))
        # About 16 elements per thread keeps loads in flight without spilling.
        num_warps = max(1, min(16, block // (32 * 16)))
        return Config(block, num_warps, vector)


@ll.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols,
                   BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    row = ll.program_id(0)
    cols = ll.arange(0, BLOCK, layout=layout)
    mask = cols < n_cols
    x = ll.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(ll.float32)
    shifted = x - ll.max(x, axis=0)
    numerator = ll.exp(shifted)
    y = numerator / ll.sum(numerator, axis=0)
    ll.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


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
    softmax_kernel[(n_rows,)](out, x, row_stride(x), row_stride(out), n_cols, BLOCK=config.block,
                              VEC=config.vector, WARPS=config.num_warps, num_warps=config.num_warps)
    return out
