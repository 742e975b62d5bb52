"""Element types by the names kernels use: Triton/Gluon spellings and short aliases.

They are the compiler's `ScalarType` values, so `x.dtype == ll.float32` and
`ll.float32 == ll.fp32` hold and each prints as its signature string ("fp32").
"""

from __future__ import annotations

from ..compiler import types as _t
from ..compiler.builder import constexpr_function
from ..compiler.types import PointerType, ScalarType

int1 = _t.i1
int8, int16, int32, int64 = _t.i8, _t.i16, _t.i32, _t.i64
uint8, uint16, uint32, uint64 = _t.u8, _t.u16, _t.u32, _t.u64
float16, bfloat16, float32, float64 = _t.fp16, _t.bf16, _t.fp32, _t.fp64
float8e4nv, float8e5 = _t.fp8e4m3, _t.fp8e5m2

# Short aliases, spelled as in signatures.
i1, i8, i16, i32, i64 = int1, int8, int16, int32, int64
u8, u16, u32, u64 = uint8, uint16, uint32, uint64
fp16, bf16, fp32, fp64 = float16, bfloat16, float32, float64
fp8e4m3, fp8e5m2 = float8e4nv, float8e5


@constexpr_function
def pointer_type(element: ScalarType) -> PointerType:
    """The type of a pointer to `element` (for `.to(ll.pointer_type(ll.float16))`)."""
    return PointerType(element)
