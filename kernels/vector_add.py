"""Vector add: out = x + y over any number of elements, 128-bit accesses where aligned."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import lowlevel as ll
from ..runtime.host_arrays import check_arrays, contiguous, is_contiguous, is_torch, new_array


@dataclass(frozen=True)
class Config:
    block: int = 4096
    num_warps: int = 4
    vector: int = 4  # elements per thread per access (4 x fp32 = 128 bits)

    def __post_init__(self):
        for name in ("block", "num_warps", "vector"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Config.{name} must be a power of two, got {value}")
        if self.block < self.vector * 32 * self.num_warps:
            raise ValueError(f"Config.block={self.block} is smaller than one layout tile "
                             f"({self.vector} x 32 lanes x {self.num_warps} warps)")


@ll.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: ll.constexpr, VEC: ll.constexpr, WARPS: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([VEC], [32], [WARPS], [0])
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=layout)
    mask = offsets < n
    x = ll.load(x_ptr + offsets, mask=mask)
    y = ll.load(y_ptr + offsets, mask=mask)
    ll.store(out_ptr + offsets, x + y, mask=mask)


def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) + y.astype(np.float64))


def add(x, y, out=None, config: Config = None):
    """x + y for two same-shaped arrays of any strides (GPU for torch CUDA tensors, else the
    emulator), into `out` when given (any strides too), else into a new contiguous array.

    The kernel walks flat memory, so inputs that are not contiguous are copied first, and
    an `out` that is not is written through a contiguous temporary."""
    arrays = dict(x=x, y=y) if out is None else dict(x=x, y=y, out=out)
    check_arrays("add", **arrays)
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"add: shapes differ: {tuple(x.shape)} and {tuple(y.shape)}")
    if out is not None and tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"add: out has shape {tuple(out.shape)}, the inputs {tuple(x.shape)}")
    if config is None:  # 128-bit accesses whatever the element type
        bits = (x.element_size() if is_torch(x) else x.itemsize) * 8
        config = Config(vector=max(1, 128 // bits))
    n = int(np.prod(x.shape))
    result = new_array(x, tuple(x.shape)) if out is None else out
    if n == 0:
        return result
    target = result if is_contiguous(result) else new_array(result, tuple(x.shape))
    grid = (-(-n // config.block),)
    add_kernel[grid](contiguous(x), contiguous(y), target, n, BLOCK=config.block, VEC=config.vector,
                     WARPS=config.num_warps, num_warps=config.num_warps)
    if target is not result:
        result[...] = target
    return result


def add_kernel_for_overhead():
    """A launcher of a 3-argument kernel, for measuring the cached launch path."""
    @ll.jit
    def copy_kernel(x_ptr, y_ptr, n):
        layout: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
        offsets = ll.arange(0, 128, layout=layout)
        ll.store(y_ptr + offsets, ll.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)

    return lambda x, y, n: copy_kernel[(1,)](x, y, n)
