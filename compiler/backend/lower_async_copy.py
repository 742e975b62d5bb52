"""Lowering of cp.async (Gluon's `async_copy` module: async_copy_global_to_shared,
commit_group, wait_group, and mbarrier_arrive: cp.async.mbarrier.arrive.noinc).

Each thread copies the elements it owns of the pointer tensor into the same coordinates
of the buffer, `vector` elements (the global side proven by vectorize_memory) at a time
when they are also consecutive and aligned in shared memory, as 4-, 8- or 16-byte
copies; a masked-off copy reads 0 bytes and zero-fills. Accesses narrower than 4 bytes
(cp.async's minimum) fall back to a plain load and shared store, which have landed
before any later wait_group returns, as the copy would have.
"""

from __future__ import annotations

from llvmlite import ir

from ...layouts import LinearLayout
from ...layouts.banks import vector_width_of
from ..ir import AsyncCopyCommitGroup, AsyncCopyGlobalToShared, AsyncCopyMBarrierArrive, AsyncCopyWaitGroup
from . import llvm_types as T
from . import ptx_asm
from .async_common import barrier_address
from .context import Lowering, lowers
from .indexing import duplicate_registers, element_pointer, offset_map, owner_predicate

MAX_COPY_BYTES = 16


def async_copy_width(op: AsyncCopyGlobalToShared, offsets: LinearLayout, xor: int, element_bytes: int) -> int:
    """Elements per copy: what vectorize_memory proved for the global side, within what
    is consecutive and aligned in shared memory, at most 16 bytes."""
    width = min(max(op.vector, 1), vector_width_of(offsets, 8 * element_bytes), MAX_COPY_BYTES // element_bytes)
    while width > 1 and xor % width:
        width //= 2
    return width


@lowers(AsyncCopyGlobalToShared)
def lower_async_copy_global_to_shared(ctx: Lowering, op: AsyncCopyGlobalToShared) -> None:
    b = ctx.builder
    view = ctx.shared(op.buffer)
    element = view.type.element
    element_bytes = T.memory_bytes(element)
    layout = op.pointer.type.layout
    count = T.register_count(op.pointer.type)
    offsets = offset_map(layout, view.addressing)
    width = min(async_copy_width(op, offsets, view.xor, element_bytes), count)
    nbytes = width * element_bytes
    pointers = ctx.registers(op.pointer, count)
    masks = ctx.registers(op.mask, count) if op.mask is not None else None
    owner = owner_predicate(ctx, layout)
    duplicates = duplicate_registers(layout)
    memory = T.memory_type(element)
    for start in range(0, count, width):
        if start & duplicates:
            continue
        destination = element_pointer(ctx, view.base, memory, offsets, start, view.xor)
        mask = masks[start] if masks is not None else None
        if nbytes < 4:
            _copy_through_registers(ctx, pointers[start:start + width], mask, owner, destination, element)
            ctx.plain_copies = True  # a later async_copy_mbarrier_arrive must release these stores
            continue
        size = ir.Constant(T.I32, nbytes)
        if mask is not None:
            size = b.select(mask, size, ir.Constant(T.I32, 0))
        args = [b.ptrtoint(destination, T.I32), pointers[start], size]
        if owner is not None:
            args.append(owner)
        ctx.inline_asm(ptx_asm.async_copy(nbytes, owner is not None), args)


def _copy_through_registers(ctx: Lowering, pointers, mask, owner, destination, element) -> None:
    """Elements narrower than cp.async's 4 bytes: a predicated load, then a shared store."""
    from .lower_memory import load_group  # the masked global load of lower_memory

    b = ctx.builder
    memory = T.memory_type(element)
    values = load_group(ctx, pointers[0], mask, element, len(pointers))
    if len(values) == 1:
        data = values[0]
    else:
        data = ir.Constant(ir.VectorType(memory, len(values)), None)
        for i, value in enumerate(values):
            data = b.insert_element(data, value, ir.Constant(T.I32, i))
    align = len(values) * T.memory_bytes(element)
    if owner is None:
        b.store(data, destination, align=align)
        return
    with b.if_then(owner):
        b.store(data, destination, align=align)


@lowers(AsyncCopyCommitGroup)
def lower_async_copy_commit_group(ctx: Lowering, op: AsyncCopyCommitGroup) -> None:
    ctx.inline_asm(ptx_asm.async_commit_group(), [])


@lowers(AsyncCopyWaitGroup)
def lower_async_copy_wait_group(ctx: Lowering, op: AsyncCopyWaitGroup) -> None:
    ctx.inline_asm(ptx_asm.async_wait_group(op.pending), [])


@lowers(AsyncCopyMBarrierArrive)
def lower_async_copy_mbarrier_arrive(ctx: Lowering, op: AsyncCopyMBarrierArrive) -> None:
    """Each thread's arrival once its copies landed (.noinc). Where some copies of the
    kernel went through registers (narrower than 4 bytes), their shared stores are not
    cp.async: the thread then holds the phase back until its copies landed (the arrival
    without .noinc adds one pending arrival and takes it) and arrives itself by an
    mbarrier.arrive, whose release orders the stores before the phase."""
    address = barrier_address(ctx, op.barrier)
    ctx.inline_asm(ptx_asm.async_copy_mbarrier_arrive(noinc=not ctx.plain_copies), [address])
    if ctx.plain_copies:
        ctx.inline_asm(ptx_asm.mbarrier_arrive(1), [address, ir.Constant(T.I1, 1)])
