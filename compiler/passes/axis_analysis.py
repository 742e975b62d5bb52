"""axis_analysis: contiguity, divisibility and constancy of integer and pointer tensors.

For each dim d of a value (Triton's AxisInfo):
- contiguity[d] = C: along d the values run in steps of +1 over aligned groups of C elements;
- divisibility[d] = D: the first value of each such group is a multiple of D (for pointers,
  the address in bytes);
- constancy[d] = K: the values are equal over aligned groups of K elements.
Everything is a power of two. Unknown facts are 1, the safe answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ..ir import (AddPtr, Arange, Binary, Broadcast, Compare, Constant, ExpandDims, Kernel, Op,
                  Select, Splat, Value)
from ..types import PointerType, TensorType

NAME = "axis_analysis"
MAX_DIVISIBILITY = 1 << 30


@dataclass(frozen=True)
class AxisInfo:
    contiguity: tuple[int, ...]
    divisibility: tuple[int, ...]
    constancy: tuple[int, ...]


def _pow2_divisor(value: int) -> int:
    if value == 0:
        return MAX_DIVISIBILITY
    return min(value & -value, MAX_DIVISIBILITY)


def _shape(value: Value) -> tuple[int, ...]:
    return value.type.shape if isinstance(value.type, TensorType) else ()


def _unknown(value: Value) -> AxisInfo:
    rank = len(_shape(value))
    return AxisInfo((1,) * rank, (1,) * rank, (1,) * rank)


def _uniform(value: Value, divisibility: int) -> AxisInfo:
    shape = _shape(value)
    return AxisInfo((1,) * len(shape), (divisibility,) * len(shape) or (), tuple(shape))


def _scalar_div(info: AxisInfo) -> int:
    return info.divisibility[0] if info.divisibility else 1


def analyze_axes(kernel: Kernel) -> dict[Value, AxisInfo]:
    """AxisInfo for every integer or pointer value of the kernel (others are absent)."""
    infos: dict[Value, AxisInfo] = {}
    scalar_div: dict[Value, int] = {}
    for param, div in zip(kernel.params, kernel.param_divisibility or ()):
        scalar_div[param] = div
    for op in kernel.walk():
        for result in op.defines():
            infos[result] = _infer(op, result, infos, scalar_div)
    return infos


def _get(infos, scalar_div, value: Value) -> AxisInfo:
    if value in infos:
        return infos[value]
    if not isinstance(value.type, TensorType):
        return AxisInfo((), (scalar_div.get(value, 1),), ())
    return _unknown(value)


def _infer(op: Op, result: Value, infos, scalar_div) -> AxisInfo:
    get = lambda v: _get(infos, scalar_div, v)  # noqa: E731
    if isinstance(op, Arange):
        return AxisInfo((op.end - op.start,), (_pow2_divisor(op.start),), (1,))
    if isinstance(op, Constant) and isinstance(op.value, int) and not isinstance(op.value, bool):
        div = _pow2_divisor(op.value)
        if isinstance(result.type, TensorType):
            return _uniform(result, div)
        scalar_div[result] = div
        return AxisInfo((), (div,), ())
    if isinstance(op, Splat):
        return _uniform(result, _scalar_div(get(op.operand)))
    if isinstance(op, ExpandDims):
        a = get(op.operand)
        insert = lambda t, v: t[: op.axis] + (v,) + t[op.axis:]  # noqa: E731
        return AxisInfo(insert(a.contiguity, 1), insert(a.divisibility, a.divisibility[0] if a.divisibility else 1), insert(a.constancy, 1))
    if isinstance(op, Broadcast):
        a = get(op.operand)
        src, dst = _shape(op.operand), _shape(result)
        return AxisInfo(
            tuple(c if s == d else 1 for c, s, d in zip(a.contiguity, src, dst)),
            a.divisibility,
            tuple(k if s == d else d for k, s, d in zip(a.constancy, src, dst)),
        )
    if not isinstance(result.type, TensorType):
        if isinstance(op, AddPtr):
            elem_bytes = max(result.type.pointee.bits // 8, 1)
            div = gcd(_scalar_div(get(op.pointer)), _scalar_div(get(op.offset)) * elem_bytes)
            scalar_div[result] = min(div, MAX_DIVISIBILITY)
            return AxisInfo((), (scalar_div[result],), ())
        if isinstance(op, Binary) and op.kind in ("add", "sub", "mul"):
            a, b = get(op.lhs), get(op.rhs)
            div = _scalar_div(a) * _scalar_div(b) if op.kind == "mul" else gcd(_scalar_div(a), _scalar_div(b))
            scalar_div[result] = min(div, MAX_DIVISIBILITY)
            return AxisInfo((), (scalar_div[result],), ())
        return AxisInfo((), (1,), ())
    if isinstance(op, AddPtr):
        p, o = get(op.pointer), get(op.offset)
        elem_bytes = max(result.type.element.pointee.bits // 8, 1)
        return _add_like(p, o, scale_rhs=elem_bytes)
    if isinstance(op, Binary):
        a, b = get(op.lhs), get(op.rhs)
        if op.kind in ("add", "sub"):
            return _add_like(a, b, scale_rhs=1, subtract=op.kind == "sub")
        if op.kind == "mul":
            return AxisInfo(
                tuple(1 for _ in a.contiguity),
                tuple(min(x * y, MAX_DIVISIBILITY) for x, y in zip(a.divisibility, b.divisibility)),
                tuple(gcd(x, y) for x, y in zip(a.constancy, b.constancy)),
            )
        if op.kind in ("and", "or"):
            return AxisInfo(tuple(1 for _ in a.contiguity), tuple(1 for _ in a.contiguity),
                            tuple(gcd(x, y) for x, y in zip(a.constancy, b.constancy)))
    if isinstance(op, Compare):
        a, b = get(op.lhs), get(op.rhs)
        constancy = []
        for d in range(len(a.constancy)):
            k = gcd(a.constancy[d], b.constancy[d])
            # A run of C consecutive values starting at a multiple of C compared against a
            # value constant over the run and divisible by C gives one answer for the run.
            if op.predicate in ("lt", "ge", "le", "gt") and b.constancy[d] >= a.contiguity[d]:
                k = max(k, gcd(a.contiguity[d], gcd(a.divisibility[d], b.divisibility[d])))
            constancy.append(k)
        return AxisInfo(tuple(1 for _ in constancy), tuple(1 for _ in constancy), tuple(constancy))
    if isinstance(op, Select):
        c, a, b = get(op.condition), get(op.true_value), get(op.false_value)
        return AxisInfo(tuple(1 for _ in a.contiguity),
                        tuple(gcd(x, y) for x, y in zip(a.divisibility, b.divisibility)),
                        tuple(gcd(gcd(x, y), z) for x, y, z in zip(a.constancy, b.constancy, c.constancy)))
    return _unknown(result)


def _add_like(a: AxisInfo, b: AxisInfo, scale_rhs: int, subtract: bool = False) -> AxisInfo:
    contiguity, divisibility, constancy = [], [], []
    for d in range(len(a.contiguity)):
        contiguity.append(max(gcd(a.contiguity[d], b.constancy[d]),
                              1 if subtract else gcd(a.constancy[d], b.contiguity[d])))
        divisibility.append(min(gcd(a.divisibility[d], b.divisibility[d] * scale_rhs), MAX_DIVISIBILITY))
        constancy.append(gcd(a.constancy[d], b.constancy[d]))
    return AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy))
