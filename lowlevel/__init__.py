"""weft.lowlevel: the explicit, Gluon-style language (docs/design.md).

Every tensor carries a layout the kernel chose. Kernels are Python functions decorated
with `@ll.jit`; inside them the names below build IR (see `compiler/frontend.py` for the
Python subset a kernel may use):

    from weft import lowlevel as ll

    @ll.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: ll.constexpr, L: ll.constexpr):
        offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=L)
        mask = offsets < n
        ll.store(out_ptr + offsets, ll.load(x_ptr + offsets, mask) + ll.load(y_ptr + offsets, mask), mask)
"""

from ..compiler.aggregates import aggregate
from ..compiler.builder import condition, constexpr_function, dynamic_range as range, register_language, static_range
from ..compiler.types import PointerType, ScalarType, SharedType, TensorDescriptorType
from ..compiler.frontend_expr import must_use_result
from ..runtime.autotune import Config, autotune, heuristics
from ..runtime.jit import constexpr
from .atomics import (atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or, atomic_xchg,
                      atomic_xor)
from .builtins import (abs, arange, argmax, argmin, barrier, barrier_any, cdiv, cluster_barrier, prefetch_l2, ceil,
                       convert_layout, cos, device_assert, device_print, erf, exp, exp2, expand_dims, fma, floor, full,
                       load, log, log2, max, maximum, min, minimum, num_programs, permute,
                       program_id, reshape, rsqrt, sin, sqrt, static_assert, static_print, store,
                       sum, to_tensor, warp_any, where, zeros)
from .builtins import num_warps
from .dtypes import (bf16, bfloat16, float8e4nv, float8e5, float16, float32, float64, fp8e4m3,
                     fp8e5m2, fp16, fp32, fp64, i1, i8, i16, i32, i64, int1, int8, int16, int32,
                     int64, pointer_type, u8, u16, u32, u64, uint8, uint16, uint32, uint64)
from .jit import jit
from ..layouts import (BlockedLayout, DistributedLayout, DotOperandLayout, LinearDistributedLayout,
                       LinearSharedLayout, MBarrierLayout, NVMMADistributedLayout, NVMMASharedLayout,
                       SharedLayout, SliceLayout, SwizzledSharedLayout)
from .shared import SharedMemoryDescriptor, allocate_shared_memory, fence_async_shared
from .tensor import Tensor
from . import async_copy, mbarrier, tma  # noqa: E402  (Gluon's Hopper modules)
from .tma import TensorDescriptorValue
from ..runtime.tensor_descriptor import TensorDescriptor
from .warp_specialize import replica_index, warp_specialize
from .mma_v2 import mma_v2
from .warpgroup_mma import warpgroup_mma, warpgroup_mma_accumulator, warpgroup_mma_init, warpgroup_mma_wait

dtype = ScalarType
tensor = Tensor
shared_memory_descriptor = SharedMemoryDescriptor  # Gluon's names, for annotations
tensor_descriptor = TensorDescriptorValue


def _wrap(value):
    """How lowlevel kernels see IR values: shared buffers as descriptors, the rest as tensors."""
    if isinstance(value.type, SharedType):
        return SharedMemoryDescriptor(value)
    if isinstance(value.type, TensorDescriptorType):
        return TensorDescriptorValue(value)
    return Tensor(value)


register_language("lowlevel", _wrap)

__all__ = [
    # kernels and compile-time helpers
    "jit", "autotune", "Config", "heuristics", "constexpr", "constexpr_function", "aggregate", "must_use_result", "num_warps", "to_tensor", "static_range", "range", "condition",
    # layouts
    "BlockedLayout", "SliceLayout", "NVMMADistributedLayout", "DotOperandLayout",
    "LinearDistributedLayout", "SwizzledSharedLayout", "NVMMASharedLayout", "LinearSharedLayout",
    "DistributedLayout", "SharedLayout", "MBarrierLayout",
    # Hopper async machinery
    "mbarrier", "tma", "async_copy", "warpgroup_mma", "warpgroup_mma_wait", "warpgroup_mma_init", "warpgroup_mma_accumulator", "fence_async_shared", "mma_v2",
    "warp_specialize", "replica_index", "TensorDescriptorValue", "TensorDescriptor",
    # values
    "Tensor", "tensor", "SharedMemoryDescriptor", "shared_memory_descriptor", "tensor_descriptor", "dtype", "pointer_type",
    # ops
    "program_id", "num_programs", "arange", "full", "zeros", "load", "store", "where",
    "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "erf", "sin", "cos", "floor", "ceil", "abs",
    "maximum", "minimum", "fma", "cdiv", "sum", "max", "min", "argmax", "argmin", "warp_any",
    "expand_dims", "reshape", "permute", "convert_layout", "allocate_shared_memory", "barrier", "barrier_any",
    "cluster_barrier", "prefetch_l2",
    "device_print", "device_assert", "static_assert", "static_print",
    # element types
    "int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "float8e4nv", "float8e5",
    "i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64",
    "fp8e4m3", "fp8e5m2",
]
