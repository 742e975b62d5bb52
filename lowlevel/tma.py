"""TMA (Gluon's `tma` module): bulk tensor copies between global and shared memory through
a tensor descriptor, issued by one thread.

    tma.async_copy_global_to_shared(desc, [row, col], bar, smem)   # lands on `bar`
    tma.async_copy_shared_to_global(desc, [row, col], smem)
    tma.async_reduce_add(desc, [row, col], smem)                    # global box += smem
    tma.store_wait(0)                                               # before reusing smem
    tma.async_bulk_copy_global_to_shared(row_ptr, bar, smem, nbytes) # no descriptor
    desc = tma.replace_tensor_map(slot_ptr, template, base, shape, strides)  # a map made
    tma.fence_tensor_map(desc)                                      # in the kernel

Coordinates are element offsets along the tensor's dims, outermost first. Box elements
outside the tensor load as zero and are not stored, so tiles at the edges need no masks.
The descriptor comes from the host: `ll.TensorDescriptor.from_tensor(t, block_shape, layout)`.
A bulk copy needs none: it moves contiguous bytes (a row) into a plain row-major buffer,
which suits streaming kernels whose rows are longer than a TMA box (256 elements per dim).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..compiler import ir
from ..layouts import rules as layout_rules
from ..compiler.builder import DynamicValue, builtin
from ..compiler.types import BlockType, PointerType, ScalarType, TensorDescriptorType, tensor_descriptor_swizzle
from . import semantic as sem
from .layouts import LinearSharedLayout, NVMMASharedLayout
from .mbarrier import _barrier
from .shared import SharedMemoryDescriptor

__all__ = ["TensorDescriptorValue", "tensor_descriptor", "async_bulk_copy_global_to_shared", "async_copy_global_to_shared",
           "async_copy_shared_to_global", "store_wait",
           "async_reduce_add", "replace_tensor_map", "fence_tensor_map"]


class TensorDescriptorValue(DynamicValue):
    """A kernel's TMA descriptor parameter. Its box is known at compile time."""

    __slots__ = ()

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.type.block_shape

    @property
    def dtype(self) -> ScalarType:
        return self.type.element

    @property
    def layout(self):
        """The shared layout a box lands in (allocate the destination with it)."""
        if self.type.encoding is not None:
            return self.type.encoding
        if self.type.rank >= 2:  # the NVMMA layout it is, so that it extends to rings
            try:
                candidate = NVMMASharedLayout(tensor_descriptor_swizzle(self.type), self.dtype.bits,
                                              self.type.rank)
                if candidate.to_linear(self.block_shape) == self.type.layout:
                    return candidate
            except ValueError:  # no TMA swizzle places it so (LayoutError is a ValueError)
                pass
        return LinearSharedLayout.from_linear(self.type.layout)

    @property
    def nbytes(self) -> int:
        """Bytes one box copy moves (what mbarrier.expect waits for)."""
        return self.type.box_bytes

    @property
    def shape(self) -> tuple:
        """The global tensor's shape (i32 scalars, outermost dim first), read at run time:
        the kernel takes them as hidden parameters that the launch fills from the
        descriptor argument (only kernels that read them do)."""
        return self._fields("shape", ScalarType("i32"))

    @property
    def strides(self) -> tuple:
        """The global tensor's strides in elements (i64 scalars), as `shape`."""
        return self._fields("strides", ScalarType("i64"))

    def _fields(self, field: str, type_: ScalarType) -> "DescriptorFields":
        return DescriptorFields(self.handle, field, type_)

    @property
    def block_type(self) -> BlockType:
        """The box as a type: `.shape` (a list), `.element_ty`, `.nbytes`; compares with ==."""
        return self.type.block_type

    def __repr__(self) -> str:
        return f"TensorDescriptorValue({self.type})"

    __hash__ = object.__hash__


# Gluon's name for the type, as aggregates annotate their descriptor fields (`tma.tensor_descriptor`).
tensor_descriptor = TensorDescriptorValue


class DescriptorFields(Sequence):
    """`desc.shape` or `desc.strides`: one run-time scalar per dim, each a hidden kernel
    parameter made when first read (so a kernel takes only the ones it uses)."""

    def __init__(self, descriptor: ir.Value, field: str, type_: ScalarType):
        self.descriptor, self.field, self.type = descriptor, field, type_

    def __len__(self) -> int:
        return self.descriptor.type.rank

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        if isinstance(index, bool) or not isinstance(index, int) or not -len(self) <= index < len(self):
            raise sem.builder().error(f"desc.{self.field}[{index!r}]: the index must be a compile-time int "
                                      f"below the descriptor's rank {len(self)}")
        b = sem.builder()
        return b.wrap(b.hidden_param(self.descriptor, self.field, index % len(self), self.type))


def _descriptor(desc: Any, what: str) -> TensorDescriptorType:
    if not isinstance(desc, DynamicValue) or not isinstance(desc.type, TensorDescriptorType):
        raise sem.builder().error(f"{what} needs a tensor descriptor kernel argument, found {sem.describe(desc)}",
                                  suggestion="pass ll.TensorDescriptor.from_tensor(t, block_shape, layout) "
                                             "when launching")
    return desc.type


def _coords(coords: Any, rank: int, what: str) -> tuple[ir.Value, ...]:
    if not isinstance(coords, (list, tuple)) or len(coords) != rank:
        raise sem.builder().error(f"{what} needs {rank} coordinates (one per tensor dim, "
                                  f"outermost first), found {coords!r}")
    return tuple(sem.i32_scalar(c, f"{what} coordinate {i}") for i, c in enumerate(coords))


def _box_buffer(smem: Any, type_: TensorDescriptorType, what: str) -> ir.Value:
    b = sem.builder()
    if not isinstance(smem, SharedMemoryDescriptor):
        raise b.error(f"{what} needs a shared-memory buffer, found {sem.describe(smem)}")
    if smem.shape != type_.block_shape or smem.dtype != type_.element:
        raise b.error(f"{what}: the buffer is {smem.type} but the descriptor's box is "
                      f"{list(type_.block_shape)} of {type_.element}",
                      suggestion="allocate the buffer with the descriptor's block_shape and dtype")
    if smem.handle.type.layout != type_.layout:
        raise b.error(f"{what}: the buffer's shared layout {smem.layout} is not the descriptor's "
                      f"{type_.encoding or 'layout'}; TMA writes boxes in the descriptor's swizzle",
                      suggestion="allocate the buffer with layout=desc.layout")
    return smem.handle


@builtin
def async_copy_global_to_shared(desc: Any, coords: Sequence[Any], bar: Any, result: Any,
                                pred: Any = True, multicast: Any = None) -> None:
    """Start copying the box at `coords` into `result`; its bytes complete on `bar`.

    `multicast` (an int or i32 scalar mask of cluster ranks; launch with `cluster=`): the
    box lands in `result`'s offsets in every CTA whose bit is set, completing on the
    barrier at `bar`'s offset in each, so each CTA expects the bytes its peers load too.
    One load from L2 then feeds the CTAs that share a tile (K and V in attention)."""
    b = sem.builder()
    what = "tma.async_copy_global_to_shared"
    type_ = _descriptor(desc, what)
    if isinstance(multicast, int) and not isinstance(multicast, bool) and not 0 < multicast < 1 << 16:
        raise b.error(f"{what}: multicast must be a non-empty 16-bit mask of cluster ranks, found {multicast}")
    b.emit(ir.TmaAsyncCopyGlobalToShared(descriptor=desc.handle, coords=_coords(coords, type_.rank, what),
                      barrier=_barrier(bar, what), buffer=_box_buffer(result, type_, what),
                      pred=sem.predicate(pred, what),
                      multicast=None if multicast is None else sem.i32_scalar(multicast, f"{what} multicast"),
                      loc=b.loc))


@builtin
def async_copy_shared_to_global(desc: Any, coords: Sequence[Any], src: Any) -> None:
    """Start copying `src` to the box at `coords` (wait with store_wait before reusing src)."""
    b = sem.builder()
    what = "tma.async_copy_shared_to_global"
    type_ = _descriptor(desc, what)
    b.emit(ir.TmaAsyncCopySharedToGlobal(descriptor=desc.handle, coords=_coords(coords, type_.rank, what),
                       buffer=_box_buffer(src, type_, what), loc=b.loc))


@builtin
def store_wait(pendings: int = 0) -> None:
    """Wait until at most `pendings` TMA stores still read their shared memory."""
    b = sem.builder()
    if isinstance(pendings, bool) or not isinstance(pendings, int) or not 0 <= pendings <= 63:
        raise b.error(f"tma.store_wait pendings must be a compile-time int in [0, 63], found {pendings!r}")
    b.emit(ir.TmaStoreWait(pending=pendings, loc=b.loc))


@builtin
def async_bulk_copy_global_to_shared(src: Any, bar: Any, result: Any, nbytes: Any = None,
                                     pred: Any = True) -> None:
    """Start copying `nbytes` contiguous bytes at the scalar pointer `src` to the start of
    `result`; they complete on `bar` (count them in `mbarrier.expect`).

    `result` must be laid out plainly row-major (e.g. SwizzledSharedLayout(1, 1, 1,
    order=[rank-1, ..., 0])); `nbytes` (default: all of `result`) may be a run-time i32 and
    must be a multiple of 16, and `src` 16-byte aligned: the hardware faults otherwise.
    """
    b = sem.builder()
    what = "tma.async_bulk_copy_global_to_shared"
    pointer = sem.to_value(src)
    if not isinstance(pointer.type, PointerType):
        raise b.error(f"{what} needs a scalar pointer as its source, found {sem.describe(src)}",
                      suggestion="pass a pointer such as x_ptr + row * stride")
    if not isinstance(result, SharedMemoryDescriptor):
        raise b.error(f"{what} needs a shared-memory buffer, found {sem.describe(result)}")
    if pointer.type.pointee != result.dtype:
        raise b.error(f"{what}: the source points to {pointer.type.pointee} but the buffer holds "
                      f"{result.dtype}")
    if not layout_rules.is_row_major(layout_rules.shared_addressing(result.handle.type.layout), result.shape):
        raise b.error(f"{what}: the buffer's layout {result.layout} does not place its elements "
                      "one after another in row-major order, as a bulk copy writes them",
                      suggestion="allocate it with ll.SwizzledSharedLayout(1, 1, 1, order=[...descending dims])")
    capacity = result.type.num_bytes
    if nbytes is None:
        nbytes = capacity
    if isinstance(nbytes, int) and not isinstance(nbytes, bool) and \
            (nbytes <= 0 or nbytes % 16 or nbytes > capacity):
        raise b.error(f"{what}: nbytes={nbytes} must be a positive multiple of 16 of at most the "
                      f"buffer's {capacity} bytes")
    b.emit(ir.AsyncBulkCopyGlobalToShared(pointer=pointer.handle, nbytes=sem.i32_scalar(nbytes, f"{what} nbytes"),
                           barrier=_barrier(bar, what), buffer=result.handle,
                           pred=sem.predicate(pred, what), loc=b.loc))


# Element types cp.reduce.async.bulk.tensor adds (the tensor map's type picks the add).
REDUCE_ADD_TYPES = ("fp32", "fp16", "bf16", "i32", "u32", "u64")


@builtin
def async_reduce_add(desc: Any, coords: Sequence[Any], src: Any) -> None:
    """Start adding `src` into the box at `coords`: each in-range element of the box gets
    src's element added, atomically with respect to other adds (CTAs may add into the same
    box), out-of-range ones are skipped. A bulk group as a TMA store: wait with
    store_wait before rewriting `src`; the sums are in global memory once the kernel ends."""
    b = sem.builder()
    what = "tma.async_reduce_add"
    type_ = _descriptor(desc, what)
    if type_.element.name not in REDUCE_ADD_TYPES:
        raise b.error(f"{what}: TMA adds elements of {', '.join(REDUCE_ADD_TYPES)}, not {type_.element}",
                      suggestion="accumulate in a float32 tensor and convert it afterwards")
    b.emit(ir.TmaAsyncReduceAdd(descriptor=desc.handle, coords=_coords(coords, type_.rank, what),
                                buffer=_box_buffer(src, type_, what), loc=b.loc))


class WrittenTensorDescriptor(TensorDescriptorValue):
    """A descriptor whose tensor map the kernel wrote (replace_tensor_map): its `shape`
    and `strides` are the values it was written with."""

    __slots__ = ("_shape", "_strides")

    def __init__(self, handle, shape: tuple, strides: tuple):
        super().__init__(handle)
        self._shape, self._strides = shape, strides

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def strides(self) -> tuple:
        return self._strides


@builtin
def replace_tensor_map(slot: Any, template: Any, base: Any, shape: Sequence[Any], strides: Sequence[Any]):
    """Write a tensor map into the 128 bytes of global memory at the scalar pointer `slot`
    (64-byte aligned, one per map in use at once; each program its own): `template`'s map
    (a descriptor argument: element type, box, swizzle) over the tensor at `base` with
    `shape` and `strides` (elements, outermost first; the innermost stride 1). The base
    must be 16-byte aligned and the other strides multiples of 16 bytes.

    Returns a descriptor of the template's type; call fence_tensor_map(desc) before a TMA
    copy uses it (tensormap.replace, PTX ISA)."""
    b = sem.builder()
    what = "tma.replace_tensor_map"
    type_ = _descriptor(template, what)
    slot_value, base_value = sem.to_value(slot), sem.to_value(base)
    for name, value in (("slot", slot_value), ("base", base_value)):
        if not isinstance(value.type, PointerType):
            raise b.error(f"{what}: {name} must be a scalar pointer, found {sem.describe(value)}")
    if base_value.type.pointee != type_.element:
        raise b.error(f"{what}: base points to {base_value.type.pointee} but the template describes "
                      f"{type_.element}", suggestion=f"cast it: base.to(tl.pointer_type(tl.{type_.element.name}))")
    for name, values in (("shape", shape), ("strides", strides)):
        if not isinstance(values, (list, tuple)) or len(values) != type_.rank:
            raise b.error(f"{what}: {name} needs {type_.rank} values (one per dim of the box "
                          f"{list(type_.block_shape)}), found {values!r}")
    if isinstance(strides[-1], int) and strides[-1] != 1:
        raise b.error(f"{what}: the innermost stride must be 1 (TMA moves contiguous rows), found {strides[-1]}")
    shape_values = tuple(_scalar(v, ScalarType("i32"), f"{what} shape[{d}]") for d, v in enumerate(shape))
    stride_values = tuple(_scalar(v, ScalarType("i64"), f"{what} strides[{d}]") for d, v in enumerate(strides))
    result = b.create(ir.TensormapReplace, type_, slot=slot_value.handle, template=template.handle,
                      address=base_value.handle, shape=tuple(v.handle for v in shape_values),
                      strides=tuple(v.handle for v in stride_values))
    return WrittenTensorDescriptor(result, shape_values, stride_values)


def _scalar(x: Any, element: ScalarType, what: str):
    value = sem.to_value(x, element)
    if not isinstance(value.type, ScalarType) or not value.type.is_int:
        raise sem.builder().error(f"{what} must be an int or an integer scalar, found {sem.describe(x)}")
    return sem.cast(value, element)


@builtin
def fence_tensor_map(desc: Any) -> None:
    """Publish a tensor map written by replace_tensor_map to the TMA unit (every thread
    running this code meets here): without it a TMA copy may read the old map."""
    b = sem.builder()
    if not isinstance(desc, WrittenTensorDescriptor):
        raise b.error(f"tma.fence_tensor_map needs a descriptor from tma.replace_tensor_map, "
                      f"found {sem.describe(desc)}")
    b.emit(ir.TensormapFence(descriptor=desc.handle, loc=b.loc))
