"""Hopper's (sm_90) hardware limits: the one module the compiler, runtime, languages, kernels
and CLI read them from, so a limit is stated once (HOPPER.md has the sources).

The warp shape belongs to the layout vocabulary below the compiler (layouts/ imports
nothing of weft), so it is re-exported here rather than stated twice.
"""

from __future__ import annotations

from ..layouts.standard import LANES_PER_WARP as LANES  # threads in a warp
from ..layouts.standard import MAX_WARPS_PER_CTA as MAX_WARPS  # 1024 threads, a CTA's limit
from ..layouts.standard import WARPS_PER_WARPGROUP  # the warps a wgmma or setmaxnreg acts on together

__all__ = ["LANES", "MAX_WARPS", "WARPS_PER_WARPGROUP", "REGISTER_FILE", "MAX_REGISTERS", "MIN_REGISTERS",
           "STATIC_SHARED_LIMIT", "SHARED_LIMIT", "SM_SHARED", "SHARED_RESERVED_PER_CTA", "MAX_CLUSTER_CTAS", "MAX_GRID",
           "MAX_ACCESS_BITS", "TMA_MAX_RANK", "TMA_MAX_BOX", "TENSOR_MAP_BYTES", "TENSOR_MAP_ALIGN", "TMA_MAX_GLOBAL_DIM", "TMA_MAX_COORDINATE", "TMA_GLOBAL_ALIGN",
           "TMA_MAX_STRIDE_BYTES"]

# Registers.
REGISTER_FILE = 65536  # 32-bit registers per SM, all of them for one CTA at most
MAX_REGISTERS = 255  # per thread (.maxnreg)
MIN_REGISTERS = 16  # the fewest registers a thread may be limited to (maxnreg)

# Shared memory, in bytes.
STATIC_SHARED_LIMIT = 48 * 1024  # a CTA's static shared memory, and its dynamic one unless the launch opts in
                                 # (cuFuncSetAttribute)
SHARED_LIMIT = 227 * 1024  # usable by one CTA on H100/H200 (HOPPER.md)
SM_SHARED = 228 * 1024  # an SM has for its CTAs, each of which the driver takes 1 KB of
SHARED_RESERVED_PER_CTA = 1024  # that 1 KB: the CTAs an SM holds are SM_SHARED // (bytes + this)

# Launches.
MAX_CLUSTER_CTAS = 8  # CTAs per cluster any sm_90 launch may take without opting into more
MAX_GRID = (2**31 - 1, 65535, 65535)  # CTAs along x, y, z (CUDA C Programming Guide, "Compute Capabilities")

# Memory accesses.
MAX_ACCESS_BITS = 128  # the widest vector load or store (v4.b32)

# TMA descriptors (CUtensorMap).
TMA_MAX_RANK = 5  # dimensions of a box
TMA_MAX_BOX = 256  # elements along one dimension of a box
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64  # CUtensorMap's alignment (alignas(64) in cuda.h)
TMA_GLOBAL_ALIGN = 16  # bytes: a tensor map's base address and strides (cuTensorMapEncodeTiled)
TMA_MAX_GLOBAL_DIM = 2**32  # elements along one dimension of the described tensor
TMA_MAX_STRIDE_BYTES = 2**40  # a global stride, exclusive
# A box's coordinates are signed 32-bit, so no copy reaches an element at or past 2**31
# along a dimension: the extent of a dimension nothing bounds. (The encoder accepts
# TMA_MAX_GLOBAL_DIM there too, but the copy then faults with an illegal instruction.)
TMA_MAX_COORDINATE = 2**31
