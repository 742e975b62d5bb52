"""Emulation rules: shared-memory buffers, their views, loads, stores, barriers (of the CTA
and of the cluster) and the async-proxy fence.

Addresses are computed as the backend computes them (backend/lower_shared, SharedView): a
buffer value is a `SharedRef` whose element at coordinates c lives at byte
`offset + (addressing(c) XOR xor) * element_bytes`, where `addressing` is the minimal inverse
of the root buffer's shared layout (dims -> element offset). `shared_index` keeps the
root's addressing without the leading dim and moves the byte offset by index * stride;
`shared_slice` keeps the root's addressing and XORs in the offset of its start. So a
wrong swizzle, a view the layout cannot express, or two live buffers placed on the same
bytes produce wrong data (or an error) here as on the GPU.
"""

from __future__ import annotations

import math

import numpy as np

from ...compiler import ir
from ...layouts import LinearLayout
from ...layouts.rules import shared_addressing, shared_index_addressing, shared_slice_addressing
from .async_common import partition_warps
from .dtypes import element_bytes
from .errors import EmulationError
from .interpreter import OutOfRangeView, SharedRef
from .registers import thread_coordinates
from .rules import EMULATION_RULES as RULES


def _addresses(cta, op, ref: SharedRef, tensor_type) -> np.ndarray:
    """(num_warps, 32, registers) byte addresses of a distributed tensor's elements in `ref`."""
    if tuple(tensor_type.shape) != tuple(ref.type.shape):
        raise EmulationError(f"tensor of shape {list(tensor_type.shape)} against a shared buffer of "
                             f"shape {list(ref.type.shape)}")
    return layout_addresses(cta, op, ref, cta.layout(tensor_type))


def layout_addresses(cta, op, ref: SharedRef, layout, key=()) -> np.ndarray:
    """(num_warps, 32, registers) byte addresses in `ref` of the elements each register of
    `layout` holds; `key` tells apart several reads of one op (memoised per op)."""
    def element_offsets():
        coords = thread_coordinates(layout, cta.num_warps)
        (offsets,) = ref.addressing(**{f"dim{i}": c for i, c in enumerate(coords)})
        return offsets
    # addressing objects are memoised per defining op, so their ids are stable keys
    offsets = cta.memo(op, ("offsets", key, id(ref.addressing)), element_offsets)
    return ref.offset + (offsets ^ ref.xor) * element_bytes(ref.type.element)


def _store(cta, op, ref: SharedRef, value: ir.Value) -> None:
    """As the backend (lower_shared.store_tensor): an element several warps hold is
    written by the warp whose free warp bits are clear (within a warp the lanes write one
    value, so which lane does is not visible here)."""
    addresses = _addresses(cta, op, ref, value.type)
    free = cta.layout(value.type).free_variable_masks().get("warp", 0)
    writers = None
    if free:
        writers = (np.arange(addresses.shape[0]) & free) == 0
    cta.shared.write(addresses, cta[value], ref.type.element, op, cta.describe(value.type), writers=writers)


@RULES.register(ir.AllocateSharedMemory)
def allocate_shared_memory(cta, op: ir.AllocateSharedMemory) -> None:
    offset = op.offset if op.offset is not None else cta.placements[id(op)]
    type_ = op.result.type
    if offset < 0 or offset + type_.num_bytes > cta.shared.cta_size:
        raise EmulationError(
            f"buffer of {type_.num_bytes} bytes at offset {offset} does not fit in the kernel's "
            f"{cta.shared.cta_size} bytes of shared memory (kernel.shared_bytes)", op.loc)
    addressing = cta.memo(op, "addressing", lambda: shared_addressing(type_.layout))
    start = cta.shared_base + offset  # in its CTA's window of a cluster
    ref = SharedRef(start, type_, addressing, end=start + type_.num_bytes)
    if op.init is not None:
        _store(cta, op, ref, op.init)
    cta.bind(op.result, ref)


@RULES.register(ir.SharedStore)
def shared_store(cta, op: ir.SharedStore) -> None:
    _store(cta, op, cta[op.buffer], op.value)


@RULES.register(ir.SharedLoad)
def shared_load(cta, op: ir.SharedLoad) -> None:
    ref: SharedRef = cta[op.buffer]
    addresses = _addresses(cta, op, ref, op.result.type)
    values = cta.shared.read(addresses, ref.type.element, op, cta.describe(op.result.type))
    cta.bind(op.result, values)


def view_source(cta, op, buffer: ir.Value):
    """The SharedRef a view op starts from; None when it is out of range itself (the view
    of it is bound to the same OutOfRangeView)."""
    ref = cta.peek(buffer)
    if type(ref) is OutOfRangeView:
        cta.bind(op.result, ref)
        return None
    return cta[buffer]


@RULES.register(ir.SharedIndex)
def shared_index(cta, op: ir.SharedIndex) -> None:
    """Sub-buffer `index` of the leading dim, which must own the top offset bits. An index
    out of range is an error only for an op that uses the view (OutOfRangeView)."""
    ref = view_source(cta, op, op.buffer)
    if ref is None:
        return
    stages = ref.type.shape[0]
    stride = math.prod(ref.type.shape[1:])

    addressing = cta.memo(op, ("view", id(ref.addressing)),
                          lambda: shared_index_addressing(ref.addressing, ref.type.shape, ref.xor))
    index = int(cta[op.index])
    if not 0 <= index < stages:
        cta.bind(op.result, OutOfRangeView(f"shared_index {index} out of range for a buffer of "
                                           f"{stages} stages (shape {list(ref.type.shape)})", op))
        return
    offset = ref.offset + index * stride * element_bytes(ref.type.element)
    cta.bind(op.result, SharedRef(offset, op.result.type, addressing, ref.xor, ref.end))


@RULES.register(ir.SharedSlice)
def shared_slice(cta, op: ir.SharedSlice) -> None:
    """A power-of-two window at a multiple of its size: c + start = c XOR start."""
    ref = view_source(cta, op, op.buffer)
    if ref is None:
        return
    size = op.result.type.shape[op.dim]
    if op.start % size or not 0 <= op.start < ref.type.shape[op.dim]:
        raise EmulationError(f"shared_slice [{op.start}, {op.start + size}) of dim {op.dim} (size "
                             f"{ref.type.shape[op.dim]}) must start at a multiple of its size", op.loc)

    addressing, start_offset = cta.memo(
        op, ("view", id(ref.addressing)),
        lambda: shared_slice_addressing(ref.addressing, op.dim, op.start, size))
    cta.bind(op.result, SharedRef(ref.offset, op.result.type, addressing, ref.xor ^ start_offset, ref.end))


@RULES.register(ir.SharedPermute)
def shared_permute(cta, op: ir.SharedPermute) -> None:
    """A view with dims reordered: view dim i addresses buffer dim order[i]."""
    ref = view_source(cta, op, op.buffer)
    if ref is None:
        return

    def permuted() -> LinearLayout:
        bases = ref.addressing.bases
        return LinearLayout({f"dim{i}": bases[f"dim{o}"] for i, o in enumerate(op.order)},
                            ref.addressing.out_dims)
    addressing = cta.memo(op, ("view", id(ref.addressing)), permuted)
    cta.bind(op.result, SharedRef(ref.offset, op.result.type, addressing, ref.xor, ref.end))


@RULES.register(ir.SharedReinterpret)
def shared_reinterpret(cta, op: ir.SharedReinterpret) -> None:
    """The same first byte, addressed by the new type's own layout: reads and writes of
    either view land on, and are race-checked on, the same bytes."""
    ref = view_source(cta, op, op.buffer)
    if ref is None:
        return
    if ref.xor:
        raise EmulationError("shared_reinterpret of a slice that does not start the buffer: the view's "
                             "elements are not one run of bytes from its first; reinterpret the whole "
                             "buffer, then slice", op.loc)
    need = op.result.type.num_bytes
    if ref.end and ref.offset + need > ref.end:
        raise EmulationError(f"shared_reinterpret as {op.result.type} needs {need} bytes from byte "
                             f"{ref.offset}, but its allocation ends {ref.end - ref.offset} bytes after that; "
                             f"the view would reach into other buffers", op.loc)
    addressing = cta.memo(op, "addressing", lambda: shared_addressing(op.result.type.layout))
    cta.bind(op.result, SharedRef(ref.offset, op.result.type, addressing, end=ref.end))


@RULES.register(ir.Barrier)
def barrier(cta, op: ir.Barrier) -> None:
    cta.shared.barrier()


@RULES.register(ir.BarrierAny)
def barrier_any(cta, op: ir.BarrierAny) -> None:
    """A barrier; every thread gets whether the mask held anywhere in the threads running
    this code (the warps of the CTA, or of the partition copy)."""
    cta.shared.barrier()
    cta.bind(op.result, np.bool_(np.asarray(cta[op.operand], dtype=bool).any()))


@RULES.register(ir.FenceAsyncShared)
def fence_async_shared(cta, op: ir.FenceAsyncShared) -> None:
    cta.shared.ordering.fence(partition_warps(cta))


@RULES.register(ir.ClusterBarrier)
def cluster_barrier(cta, op: ir.ClusterBarrier) -> None:
    if cta.in_partition:
        raise EmulationError("cluster_barrier inside a warp_specialize partition: every thread "
                             "of the CTA must reach it together", op.loc)
    if cta.scheduler is None:
        cta.shared.barrier()  # a cluster of one CTA: the CTA's threads meet
    else:
        cta.scheduler.cluster_barrier(cta, op, cta.shared.ctas)
