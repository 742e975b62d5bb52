"""Lowering of unary math: hardware approximations where PTX has them, polynomials where
it does not (there is no libdevice here).

fp32 accuracy (worst case over the fp32 range, against correctly rounded results):
- exp(x) = ex2.approx(x * log2 e): about 2 ulp plus |x| * 2^-24 from the scaling (Triton's
  lowering); exp2 = ex2.approx.ftz.f32 (2 ulp; results below 2^-126 flush to 0, as with
  Triton's and CUDA's fast math: without .ftz, ptxas wraps every MUFU.EX2 in a compare
  and two multiplies that keep denormal results); log = lg2.approx * ln 2, log2 = lg2.approx
  (absolute error 2^-22 near 1, relative 2^-22 elsewhere);
- sqrt is IEEE round-to-nearest (sqrt.rn.f32); rsqrt = rsqrt.approx.f32 (2 ulp);
- sin/cos: reduction by 2*pi in two fp32 parts, then sin/cos.approx.f32 (absolute error
  below 1e-6 for |x| < 1e5);
- erf: the polynomials below (relative error below 2e-7, checked in the tests).
fp16/bf16 compute in fp32 and round once; neg/abs/floor/ceil/sqrt work on any float
width. fp64 transcendental functions are refused: PTX has no fp64 approximations and
there is no libdevice to link.
ex2/lg2/sin/cos/rsqrt: https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#floating-point-instructions
"""

from __future__ import annotations

import math

from llvmlite import ir

from .. import exp2_polynomial as poly
from ..errors import CompilationError
from ..ir import Unary
from ..types import TensorType
from . import llvm_types as T
from .context import Lowering, elementwise, lowers

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453
TWO_PI_HI = 6.2831854820251465  # fp32(2 pi)
TWO_PI_LO = -1.7484556000744883e-07  # 2 pi - TWO_PI_HI
INV_TWO_PI = 0.15915494309189535

# erf(x) = x * P(x^2) for |x| < 1 (fitted for relative error over [0, 1]).
ERF_SMALL = (1.1283791065216064, -0.37612324953079224, 0.11280180513858795,
             -0.026711322367191315, 0.004917562939226627, -0.0005631463136523962)
# erf(|x|) = 1 - 2^Q(min(|x|, 4) - 2.5) for |x| >= 1: Q fits log2(erfc) on [1, 4]; erfc(4)
# is below half an fp32 ulp of 1, so the clamp is exact in fp32.
ERF_LARGE = (-11.262853622436523, -7.722285747528076, -1.361750602722168, -0.015665486454963684,
             0.003123552305623889, -0.000606181682087481, 0.00011174385144840926,
             -1.9190307284588926e-05, 2.308045850440976e-06)
ERF_SPLIT, ERF_CLAMP, ERF_CENTER = 1.0, 4.0, 2.5

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


def erf_f32(ctx: Lowering, x: ir.Value) -> ir.Value:
    b = ctx.builder
    magnitude = ctx.intrinsic("llvm.fabs.f32", T.F32, [x])
    small = b.fmul(x, horner(b, ctx, b.fmul(x, x), ERF_SMALL))
    clamped = ctx.intrinsic("llvm.minnum.f32", T.F32, [magnitude, f32(ERF_CLAMP)])
    q = horner(b, ctx, b.fsub(clamped, f32(ERF_CENTER)), ERF_LARGE)
    large = ctx.intrinsic("llvm.copysign.f32", T.F32, [b.fsub(f32(1.0), ex2(ctx, q)), x])
    result = b.select(b.fcmp_ordered("<", magnitude, f32(ERF_SPLIT)), small, large)
    return b.select(b.fcmp_unordered("uno", x, x), x, result)  # NaN stays NaN


def _reduce_angle(ctx: Lowering, x: ir.Value) -> ir.Value:
    """x - k * 2 pi with k = rint(x / 2 pi), in two fp32 parts (Cody-Waite)."""
    b = ctx.builder
    k = ctx.intrinsic("llvm.rint.f32", T.F32, [b.fmul(x, f32(INV_TWO_PI))])
    negative_k = b.fneg(k)
    r = ctx.intrinsic("llvm.fma.f32", T.F32, [negative_k, f32(TWO_PI_HI), x])
    return ctx.intrinsic("llvm.fma.f32", T.F32, [negative_k, f32(TWO_PI_LO), r])


def float_pow(ctx: Lowering, x: ir.Value, y: ir.Value) -> ir.Value:
    """x ** y = 2^(y log2 |x|), negative x allowed for integral y (sign (-1)^y), else NaN;
    x ** 0 == 1 for every x. Computed in fp32."""
    b = ctx.builder
    original = x.type
    if original != T.F32:
        if original == T.F64:
            raise CompilationError("fp64 pow needs libdevice, which weft does not link")
        x, y = b.fpext(x, T.F32), b.fpext(y, T.F32)
    magnitude = ctx.intrinsic("llvm.fabs.f32", T.F32, [x])
    result = ex2(ctx, b.fmul(y, lg2(ctx, magnitude)))
    integral = b.fcmp_ordered("==", ctx.intrinsic("llvm.trunc.f32", T.F32, [y]), y)
    half = b.fmul(y, f32(0.5))
    odd = b.and_(integral, b.fcmp_ordered("!=", ctx.intrinsic("llvm.trunc.f32", T.F32, [half]), half))
    negative = b.fcmp_ordered("<", x, f32(0.0))
    result = b.select(b.and_(negative, odd), b.fneg(result), result)
    result = b.select(b.and_(negative, b.not_(integral)), f32(math.nan), result)
    result = b.select(b.fcmp_ordered("==", y, f32(0.0)), f32(1.0), result)
    return result if original == T.F32 else b.fptrunc(result, original)


def _f32_functions(ctx: Lowering):
    b = ctx.builder
    return {
        "exp": lambda x: ex2(ctx, b.fmul(x, f32(LOG2_E))),
        "exp2": lambda x: ex2(ctx, x),
        "log": lambda x: b.fmul(lg2(ctx, x), f32(LN_2)),
        "log2": lambda x: lg2(ctx, x),
        "rsqrt": lambda x: ctx.intrinsic("llvm.nvvm.rsqrt.approx.f", T.F32, [x]),
        "erf": lambda x: erf_f32(ctx, x),
        "sin": lambda x: ctx.intrinsic("llvm.nvvm.sin.approx.f", T.F32, [_reduce_angle(ctx, x)]),
        "cos": lambda x: ctx.intrinsic("llvm.nvvm.cos.approx.f", T.F32, [_reduce_angle(ctx, x)]),
    }


_ANY_WIDTH = {"sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil", "abs": "llvm.fabs"}


def unary_float(ctx: Lowering, kind: str, x: ir.Value) -> ir.Value:
    b = ctx.builder
    if kind == "neg":
        return b.fneg(x)
    if kind in _ANY_WIDTH:
        return ctx.intrinsic(f"{_ANY_WIDTH[kind]}.{llvm_suffix(x.type)}", x.type, [x])
    function = _f32_functions(ctx).get(kind)
    if function is None:
        raise CompilationError(f"unary `{kind}` is not defined on floats")
    if x.type == T.F32:
        return function(x)
    if x.type == T.F64:
        raise CompilationError(f"fp64 `{kind}` needs libdevice, which weft does not link",
                               suggestion="cast to fp32 first if its precision is enough")
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
