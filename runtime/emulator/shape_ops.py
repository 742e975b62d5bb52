"""Emulation rules: shape ops (no data moves), broadcast, and layout conversion.

expand_dims, reshape and permute keep every register where it is: only the layout's
description of the registers changes (layouts/rules.py computes it), so the arrays pass through.
broadcast gathers registers within each thread by `broadcast_register_map`.
convert_layout runs the op's recorded plan with the weft.layouts plan executor, so the
emulator moves data exactly as the GPU code does; a plan through shared memory also counts
as a write of its scratch, an internal barrier and a pending read (as insert_barriers
assumes), and leaves the scratch bytes clobbered so a buffer wrongly overlapping it reads
garbage.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...compiler import ir
from ...layouts.rules import broadcast_register_map
from ...compiler.types import element_of, u8
from ...layouts.execute import execute_plan
from .errors import EmulationError
from .memory import POISON_BYTE
from .registers import num_registers, thread_elements
from .rules import EMULATION_RULES as RULES


@RULES.register(ir.AxisHint)
def axis_hint(cta, op) -> None:
    """The operand itself (the hint is a promise to axis analysis, unchecked as in Triton)."""
    cta.bind(op.result, cta[op.operand])


@RULES.register(ir.ExpandDims, ir.Reshape, ir.Permute)
def same_registers(cta, op) -> None:
    source, result = cta.layout(op.operand.type), cta.layout(op.result.type)
    if num_registers(source) != num_registers(result):
        raise EmulationError(
            f"`{op.NAME}` result layout has {num_registers(result)} registers per thread, the "
            f"operand's {num_registers(source)}: a shape op moves no data; convert_layout first",
            op.loc)
    cta.bind(op.result, cta[op.operand])


@lru_cache(maxsize=256)
def _broadcast_map(source, result) -> np.ndarray:
    return np.array(broadcast_register_map(source, result), dtype=np.int64)


@RULES.register(ir.Broadcast)
def broadcast(cta, op: ir.Broadcast) -> None:
    register_map = cta.memo(op, "map", lambda: _broadcast_map(cta.layout(op.operand.type),
                                                             cta.layout(op.result.type)))
    cta.bind(op.result, cta[op.operand][..., register_map])


# ------------------------------------------------------------------- conversions
@lru_cache(maxsize=256)
def _direct_gather(source, result, num_warps: int) -> np.ndarray:
    """For each result register, the flat (warp, lane, register) of a source copy of its element."""
    held = thread_elements(source, num_warps).reshape(-1)
    holder = np.full(int(np.prod(tuple(source.out_dims.values()))), -1, dtype=np.int64)
    holder[held[::-1]] = np.arange(held.size - 1, -1, -1)
    needed = holder[thread_elements(result, num_warps)]
    if (needed < 0).any():
        raise EmulationError("convert_layout: the result needs elements the operand does not hold")
    return needed


def _scratch_effect(cta, op, plan) -> None:
    size = int(getattr(plan, "scratch_bytes", 0) or 0)
    if not size or op.scratch_offset is None:
        return
    start, limit = op.scratch_offset, min(cta.shared.size, cta.shared.window)  # one CTA's bytes
    if start < 0 or start + size > limit:
        raise EmulationError(f"convert_layout scratch [{start}, {start + size}) lies outside the "
                             f"{limit} bytes of shared memory", op.loc)
    start += cta.shared_base  # in the CTA's own window of a cluster's shared memory
    every_warp = np.broadcast_to(np.arange(start, start + size, dtype=np.int64),
                                 (cta.num_warps, size))
    cta.shared.write(every_warp, POISON_BYTE, u8, op, lambda position: "scratch")
    cta.shared.barrier()
    cta.shared.read(every_warp, u8, op, lambda position: "scratch")


@RULES.register(ir.ConvertLayout)
def convert_layout(cta, op: ir.ConvertLayout) -> None:
    source, result = cta.layout(op.operand.type), cta.layout(op.result.type)
    x = cta[op.operand]
    plan = op.plan
    if plan is None:
        raise EmulationError("convert_layout has no plan: run the plan_data_movement pass first", op.loc)
    _scratch_effect(cta, op, plan)
    if all(layout.in_dims.get("warp", 1) == cta.num_warps for layout in (source, result)):
        cta.bind(op.result, execute_plan(plan, x[None], source, result)[0])
    else:  # a layout that broadcasts over missing warp bits: move elements directly
        cta.bind(op.result, x.reshape(-1)[_direct_gather(source, result, cta.num_warps)])
