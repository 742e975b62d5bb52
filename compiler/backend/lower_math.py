"""Lowering of unary math the way Triton lowers it: libdevice where Triton calls libdevice,
hardware approximations where Triton uses those.

libdevice (`__nv_*` calls; target.py links the functions called and inlines them, with
Triton's flush-to-zero reflect flag, so the bits are Triton's):
- fp32 log, sin, cos, erf, pow (`__nv_logf`, `__nv_sinf`, ... ; sin/cos reduce large
  arguments exactly, by Payne-Hanek);
- fp64 exp, exp2, log, log2, sin, cos, erf, rsqrt, pow (`__nv_exp`, ...).
Hardware approximations (fp32; Triton's choices too, except where said):
- exp(x) = ex2.approx(x * log2 e): about 2 ulp plus |x| * 2^-24 from the scaling; exp2 =
  ex2.approx.ftz.f32 (2 ulp; results below 2^-126 flush to 0, as with Triton's and CUDA's
  fast math: without .ftz, ptxas wraps every MUFU.EX2 in a compare and two multiplies that
  keep denormal results); rsqrt = rsqrt.approx.f32 (2 ulp);
- log2 = lg2.approx.f32 (absolute error 2^-22 near 1, relative 2^-22 elsewhere): weft's own
  choice, where Triton calls `__nv_log2f`; kernels use it as one exp-unit op;
- sqrt_approx (highlevel `tl.sqrt`) = sqrt.approx.ftz.f32, what Triton's `__nv_sqrtf`
  becomes under its flush-to-zero flag; sqrt (lowlevel `sqrt`, `tl.sqrt_rn`) is IEEE
  round-to-nearest (sqrt.rn).
fp16/bf16 compute in fp32 and round once; neg/abs/floor/ceil/sqrt work on any float
width; fp64 sqrt is sqrt.rn.f64 (as libdevice's).
ex2/lg2/sqrt/rsqrt: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#floating-point-instructions
libdevice: https://docs.nvidia.com/cuda/libdevice-users-guide/
"""

from __future__ import annotations

from llvmlite import ir

from .. import exp2_polynomial as poly
from ..errors import CompilationError
from ..ir import Unary
from ..types import TensorType
from . import llvm_types as T
from .context import Lowering, elementwise, lowers

LOG2_E = 1.4426950408889634

# Triton's libdevice function for each unary kind, per width (fp16/bf16 go through fp32).
LIBDEVICE_F32 = {"log": "__nv_logf", "sin": "__nv_sinf", "cos": "__nv_cosf", "erf": "__nv_erff"}
LIBDEVICE_F64 = {"exp": "__nv_exp", "exp2": "__nv_exp2", "log": "__nv_log", "log2": "__nv_log2",
                 "sin": "__nv_sin", "cos": "__nv_cos", "erf": "__nv_erf", "rsqrt": "__nv_rsqrt"}
POW = {"float": "__nv_powf", "double": "__nv_pow"}

_SUFFIX = {"half": "f16", "bfloat": "bf16", "float": "f32", "double": "f64"}


def llvm_suffix(llvm_type: ir.Type) -> str:
    """The overload suffix of an LLVM intrinsic for a type: f32, bf16, i32, ..."""
    if isinstance(llvm_type, ir.IntType):
        return f"i{llvm_type.width}"
    return _SUFFIX[str(llvm_type)]


def f32(value: float) -> ir.Constant:
    return ir.Constant(T.F32, value)


def horner(builder: ir.IRBuilder, ctx: Lowering, x: ir.Value, coefficients) -> ir.Value:
    """c0 + x (c1 + x (c2 + ...)) with fused multiply-adds (fp32)."""
    result = f32(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        result = ctx.intrinsic("llvm.fma.f32", T.F32, [result, x, f32(c)])
    return result


def ex2(ctx: Lowering, x: ir.Value) -> ir.Value:
    """2^x, one MUFU.EX2 (denormal inputs and results flush to zero)."""
    return ctx.intrinsic("llvm.nvvm.ex2.approx.ftz.f", T.F32, [x])


def lg2(ctx: Lowering, x: ir.Value) -> ir.Value:
    return ctx.intrinsic("llvm.nvvm.lg2.approx.f", T.F32, [x])


def libdevice(ctx: Lowering, name: str, args) -> ir.Value:
    """A call of libdevice's `name` (linked and inlined by target.py)."""
    return ctx.intrinsic(name, args[0].type, args)


def float_pow(ctx: Lowering, x: ir.Value, y: ir.Value) -> ir.Value:
    """x ** y by libdevice's pow (fp16/bf16 in fp32, rounded once)."""
    b = ctx.builder
    name = POW.get(str(x.type))
    if name is not None:
        return libdevice(ctx, name, [x, y])
    return b.fptrunc(libdevice(ctx, POW["float"], [b.fpext(x, T.F32), b.fpext(y, T.F32)]), x.type)


def _f32_functions(ctx: Lowering):
    b = ctx.builder
    functions = {
        "exp": lambda x: ex2(ctx, b.fmul(x, f32(LOG2_E))),
        "exp2": lambda x: ex2(ctx, x),
        "log2": lambda x: lg2(ctx, x),
        "rsqrt": lambda x: ctx.intrinsic("llvm.nvvm.rsqrt.approx.f", T.F32, [x]),
        "sqrt_approx": lambda x: ctx.intrinsic("llvm.nvvm.sqrt.approx.ftz.f", T.F32, [x]),
    }
    for kind, name in LIBDEVICE_F32.items():
        functions[kind] = lambda x, name=name: libdevice(ctx, name, [x])
    return functions


_ANY_WIDTH = {"sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil", "abs": "llvm.fabs"}


def unary_float(ctx: Lowering, kind: str, x: ir.Value) -> ir.Value:
    b = ctx.builder
    if kind == "neg":
        return b.fneg(x)
    if kind in _ANY_WIDTH or (kind == "sqrt_approx" and x.type == T.F64):
        intrinsic = _ANY_WIDTH.get(kind, "llvm.sqrt")
        return ctx.intrinsic(f"{intrinsic}.{llvm_suffix(x.type)}", x.type, [x])
    if x.type == T.F64 and kind in LIBDEVICE_F64:
        return libdevice(ctx, LIBDEVICE_F64[kind], [x])
    function = _f32_functions(ctx).get(kind)
    if function is None:
        raise CompilationError(f"unary `{kind}` is not defined on floats")
    if x.type == T.F32:
        return function(x)
    return b.fptrunc(function(b.fpext(x, T.F32)), x.type)


def unary_int(ctx: Lowering, kind: str, x: ir.Value, signed: bool) -> ir.Value:
    b = ctx.builder
    if kind == "neg":
        return b.neg(x)
    if kind == "not":
        return b.not_(x)
    if kind == "abs":
        if not signed:
            return x
        return ctx.intrinsic(f"llvm.abs.i{x.type.width}", x.type, [x, ir.Constant(T.I1, 0)])
    raise CompilationError(f"unary `{kind}` is not defined on integers",
                           suggestion="cast to a float type first")


def exp2_on_fma(ctx: Lowering, x: ir.Value) -> ir.Value:
    """2^x (fp32) by the FMA-pipe polynomial of compiler/exp2_polynomial.py."""
    b = ctx.builder
    x = ctx.intrinsic("llvm.maximum.f32", T.F32, [x, f32(poly.CLAMP_LOW)])  # NaN-propagating
    x = ctx.intrinsic("llvm.minimum.f32", T.F32, [x, f32(poly.CLAMP_HIGH)])
    shifted = ctx.intrinsic("llvm.nvvm.add.rm.f", T.F32, [x, f32(poly.ROUNDING_MAGIC)])
    fraction = b.fsub(x, b.fsub(shifted, f32(poly.ROUNDING_MAGIC)))
    mantissa = horner(b, ctx, fraction, poly.COEFFICIENTS)
    power_bits = b.add(b.shl(b.bitcast(shifted, T.I32), ir.Constant(T.I32, poly.MANTISSA_BITS)),
                       ir.Constant(T.I32, poly.ONE_BITS))
    return b.fmul(mantissa, b.bitcast(power_bits, T.F32))


def lower_split_exp2(ctx: Lowering, op: Unary) -> None:
    """exp2 with `fma_share`: the registers polynomial_registers picks go to the FMA pipe,
    the rest to the exp unit."""
    b = ctx.builder
    count = T.register_count(op.result.type)
    on_fma = set(poly.polynomial_registers(count, op.fma_share))
    results = []
    for index, x in enumerate(ctx.registers(op.operand, count)):
        wide = x if x.type == T.F32 else b.fpext(x, T.F32)
        value = exp2_on_fma(ctx, wide) if index in on_fma else ex2(ctx, wide)
        results.append(value if x.type == T.F32 else b.fptrunc(value, x.type))
    ctx.define(op.result, tuple(results))


@lowers(Unary)
def lower_unary(ctx: Lowering, op: Unary) -> None:
    elem = T.element_of(op.operand.type)
    if T.is_fp8(elem):
        raise CompilationError(f"unary `{op.kind}` on fp8: cast to fp32 first", op.loc)
    if op.fma_share and isinstance(op.result.type, TensorType) and elem.is_float and elem.bits <= 32:
        lower_split_exp2(ctx, op)
    elif elem.is_float:
        elementwise(ctx, op.result, (op.operand,), lambda _, x: unary_float(ctx, op.kind, x))
    else:
        elementwise(ctx, op.result, (op.operand,), lambda _, x: unary_int(ctx, op.kind, x, elem.is_signed))
