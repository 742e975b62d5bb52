"""Warp-level building blocks: shuffles of any width, per-lane register choice, bit casts.

Shuffles use the NVVM intrinsics `llvm.nvvm.shfl.sync.{idx,bfly}.i32` with the full
member mask: every lane of the warp must execute them together (PTX ISA, shfl.sync:
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#data-movement-and-conversion-instructions-shfl-sync).
Values wider than 32 bits travel as several 32-bit words; narrower ones are widened.
"""

from __future__ import annotations

from typing import Optional

from llvmlite import ir

from ..errors import CompilationError
from . import llvm_types as T
from .indexing import xor_of_bits

FULL_MASK = ir.Constant(T.I32, -1)
CLAMP = ir.Constant(T.I32, 0x1F)  # c operand: whole warp, no segments


def type_bits(llvm_type: ir.Type) -> int:
    if isinstance(llvm_type, ir.PointerType):
        return 64
    if isinstance(llvm_type, ir.IntType):
        return max(llvm_type.width, 8)
    return {"half": 16, "bfloat": 16, "float": 32, "double": 64}[str(llvm_type)]


def is_half(value: ir.Value) -> bool:
    """A 16-bit float (half or bfloat)."""
    return str(value.type) in ("half", "bfloat")


def pack_word(b: ir.IRBuilder, values: list[ir.Value], bits: int) -> ir.Value:
    """Elements of `bits` bits each into one 32-bit register, the first in the lowest bits
    (an operand of mma, wgmma or stmatrix).

    A 16-bit float pair is a vector bitcast: when the pair came out of one 32-bit register
    (a packed cvt, see lower_cast), LLVM folds the repack away."""
    if len(values) == 1:
        return to_bits(b, values[0]) if values[0].type != T.I32 else values[0]
    if len(values) == 2 and is_half(values[0]) and values[1].type == values[0].type:
        vector = ir.Constant(ir.VectorType(values[0].type, 2), None)
        for j, value in enumerate(values):
            vector = b.insert_element(vector, value, ir.Constant(T.I32, j))
        return b.bitcast(vector, T.I32)
    word = None
    for j, value in enumerate(values):
        part = b.zext(to_bits(b, value), T.I32)
        if j:
            part = b.shl(part, ir.Constant(T.I32, j * bits))
        word = part if word is None else b.or_(word, part)
    return word


def to_bits(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """The value as an integer of `type_bits` bits (i1 -> i8, pointers -> i64)."""
    llvm_type = value.type
    if isinstance(llvm_type, ir.PointerType):
        return b.ptrtoint(value, T.I64)
    if isinstance(llvm_type, ir.IntType):
        return b.zext(value, T.I8) if llvm_type.width == 1 else value
    return b.bitcast(value, ir.IntType(type_bits(llvm_type)))


def from_bits(b: ir.IRBuilder, bits: ir.Value, llvm_type: ir.Type) -> ir.Value:
    """Inverse of `to_bits`."""
    if isinstance(llvm_type, ir.PointerType):
        return b.inttoptr(bits, llvm_type)
    if isinstance(llvm_type, ir.IntType):
        return b.trunc(bits, T.I1) if llvm_type.width == 1 else bits
    return b.bitcast(bits, llvm_type)


def _words(b: ir.IRBuilder, value: ir.Value) -> list[ir.Value]:
    bits = to_bits(b, value)
    width = bits.type.width
    if width < 32:
        return [b.zext(bits, T.I32)]
    if width == 32:
        return [bits]
    vector = b.bitcast(bits, ir.VectorType(T.I32, width // 32))
    return [b.extract_element(vector, ir.Constant(T.I32, i)) for i in range(width // 32)]


def _unwords(b: ir.IRBuilder, words, llvm_type: ir.Type) -> ir.Value:
    width = type_bits(llvm_type)
    if width < 32:
        return from_bits(b, b.trunc(words[0], ir.IntType(width)), llvm_type)
    if width == 32:
        return from_bits(b, words[0], llvm_type)
    vector = ir.Constant(ir.VectorType(T.I32, width // 32), None)
    for i, word in enumerate(words):
        vector = b.insert_element(vector, word, ir.Constant(T.I32, i))
    return from_bits(b, b.bitcast(vector, ir.IntType(width)), llvm_type)


def shuffle(ctx, value: ir.Value, lane: ir.Value, mode: str) -> ir.Value:
    """shfl.sync.<mode> of any value: mode "bfly" (lane = XOR mask) or "idx" (source lane)."""
    b = ctx.builder
    words = _words(b, value)
    moved = [ctx.intrinsic(f"llvm.nvvm.shfl.sync.{mode}.i32", T.I32, [FULL_MASK, w, lane, CLAMP]) for w in words]
    return _unwords(b, moved, value.type)


def shuffle_xor(ctx, value: ir.Value, lane_mask: int) -> ir.Value:
    return shuffle(ctx, value, ir.Constant(T.I32, lane_mask), "bfly")


# --------------------------------------------------------------- per-lane choices
def lane_in(ctx, lanes: int) -> Optional[ir.Value]:
    """i1: this thread's lane is in the set `lanes` (bit L = lane L); None when all are."""
    lanes &= 0xFFFFFFFF
    if lanes == 0xFFFFFFFF:
        return None
    if lanes == 0:
        return ir.Constant(T.I1, 0)

    def make(builder: ir.IRBuilder) -> ir.Value:
        lane = ctx.hardware_index("lane")
        for bit in range(5):
            with_bit = sum(1 << L for L in range(32) if L >> bit & 1)
            if lanes in (with_bit, with_bit ^ 0xFFFFFFFF):
                test = builder.and_(lane, ir.Constant(T.I32, 1 << bit))
                predicate = "!=" if lanes == with_bit else "=="
                return builder.icmp_unsigned(predicate, test, ir.Constant(T.I32, 0))
        shifted = builder.lshr(ir.Constant(T.I32, lanes - (1 << 32) if lanes >> 31 else lanes), lane)
        return builder.trunc(shifted, T.I1)

    return ctx.cached(("lane_in", lanes), make)


def pick_by_lane(ctx, choices, registers) -> Optional[ir.Value]:
    """Per lane L, `registers[choices[L]]` (choices[L] == -1: any value will do)."""
    lanes_of: dict[int, int] = {}
    for lane, register in enumerate(choices):
        if register >= 0:
            lanes_of[register] = lanes_of.get(register, 0) | 1 << lane
    if not lanes_of:
        return None
    ordered = sorted(lanes_of, key=lambda r: -bin(lanes_of[r]).count("1"))
    value = registers[ordered[0]]
    for register in ordered[1:]:
        value = ctx.builder.select(lane_in(ctx, lanes_of[register]), registers[register], value)
    return value


def pick_by_lane_and_warp(ctx, choices, registers, warp_xor) -> Optional[ir.Value]:
    """Like `pick_by_lane`, with every choice XORed by warp_xor[b] for each set warp bit b."""
    xors = {0}
    for x in warp_xor:
        xors |= {v ^ x for v in xors}
    if xors == {0}:
        return pick_by_lane(ctx, choices, registers)
    runtime = ctx.cached(("warp_register_xor", tuple(warp_xor)), lambda builder: xor_of_bits(
        builder, ctx.hardware_index("warp"), list(warp_xor)))
    value = None
    for x in sorted(xors):
        moved = pick_by_lane(ctx, [c ^ x if c >= 0 else -1 for c in choices], registers)
        if value is None:
            value = moved
        else:
            value = ctx.builder.select(ctx.builder.icmp_unsigned("==", runtime, ir.Constant(T.I32, x)), moved, value)
    return value


def affine_lane_function(ctx, table) -> ir.Value:
    """The runtime value table[lane] for a table affine over GF(2) (c XOR linear(lane))."""
    base = table[0]
    columns = [table[1 << bit] ^ base for bit in range(5)]
    for lane, value in enumerate(table):
        expected = base
        for bit in range(5):
            if lane >> bit & 1:
                expected ^= columns[bit]
        if value != expected:
            raise CompilationError(f"internal: shuffle source lanes {list(table)} are not XOR-affine in the lane")

    def make(builder: ir.IRBuilder) -> ir.Value:
        linear = xor_of_bits(builder, ctx.hardware_index("lane"), columns)
        if linear is None:
            return ir.Constant(T.I32, base)
        return builder.xor(linear, ir.Constant(T.I32, base)) if base else linear

    return ctx.cached(("lane_function", tuple(table)), make)
