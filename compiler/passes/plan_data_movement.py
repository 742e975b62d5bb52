"""plan_data_movement: record, on every op that moves data between threads, how it moves.

`convert_layout` gets its conversion plan (weft.layouts), `reduce` its ReductionPlan with
the bytes of shared scratch its cross-warp stage needs, `warpgroup_mma` its DotPlan
(compiler/warpgroup_mma_plan.py: accumulator tiling, register-A packing, and the static part of
every shared-memory descriptor, read off the operands' addressing by shared_views).
Decided once here so that the backend emits, the emulator executes, the verifier checks
and allocation sizes the same plan; each of them reads `op.plan` and refuses an op
without one.
"""

from __future__ import annotations

import dataclasses

from ...layouts import LayoutError, plan_conversion
from ..errors import CompilationError
from ..ir import Block, ConvertLayout, Kernel, Op, Reduce, Value, WarpSpecialize, WarpgroupMma
from ..warpgroup_mma_plan import plan_warpgroup_mma
from ...layouts.rules import plan_reduction
from .shared_views import Traced, trace_shared_views

NAME = "plan_data_movement"


def element_bits(value) -> int:
    # Pointers and i1 travel as whole registers: 64 and 8 bits.
    bits = value.type.element.bits
    return 8 if bits == 1 else bits


def reduction_scratch_bytes(op: Reduce, plan, num_warps: int) -> int:
    """Shared scratch of a reduction's cross-warp stage: one value per (warp, lane, result
    register), combined in at least 32 bits; argmax/argmin also keep an i32 index."""
    bits = max(op.operand.type.element.bits, 32)
    per_element = bits // 8 + (4 if op.kind in ("argmax", "argmin") else 0)
    return plan.scratch_elements(num_warps) * per_element


def _view_of(views: dict[Value, Traced]):
    def view_of(op: WarpgroupMma, value: Value, name: str) -> tuple:
        view = views.get(value, "it is not a buffer the kernel allocates or a view of one")
        if isinstance(view, str):
            raise CompilationError(f"warpgroup_mma: operand {name} ({value.type}): {view}", op.loc)
        return view.addressing, view.xor
    return view_of


def _plan(op: Op, num_warps: int, views: dict[Value, Traced]) -> Op:
    if isinstance(op, ConvertLayout) and op.plan is None:
        plan = plan_conversion(op.operand.type.layout, op.result.type.layout, element_bits(op.operand))
        return dataclasses.replace(op, plan=plan)
    if isinstance(op, Reduce) and op.plan is None:
        try:
            plan = plan_reduction(op.operand.type.layout, op.axis)
        except LayoutError as error:
            raise CompilationError(str(error), op.loc) from None
        plan = dataclasses.replace(plan, scratch_bytes=reduction_scratch_bytes(op, plan, num_warps))
        return dataclasses.replace(op, plan=plan)
    if isinstance(op, WarpgroupMma) and op.plan is None:
        return dataclasses.replace(op, plan=plan_warpgroup_mma(op, _view_of(views)))
    return op


def _plan_block(block: Block, num_warps: int, views: dict[Value, Traced]) -> Block:
    ops = []
    for op in block.ops:
        if isinstance(op, WarpSpecialize):
            # A partition's layouts, and so its scratch, are over its own warps.
            warps = iter((num_warps,) + tuple(op.worker_num_warps))
            op = op.map_regions(lambda region: _plan_block(region, next(warps), views))
        else:
            op = op.map_regions(lambda region: _plan_block(region, num_warps, views))
        ops.append(_plan(op, num_warps, views))
    return Block(block.args, tuple(ops))


def plan_data_movement(kernel: Kernel) -> Kernel:
    views = trace_shared_views(kernel.body)
    return kernel.with_body(_plan_block(kernel.body, kernel.num_warps, views))
