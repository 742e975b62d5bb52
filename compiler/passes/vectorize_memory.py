"""vectorize_memory: choose how many elements each global load/store moves at once.

It also marks comparisons whose answer is uniform over aligned runs of registers (a
mask `cols < n` is the same for a whole vector), so the backend computes one predicate
per run instead of one per element.

A thread can move `v` elements with one 64- or 128-bit access when (1) its registers
0..v-1 hold v consecutive elements along one dim of the layout, and every other basis
keeps vectors aligned along that dim; (2) axis analysis proves the pointers are
contiguous over aligned runs of v and the first address of a run is aligned to v
elements' bytes; (3) the mask is constant over each run.
"""

from __future__ import annotations

import dataclasses

from ..hardware import MAX_ACCESS_BITS
from ..ir import AsyncCopyGlobalToShared, Compare, Kernel, Load, Op, Store
from ..types import TensorType
from .axis_analysis import analyze_axes
from .rewrite import rewrite_kernel

NAME = "vectorize_memory"


def contiguous_registers(layout, dim: int) -> int:
    """How many leading registers hold consecutive elements along `dim`, aligned."""
    registers = layout.bases.get("register", ())
    count = 0
    for bit, basis in enumerate(registers):
        expected = tuple((1 << bit) if i == dim else 0 for i in range(len(basis)))
        if basis != expected:
            break
        count += 1
    vector = 1 << count
    # Every other basis must move along `dim` by whole vectors, so each run starts aligned.
    for name, rows in layout.bases.items():
        for bit, basis in enumerate(rows):
            if name == "register" and bit < count:
                continue
            while vector > 1 and basis[dim] % vector:
                vector //= 2
    return vector


def choose_vector(op, infos) -> int:
    pointer = op.pointer
    if not isinstance(pointer.type, TensorType):
        return 1
    layout = pointer.type.layout
    elem_bits = pointer.type.element.pointee.bits
    elem_bytes = max(elem_bits // 8, 1)
    info = infos.get(pointer)
    if layout is None or info is None or elem_bits < 8:
        return 1
    # Only the dim that register 0 moves along can give a thread consecutive elements.
    dim = _fastest_register_dim(layout)
    vector = min(contiguous_registers(layout, dim), info.contiguity[dim], MAX_ACCESS_BITS // elem_bits)
    while vector > 1 and info.divisibility[dim] % (vector * elem_bytes):
        vector //= 2
    if op.mask is not None:
        mask_info = infos.get(op.mask)
        constancy = mask_info.constancy[dim] if mask_info else 1
        while vector > 1 and constancy % vector:
            vector //= 2
    return vector


def _fastest_register_dim(layout) -> int:
    registers = layout.bases.get("register", ())
    if registers:
        for i, v in enumerate(registers[0]):
            if v:
                return i
    return len(layout.out_dims) - 1


def uniform_register_run(op: Compare, infos) -> int:
    """Registers per aligned run over which the comparison's result is constant."""
    result = op.result
    if not isinstance(result.type, TensorType) or result.type.layout is None or result not in infos:
        return 1
    layout = result.type.layout
    dim = _fastest_register_dim(layout)
    run = min(contiguous_registers(layout, dim), infos[result].constancy[dim])
    return run if run > 1 else 1


def vectorize_memory(kernel: Kernel) -> Kernel:
    infos = analyze_axes(kernel)

    def rule(op: Op) -> Op:
        if isinstance(op, Compare):
            run = uniform_register_run(op, infos)
            if run != op.register_run:
                return dataclasses.replace(op, register_run=run)
        if isinstance(op, (Load, Store, AsyncCopyGlobalToShared)):  # cp.async: the global side of each copy
            vector = choose_vector(op, infos)
            if vector != op.vector:
                return dataclasses.replace(op, vector=vector)
        return op

    return rewrite_kernel(kernel, rule)
