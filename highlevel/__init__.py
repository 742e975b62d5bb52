"""weft.highlevel: Triton-style tile kernels whose layouts the compiler infers (docs/design.md).

Kernels never name a layout; the `tile`-stage IR they build goes through axis analysis,
coalescing, layout propagation and lowering (compiler/pipeline.py, TILE_PASSES) to the same
explicit `layout` IR that lowlevel kernels build, and on through the same backend. Code
written for Triton's `tl` in the supported subset ports by changing the imports
(`triton.jit`, `triton.autotune`, `triton.Config`, `triton.heuristics`, `triton.cdiv` and
`triton.next_power_of_2` are here too):

    from weft import highlevel as tl          # import triton.language as tl
    from weft import highlevel as triton      # import triton

    @tl.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask) + tl.load(y_ptr + offsets, mask), mask)
"""

from ..compiler.builder import constexpr_function, register_language, static_range
from ..compiler.types import ScalarType, SharedType, TensorDescriptorType
from ..lowlevel.shared import SharedMemoryDescriptor
from ..lowlevel.dtypes import (bf16, bfloat16, float8e4nv, float8e5, float16, float32, float64, fp8e4m3,
                               fp8e5m2, fp16, fp32, fp64, i1, i8, i16, i32, i64, int1, int8, int16, int32,
                               int64, pointer_type, u8, u16, u32, u64, uint8, uint16, uint32, uint64)
from ..runtime.autotune import Config, autotune, heuristics
from ..runtime.jit import constexpr
from .builtins import (abs, arange, atomic_add, atomic_and, atomic_cas, atomic_max, atomic_min, atomic_or,
                       atomic_xchg, atomic_xor, argmax, argmin, broadcast, broadcast_to, cdiv, ceil, cos, debug_barrier,
                       device_assert, device_print, erf, exp, exp2, expand_dims, floor, fma, full, load, log,
                       log2, max, maximum, min, minimum, next_power_of_2, num_programs, permute, program_id,
                       rsqrt, sin, sqrt, static_assert, static_print, store, sum, trans, where, zeros,
                       zeros_like)
from .builtins import associative_scan, cumprod, cumsum, interleave, join, ravel, reshape, split, view
from . import math
from .block_pointer import advance, make_block_ptr
from .hints import assume, max_constancy, max_contiguous, multiple_of, range
from .dot import dot
from .jit import jit
from .math import umulhi
from .random import (pair_uniform_to_normal, philox, rand, rand4x, randint, randint4x, randn, randn4x,
                     uint_to_uniform_float)
from .tensor import Tensor
from .tensor_descriptor import TensorDescriptor as tensor_descriptor
from .tensor_descriptor import load_tensor_descriptor, make_tensor_descriptor, set_allocator, store_tensor_descriptor
from . import tools
from .unsupported import unsupported_name_error

dtype = ScalarType
tensor = Tensor


def _wrap(value):
    """How highlevel kernels see IR values: as tile tensors, descriptors as descriptors
    (shared buffers only appear inside the ops that stage through them)."""
    if isinstance(value.type, TensorDescriptorType):
        return tensor_descriptor(value)
    if isinstance(value.type, SharedType):
        return SharedMemoryDescriptor(value)
    return Tensor(value)


# Tensors start without layouts (`tile` stage); the inference passes choose them.
register_language("highlevel", _wrap, stage="tile", prefix="tl")


def __getattr__(name: str):
    """Only names not defined above get here: a Triton name (`tl.sort`) says it is not
    supported yet and what to use instead, inside a kernel too (at the user's line)."""
    raise unsupported_name_error(__name__, name)

__all__ = [
    # kernels and compile-time helpers
    "jit", "autotune", "Config", "heuristics", "constexpr", "constexpr_function", "static_range", "range",
    # values
    "Tensor", "tensor", "tensor_descriptor", "dtype", "pointer_type", "tools",
    # ops
    "program_id", "num_programs", "arange", "full", "zeros", "zeros_like", "load", "store", "where",
    "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "erf", "sin", "cos", "floor", "ceil", "abs",
    "maximum", "minimum", "fma", "cdiv", "next_power_of_2", "sum", "max", "min", "argmax", "argmin",
    "expand_dims", "broadcast_to", "broadcast", "permute", "trans", "reshape", "view", "ravel", "join", "split",
    "interleave",
    "philox", "randint", "randint4x", "rand", "rand4x", "randn", "randn4x", "uint_to_uniform_float",
    "pair_uniform_to_normal", "associative_scan", "cumsum", "cumprod", "make_block_ptr", "advance",
    "make_tensor_descriptor", "load_tensor_descriptor", "store_tensor_descriptor", "set_allocator",
    "multiple_of", "max_contiguous", "max_constancy", "assume", "math", "umulhi", "dot",
    "device_print", "device_assert", "static_assert", "static_print", "debug_barrier",
    # element types
    "int1", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "float8e4nv", "float8e5",
    "i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64",
    "fp8e4m3", "fp8e5m2",
]
