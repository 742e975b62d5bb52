"""axis_analysis: contiguity, divisibility and constancy of integer and pointer tensors.

For each dim d of a value (Triton's AxisInfo):
- contiguity[d] = C: along d the values run in steps of +1 over aligned groups of C elements;
- divisibility[d] = D: the first value of each such group is a multiple of D (for pointers,
  the address in bytes);
- constancy[d] = K: the values are equal over aligned groups of K elements.
Everything is a power of two. Unknown facts are 1, the safe answer. A constant also
carries its value (so `x * 1`, a stride specialized to 1, keeps x's facts).

A loop-carried value (a pointer tile advanced each iteration) has the facts its initial
value and the value yielded back share; the body is analysed again until they settle
(Triton's fixpoint over the loop's block arguments).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Optional

from ..ir import (AddPtr, Arange, AxisHint, Binary, Bitcast, Broadcast, Cast, Compare, Constant, ConvertLayout,
                  ExpandDims, For, If, Kernel, Op, Splat, Value, WarpSpecialize, Where)
from ..types import PointerType, TensorType, element_of

NAME = "axis_analysis"
MAX_DIVISIBILITY = 1 << 30


@dataclass(frozen=True)
class AxisInfo:
    contiguity: tuple[int, ...]
    divisibility: tuple[int, ...]
    constancy: tuple[int, ...]
    value: Optional[int] = None  # every element's value, when it is a known constant


def _pow2_divisor(value: int) -> int:
    if value == 0:
        return MAX_DIVISIBILITY
    return min(value & -value, MAX_DIVISIBILITY)


def _shape(value: Value) -> tuple[int, ...]:
    return value.type.shape if isinstance(value.type, TensorType) else ()


def _unknown(value: Value) -> AxisInfo:
    rank = len(_shape(value))
    return AxisInfo((1,) * rank, (1,) * rank, (1,) * rank)


def _uniform(value: Value, divisibility: int, known: Optional[int] = None) -> AxisInfo:
    shape = _shape(value)
    return AxisInfo((1,) * len(shape), (divisibility,) * len(shape) or (), tuple(shape), known)


def _join(a: AxisInfo, b: AxisInfo) -> AxisInfo:
    """The facts that hold for both (a loop-carried value's initial and yielded values)."""
    return AxisInfo(tuple(gcd(x, y) for x, y in zip(a.contiguity, b.contiguity)),
                    tuple(gcd(x, y) for x, y in zip(a.divisibility, b.divisibility)),
                    tuple(gcd(x, y) for x, y in zip(a.constancy, b.constancy)),
                    a.value if a.value == b.value else None)


def _scalar_div(info: AxisInfo) -> int:
    return info.divisibility[0] if info.divisibility else 1


def analyze_axes(kernel: Kernel) -> dict[Value, AxisInfo]:
    """AxisInfo for every integer or pointer value of the kernel (others are absent)."""
    infos: dict[Value, AxisInfo] = {}
    scalar_div: dict[Value, int] = {}
    for param, div in zip(kernel.params, kernel.param_divisibility or ()):
        scalar_div[param] = div
    _analyze_block(kernel.body, infos, scalar_div)
    return infos


# Rounds of a loop body's analysis before its carried values are taken as unknown (facts
# only shrink between rounds, and they settle in two or three in practice).
MAX_LOOP_ROUNDS = 16


def _analyze_block(block, infos: dict, scalar_div: dict) -> None:
    for op in block.ops:
        if isinstance(op, For):
            _analyze_loop(op, infos, scalar_div)
            continue
        if isinstance(op, If):
            _analyze_branches(op, infos, scalar_div)
            continue
        for result in op.defines():
            infos[result] = _infer(op, result, infos, scalar_div)
        if isinstance(op, WarpSpecialize):
            # Every partition's args are the captured values themselves: same facts.
            for region in (op.default, *op.workers):
                for arg, captured in zip(region.args, op.captures):
                    if isinstance(arg.type, TensorType):
                        if captured in infos:
                            infos[arg] = infos[captured]
                    else:
                        scalar_div[arg] = _scalar_div(_get(infos, scalar_div, captured))
        for region in op.nested_blocks():
            _analyze_block(region, infos, scalar_div)


def _analyze_loop(op: For, infos: dict, scalar_div: dict) -> None:
    get = lambda v: _get(infos, scalar_div, v)  # noqa: E731
    # iv = lower + k * step: divisible by whatever divides both.
    scalar_div[op.body.args[0]] = gcd(_scalar_div(get(op.lower)), _scalar_div(get(op.step)))

    def assume(values, facts) -> None:
        for value, fact in zip(values, facts):
            infos[value] = fact
            if not isinstance(value.type, TensorType):
                scalar_div[value] = _scalar_div(fact)

    facts = [get(v) for v in op.inits]
    for _ in range(MAX_LOOP_ROUNDS):
        assume(op.body.args[1:], facts)
        _analyze_block(op.body, infos, scalar_div)
        joined = [_join(fact, get(v)) for fact, v in zip(facts, op.body.ops[-1].values)]
        if joined == facts:
            break
        facts = joined
    else:
        facts = [_unknown(v) if isinstance(v.type, TensorType) else AxisInfo((), (1,), ()) for v in op.inits]
        assume(op.body.args[1:], facts)
        _analyze_block(op.body, infos, scalar_div)
    assume(op.results, facts)


def _analyze_branches(op: If, infos: dict, scalar_div: dict) -> None:
    """An If's results hold what both branches' yields hold (issue_dot_ahead's peeled
    block hands the loop its block pointers' offsets through one: unknown, the loop's
    copies would fall back to scalar loads)."""
    get = lambda v: _get(infos, scalar_div, v)  # noqa: E731
    _analyze_block(op.then_body, infos, scalar_div)
    _analyze_block(op.else_body, infos, scalar_div)
    yields = (op.then_body.ops[-1].values, op.else_body.ops[-1].values)
    for result, then_value, else_value in zip(op.results, *yields):
        fact = _join(get(then_value), get(else_value))
        infos[result] = fact
        if not isinstance(result.type, TensorType):
            scalar_div[result] = _scalar_div(fact)


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
            return _uniform(result, div, op.value)
        scalar_div[result] = div
        return AxisInfo((), (div,), (), op.value)
    if isinstance(op, Splat):
        operand = get(op.operand)
        return _uniform(result, _scalar_div(operand), operand.value)
    if isinstance(op, ExpandDims):
        a = get(op.operand)
        insert = lambda t, v: t[: op.axis] + (v,) + t[op.axis:]  # noqa: E731
        # Along the new dim every element is its own group, so its divisibility must hold
        # for all of them: a contiguous run [k, k+1, ...] only guarantees 1 (Triton's rule).
        divisor = 0
        for c, d in zip(a.contiguity, a.divisibility):
            divisor = gcd(divisor, 1 if c > 1 else d)
        return AxisInfo(insert(a.contiguity, 1), insert(a.divisibility, divisor or 1), insert(a.constancy, 1),
                        a.value)
    if isinstance(op, AxisHint):
        return _hinted(op, result, get(op.operand), scalar_div)
    if isinstance(op, ConvertLayout) or (isinstance(op, (Cast, Bitcast)) and _integer_like(op)):
        return get(op.operand)  # the same values (integer casts: widened or same-width)
    if isinstance(op, Broadcast):
        a = get(op.operand)
        src, dst = _shape(op.operand), _shape(result)
        return AxisInfo(
            tuple(c if s == d else 1 for c, s, d in zip(a.contiguity, src, dst)),
            a.divisibility,
            tuple(k if s == d else d for k, s, d in zip(a.constancy, src, dst)),
            a.value,
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
        if op.kind == "mul" and 1 in (a.value, b.value):
            return b if a.value == 1 else a  # x * 1: a stride specialized to 1
        if op.kind == "mul":
            return AxisInfo(
                tuple(1 for _ in a.contiguity),
                tuple(min(x * y, MAX_DIVISIBILITY) for x, y in zip(a.divisibility, b.divisibility)),
                tuple(gcd(x, y) for x, y in zip(a.constancy, b.constancy)),
            )
        if op.kind == "mod" and element_of(result.type).is_int:
            return _remainder(a, b, _shape(result))
        if op.kind in ("and", "or"):
            return AxisInfo(tuple(1 for _ in a.contiguity), tuple(1 for _ in a.contiguity),
                            tuple(gcd(x, y) for x, y in zip(a.constancy, b.constancy)))
    if isinstance(op, Compare):
        a, b = get(op.lhs), get(op.rhs)
        constancy = []
        for d in range(len(a.constancy)):
            k = gcd(a.constancy[d], b.constancy[d])
            # A run of C consecutive values starting at a multiple of C compared against a
            # value constant over the run and divisible by C gives one answer for the run
            # when the answer changes at that value (`<`, `>=`); `<=` and `>` change one
            # past it, inside a run (`x <= 0` holds for the run's first value only).
            if op.predicate in ("lt", "ge") and b.constancy[d] >= a.contiguity[d]:
                k = max(k, gcd(a.contiguity[d], gcd(a.divisibility[d], b.divisibility[d])))
            constancy.append(k)
        return AxisInfo(tuple(1 for _ in constancy), tuple(1 for _ in constancy), tuple(constancy))
    if isinstance(op, Where):
        c, a, b = get(op.condition), get(op.true_value), get(op.false_value)
        return AxisInfo(tuple(1 for _ in a.contiguity),
                        tuple(gcd(x, y) for x, y in zip(a.divisibility, b.divisibility)),
                        tuple(gcd(gcd(x, y), z) for x, y, z in zip(a.constancy, b.constancy, c.constancy)))
    return _unknown(result)


def _remainder(a: AxisInfo, b: AxisInfo, shape: tuple[int, ...]) -> AxisInfo:
    """`a % b` (the tutorials' `(pid_m * BLOCK_M + arange) % M` wrap of out-of-range rows).

    Along a dim where `a` runs +1 over the whole dim and `b` is one value there, a group of
    g = gcd(contiguity, divisibility of a, divisibility of b) elements starts at a multiple of
    g, and every multiple of b is a multiple of g, so no group crosses a wrap: the result
    runs +1 over g and starts at a multiple of g. The offsets this serves are never negative
    (a negative multiple of b would restart its group at 0); Triton's axis facts make the
    same assumption, so ported kernels vectorise as they do there."""
    contiguity, divisibility, constancy = [], [], []
    for d, size in enumerate(shape):
        b_constant = b.constancy[d] == size
        if a.contiguity[d] == size and b_constant:
            contiguity.append(gcd(a.contiguity[d], gcd(a.divisibility[d], b.divisibility[d])))
        else:
            contiguity.append(1)
        divisibility.append(gcd(a.divisibility[d], b.divisibility[d]) if b.constancy[d] > 1 else 1)
        constancy.append(size if b.value == 1 else gcd(a.constancy[d], b.constancy[d]))
    known = a.value is not None and b.value is not None and a.value >= 0 and b.value > 0
    value = a.value % b.value if known else None
    return AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy), value)


def _hinted(op: AxisHint, result: Value, info: AxisInfo, scalar_div) -> AxisInfo:
    """The operand's facts raised to what the user promises (tl.multiple_of and friends):
    a promise can only add knowledge, never lose what the analysis proved."""
    if not isinstance(result.type, TensorType):
        div = max(_scalar_div(info), _pow2_divisor(op.values[0])) if op.kind == "multiple_of" else _scalar_div(info)
        scalar_div[result] = div
        return AxisInfo((), (div,), ())
    contiguity, divisibility, constancy = info.contiguity, info.divisibility, info.constancy
    shape = _shape(result)
    if op.kind == "multiple_of":
        divisibility = tuple(max(d, _pow2_divisor(v)) for d, v in zip(divisibility, op.values))
    elif op.kind == "max_contiguous":
        contiguity = tuple(max(c, min(_pow2_floor(v), s)) for c, v, s in zip(contiguity, op.values, shape))
    else:
        constancy = tuple(max(k, min(_pow2_floor(v), s)) for k, v, s in zip(constancy, op.values, shape))
    return AxisInfo(contiguity, divisibility, constancy)


def _pow2_floor(value: int) -> int:
    return 1 << (max(value, 1).bit_length() - 1)


def _integer_like(op: Op) -> bool:
    """An integer cast to a type at least as wide: the facts hold for the bit patterns."""
    src, dst = element_of(op.operand.type), element_of(op.result.type)
    if isinstance(src, PointerType) or isinstance(dst, PointerType):
        return False
    return src.is_int and dst.is_int and not src.is_bool and dst.bits >= src.bits


def format_axis_info(kernel: Kernel) -> str:
    """One line per integer, boolean or pointer tensor, named as `print_kernel` names it:
    `%name: contiguity=[..] divisibility=[..] constancy=[..]` (for dumps and golden tests)."""
    from ..printer import Printer

    infos = analyze_axes(kernel)
    printer = Printer()
    lines: list[str] = []

    def visit(block) -> None:
        for op in block.ops:
            for value in op.defines():
                name = printer.name(value)
                element = element_of(value.type)
                if isinstance(value.type, TensorType) and value in infos and \
                        (isinstance(element, PointerType) or element.is_int):
                    info = infos[value]
                    lines.append(f"{name}: contiguity={list(info.contiguity)} divisibility="
                                 f"{list(info.divisibility)} constancy={list(info.constancy)}")
            for region in op.nested_blocks():
                for arg in region.args:
                    printer.name(arg)
                visit(region)

    for param in kernel.params:
        printer.name(param)
    visit(kernel.body)
    return "\n".join(lines) + "\n"


def _add_like(a: AxisInfo, b: AxisInfo, scale_rhs: int, subtract: bool = False) -> AxisInfo:
    contiguity, divisibility, constancy = [], [], []
    for d in range(len(a.contiguity)):
        contiguity.append(max(gcd(a.contiguity[d], b.constancy[d]),
                              1 if subtract else gcd(a.constancy[d], b.contiguity[d])))
        divisibility.append(min(gcd(a.divisibility[d], b.divisibility[d] * scale_rhs), MAX_DIVISIBILITY))
        constancy.append(gcd(a.constancy[d], b.constancy[d]))
    return AxisInfo(tuple(contiguity), tuple(divisibility), tuple(constancy))
