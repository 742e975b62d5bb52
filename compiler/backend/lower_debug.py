"""Lowering of device-side print and assert through the CUDA system calls.

`vprintf(format, args)` takes a format string and a buffer of arguments laid out like C
varargs (ints as i32/i64, floats promoted to double); `__assertfail(message, file, line,
function, char_size)` reports a failed assert and traps. ptxas knows both as extern
functions (CUDA C Programming Guide, "Formatted Output" and "Assertion").

Like Triton's device_print, every thread prints each register of a tensor with the
program id and the element's coordinates (taken from the layout), so a broadcast layout
prints its duplicates too.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import DeviceAssert, DevicePrint, Value
from ..types import PointerType, TensorType
from . import llvm_types as T
from .context import Lowering, lowers
from .indexing import coordinate


def _printf_argument(b: ir.IRBuilder, value: ir.Value, element) -> tuple[str, ir.Value]:
    """(conversion spec, promoted value) as C varargs pass it."""
    if isinstance(element, PointerType):
        return "%p", value
    if T.is_fp8(element):
        return "0x%02x", b.zext(value, T.I32)
    if element.is_float:
        promoted = value if value.type == T.F64 else b.fpext(value, T.F64)
        return "%f", promoted
    if element.bits == 64:
        return ("%lld" if element.is_signed else "%llu"), value
    if element.is_signed:
        return "%d", b.sext(value, T.I32) if value.type.width < 32 else value
    return "%u", b.zext(value, T.I32) if value.type.width < 32 else value


def vprintf(ctx: Lowering, text: str, arguments) -> None:
    b = ctx.builder
    function = ctx.declare("vprintf", T.I32, [T.GENERIC_PTR, T.GENERIC_PTR])
    fmt = ctx.global_string(text)
    if arguments:
        struct = ir.LiteralStructType([a.type for a in arguments])
        buffer = ctx.prologue.alloca(struct)
        buffer.type = T.GENERIC_PTR  # refer to it as an opaque pointer (llvmlite types it)
        for i, argument in enumerate(arguments):
            slot = b.gep(buffer, [ir.Constant(T.I32, 0), ir.Constant(T.I32, i)], source_etype=struct)
            b.store(argument, slot)
        args_pointer = buffer
    else:
        args_pointer = ir.Constant(T.GENERIC_PTR, None)
    b.call(function, [fmt, args_pointer])


def _program_ids(ctx: Lowering) -> list:
    return [ctx.special_register(f"ctaid.{axis}") for axis in "xyz"]


@lowers(DevicePrint)
def lower_device_print(ctx: Lowering, op: DevicePrint) -> None:
    b = ctx.builder
    pid = "pid (%u, %u, %u)"
    if not op.values:
        vprintf(ctx, f"{pid} {op.prefix}\n", _program_ids(ctx))
        return
    for operand, value in enumerate(op.values):
        element = T.element_of(value.type)
        label = op.prefix + (f" (operand {operand})" if len(op.values) > 1 else "")
        if not isinstance(value.type, TensorType):
            spec, argument = _printf_argument(b, ctx.scalar(value), element)
            vprintf(ctx, f"{pid} {label}: {spec}\n", _program_ids(ctx) + [argument])
            continue
        layout = value.type.layout
        dims = list(layout.out_dim_names)
        index = "idx (" + ", ".join(["%u"] * len(dims)) + ")"
        for register, item in enumerate(ctx.registers(value)):
            coords = [coordinate(ctx, layout, dim, register) for dim in dims]
            spec, argument = _printf_argument(b, item, element)
            vprintf(ctx, f"{pid} {index} {label}: {spec}\n", _program_ids(ctx) + coords + [argument])


@lowers(DeviceAssert)
def lower_device_assert(ctx: Lowering, op: DeviceAssert) -> None:
    b = ctx.builder
    failed = None
    for condition in _conditions(ctx, op.condition):
        bad = b.not_(condition)
        failed = bad if failed is None else b.or_(failed, bad)
    fail_block, continue_block = ctx.new_block("assert_fail"), ctx.new_block("assert_ok")
    b.cbranch(failed, fail_block, continue_block)
    b.position_at_end(fail_block)
    function = ctx.declare("__assertfail", ir.VoidType(),
                           [T.GENERIC_PTR, T.GENERIC_PTR, T.I32, T.GENERIC_PTR, T.I64])
    b.call(function, [
        ctx.global_string(op.message),
        ctx.global_string(op.loc.file),
        ir.Constant(T.I32, op.loc.line),
        ctx.global_string(ctx.kernel.name),
        ir.Constant(T.I64, 1),
    ])
    b.branch(continue_block)
    b.position_at_end(continue_block)


def _conditions(ctx: Lowering, value: Value) -> list:
    registers = ctx.registers(value)
    element = T.element_of(value.type)
    if element.is_bool:
        return list(registers)
    zero = T.constant(element, 0)
    if element.is_float:
        return [ctx.builder.fcmp_unordered("!=", r, zero) for r in registers]
    return [ctx.builder.icmp_unsigned("!=", r, zero) for r in registers]
