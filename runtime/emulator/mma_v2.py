"""Emulation rule: mma.sync (mma_v2).

`a @ b + acc` is computed in float64 and rounded once to the accumulator's type, warp by
warp from what each warp holds: its own registers of a register operand, or the elements
its threads read from a shared one in the operand's register layout (`a_layout`,
`b_layout`), as the backend reads them. An accumulator element whose row of A or column
of B the warp does not hold wholly is an error, so a layout that would need another
warp's registers cannot pass here.
"""

from __future__ import annotations

import numpy as np

from ...compiler import ir
from ...layouts import LinearLayout
from .dtypes import finish
from .errors import EmulationError
from .interpreter import SharedRef
from .registers import thread_coordinates
from .rules import EMULATION_RULES as RULES
from .shared_memory import layout_addresses


def _mma_v2_operand(cta, op: ir.MmaV2, value: ir.Value, layout, name: str):
    """(registers as float64, layout) of a mma_v2 operand: a tensor's own, or a shared
    buffer read as if loaded in `layout` (the backend reads those elements)."""
    if not isinstance(value.type, ir.SharedType):
        return np.asarray(cta[value], dtype=np.float64), cta.layout(value.type)
    ref: SharedRef = cta[value]
    addresses = layout_addresses(cta, op, ref, layout, key=name)
    values = cta.shared.read(addresses, ref.type.element, op, lambda position: f"mma_v2 operand {name}")
    return np.asarray(values, dtype=np.float64), layout


def _warp_matrix(registers: np.ndarray, layout: LinearLayout, warp: int) -> tuple[np.ndarray, np.ndarray]:
    """(the tensor as warp `warp` holds it, 0 where it holds nothing; which it holds)."""
    coords = tuple(c[warp] for c in thread_coordinates(layout, registers.shape[0]))
    shape = tuple(layout.out_dims.values())
    values, held = np.zeros(shape), np.zeros(shape, dtype=bool)
    values[coords] = registers[warp]
    held[coords] = True
    return values, held


@RULES.register(ir.MmaV2)
def mma_v2(cta, op: ir.MmaV2) -> None:
    """acc + a @ b, each warp on what it holds (module docstring)."""
    a, a_layout = _mma_v2_operand(cta, op, op.a, op.a_layout, "a")
    b, b_layout = _mma_v2_operand(cta, op, op.b, op.b_layout, "b")
    acc_layout = cta.layout(op.acc.type)
    acc = np.asarray(cta[op.acc], dtype=np.float64)
    coords = thread_coordinates(acc_layout, cta.num_warps)
    depth = a_layout.out_dims["dim1"]
    out = np.empty(acc.shape)
    for warp in range(cta.num_warps):
        (a_values, a_held), (b_values, b_held) = _warp_matrix(a, a_layout, warp), _warp_matrix(b, b_layout, warp)
        mine = tuple(c[warp] for c in coords)
        complete = (a_held.astype(np.int64) @ b_held.astype(np.int64))[mine] == depth
        if not complete.all():
            raise EmulationError(f"mma_v2: warp {cta.warp_base + warp} does not hold every element of A's rows and "
                                 f"B's columns its accumulator elements need", op.loc)
        out[warp] = (a_values @ b_values)[mine] + acc[warp]
    cta.bind(op.result, finish(op.result.type.element, out))
