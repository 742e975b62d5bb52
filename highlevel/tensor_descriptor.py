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
from ..compiler.types import PointerType, TensorType, i32, i64, tensor_descriptor_type
from ..lowlevel import mbarrier, tma
from ..lowlevel.shared import allocate_shared_memory, fence_async_shared
from ..lowlevel.tma import TensorDescriptorValue
from ..runtime import made_tensor_descriptor as made
from ..lowlevel import semantic as ll_sem
from . import semantic as sem
from .device_tensor_map import device_tensor_map

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


@builtin
def load_tensor_descriptor(desc: Any, offsets: Sequence[Any]):
    """`desc.load(offsets)` as a function (Triton's `tl.load_tensor_descriptor`)."""
    return load(_descriptor(desc, "load_tensor_descriptor"), offsets)


@builtin
def store_tensor_descriptor(desc: Any, offsets: Sequence[Any], value: Any) -> None:
    """`desc.store(offsets, value)` as a function (Triton's `tl.store_tensor_descriptor`)."""
    store(_descriptor(desc, "store_tensor_descriptor"), offsets, value)


def _descriptor(desc: Any, what: str) -> "TensorDescriptor":
    if not isinstance(desc, TensorDescriptor):
        raise sem.builder().error(f"{what} needs a tensor descriptor, found {sem.describe(desc)}",
                                  suggestion="pass a TensorDescriptor argument or tl.make_tensor_descriptor(...)")
    return desc


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


class MadeTensorDescriptor(TensorDescriptor):
    """A descriptor the kernel made (`tl.make_tensor_descriptor`): its `shape` and
    `strides` are the values it was made from."""

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
def make_tensor_descriptor(base: Any, shape: Sequence[Any], strides: Sequence[Any], block_shape: Sequence[int],
                           padding_option: str = "zero"):
    """A tensor descriptor of the scalar pointer `base` with run-time `shape` and `strides`
    (elements, the innermost stride 1) and a compile-time `block_shape`.

    When `base` is a pointer parameter and each shape and stride an int parameter, a
    constant, or +, - and * of those, the tensor map is built on the host at each launch
    (runtime/made_tensor_descriptor.py). Otherwise (a pointer loaded from a table, a size
    read from memory) the kernel writes it (device_tensor_map.py). Either way the base must
    be 16-byte aligned and the outer strides multiples of 16 bytes."""
    b = sem.builder()
    what = "make_tensor_descriptor"
    handle = getattr(base, "handle", None)
    if not isinstance(getattr(handle, "type", None), PointerType) or sem.is_tensor(base):
        raise b.error(f"{what} needs a scalar pointer as its base, found {sem.describe(base)}")
    element = base.type.pointee
    if padding_option != "zero":
        raise b.error(f"{what}: padding_option={padding_option!r} is not supported; TMA loads fill "
                      "out-of-bounds elements with zeros", suggestion="leave padding_option out")
    if not isinstance(block_shape, (list, tuple)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in block_shape):
        raise b.error(f"{what}: block_shape must be a list of compile-time ints, found {block_shape!r}")
    try:
        type_ = tensor_descriptor_type(element, tuple(block_shape))
    except ValueError as error:
        raise b.error(f"{what}: {error}") from None
    rank = type_.rank
    for name, values in (("shape", shape), ("strides", strides)):
        if not isinstance(values, (list, tuple)) or len(values) != rank:
            raise b.error(f"{what}: {name} needs {rank} values (one per dim of block_shape "
                          f"{list(block_shape)}), found {values!r}")
    shape_exprs = tuple(_host_expression(v, f"{what} shape[{d}]") for d, v in enumerate(shape))
    stride_exprs = tuple(_host_expression(v, f"{what} strides[{d}]") for d, v in enumerate(strides))
    if stride_exprs[-1] != ("const", 1):
        raise b.error(f"{what}: the innermost stride must be the constant 1 (TMA moves contiguous rows), "
                      f"found {strides[-1]!r}", suggestion="describe the tensor with its contiguous dim last")
    base_name = handle.hint
    if base_name is None or b.kernel_params.get(base_name) is not handle or None in shape_exprs + stride_exprs:
        desc = device_tensor_map(base, shape, strides, type_)
        return MadeTensorDescriptor(desc.handle, desc.shape, desc.strides)
    key = (base_name, made.FIELD, made.recipe_text(shape_exprs, stride_exprs, type_.block_shape))
    if key not in b.hidden_params:
        b.hidden_params[key] = ir.Value(type_, f"{base_name}_desc{len(b.hidden_params)}")
    i32_shape = tuple(ll_sem.to_value(v, i32) if not ll_sem.is_value(v) else v for v in shape)
    i64_strides = tuple(ll_sem.to_value(v, i64) if not ll_sem.is_value(v) else v for v in strides)
    return MadeTensorDescriptor(b.hidden_params[key], i32_shape, i64_strides)


def _host_expression(value: Any, what: str) -> tuple | None:
    """`value` as an expression of the kernel's int parameters and constants (made_tensor_descriptor
    recipes), or None when it is known only on the device."""
    b = sem.builder()
    if isinstance(value, int) and not isinstance(value, bool):
        return ("const", value)
    if not ll_sem.is_value(value) or sem.is_tensor(value) or not value.type.is_int:
        raise b.error(f"{what} must be an int or an integer scalar, found {sem.describe(value)}")
    definitions = {result: op for block in b._blocks for op in block for result in op.defines()}
    parameters = {v: n for n, v in b.kernel_params.items()}

    def walk(handle) -> tuple | None:
        if handle in parameters:
            return ("param", parameters[handle])
        op = definitions.get(handle)
        if isinstance(op, ir.Constant):
            return ("const", int(op.value))
        if isinstance(op, (ir.Cast, ir.AxisHint)):
            return walk(op.operand)
        if isinstance(op, ir.Binary) and op.kind in made.OPERATIONS:
            lhs, rhs = walk(op.lhs), walk(op.rhs)
            return None if lhs is None or rhs is None else (op.kind, lhs, rhs)
        return None

    return walk(value.handle)


_ALLOCATOR: list = []


def set_allocator(allocator) -> None:
    """Triton's `triton.set_allocator(fn)`: the global scratch Triton writes in-kernel tensor
    maps in. weft's launcher allocates that workspace itself (device_tensor_map.py), so the
    function is kept (for code that calls it or reads it back) and never called."""
    if not callable(allocator):
        raise TypeError(f"set_allocator takes a function of (size, alignment, stream), found {allocator!r}")
    _ALLOCATOR[:] = [allocator]
