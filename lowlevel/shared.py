"""Shared memory in lowlevel kernels: `allocate_shared_memory`, the buffer it returns, and
`fence_async_shared`, which orders a thread's shared-memory accesses with the async proxy.

A buffer has a shape, an element type and a shared layout (offset -> element). Views
(`index` of a multi-buffered allocation, `slice` of a window) keep addressing the parent's
memory: their layouts give offsets relative to the view's first element, with a zero basis
for each offset bit the view skips over.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..compiler import ir
from ..layouts import rules as layout_rules
from ..compiler.builder import DynamicValue, builtin
from ..compiler.types import ScalarType, SharedType, TensorType
from ..layouts import LayoutError, LinearLayout
from . import semantic as sem
from .layouts import LinearSharedLayout, NVMMASharedLayout, SharedLayout, as_shared
from .shape_ops import distributed_layout


class SharedMemoryType:
    """`smem.type` as Gluon shows it: `.layout` is the layout object the user allocated
    with (the compiler's SharedType keeps the LinearLayout it stands for, read by weft
    itself through `smem.handle.type`); the rest as SharedType's."""

    __slots__ = ("ir_type",)

    def __init__(self, ir_type: SharedType):
        self.ir_type = ir_type

    @property
    def layout(self):
        return self.ir_type.encoding

    @property
    def element_ty(self) -> ScalarType:
        return self.ir_type.element

    def __getattr__(self, name: str):
        return getattr(self.ir_type, name)

    def __eq__(self, other) -> bool:
        return isinstance(other, SharedMemoryType) and self.ir_type == other.ir_type

    def __hash__(self) -> int:
        return hash(self.ir_type)

    def __str__(self) -> str:
        return str(self.ir_type)

    __repr__ = __str__


class SharedMemoryDescriptor(DynamicValue):
    """A buffer (or a view of one) in shared memory."""

    __slots__ = ()

    @property
    def type(self) -> SharedMemoryType:
        return SharedMemoryType(self.handle.type)

    @property
    def dtype(self) -> ScalarType:
        return self.type.element

    @property
    def shape(self) -> tuple[int, ...]:
        return self.handle.type.shape

    @property
    def layout(self):
        return self.type.encoding

    def __repr__(self) -> str:
        return f"SharedMemoryDescriptor({self.type} in {self.layout})"

    __hash__ = object.__hash__

    @builtin
    def load(self, layout: Any):
        """The whole buffer as a distributed tensor in `layout`."""
        b = sem.builder()
        encoding, linear = distributed_layout(layout, self.shape, "shared load layout")
        result_type = TensorType(self.shape, self.dtype, linear, encoding)
        return b.wrap(b.create(ir.SharedLoad, result_type, buffer=self.handle))

    @builtin
    def store(self, value: Any):
        """Write a distributed tensor of the buffer's shape and element type."""
        b = sem.builder()
        if not sem.is_tensor(value) or value.type.shape != self.shape:
            raise b.error(f"store into a shared buffer of shape {list(self.shape)} needs a tensor "
                          f"of that shape, found {sem.describe(value)}")
        if value.type.element != self.dtype:
            raise b.error(f"store of {value.type.element} values into a {self.dtype} shared buffer",
                          suggestion=f"convert first: value.to(ll.{self.dtype})")
        b.emit(ir.SharedStore(buffer=self.handle, value=value.handle, loc=b.loc))

    @builtin
    def index(self, i: Any):
        """Buffer `i` of a multi-buffered allocation (the leading dim), as a view."""
        b = sem.builder()
        if len(self.shape) < 2:
            raise b.error(f"index needs a buffer with a leading buffer dim, found shape {list(self.shape)}")
        if not sem.is_value(i) and (isinstance(i, bool) or not isinstance(i, int)):
            raise b.error(f"index must be an int, found {i!r}")
        if not sem.is_value(i) and not 0 <= i < self.shape[0]:
            raise b.error(f"index {i} is outside the {self.shape[0]} buffers")
        i = sem.to_value(i)
        if not isinstance(i.type, ScalarType) or not i.type.is_int:
            raise b.error(f"index must be an integer scalar, found {sem.describe(i)}")
        layout = _view_layout(self.handle.type.layout, 0)
        encoding = self.layout
        if not (isinstance(encoding, NVMMASharedLayout) and encoding.rank <= len(self.shape) - 1):
            encoding = LinearSharedLayout.from_linear(layout)
        result_type = SharedType(self.shape[1:], self.dtype, layout, encoding)
        return b.wrap(b.create(ir.SharedIndex, result_type, buffer=self.handle, index=i.handle))

    @builtin
    def slice(self, start: int, length: int, dim: int = 0):
        """The window [start, start + length) along `dim`, as a view; `length` a power of
        two dividing `start`."""
        b = sem.builder()
        rank = len(self.shape)
        for name, value in (("start", start), ("length", length), ("dim", dim)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise b.error(f"slice {name} must be a compile-time int, found {sem.describe(value)}")
        if not 0 <= dim < rank:
            raise b.error(f"slice dim {dim} is not a dim of shape {list(self.shape)}")
        if length < 1 or length & (length - 1) or start % length or start < 0 \
                or start + length > self.shape[dim]:
            raise b.error(f"slice [{start}, {start + length}) of dim {dim} (size {self.shape[dim]}): "
                          f"length must be a power of two dividing start, inside the dim")
        try:
            layout = _window_layout(self.handle.type.layout, dim, length)
        except LayoutError as error:
            raise b.error(str(error))
        shape = self.shape[:dim] + (length,) + self.shape[dim + 1:]
        result_type = SharedType(shape, self.dtype, layout, LinearSharedLayout.from_linear(layout))
        return b.wrap(b.create(ir.SharedSlice, result_type, buffer=self.handle, dim=dim, start=start))


    @builtin
    def permute(self, order: Sequence[int]):
        """A view with dims reordered: result dim i is dim order[i] (e.g. (1, 0) shows a
        K-major [N, K] tile as the [K, N] operand wgmma reads transposed)."""
        b = sem.builder()
        rank = len(self.shape)
        if not isinstance(order, (list, tuple)) or sorted(order) != list(range(rank)) or \
                any(isinstance(o, bool) or not isinstance(o, int) for o in order):
            raise b.error(f"permute order must be a permutation of {list(range(rank))}, found {order!r}")
        order = tuple(order)
        names = [f"dim{i}" for i in range(rank)]
        layout = layout_rules.permute_layout(self.handle.type.layout.transpose_outs(names), order)
        shape = tuple(self.shape[o] for o in order)
        encoding = self.layout
        flipped = None
        if isinstance(encoding, NVMMASharedLayout) and order == (1, 0) and encoding.rank == 2:
            flipped = NVMMASharedLayout(encoding.swizzle_byte_width, encoding.element_bitwidth,
                                        2, not encoding.transposed)
        if flipped is None or flipped.to_linear(shape) != layout:
            flipped = LinearSharedLayout.from_linear(layout)
        result_type = SharedType(shape, self.dtype, layout, flipped)
        return b.wrap(b.create(ir.SharedPermute, result_type, buffer=self.handle, order=order))

    @builtin
    def _reinterpret(self, dtype: ScalarType, shape: Sequence[int], layout: Any):
        """The same bytes as a buffer of another element type, shape and shared layout
        (Gluon's spelling): it starts at this buffer's first byte and may not need more
        bytes than this buffer holds. Writes through one view are reads of the other."""
        b = sem.builder()
        what = "_reinterpret"
        if not isinstance(dtype, ScalarType):
            raise b.error(f"{what} element type must be like ll.float16, found {dtype!r}")
        if not isinstance(shape, (list, tuple)) or not shape or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
            raise b.error(f"{what} shape must be positive compile-time ints, found {shape!r}")
        shape = tuple(shape)
        try:
            encoding: SharedLayout = as_shared(layout, f"{what} layout")
            linear = encoding.to_linear(shape)
        except LayoutError as error:
            raise b.error(str(error))
        result_type = SharedType(shape, dtype, linear, encoding)
        # A view of one buffer of several may reach into the next ones (the emulator checks
        # where it starts at run time), but never past the whole allocation.
        allocation = _allocation_of(self.handle)
        have, need = allocation.type.num_bytes, result_type.num_bytes
        if need > have:
            raise b.error(f"{what} as {result_type} needs {need} bytes, but the allocation "
                          f"{allocation.type} it views holds {have}; the view would reach past it "
                          f"into other buffers", suggestion="allocate the buffer large enough for every view of it")
        return b.wrap(b.create(ir.SharedReinterpret, result_type, buffer=self.handle))


def _allocation_of(buffer: ir.Value) -> ir.Value:
    """The buffer a view was taken from, through the view ops built so far (`buffer`
    itself when it is no view: an allocation, or a partition's copy of a buffer)."""
    made_by = {}
    for ops in sem.builder()._blocks:
        for op in ir.Block((), tuple(ops)).walk():
            if isinstance(op, (ir.SharedIndex, ir.SharedSlice, ir.SharedPermute, ir.SharedReinterpret)):
                made_by[op.result] = op.buffer
    while buffer in made_by:
        buffer = made_by[buffer]
    return buffer


def _strip_top_zeros(rows: list) -> list:
    while rows and not any(rows[-1]):
        rows.pop()
    return rows


def _view_layout(layout: LinearLayout, dim: int) -> LinearLayout:
    """The layout of one buffer: `dim` removed; offset bits that only chose the buffer
    become zero bases (dropped when they are the top bits)."""
    names = [f"dim{i}" for i in range(len(layout.out_dims))]
    layout = layout.transpose_outs(names)
    sizes = [layout.out_dims[n] for n in names]
    rows = []
    for row in layout.bases["offset"]:
        if row[dim] and any(v for d, v in enumerate(row) if d != dim):
            raise LayoutError("the buffer dim is mixed with other dims in this shared layout; "
                              "index() needs the buffers stored one after another")
        rows.append(tuple(v for d, v in enumerate(row) if d != dim))
    out = [(f"dim{i}", s) for i, s in enumerate(sizes[:dim] + sizes[dim + 1:])]
    blocks = [tuple(v for d, v in enumerate(r) if d != dim) for r in layout.bases.get("block", ())]
    return LinearLayout({"offset": _strip_top_zeros(rows), "block": blocks}, out)


def _window_layout(layout: LinearLayout, dim: int, length: int) -> LinearLayout:
    """The layout of a `length`-wide window along `dim`: coordinates along `dim` below
    `length` stay, offset bits that step past the window become zero bases."""
    names = [f"dim{i}" for i in range(len(layout.out_dims))]
    layout = layout.transpose_outs(names)
    sizes = [layout.out_dims[n] for n in names]
    rows = []
    for row in layout.bases["offset"]:
        high = row[dim] & ~(length - 1)
        if high and (row[dim] & (length - 1) or any(v for d, v in enumerate(row) if d != dim)):
            raise LayoutError(f"this shared layout mixes dim{dim} bits beyond the window with "
                              f"other coordinates (a swizzle across the window), so a "
                              f"{length}-wide slice is not a plain view")
        rows.append(tuple(0 for _ in row) if high else row)
    sizes[dim] = length
    return LinearLayout({"offset": _strip_top_zeros(rows), "block": layout.bases.get("block", ())},
                        [(n, s) for n, s in zip(names, sizes)])


@builtin
def allocate_shared_memory(element_ty: ScalarType, shape: Sequence[int], layout: Any,
                           value: Any = None) -> SharedMemoryDescriptor:
    """A shared-memory buffer of `shape` and `element_ty` in the shared `layout`,
    optionally initialised from a distributed tensor `value`."""
    b = sem.builder()
    if not isinstance(element_ty, ScalarType):
        raise b.error(f"allocate_shared_memory element type must be like ll.float16, found {element_ty!r}")
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise b.error(f"allocate_shared_memory shape must be compile-time ints, found {shape!r}")
    shape = tuple(shape)
    try:
        encoding: SharedLayout = as_shared(layout, "allocate_shared_memory layout")
        linear = encoding.to_linear(shape)
    except LayoutError as error:
        raise b.error(str(error))
    init = None
    if value is not None:
        if not sem.is_tensor(value) or value.type.shape != shape or value.type.element != element_ty:
            raise b.error(f"allocate_shared_memory value must be a {element_ty} tensor of shape "
                          f"{list(shape)}, found {sem.describe(value)}")
        init = value.handle
    result_type = SharedType(shape, element_ty, linear, encoding)
    return b.wrap(b.create(ir.AllocateSharedMemory, result_type, init=init))


@builtin
def fence_async_shared() -> None:
    """Make this thread's earlier shared-memory stores visible to wgmma and TMA (the async
    proxy) once a barrier publishes them."""
    b = sem.builder()
    b.emit(ir.FenceAsyncShared(loc=b.loc))
