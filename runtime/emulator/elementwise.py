"""Emulation rules: constants, program ids, ranges and elementwise arithmetic.

Operands of an elementwise op share shape and layout, so an op is one numpy call over the
(num_warps, 32, num_registers) arrays (or over numpy scalars), followed by `finish`, which
rounds to bf16/fp8 and keeps integer widths. Float max/min ignore a NaN operand (PTX
`max.f32`, LLVM `maxnum`), as the backend lowers them.
"""

from __future__ import annotations

import math

import numpy as np

from ...compiler import exp2_polynomial as poly
from ...compiler import ir
from ...compiler.types import PointerType, ScalarType, element_of
from .dtypes import bitcast, c_divide, c_remainder, cast, finish, is_float, storage_dtype
from .errors import EmulationError
from .host_pointers import to_virtual
from .registers import axis_coordinate
from .rules import EMULATION_RULES as RULES


def _element(value: ir.Value):
    return element_of(value.type)


@RULES.register(ir.ProgramId)
def program_id(cta, op: ir.ProgramId) -> None:
    cta.bind(op.result, finish(op.result.type, cta.program_id[op.axis]))


@RULES.register(ir.NumPrograms)
def num_programs(cta, op: ir.NumPrograms) -> None:
    cta.bind(op.result, finish(op.result.type, cta.grid[op.axis]))


@RULES.register(ir.Constant)
def constant(cta, op: ir.Constant) -> None:
    cta.bind(op.result, cta.full(op.result.type, op.value))


@RULES.register(ir.Splat)
def splat(cta, op: ir.Splat) -> None:
    cta.bind(op.result, cta.full(op.result.type, cta[op.operand]))


@RULES.register(ir.Arange)
def arange(cta, op: ir.Arange) -> None:
    type_ = op.result.type
    values = cta.memo(op, "values", lambda: finish(
        type_.element, axis_coordinate(cta.layout(type_), cta.num_warps, 0) + op.start))
    cta.bind(op.result, values.copy())


# ------------------------------------------------------------------------ binary
def _shift(a, b, element, left: bool):
    width = np.dtype(storage_dtype(element)).itemsize * 8
    amount = np.asarray(b).astype(np.int64)
    too_far = (amount < 0) | (amount >= width)
    clamped = np.where(too_far, width - 1, amount).astype(np.asarray(a).dtype)
    if left:
        return np.where(too_far, 0, np.left_shift(a, clamped))
    shifted = np.right_shift(a, clamped)  # arithmetic for signed types: sign fill at width - 1
    return shifted if element.is_signed else np.where(too_far, 0, shifted)


def _divide(a, b, element):
    return np.divide(a, b) if is_float(element) else c_divide(a, b)


def _floordiv(a, b, element):
    return np.floor(np.divide(a, b)) if is_float(element) else c_divide(a, b)


def _mod(a, b, element):
    return np.fmod(a, b) if is_float(element) else c_remainder(a, b)


def _maximum(a, b, element):
    return np.fmax(a, b) if is_float(element) else np.maximum(a, b)


def _minimum(a, b, element):
    return np.fmin(a, b) if is_float(element) else np.minimum(a, b)


BINARY = {
    "add": lambda a, b, e: np.add(a, b),
    "sub": lambda a, b, e: np.subtract(a, b),
    "mul": lambda a, b, e: np.multiply(a, b),
    "div": _divide,
    "floordiv": _floordiv,
    "mod": _mod,
    "and": lambda a, b, e: np.bitwise_and(a, b),
    "or": lambda a, b, e: np.bitwise_or(a, b),
    "xor": lambda a, b, e: np.bitwise_xor(a, b),
    "shl": lambda a, b, e: _shift(a, b, e, left=True),
    "shr": lambda a, b, e: _shift(a, b, e, left=False),
    "max": _maximum,
    "min": _minimum,
    "pow": lambda a, b, e: np.power(a, b),
}


@RULES.register(ir.Binary)
def binary(cta, op: ir.Binary) -> None:
    element = _element(op.result)
    if op.kind not in BINARY:
        raise EmulationError(f"unknown binary kind {op.kind!r}", op.loc)
    if isinstance(element, PointerType):
        raise EmulationError(f"`{op.kind}` on pointers: use add_ptr", op.loc)
    result = BINARY[op.kind](cta[op.lhs], cta[op.rhs], element)
    cta.bind(op.result, finish(element, result))


COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
           "gt": np.greater, "ge": np.greater_equal}


@RULES.register(ir.Compare)
def compare(cta, op: ir.Compare) -> None:
    result = COMPARE[op.predicate](cta[op.lhs], cta[op.rhs])
    run = op.register_run
    if run > 1 and np.ndim(result) == 3:
        # The backend computes one predicate per run: check that the claim holds.
        runs = result.reshape(result.shape[:2] + (-1, run))
        if (runs != runs[..., :1]).any():
            raise EmulationError(f"compare marked uniform over runs of {run} registers, but "
                                 "its values differ inside a run (an axis-analysis bug)", op.loc)
    cta.bind(op.result, finish(_element(op.result), result))


# ------------------------------------------------------------------------- unary
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _float_only(function):
    def apply(x, element):
        if not is_float(element):
            raise TypeError(f"needs a floating-point operand, got {element}")
        return function(x)
    return apply


def _flushed(function):
    """`function` (exp2 or exp) as the backend computes it, with ex2.approx.ftz.f32:
    results below 2^-126 (denormal) flush to 0 (fp16/bf16 compute in fp32 on the GPU
    too; fp64 is refused by the backend and left exact here)."""
    def apply(x) -> np.ndarray:
        result = function(x)
        if np.asarray(x).dtype == np.float64:
            return result
        return np.where(np.abs(result) < np.float32(2.0 ** -126), np.zeros_like(result), result)
    return apply


_exp2_ftz = _flushed(np.exp2)


UNARY = {
    "neg": lambda x, e: np.negative(x),
    "not": lambda x, e: np.invert(x),
    "exp": _float_only(_flushed(np.exp)),
    "exp2": _float_only(_exp2_ftz),
    "log": _float_only(np.log),
    "log2": _float_only(np.log2),
    "sqrt": _float_only(np.sqrt),
    "sqrt_approx": _float_only(np.sqrt),
    "rsqrt": _float_only(lambda x: np.reciprocal(np.sqrt(x))),
    "abs": lambda x, e: np.abs(x),
    "erf": _float_only(lambda x: _erf(x).astype(np.asarray(x).dtype)),
    "sin": _float_only(np.sin),
    "cos": _float_only(np.cos),
    "floor": lambda x, e: np.floor(x) if is_float(e) else x,
    "ceil": lambda x, e: np.ceil(x) if is_float(e) else x,
}


def exp2_on_fma(x) -> np.ndarray:
    """2^x by the backend's FMA-pipe polynomial (compiler/exp2_polynomial.py), step by step
    in fp32 (each FMA rounded once)."""
    f32 = np.float32
    x = np.asarray(x, f32)
    x = np.where(np.isnan(x), x, np.clip(x, f32(poly.CLAMP_LOW), f32(poly.CLAMP_HIGH)))
    whole = np.floor(x)  # what the rounded-down add of the magic number leaves
    fraction = (x - whole).astype(f32)
    mantissa = np.full_like(x, poly.COEFFICIENTS[-1])
    for c in reversed(poly.COEFFICIENTS[:-1]):
        mantissa = (mantissa.astype(np.float64) * fraction + c).astype(f32)
    with np.errstate(over="ignore", invalid="ignore"):
        power = np.ldexp(f32(1.0), np.nan_to_num(whole, nan=0.0).astype(np.int32)).astype(f32)
        power = np.where(whole <= poly.CLAMP_LOW, f32(0.0), power)  # bits(t) << 23 gives 0 there
        return (mantissa * power).astype(f32)


def split_exp2(x, share: float) -> np.ndarray:
    """exp2 with `fma_share`: the registers the backend computes by the polynomial (the
    last axis of (warps, 32, registers)) get its values, the rest np.exp2."""
    result = _exp2_ftz(np.asarray(x, np.float32))
    on_fma = list(poly.polynomial_registers(result.shape[-1], share))
    result[..., on_fma] = exp2_on_fma(np.asarray(x)[..., on_fma])
    return result


@RULES.register(ir.Unary)
def unary(cta, op: ir.Unary) -> None:
    element = _element(op.result)
    if op.kind not in UNARY:
        raise EmulationError(f"unknown unary kind {op.kind!r}", op.loc)
    x = cta[op.operand]
    if op.fma_share and np.ndim(x) == 3 and is_float(element) and element.bits <= 32:
        cta.bind(op.result, finish(element, split_exp2(x, op.fma_share)))
    else:
        cta.bind(op.result, finish(element, UNARY[op.kind](x, element)))


@RULES.register(ir.Fma)
def fma(cta, op: ir.Fma) -> None:
    """a * b + c rounded once for 32-bit and narrower floats (the product is exact in fp64)."""
    element = _element(op.result)
    a, b, c = cta[op.a], cta[op.b], cta[op.c]
    if is_float(element) and element.bits <= 32:
        result = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
        cta.bind(op.result, cast(result, ScalarType("fp64"), element))
    else:
        cta.bind(op.result, finish(element, a * b + c))


@RULES.register(ir.Where)
def where(cta, op: ir.Where) -> None:
    condition = cta[op.condition]
    true_value, false_value = cta[op.true_value], cta[op.false_value]
    if np.ndim(condition) == 0:
        result = true_value if bool(condition) else false_value
    else:
        result = np.where(condition, true_value, false_value)
    cta.bind(op.result, finish(_element(op.result), result))


@RULES.register(ir.Cast)
def cast_rule(cta, op: ir.Cast) -> None:
    source, target = _element(op.operand), _element(op.result)
    x = cta[op.operand]
    if isinstance(target, PointerType) and not isinstance(source, PointerType):  # an int: maybe a host address
        cta.bind(op.result, finish(target, to_virtual(cta.memory, x)))
    elif isinstance(source, PointerType) or isinstance(target, PointerType):
        cta.bind(op.result, finish(target, np.asarray(x).astype(np.int64)))
    else:
        cta.bind(op.result, cast(x, source, target))


@RULES.register(ir.Bitcast)
def bitcast_rule(cta, op: ir.Bitcast) -> None:
    source, target = _element(op.operand), _element(op.result)
    x = cta[op.operand]
    if isinstance(source, PointerType) and isinstance(target, PointerType):
        cta.bind(op.result, x)
    else:
        cta.bind(op.result, bitcast(x, source, target))
