"""What the kernel families share: where an array lives, and allocating outputs like it.

A torch CUDA tensor runs on the GPU; a numpy array or CPU torch tensor runs the same kernel
on the CPU emulator (the JIT decides from the arguments). Nothing here imports torch
unless the caller passed a torch tensor.
"""

from __future__ import annotations

import numpy as np


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def empty_like(x, dtype=None):
    if is_torch(x):
        import torch

        return torch.empty_like(x, dtype=dtype)
    return np.empty_like(x, dtype=dtype)


def element_name(x) -> str:
    """The signature name of an array's element type ("fp32", "bf16", ...)."""
    if is_torch(x):
        return {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(x.dtype), str(x.dtype))
    return {"float32": "fp32", "float16": "fp16"}.get(x.dtype.name, x.dtype.name)


def row_stride(x) -> int:
    """Elements between consecutive rows; the last dim must be contiguous."""
    if is_torch(x):
        strides = x.stride()
    else:
        strides = tuple(s // x.itemsize for s in x.strides)
    if strides[-1] != 1:
        raise ValueError(f"the last dim must be contiguous (stride 1), got strides {strides}")
    return strides[0] if len(strides) > 1 else x.shape[-1]


def next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()

