"""Lowering of shared-memory buffers, views, loads/stores, the CTA and cluster barriers, and
the async-proxy fence.

A buffer's element at coordinates c sits at element offset S^-1(c) of its shared layout S.
For a distributed tensor with layout D, offset(r, lane, warp) = S^-1(D(r, lane, warp)) is
linear, so (as for coordinates) the lane/warp part is computed once per (D, S) pair and
each register adds a constant XOR. Registers whose offsets are consecutive and aligned
move together as one `ld.shared.v{2,4}` / `st.shared.v{2,4}` of up to 128 bits.
"""

from __future__ import annotations

import contextlib
import math

from llvmlite import ir

from ...layouts import LayoutError, LinearLayout
from ..errors import CompilationError
from ..ir import (AllocateSharedMemory, Barrier, ClusterBarrier, FenceAsyncShared, SharedIndex, SharedLoad, SharedPermute,
                  SharedReinterpret, SharedSlice, SharedStore, Value)
from . import llvm_types as T
from .context import Lowering, SharedView, lowers
from ...layouts.banks import vector_width_of
from ...layouts.rules import shared_index_addressing, shared_slice_addressing
from ..mma import stmatrix_groups
from . import ptx_asm
from .indexing import addressing_of, duplicate_registers, element_pointer, offset_map, owner_predicate
from .warp_ops import pack_word


def barrier(ctx: Lowering) -> None:
    """bar.sync 0 (all threads of the CTA); a named barrier inside a warp_specialize partition."""
    ctx.barrier()


@lowers(Barrier)
def lower_barrier(ctx: Lowering, op: Barrier) -> None:
    barrier(ctx)


@lowers(ClusterBarrier)
def lower_cluster_barrier(ctx: Lowering, op: ClusterBarrier) -> None:
    if ctx.partition is not None:
        raise CompilationError(
            "cluster_barrier inside a warp_specialize partition: every thread of the CTA must "
            "reach it together", op.loc, suggestion="call ll.cluster_barrier() before or after warp_specialize")
    ctx.inline_asm(ptx_asm.cluster_barrier(), [])


@lowers(FenceAsyncShared)
def lower_fence_async_shared(ctx: Lowering, op: FenceAsyncShared) -> None:
    ctx.inline_asm(ptx_asm.fence_proxy_async_shared(), [])


@lowers(AllocateSharedMemory)
def lower_allocate_shared_memory(ctx: Lowering, op: AllocateSharedMemory) -> None:
    if op.offset is None:
        raise CompilationError("shared buffer has no offset", op.loc,
                               suggestion="run allocate_shared_memory before the backend")
    type_ = op.result.type
    view = SharedView(type_, ctx.shared_pointer(op.offset), addressing_of(type_.layout))
    ctx.define(op.result, view)
    if op.init is not None:
        store_tensor(ctx, view, op.init)


class SharedAccess:
    """Per-register element addresses of a distributed tensor inside a shared view."""

    def __init__(self, ctx: Lowering, view: SharedView, tensor_layout: LinearLayout):
        self.ctx = ctx
        self.view = view
        self.element = view.type.element
        self.memory = T.memory_type(self.element)
        self.bytes = T.memory_bytes(self.element)
        self.offsets = offset_map(tensor_layout, view.addressing)
        vector = vector_width_of(self.offsets, 8 * self.bytes)
        while vector > 1 and view.xor % vector:
            vector //= 2
        self.vector = vector

    def pointer(self, register: int) -> ir.Value:
        return element_pointer(self.ctx, self.view.base, self.memory, self.offsets, register, self.view.xor)

    def vector_type(self, width: int) -> ir.Type:
        return self.memory if width == 1 else ir.VectorType(self.memory, width)


def store_tensor(ctx: Lowering, view: SharedView, value: Value) -> None:
    """Write every element of a distributed tensor to its place in a shared view, once:
    an element several threads hold (a broadcast layout, a scalar splat) is written by
    its owner alone (indexing.owner_predicate), so that the thread which then signals
    the write (an mbarrier arrive, say) is the one that made it. 16-bit tensors whose
    registers pair up as 8 x 8 matrices (an MMA accumulator's), whose widest store would
    be 32 bits, go four matrices a stmatrix where the view allows it
    (mma.stmatrix_groups): a quarter of the store instructions."""
    b = ctx.builder
    layout = value.type.layout
    access = SharedAccess(ctx, view, layout)
    registers = ctx.registers(value, T.register_count(value.type))
    duplicates = duplicate_registers(layout)
    width = min(access.vector, len(registers))
    owner = owner_predicate(ctx, layout)
    groups = None
    if owner is None and not duplicates and access.vector == 2:  # 32 bits the widest store
        groups = stmatrix_groups(access.offsets, len(registers), view.xor, view.align, access.bytes)
    if groups is not None:
        for words, addresses in groups:
            pointer = element_pointer(ctx, view.base, access.memory, addresses, words[0][0], view.xor)
            data = [pack_word(b, [registers[first], registers[second]], 16) for first, second in words]
            ctx.inline_asm(ptx_asm.stmatrix(len(words)), [b.ptrtoint(pointer, T.I32), *data])
        return
    with b.if_then(owner) if owner is not None else contextlib.nullcontext():
        for start in range(0, len(registers), width):
            if start & duplicates:
                continue
            group = [_to_memory(b, r, view.type.element) for r in registers[start:start + width]]
            data = group[0]
            if width > 1:
                data = ir.Constant(access.vector_type(width), None)
                for i, item in enumerate(group):
                    data = b.insert_element(data, item, ir.Constant(T.I32, i))
            b.store(data, access.pointer(start), align=width * access.bytes)


def load_tensor(ctx: Lowering, view: SharedView, layout: LinearLayout, count: int) -> tuple:
    """Read a distributed tensor with `layout` from a shared view."""
    b = ctx.builder
    access = SharedAccess(ctx, view, layout)
    width = min(access.vector, count)
    values = []
    for start in range(0, count, width):
        data = b.load(access.pointer(start), typ=access.vector_type(width), align=width * access.bytes)
        group = [data] if width == 1 else [b.extract_element(data, ir.Constant(T.I32, i)) for i in range(width)]
        values.extend(_to_register(b, item, view.type.element) for item in group)
    return tuple(values)


def _to_memory(b, value, element):
    return b.zext(value, T.I8) if element.is_bool else value


def _to_register(b, value, element):
    return b.icmp_unsigned("!=", value, ir.Constant(T.I8, 0)) if element.is_bool else value


@lowers(SharedStore)
def lower_shared_store(ctx: Lowering, op: SharedStore) -> None:
    store_tensor(ctx, ctx.shared(op.buffer), op.value)


@lowers(SharedLoad)
def lower_shared_load(ctx: Lowering, op: SharedLoad) -> None:
    count = T.register_count(op.result.type)
    ctx.define(op.result, load_tensor(ctx, ctx.shared(op.buffer), op.result.type.layout, count))


@lowers(SharedIndex)
def lower_shared_index(ctx: Lowering, op: SharedIndex) -> None:
    """Sub-buffer `index` of the leading dim: the leading dim must own the top offset bits,
    so the sub-buffer starts at index * (its size) elements and keeps the rest's addressing."""
    parent = ctx.shared(op.buffer)
    try:
        addressing = shared_index_addressing(parent.addressing, parent.type.shape, parent.xor)
    except LayoutError as error:
        raise CompilationError(str(error), op.loc) from None
    stride = 1
    for size in parent.type.shape[1:]:
        stride *= size
    b = ctx.builder
    index = ctx.scalar(op.index)
    if index.type.width != 32:
        index = b.trunc(index, T.I32) if index.type.width > 32 else b.zext(index, T.I32)
    element_offset = b.mul(index, ir.Constant(T.I32, stride))
    base = b.gep(parent.base, [element_offset], source_etype=T.memory_type(parent.type.element))
    align = math.gcd(parent.align, stride * T.memory_bytes(parent.type.element))
    ctx.define(op.result, SharedView(op.result.type, base, addressing, parent.xor, align))


@lowers(SharedSlice)
def lower_shared_slice(ctx: Lowering, op: SharedSlice) -> None:
    """A power-of-two window starting at a multiple of its size: coordinates c of the window
    are c + start = c XOR start of the buffer, so the view keeps the buffer's addressing
    (fewer bits along `dim`) and XORs in the offset of `start`."""
    parent = ctx.shared(op.buffer)
    size = op.result.type.shape[op.dim]
    if op.start % size:
        raise CompilationError(
            f"shared_slice start {op.start} along dim {op.dim} is not a multiple of the window "
            f"size {size}; such windows are not linear in the shared layout", op.loc)
    addressing, start_offset = shared_slice_addressing(parent.addressing, op.dim, op.start, size)
    ctx.define(op.result, SharedView(op.result.type, parent.base, addressing, parent.xor ^ start_offset,
                                     parent.align))


@lowers(SharedPermute)
def lower_shared_permute(ctx: Lowering, op: SharedPermute) -> None:
    """Result dim i is buffer dim order[i]: the same memory, addressing with dims renamed."""
    parent = ctx.shared(op.buffer)
    bases = parent.addressing.bases
    rank = len(bases)
    if sorted(op.order) != list(range(rank)):
        raise CompilationError(f"shared_permute order {list(op.order)} is not a permutation of "
                               f"{list(range(rank))}", op.loc)
    addressing = LinearLayout({f"dim{i}": bases[f"dim{d}"] for i, d in enumerate(op.order)},
                              parent.addressing.out_dims)
    ctx.define(op.result, SharedView(op.result.type, parent.base, addressing, parent.xor, parent.align))


@lowers(SharedReinterpret)
def lower_shared_reinterpret(ctx: Lowering, op: SharedReinterpret) -> None:
    """The same first byte, addressed by the new type's own layout."""
    parent = ctx.shared(op.buffer)
    if parent.xor:
        raise CompilationError(
            "shared_reinterpret of a slice that does not start the buffer: the view's elements are "
            "not one run of bytes from its first", op.loc, suggestion="reinterpret the whole buffer, then slice")
    ctx.define(op.result, SharedView(op.result.type, parent.base, addressing_of(op.result.type.layout), 0,
                                     parent.align))
