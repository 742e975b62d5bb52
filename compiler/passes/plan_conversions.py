"""plan_conversions: record, on every convert_layout, how its data moves.

Decided once here so that the backend emits, and the emulator executes, the same plan.
"""

from __future__ import annotations

import dataclasses

from ...layouts import plan_conversion
from ..ir import ConvertLayout, Kernel, Op
from .rewrite import rewrite_kernel

NAME = "plan_conversions"


def element_bits(value) -> int:
    # Pointers and i1 travel as whole registers: 64 and 8 bits.
    bits = value.type.element.bits
    return 8 if bits == 1 else bits


def plan_conversions(kernel: Kernel) -> Kernel:
    def rule(op: Op) -> Op:
        if isinstance(op, ConvertLayout) and op.plan is None:
            plan = plan_conversion(op.operand.type.layout, op.result.type.layout, element_bits(op.operand))
            return dataclasses.replace(op, plan=plan)
        return op

    return rewrite_kernel(kernel, rule)
