"""Dot operands that `desc.load` brought into shared memory by TMA, read where they landed.

`desc.load` (highlevel/tensor_descriptor.py) leaves each box in a buffer and reads it into
registers (a shared load, converted to a tile without layout). accelerate_dots asks here
whether a dot operand is such a tile, or its transpose (`b.T` of a [N, K] box, tutorial
09's form), in a layout the instruction reads; then the dot reads the box, or a permuted
view of it, instead of storing the tile to a buffer of its own. The register read is left
unused and propagate_layouts drops it.

wgmma reads K-major operands of every type and MN-major ones of 16-bit types (PTX ISA
9.7.15.5.1, imm-trans); mma.sync's buffers are taken only in the layout it chose.
"""

from __future__ import annotations

from typing import Optional

from ...layouts import NVMMASharedLayout
from ...layouts import rules as layout_rules
from ..ir import ConvertLayout, Dot, Kernel, Op, Permute, SharedLoad, SharedPermute, Value
from ..types import SharedType


def tensor_descriptor_reads(kernel: Kernel) -> dict[Value, tuple[Value, Optional[tuple[int, ...]]]]:
    """Each tile read from a TMA box, with (the box's buffer, None), and each transpose of
    such a 2-d tile, with (the buffer, its order)."""
    read_from = {op.result: op.buffer for op in kernel.walk() if isinstance(op, SharedLoad)}
    tiles = {op.result: (read_from[op.operand], None) for op in kernel.walk()
             if isinstance(op, ConvertLayout) and op.operand in read_from and op.result.type.layout is None}
    for op in kernel.walk():
        if isinstance(op, Permute) and op.operand in tiles and tiles[op.operand][1] is None and op.order == (1, 0):
            tiles[op.result] = (tiles[op.operand][0], op.order)
    return tiles


def readable_layouts(index: int, shared: NVMMASharedLayout, shape: tuple, element_bits: int, wgmma: bool) -> list:
    """The shared layouts operand `index` (0: A, 1: B) may be read in: the one chosen, and
    for wgmma the other major-ness where the instruction reads it."""
    layouts = [shared.to_linear(shape)]
    if wgmma:
        k_major = index == 1  # B stored transposed is K-major; A stored transposed is M-major
        if element_bits == 16 or k_major:
            other = NVMMASharedLayout.get_default_for(shape, element_bits, transposed=index == 1)
            layouts.append(other.to_linear(shape))
    return layouts


def box_operand(dot: Dot, index: int, shared: NVMMASharedLayout, box_reads: dict, ops: list[Op],
                wgmma: bool) -> Optional[Value]:
    """The buffer (or permuted view, its op appended to `ops`) the dot's operand `index`
    can be read from where TMA put it, or None."""
    operand = (dot.a, dot.b)[index]
    found = box_reads.get(operand)
    if found is None:
        return None
    box, order = found
    shape, element = operand.type.shape, operand.type.element
    layout = box.type.layout
    if order is not None:
        layout = layout_rules.permute_layout(layout.transpose_outs([f"dim{i}" for i in range(len(order))]), order)
    if layout not in readable_layouts(index, shared, shape, element.bits, wgmma):
        return None
    if order is None:
        return box
    encoding = box.type.encoding
    if isinstance(encoding, NVMMASharedLayout) and encoding.rank == 2:
        encoding = NVMMASharedLayout(encoding.swizzle_byte_width, encoding.element_bitwidth, 2,
                                     not encoding.transposed)
    view = Value(SharedType(shape, element, layout, encoding), box.hint)
    ops.append(SharedPermute(result=view, buffer=box, order=order, loc=dot.loc))
    return view
