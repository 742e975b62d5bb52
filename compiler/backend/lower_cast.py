"""Lowering of `cast`: numeric conversion between every pair of element types.

- to i1: `x != 0` (floats: NaN counts as true, like Python's bool);
- from i1: 0 or 1 (never -1);
- integer widening sign-extends signed sources and zero-extends unsigned ones;
- float to float rounds to nearest even (16-bit <-> 16-bit goes through fp32, exactly);
  a tensor's fp32 registers go to bf16/fp16 in pairs, one `cvt.rn.{bf16x2,f16x2}.f32`
  per pair, whose halves consumers that pack 16-bit pairs again (wgmma register A)
  get back without any instruction;
- float to integer truncates toward zero (cvt.rzi; out-of-range values are undefined,
  as in C and Triton);
- fp8 (e4m3, e5m2) converts through f16 with the sm_89+ `cvt` instructions in `ptx_asm`;
  conversions to fp8 saturate to the largest finite value.
- pointers <-> 64-bit integers keep the address bits; pointer to pointer is free.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import Cast
from ..types import PointerType, TensorType, bf16, fp16, fp32
from . import llvm_types as T
from . import ptx_asm
from .context import Lowering, elementwise, lowers


def _inline(ctx: Lowering, asm: tuple[str, str], return_type: ir.Type, args) -> ir.Value:
    text, constraints = asm
    function_type = ir.FunctionType(return_type, [a.type for a in args])
    return ctx.builder.call(ir.InlineAsm(function_type, text, constraints), list(args))


def fp8_to_f32(ctx: Lowering, x: ir.Value, fp8_name: str) -> ir.Value:
    b = ctx.builder
    pair = _inline(ctx, ptx_asm.fp8_to_f16x2(fp8_name), T.I32, [b.zext(x, T.I16)])
    return b.fpext(b.bitcast(b.trunc(pair, T.I16), T.F16), T.F32)


def f32_to_fp8(ctx: Lowering, x: ir.Value, fp8_name: str) -> ir.Value:
    b = ctx.builder
    pair = _inline(ctx, ptx_asm.f32_pair_to_fp8x2(fp8_name), T.I16, [ir.Constant(T.F32, 0.0), x])
    return b.trunc(pair, T.I8)


def _float_to_float(b: ir.IRBuilder, x: ir.Value, target: ir.Type) -> ir.Value:
    source_bits, target_bits = _float_bits(x.type), _float_bits(target)
    if source_bits == target_bits:  # fp16 <-> bf16: exact through fp32
        return b.fptrunc(b.fpext(x, T.F32), target)
    return b.fpext(x, target) if target_bits > source_bits else b.fptrunc(x, target)


def _float_bits(llvm_type: ir.Type) -> int:
    return {"half": 16, "bfloat": 16, "float": 32, "double": 64}[str(llvm_type)]


def convert(ctx: Lowering, x: ir.Value, source, target) -> ir.Value:
    """One register from element type `source` to `target`."""
    b = ctx.builder
    if source == target:
        return x
    if isinstance(source, PointerType) or isinstance(target, PointerType):
        if isinstance(source, PointerType) and isinstance(target, PointerType):
            return x
        if isinstance(source, PointerType):
            return b.ptrtoint(x, T.element_type(target))
        return b.inttoptr(b.zext(x, T.I64) if x.type.width < 64 else x, T.GLOBAL_PTR)
    if T.is_fp8(source):
        return convert(ctx, fp8_to_f32(ctx, x, source.name), fp32, target)
    if T.is_fp8(target):
        return f32_to_fp8(ctx, convert(ctx, x, source, fp32), target.name)
    llvm_target = T.element_type(target)
    if target.is_bool:
        if source.is_float:
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))
        return b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
    if source.is_float and target.is_float:
        return _float_to_float(b, x, llvm_target)
    if source.is_float:
        return b.fptosi(x, llvm_target) if target.is_signed else b.fptoui(x, llvm_target)
    if target.is_float:
        return b.sitofp(x, llvm_target) if source.is_signed else b.uitofp(x, llvm_target)
    if source.bits == target.bits:
        return x
    if source.bits > target.bits:
        return b.trunc(x, llvm_target)
    return b.sext(x, llvm_target) if source.is_signed else b.zext(x, llvm_target)


def f32_pairs_to_half(ctx: Lowering, registers, half_name: str) -> tuple:
    """Registers (an even count) converted two by two with one packed cvt each; the
    halves come back as 16-bit values through a bitcast LLVM folds into a repack."""
    b = ctx.builder
    element = {"bf16": T.BF16, "fp16": T.F16}[half_name]
    out = []
    for lo, hi in zip(registers[0::2], registers[1::2]):
        word = _inline(ctx, ptx_asm.f32_pair_to_half2(half_name), T.I32, [hi, lo])
        pair = b.bitcast(word, ir.VectorType(element, 2))
        out += [b.extract_element(pair, ir.Constant(T.I32, i)) for i in range(2)]
    return tuple(out)


@lowers(Cast)
def lower_cast(ctx: Lowering, op: Cast) -> None:
    source = T.element_of(op.operand.type)
    target = T.element_of(op.result.type)
    if source == fp32 and target in (bf16, fp16) and isinstance(op.result.type, TensorType) \
            and isinstance(op.operand.type, TensorType):
        count = T.register_count(op.result.type)
        if count % 2 == 0:
            ctx.define(op.result, f32_pairs_to_half(ctx, ctx.registers(op.operand, count), target.name))
            return
    elementwise(ctx, op.result, (op.operand,), lambda _, x: convert(ctx, x, source, target))
