"""Transpose through shared memory: read rows coalesced, write columns coalesced.

A tile is loaded in a layout whose threads run along the input's rows, stored into a
swizzled shared buffer, and read back in a layout whose threads run along the columns, so
both global accesses are 128-bit and coalesced while the swizzle keeps the shared-memory
accesses free of bank conflicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ..runtime.host_arrays import check_arrays, item_bytes, new_array, row_stride, with_contiguous_rows


@dataclass(frozen=True)
class Config:
    tile: int = 64
    num_warps: int = 4

    def __post_init__(self):
        if self.tile not in (16, 32, 64, 128):
            raise ValueError(f"Config.tile must be 16, 32, 64 or 128, got {self.tile}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"Config.num_warps must be 1, 2, 4 or 8, got {self.num_warps}")


@ll.jit
def transpose_kernel(out_ptr, in_ptr, n_rows, n_cols, in_stride, out_stride,
                     TILE: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr):
    # Rows of the input tile are contiguous: threads run along dim 1 when reading...
    read_layout: ll.constexpr = ll.BlockedLayout([1, VEC], [32 * VEC // TILE, TILE // VEC], [WARPS, 1], [1, 0])
    # ...and along dim 0 when writing, because dim 0 of the tile is contiguous in the output.
    write_layout: ll.constexpr = ll.BlockedLayout([VEC, 1], [TILE // VEC, 32 * VEC // TILE], [1, WARPS], [0, 1])
    staging: ll.constexpr = ll.SwizzledSharedLayout(VEC, 1, TILE // VEC, [1, 0])
    row0 = ll.program_id(0) * TILE
    col0 = ll.program_id(1) * TILE
    rows = row0 + ll.arange(0, TILE, layout=ll.SliceLayout(1, read_layout))
    cols = col0 + ll.arange(0, TILE, layout=ll.SliceLayout(0, read_layout))
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tile = ll.load(in_ptr + rows[:, None] * in_stride + cols[None, :], mask=mask)
    buffer = ll.allocate_shared_memory(tile.dtype, [TILE, TILE], staging, tile)
    moved = buffer.load(write_layout)
    out_rows = row0 + ll.arange(0, TILE, layout=ll.SliceLayout(1, write_layout))
    out_cols = col0 + ll.arange(0, TILE, layout=ll.SliceLayout(0, write_layout))
    out_mask = (out_rows[:, None] < n_rows) & (out_cols[None, :] < n_cols)
    ll.store(out_ptr + out_cols[None, :] * out_stride + out_rows[:, None], moved, mask=out_mask)


def reference(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T)


def transpose(x, config: Config = Config()):
    """A contiguous transpose of a 2-D array (any element type of 8 to 64 bits) of any
    strides; an x whose last dim is not contiguous is copied first."""
    check_arrays("transpose", x=x)
    if len(x.shape) != 2:
        raise ValueError(f"transpose expects a 2-D array, got shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    out = new_array(x, (n_cols, n_rows))
    if n_rows == 0 or n_cols == 0:
        return out
    x = with_contiguous_rows(x)
    bits = item_bytes(x) * 8
    vector = max(1, min(128 // bits, config.tile * config.tile // (32 * config.num_warps), config.tile // 4))
    grid = (-(-n_rows // config.tile), -(-n_cols // config.tile))
    transpose_kernel[grid](out, x, n_rows, n_cols, row_stride(x), row_stride(out), TILE=config.tile,
                           VEC=vector, WARPS=config.num_warps, num_warps=config.num_warps)
    return out
