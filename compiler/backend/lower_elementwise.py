"""Lowering of elementwise ops: each register of the result from the same registers of
the operands. Also the ops that make values from nothing (constants, ids, aranges).

Integer semantics follow Triton (and C): `div`, `floordiv` and `mod` on integers truncate
toward zero (`-7 // 2 == -3`, `-7 % 2 == -1`); signedness comes from the operand type
(i* signed, u* unsigned). On floats, `mod` is C's fmod (sign of the dividend) and
`floordiv` is floor(a / b). `max`/`min` on floats ignore a NaN operand (maxNum), like
Triton's default `propagate_nan=NONE`.
"""

from __future__ import annotations

from llvmlite import ir

from ..errors import CompilationError
from ..ir import AddPtr, Arange, Binary, Bitcast, Compare, Constant, Fma, NumPrograms, ProgramId, Splat, Value, Where
from ..types import PointerType, TensorType
from . import llvm_types as T
from .context import Lowering, elementwise, lowers
from .indexing import coordinate
from .lower_math import float_pow, llvm_suffix


def element(value: Value):
    return T.element_of(value.type)


# ------------------------------------------------------------------- sources
_AXES = "xyz"


@lowers(ProgramId)
def lower_program_id(ctx: Lowering, op: ProgramId) -> None:
    ctx.define(op.result, ctx.special_register(f"ctaid.{_AXES[op.axis]}"))


@lowers(NumPrograms)
def lower_num_programs(ctx: Lowering, op: NumPrograms) -> None:
    ctx.define(op.result, ctx.special_register(f"nctaid.{_AXES[op.axis]}"))


@lowers(Constant)
def lower_constant(ctx: Lowering, op: Constant) -> None:
    value = T.constant(element(op.result), op.value)
    if isinstance(op.result.type, TensorType):
        ctx.define(op.result, (value,) * T.register_count(op.result.type))
    else:
        ctx.define(op.result, value)


@lowers(Splat)
def lower_splat(ctx: Lowering, op: Splat) -> None:
    ctx.define(op.result, (ctx.scalar(op.operand),) * T.register_count(op.result.type))


@lowers(Arange)
def lower_arange(ctx: Lowering, op: Arange) -> None:
    """Register r holds start + the layout's dim0 coordinate of (r, lane, warp)."""
    layout = op.result.type.layout
    llvm_type = T.value_type(op.result.type)
    registers = []
    for register in range(T.register_count(op.result.type)):
        value = coordinate(ctx, layout, "dim0", register)
        if llvm_type.width != 32:
            value = ctx.builder.zext(value, llvm_type) if llvm_type.width > 32 else ctx.builder.trunc(value, llvm_type)
        if op.start:
            value = ctx.builder.add(value, ir.Constant(llvm_type, op.start))
        registers.append(value)
    ctx.define(op.result, tuple(registers))


# -------------------------------------------------------------- arithmetic
def _float_binary(ctx: Lowering, kind: str, elem):
    b = ctx.builder

    def intrinsic(name):
        return lambda x, y: ctx.intrinsic(f"llvm.{name}.{llvm_suffix(x.type)}", x.type, [x, y])

    # `contract` lets LLVM fuse a multiply and a dependent add into one fma (as Triton's
    # default does); without it NVPTX prints mul.rn/add.rn, which ptxas may not fuse.
    contract = ("contract",)
    table = {
        "add": lambda x, y: b.fadd(x, y, flags=contract),
        "sub": lambda x, y: b.fsub(x, y, flags=contract),
        "mul": lambda x, y: b.fmul(x, y, flags=contract),
        "div": b.fdiv, "mod": b.frem,
        "max": intrinsic("maxnum"), "min": intrinsic("minnum"),
        "floordiv": lambda x, y: ctx.intrinsic(f"llvm.floor.{llvm_suffix(x.type)}", x.type, [b.fdiv(x, y)]),
        "pow": lambda x, y: float_pow(ctx, x, y),
    }
    return table.get(kind)


def _int_binary(ctx: Lowering, kind: str, elem):
    b = ctx.builder
    signed = elem.is_signed

    def intrinsic(name):
        return lambda x, y: ctx.intrinsic(f"llvm.{name}.i{x.type.width}", x.type, [x, y])

    table = {
        "add": b.add, "sub": b.sub, "mul": b.mul, "and": b.and_, "or": b.or_, "xor": b.xor,
        "shl": b.shl, "shr": b.ashr if signed else b.lshr,
        "div": b.sdiv if signed else b.udiv, "floordiv": b.sdiv if signed else b.udiv,
        "mod": b.srem if signed else b.urem,
        "max": intrinsic("smax" if signed else "umax"), "min": intrinsic("smin" if signed else "umin"),
    }
    return table.get(kind)


@lowers(Binary)
def lower_binary(ctx: Lowering, op: Binary) -> None:
    elem = element(op.lhs)
    if isinstance(elem, PointerType) or T.is_fp8(elem):
        raise CompilationError(f"`{op.kind}` is not defined on {elem}", op.loc,
                               suggestion="use add_ptr for pointers; cast fp8 to fp32 first")
    compute = _float_binary(ctx, op.kind, elem) if elem.is_float else _int_binary(ctx, op.kind, elem)
    if compute is None:
        kind = "floats" if elem.is_float else "integers"
        raise CompilationError(f"binary `{op.kind}` is not supported on {kind} ({elem})", op.loc)
    elementwise(ctx, op.result, (op.lhs, op.rhs), lambda _, x, y: compute(x, y))


_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@lowers(Compare)
def lower_compare(ctx: Lowering, op: Compare) -> None:
    elem = element(op.lhs)
    symbol = _CMP[op.predicate]
    if isinstance(elem, PointerType) or not elem.is_float or T.is_fp8(elem):
        signed = not isinstance(elem, PointerType) and elem.is_signed and not T.is_fp8(elem)
        compare = (lambda b, x, y: b.icmp_signed(symbol, x, y)) if signed else \
            (lambda b, x, y: b.icmp_unsigned(symbol, x, y))
        if T.is_fp8(elem):
            raise CompilationError("compare fp8 values after casting them to fp32", op.loc)
    elif op.predicate == "ne":  # NaN != x is true, as in Python and Triton
        compare = lambda b, x, y: b.fcmp_unordered(symbol, x, y)  # noqa: E731
    else:
        compare = lambda b, x, y: b.fcmp_ordered(symbol, x, y)  # noqa: E731
    run = op.register_run
    if run <= 1 or not isinstance(op.result.type, TensorType):
        elementwise(ctx, op.result, (op.lhs, op.rhs), compare)
        return
    count = T.register_count(op.result.type)
    lhs, rhs = ctx.registers(op.lhs, count), ctx.registers(op.rhs, count)
    firsts = {r: compare(ctx.builder, lhs[r], rhs[r]) for r in range(0, count, run)}
    ctx.define(op.result, tuple(firsts[r - r % run] for r in range(count)))


@lowers(Fma)
def lower_fma(ctx: Lowering, op: Fma) -> None:
    elem = element(op.a)
    if elem.is_float:
        def compute(b, x, y, z):
            return ctx.intrinsic(f"llvm.fma.{llvm_suffix(x.type)}", x.type, [x, y, z])
    else:
        def compute(b, x, y, z):
            return b.add(b.mul(x, y), z)
    elementwise(ctx, op.result, (op.a, op.b, op.c), compute)


@lowers(Where)
def lower_where(ctx: Lowering, op: Where) -> None:
    elementwise(ctx, op.result, (op.condition, op.true_value, op.false_value),
                lambda b, c, x, y: b.select(c, x, y))


@lowers(Bitcast)
def lower_bitcast(ctx: Lowering, op: Bitcast) -> None:
    target = T.value_type(op.result.type)
    source = T.value_type(op.operand.type)

    def compute(b, x):
        if source == target:
            return x
        if isinstance(source, ir.PointerType):
            return b.ptrtoint(x, target)
        if isinstance(target, ir.PointerType):
            return b.inttoptr(x, target)
        return b.bitcast(x, target)

    elementwise(ctx, op.result, (op.operand,), compute)


@lowers(AddPtr)
def lower_add_ptr(ctx: Lowering, op: AddPtr) -> None:
    pointee = element(op.pointer).pointee
    memory = T.memory_type(pointee)
    offset_elem = element(op.offset)

    def compute(b, pointer, offset):
        if not offset_elem.is_signed and offset.type.width < 64:
            offset = b.zext(offset, T.I64)  # GEP indices are signed
        return b.gep(pointer, [offset], source_etype=memory)

    elementwise(ctx, op.result, (op.pointer, op.offset), compute)
