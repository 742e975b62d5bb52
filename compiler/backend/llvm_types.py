"""weft IR types as LLVM types, and constants of them.

Pointers are opaque: `ptr addrspace(1)` for global memory, `ptr addrspace(3)` for shared
memory (32 bits wide under --nvptx-short-ptr). Booleans are `i1` in registers and one
byte in memory, as in Triton. fp8 values live in `i8` registers; their conversions go
through inline PTX (`ptx_asm`).
"""

from __future__ import annotations

import math
import struct

from llvmlite import ir
from llvmlite.ir import types as ir_types

from ..errors import CompilationError
from ..types import PointerType, ScalarType, SharedType, TensorType

GLOBAL, SHARED, CONSTANT = 1, 3, 4


class BFloatType(ir_types._BaseFloatType):
    """LLVM's `bfloat` (llvmlite's IR layer has no bfloat type of its own).

    Constants print as `0xR` and the 16 bits of the value rounded to nearest even.
    """

    null = "0xR0000"
    intrinsic_name = "bf16"

    def __str__(self):
        return "bfloat"

    def format_constant(self, value):
        bits = float_bits(value)
        if (bits & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it quiet
            return "0xR7FC0"
        bits += 0x7FFF + ((bits >> 16) & 1)
        return f"0xR{(bits >> 16) & 0xFFFF:04X}"


BFloatType._create_instance()

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, BF16, F32, F64 = ir.HalfType(), BFloatType(), ir.FloatType(), ir.DoubleType()
GLOBAL_PTR = ir.PointerType(addrspace=GLOBAL)
SHARED_PTR = ir.PointerType(addrspace=SHARED)
GENERIC_PTR = ir.PointerType()

_SCALARS = {
    "i1": I1, "i8": I8, "i16": I16, "i32": I32, "i64": I64,
    "u8": I8, "u16": I16, "u32": I32, "u64": I64,
    "fp8e4m3": I8, "fp8e5m2": I8, "fp16": F16, "bf16": BF16, "fp32": F32, "fp64": F64,
}


def is_fp8(element) -> bool:
    return isinstance(element, ScalarType) and element.name.startswith("fp8")


def is_llvm_float(element) -> bool:
    """Floats LLVM computes with natively (fp8 is bytes until converted)."""
    return isinstance(element, ScalarType) and element.is_float and not is_fp8(element)


def element_type(element) -> ir.Type:
    """The register type of one element."""
    if isinstance(element, PointerType):
        return GLOBAL_PTR
    return _SCALARS[element.name]


def memory_type(element) -> ir.Type:
    """The type of one element in memory: i1 is stored as a byte."""
    return I8 if isinstance(element, ScalarType) and element.is_bool else element_type(element)


def memory_bytes(element) -> int:
    if isinstance(element, PointerType):
        return 8
    return max(element.bits // 8, 1)


def element_of(type_):
    if isinstance(type_, (TensorType, SharedType)):
        return type_.element
    return type_


def value_type(type_) -> ir.Type:
    """The LLVM type of one register of a value of IR type `type_`."""
    return element_type(element_of(type_))


def register_count(type_) -> int:
    """How many LLVM values a tensor of this type becomes (its layout's register size)."""
    if not isinstance(type_, TensorType):
        return 1
    if type_.layout is None:
        raise CompilationError(f"{type_} has no layout; the backend needs the `layout` stage")
    return type_.layout.in_dims.get("register", 1)


def constant(element, value) -> ir.Constant:
    """An LLVM constant of an element type (floats to fp8 round through fp32 bits)."""
    llvm_type = element_type(element)
    if isinstance(element, PointerType):
        if value != 0:
            raise CompilationError(f"pointer constant {value!r}: only null pointers are constants")
        return ir.Constant(llvm_type, None)
    if is_fp8(element):
        if value == 0 and math.copysign(1.0, value) > 0:  # +0.0: all zero bits in e4m3 and e5m2
            return ir.Constant(llvm_type, 0)
        raise CompilationError(f"fp8 constant {value!r}: build it in fp32 and cast")
    if element.is_float:
        return ir.Constant(llvm_type, float(value))
    bits = element.bits
    wrapped = int(value) & ((1 << bits) - 1)
    if bits > 1 and wrapped >> (bits - 1):  # LLVM spells integer constants signed
        wrapped -= 1 << bits
    return ir.Constant(llvm_type, wrapped)


def float_bits(value: float) -> int:
    """The IEEE fp32 bits of a Python float (rounded to fp32)."""
    return struct.unpack("<I", struct.pack("<f", value))[0]
