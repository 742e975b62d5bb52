"""Emulation rules: structured control flow, device print and device assert.

Regions run as Python loops over the IR blocks with their carried values. Control flow is
uniform across the CTA (every thread takes the same path), so a branch or loop condition
must be a scalar, or a tensor whose elements all agree; except a per-warp `if`, whose
branches (register arithmetic and in-warp reductions only) both run, each warp keeping its own's results.
"""

from __future__ import annotations

import numpy as np

from ...compiler import ir
from ...compiler.types import TensorType
from .errors import EmulationError
from .registers import LANES, thread_coordinates
from .rules import EMULATION_RULES as RULES


def _uniform(cta, value: ir.Value, op, what: str) -> bool:
    x = cta[value]
    if np.ndim(x) == 0:
        return bool(x)
    flat = np.asarray(x).reshape(-1)
    if not (flat == flat[0]).all():
        raise EmulationError(f"{what} condition differs between threads; control flow must be "
                             f"uniform across the CTA (reduce it to a scalar first)", op.loc)
    return bool(flat[0])


def _carried(cta, terminator, op, expected: int) -> tuple:
    if terminator is None:
        values = ()
    else:
        values = tuple(cta.peek(v) for v in terminator.values)
    if len(values) != expected:
        raise EmulationError(f"`{op.NAME}` region yields {len(values)} values for {expected}", op.loc)
    return values


@RULES.register(ir.For)
def for_loop(cta, op: ir.For) -> None:
    lower, upper, step = cta[op.lower], cta[op.upper], cta[op.step]
    if step == 0:
        raise EmulationError("for loop with step 0 never ends", op.loc)
    carried = tuple(cta.peek(v) for v in op.inits)
    iv = lower
    while (iv < upper) if step > 0 else (iv > upper):
        terminator = cta.run_block(op.body, (iv,) + carried)
        carried = _carried(cta, terminator, op, len(op.inits))
        iv = iv + step
    for value, x in zip(op.results, carried):
        cta.bind(value, x)


@RULES.register(ir.If)
def if_else(cta, op: ir.If) -> None:
    if op.per_warp:
        _per_warp_if(cta, op)
        return
    taken = op.then_body if _uniform(cta, op.condition, op, "if") else op.else_body
    terminator = cta.run_block(taken)
    for value, x in zip(op.results, _carried(cta, terminator, op, len(op.results))):
        cta.bind(value, x)


def _per_warp_if(cta, op: ir.If) -> None:
    """Both branches run for every warp (they hold register arithmetic and in-warp
    reductions only, so running one for nothing changes nothing else); each warp keeps
    the results of its own."""
    taken = np.asarray(cta[op.condition], dtype=bool).reshape(cta.num_warps, -1)
    if not (taken == taken[:, :1]).all():
        raise EmulationError("per-warp if condition differs inside a warp (it must come from "
                             "ll.warp_any)", op.loc)
    taken = taken[:, 0][:, None, None]
    then_values = _carried(cta, cta.run_block(op.then_body), op, len(op.results))
    else_values = _carried(cta, cta.run_block(op.else_body), op, len(op.results))
    for value, a, b in zip(op.results, then_values, else_values):
        cta.bind(value, np.where(taken, a, b).astype(np.asarray(a).dtype))


@RULES.register(ir.While)
def while_loop(cta, op: ir.While) -> None:
    carried = tuple(cta.peek(v) for v in op.inits)
    while True:
        condition = cta.run_block(op.before, carried)
        if not isinstance(condition, ir.Condition):
            raise EmulationError("while `before` region does not end with a condition", op.loc)
        values = tuple(cta.peek(v) for v in condition.values)
        if not _uniform(cta, condition.condition, condition, "while"):
            carried = values
            break
        terminator = cta.run_block(op.after, values)
        carried = _carried(cta, terminator, op, len(op.inits))
    for value, x in zip(op.results, carried):
        cta.bind(value, x)


def _element_coordinates(cta, value: ir.Value):
    """Per thread and register: the element coordinate (or () for a scalar)."""
    if isinstance(value.type, TensorType):
        return thread_coordinates(cta.layout(value.type), cta.num_warps)
    return None


@RULES.register(ir.DevicePrint)
def device_print(cta, op: ir.DevicePrint) -> None:
    """Like device_print: one line per thread and register, `pid (x, y, z) thread t idx (..)`."""
    pid = "pid ({}, {}, {})".format(*cta.program_id)
    if not op.values:
        print(f"{pid} {op.prefix}", file=cta.stream)
        return
    values = [cta[v] for v in op.values]
    coords = next((_element_coordinates(cta, v) for v in op.values if isinstance(v.type, TensorType)), None)
    registers = coords[0].shape[2] if coords else 1
    lines = []
    for warp in range(cta.num_warps):
        for lane in range(LANES):
            thread = (cta.warp_base + warp) * LANES + lane
            for register in range(registers):
                index = tuple(int(c[warp, lane, register]) for c in coords) if coords else ()
                shown = " ".join(
                    str(x[warp, lane, register] if np.ndim(x) == 3 else x) for x in values)
                lines.append(f"{pid} thread {thread} idx {index} {op.prefix}{shown}")
    print("\n".join(lines), file=cta.stream)


@RULES.register(ir.DeviceAssert)
def device_assert(cta, op: ir.DeviceAssert) -> None:
    condition = cta[op.condition]
    if np.ndim(condition) == 0:
        if not bool(condition):
            raise EmulationError(f"device assertion failed: {op.message}", op.loc)
        return
    failed = ~np.asarray(condition, dtype=bool)
    if failed.any():
        w, l, r = (int(i) for i in np.argwhere(failed)[0])
        where = cta.describe(op.condition.type)((w, l, r))
        raise EmulationError(f"device assertion failed: {op.message} ({where})", op.loc)
