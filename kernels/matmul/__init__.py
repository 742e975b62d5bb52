"""`matmul(a, b, out_dtype=None)`: C = A @ B on Hopper tensor cores, written in weft.lowlevel.

torch CUDA tensors run on the GPU (the config autotuned once per problem class and
cached); numpy arrays or CPU torch tensors run the same kernel on the CPU emulator.

    from weft.kernels.matmul import matmul
    c = matmul(a, b)                       # bf16/fp16 in, fp32 accumulate, a's dtype out
    c = matmul(a8, b8, out_dtype=torch.bfloat16)   # fp8 (e4m3/e5m2); b must be K-major

A is [M, K] with K contiguous. B is [K, N], either row-major (N contiguous) or K-major
(a transposed view of an [N, K] tensor, as torch._scaled_mm wants for fp8).
"""

from __future__ import annotations

from .config import Config, configs_for, shared_bytes
from .host import matmul, reference_matmul

__all__ = ["Config", "configs_for", "matmul", "reference_matmul", "shared_bytes"]
