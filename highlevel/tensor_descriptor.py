"""Tensor descriptors in highlevel kernels (Triton's `tl.tensor_descriptor`): a kernel
argument built on the host with `TensorDescriptor(base, shape, strides, block_shape)`
(weft.highlevel.tools.tensor_descriptor), read with `desc.load(offsets)` and written with
`desc.store(offsets, value)`; `desc.shape`, `desc.strides`, `desc.block_shape` and
`desc.dtype` as Triton has them.

Every load and store moves its box by TMA (PTX ISA 9.7.9.25, cp.async.bulk.tensor):

    desc.load  ->  buffer, mbarrier, expect-tx, TMA copy, wait, then the buffer read into
                   registers (accelerate_dots lets a dot read the buffer itself instead)
    desc.store ->  registers to a buffer, fence (generic -> async proxy), TMA store, wait

Box elements outside the tensor (negative offsets, or past `shape`) load as zeros and are
not stored, as in Triton. The buffer's swizzle is the widest an NVMMA layout of the box
allows (NVMMASharedLayout.get_default_for): the rule accelerate_dots applies to dot
operands, and the one the host applies when it encodes the tensor map, so host and kernel
agree without the launch being told.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.passes.coalesce import blocked
from ..compiler.types import TensorType
from ..lowlevel import mbarrier, tma
from ..lowlevel.shared import allocate_shared_memory, fence_async_shared
from ..lowlevel.tma import TensorDescriptorValue
from . import semantic as sem

# The widest access one thread makes to shared memory (ld.shared.v4.b32).
VECTOR_BYTES = 16


class TensorDescriptor(TensorDescriptorValue):
    """A TMA descriptor argument of a highlevel kernel (Triton's `tl.tensor_descriptor`)."""

    __slots__ = ()

    @property
    def block_shape(self) -> list:
        """The box, as Triton gives it (a list of ints)."""
        return list(self.type.block_shape)

    @builtin
    def load(self, offsets: Sequence[Any]):
        """The `block_shape` tile at `offsets` (zeros where it leaves the tensor)."""
        return load(self, offsets)

    @builtin
    def store(self, offsets: Sequence[Any], value: Any) -> None:
        """Write `value` (a `block_shape` tile of `desc.dtype`) at `offsets`; its elements
        outside the tensor are dropped."""
        store(self, offsets, value)

    def __repr__(self) -> str:
        return f"tensor_descriptor({self.type})"

    __hash__ = object.__hash__


def _box_buffer(desc: TensorDescriptor):
    return allocate_shared_memory.__wrapped__(desc.dtype, list(desc.type.block_shape), desc.layout)


def register_placement(shape: tuple, element_bits: int, num_warps: int):
    """How a box read from shared memory sits in registers: 16-byte vectors along the
    contiguous dim, as a coalesced global load would hold it."""
    vector = max(1, min(shape[-1], VECTOR_BYTES * 8 // max(element_bits, 8)))
    rank = len(shape)
    return blocked(shape, (1,) * (rank - 1) + (vector,), tuple(reversed(range(rank))), num_warps)


def load(desc: TensorDescriptor, offsets: Sequence[Any]):
    b = sem.builder()
    type_ = desc.type
    buffer = _box_buffer(desc)
    bar = mbarrier.allocate_mbarrier.__wrapped__()
    mbarrier.init.__wrapped__(bar, 1)
    mbarrier.expect.__wrapped__(bar, desc.nbytes)
    tma.async_copy_global_to_shared.__wrapped__(desc, _offsets(offsets, type_.rank, "desc.load"), bar, buffer)
    mbarrier.wait.__wrapped__(bar, 0)
    placement = register_placement(type_.block_shape, type_.element.bits, b.num_warps)
    placed = TensorType(type_.block_shape, type_.element, placement.layout, placement.encoding)
    # The placed read is an anchor of propagate_layouts; the conversion hands its consumers
    # a tile without layout, as every highlevel value is.
    read = b.create(ir.SharedLoad, placed, buffer=buffer.handle)
    tile = b.create(ir.ConvertLayout, TensorType(type_.block_shape, type_.element), operand=read)
    fence_async_shared.__wrapped__()  # these generic reads before a later TMA write of the buffer
    mbarrier.invalidate.__wrapped__(bar)
    return b.wrap(tile)


def store(desc: TensorDescriptor, offsets: Sequence[Any], value: Any) -> None:
    b = sem.builder()
    type_ = desc.type
    coords = _offsets(offsets, type_.rank, "desc.store")
    if not sem.is_tensor(value) or value.type.shape != type_.block_shape:
        raise b.error(f"desc.store needs a tile of the descriptor's block_shape {list(type_.block_shape)}, "
                      f"found {sem.describe(value)}")
    if value.type.element != type_.element:
        raise b.error(f"desc.store of {value.type.element} values through a {type_.element} descriptor",
                      suggestion=f"convert first: value.to(tl.{type_.element.name})")
    buffer = _box_buffer(desc)
    b.emit(ir.SharedStore(buffer=buffer.handle, value=value.handle, loc=b.loc))
    fence_async_shared.__wrapped__()  # the generic stores, seen by the TMA engine
    tma.async_copy_shared_to_global.__wrapped__(desc, coords, buffer)
    tma.store_wait.__wrapped__(0)  # the buffer is read before anything reuses its bytes


def _offsets(offsets: Any, rank: int, what: str) -> list:
    if not isinstance(offsets, (list, tuple)) or len(offsets) != rank:
        raise sem.builder().error(f"{what} needs {rank} offsets (one per tensor dim, outermost first), "
                                  f"found {offsets!r}")
    return list(offsets)
