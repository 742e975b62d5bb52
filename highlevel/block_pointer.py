"""Block pointers: `tl.make_block_ptr`, `tl.advance`, and `tl.load` / `tl.store` of them
with `boundary_check` and `padding_option`, as Triton defines them.

A block pointer names the tile `block_shape` at `offsets` of a tensor of `shape` and
`strides` at `base`. Here it becomes pointer arithmetic: each element's address is
base + sum over d of (offsets[d] + i_d) * strides[d], and the dims in `boundary_check`
mask the elements outside [0, shape[d]) (loads read `padding_option` there: zero, or NaN
for "nan").

A load whose block can be a TMA box is built a second way too: a tensor map over the
block pointer's tensor, its dims outermost first (reversed `order`, so order=(0, 1), K^T
read from K, is a box of K read through a transposed view), made once where the block
pointer is, and `desc.load` at the block's offsets. stage_block_pointers keeps the TMA load
where it feeds a dot and the tensor provably suits TMA (16-byte aligned base and outer
strides), else the pointer load. Conditions checked here: the contiguous dim's stride is
the constant 1 (a literal, or a parameter specialized to 1), padding_option "" or "zero"
(TMA fills zeros), and the box within TMA's limits (tensor_descriptor_type). TMA checks the
bounds of every dim, not only those in `boundary_check`: a block outside the tensor in an
unchecked dim reads zeros where Triton's result is undefined.

`BlockPointer` is an aggregate, so a loop that advances it carries its offsets.
"""

from __future__ import annotations

import builtins as py
from typing import Any, Optional, Sequence

from ..compiler.aggregates import aggregate
from ..compiler.builder import builtin
from ..compiler.passes.stage_block_pointers import BlockPointerLoad
from ..compiler.types import PointerType, ScalarType, TensorType, i32, i64, tensor_descriptor_type
from ..lowlevel import semantic as ll_sem
from ..runtime.jit import constexpr
from . import semantic as sem

PADDING_OPTIONS = ("", "zero", "nan")


@aggregate
class BlockPointer:
    """Triton's block pointer (`tl.make_block_ptr`): a scalar base pointer, the parent
    tensor's shape and strides, the block's offsets (i32 scalars), its block shape and
    memory order (compile-time)."""

    base: Any
    shape: tuple
    strides: tuple
    offsets: tuple
    block_shape: constexpr
    order: constexpr


def _scalar(value: Any, what: str, element: ScalarType):
    """An integer scalar value (numbers become constants of `element`)."""
    b = sem.builder()
    if isinstance(value, py.bool) or not (isinstance(value, py.int) or ll_sem.is_value(value)):
        raise b.error(f"{what} must be an integer or an integer scalar, found {sem.describe(value)}")
    value = ll_sem.to_value(value, element)
    if sem.is_tensor(value) or not isinstance(value.type, ScalarType) or not value.type.is_int:
        raise b.error(f"{what} must be an integer scalar, found {sem.describe(value)}")
    return value


def _ints(values: Any, rank: Optional[int], what: str) -> tuple:
    if not isinstance(values, (tuple, list)) or (rank is not None and len(values) != rank):
        count = f"{rank} " if rank is not None else ""
        raise sem.builder().error(f"{what} must be a tuple of {count}values, one per dim, found {values!r}")
    return tuple(values)


@builtin
def make_block_ptr(base: Any, shape: Sequence[Any], strides: Sequence[Any], offsets: Sequence[Any],
                   block_shape: Sequence[int], order: Sequence[int]):
    """A block pointer to the `block_shape` tile at `offsets` of the tensor at `base`."""
    b = sem.builder()
    strides_given = strides
    if not ll_sem.is_value(base) or sem.is_tensor(base) or not isinstance(base.type, PointerType):
        raise b.error(f"make_block_ptr needs a scalar pointer as its base, found {sem.describe(base)}")
    block_shape = _ints(block_shape, None, "block_shape")
    rank = len(block_shape)
    for size in block_shape:
        if isinstance(size, py.bool) or not isinstance(size, py.int) or size <= 0 or size & (size - 1):
            raise b.error(f"block_shape {list(block_shape)}: every dim must be a compile-time power of two")
    order = tuple(_ints(order, rank, "order"))
    if sorted(order) != list(py.range(rank)):
        raise b.error(f"order {list(order)} is not a permutation of the {rank} dims")
    shape = tuple(_scalar(s, "a shape entry", i32) for s in _ints(shape, rank, "shape"))
    strides = tuple(_scalar(s, "a stride", i64) for s in _ints(strides, rank, "strides"))
    offsets = tuple(ll_sem.cast(_scalar(o, "an offset", i32), i32) for o in _ints(offsets, rank, "offsets"))
    pointer = BlockPointer(base, shape, strides, offsets, block_shape, order)
    contiguous_stride = _ints(strides_given, rank, "strides")[order[0]]
    if type(contiguous_stride) is py.int and contiguous_stride == 1 and b.kernel_params:
        _note_map_site(pointer)
    return pointer


class _MapSite:
    """Where a block pointer was made (a block still being built, and the position in it):
    the place its tensor map is written, on the first load that may use it."""

    def __init__(self, ops: list, index: int):
        self.ops, self.index, self.descriptor, self.made = ops, index, None, ()


def _map_key(ptr: BlockPointer) -> tuple:
    return (ptr.base.handle, *(v.handle for v in ptr.shape), *(v.handle for v in ptr.strides),
            tuple(ptr.block_shape), tuple(ptr.order))


def _note_map_site(ptr: BlockPointer) -> None:
    b = sem.builder()
    box = tuple(ptr.block_shape[d] for d in reversed(ptr.order))
    try:
        tensor_descriptor_type(ptr.base.type.pointee, box)
    except ValueError:
        return  # not a TMA box: loads stay pointer arithmetic
    if b.probing:
        return  # a walk into a discarded block: the real walk notes the site
    key = _map_key(ptr)
    known = b.block_pointer_maps.get(key)
    if known is None or not _open(known):  # the same block pointer made again, elsewhere
        b.block_pointer_maps[key] = _MapSite(b._blocks[-1], len(b._blocks[-1]))


def _open(site: _MapSite) -> bool:
    """True while the block `site` is in is being built (it encloses where we are)."""
    return any(site.ops is ops for ops in sem.builder()._blocks)


def _tensor_map(ptr: BlockPointer, site: _MapSite):
    """The block pointer's tensor map (dims outermost first), written at `site` once."""
    from .device_tensor_map import device_tensor_map

    b = sem.builder()
    if site.descriptor is None:
        dims = tuple(reversed(ptr.order))
        type_ = tensor_descriptor_type(ptr.base.type.pointee, tuple(ptr.block_shape[d] for d in dims))
        made = b.push_block()
        desc = device_tensor_map(ptr.base, [ptr.shape[d] for d in dims], [ptr.strides[d] for d in dims], type_,
                                 check_alignment=False)
        b.pop_block()
        site.ops[site.index:site.index] = made
        for other in b.block_pointer_maps.values():
            if other is not site and other.ops is site.ops and other.index >= site.index:
                other.index += len(made)
        site.descriptor, site.made = desc, tuple(made)
    return site.descriptor


@builtin
def advance(base: Any, offsets: Sequence[Any]):
    """The block pointer moved by `offsets` (one per dim)."""
    b = sem.builder()
    if not isinstance(base, BlockPointer):
        raise b.error(f"advance needs a block pointer (from tl.make_block_ptr), found {sem.describe(base)}",
                      suggestion="advance a pointer tensor with +")
    deltas = _ints(offsets, len(base.block_shape), "advance offsets")
    moved = tuple(ll_sem.cast(o + _scalar(d, "an advance offset", i32), i32) for o, d in zip(base.offsets, deltas))
    return BlockPointer(base.base, base.shape, base.strides, moved, base.block_shape, base.order)


def _addresses(ptr: BlockPointer, boundary_check: Any, what: str):
    """(pointer tile, mask tile or None) of a block pointer."""
    b = sem.builder()
    rank = len(ptr.block_shape)
    if isinstance(boundary_check, py.int) and not isinstance(boundary_check, py.bool):
        boundary_check = (boundary_check,)
    checked = _ints(boundary_check, None, f"{what} boundary_check")
    for d in checked:
        if isinstance(d, py.bool) or not isinstance(d, py.int) or not 0 <= d < rank:
            raise b.error(f"{what} boundary_check {list(checked)}: {d!r} is not a dim of the {rank}-d block")
    base, pointers, mask = ptr.base, None, None
    for d, size in enumerate(ptr.block_shape):
        within = sem.arange_along(size, d, rank)
        # (offset + i) * stride split into a scalar and a tile that does not depend on the
        # offsets: a loop advancing the block moves one scalar, and the tile, the same
        # every iteration, is computed once (exact: the sums are in i64).
        base = base + ptr.offsets[d].to(i64) * ptr.strides[d]
        step = within.to(i64) * ptr.strides[d]
        pointers = step if pointers is None else pointers + step
        if d in checked:
            index = within + ptr.offsets[d]
            inside = (index >= 0) & (index < ptr.shape[d])
            mask = inside if mask is None else mask & inside
    pointers = sem.broadcast_to(base + pointers, tuple(ptr.block_shape))
    return pointers, (sem.broadcast_to(mask, tuple(ptr.block_shape)) if mask is not None else None)


def load(ptr: BlockPointer, mask: Any, other: Any, boundary_check: Any, padding_option: str,
         cache_modifier: str, eviction_policy: str):
    """tl.load of a block pointer."""
    from ..lowlevel import builtins as ll

    b = sem.builder()
    if mask is not None or other is not None:
        raise b.error("a block pointer load takes no mask or other",
                      suggestion="use boundary_check=(dims...) and padding_option='zero' or 'nan'")
    if padding_option not in PADDING_OPTIONS:
        raise b.error(f"padding_option must be one of {PADDING_OPTIONS}, found {padding_option!r}")
    pointers, mask = _addresses(ptr, boundary_check, "load")
    element = ptr.base.type.pointee
    if padding_option == "nan" and not element.is_float:
        raise b.error(f"padding_option='nan' needs a floating-point block, found {element}")
    padding = float("nan") if padding_option == "nan" else 0
    other = None if mask is None else ll_sem.constant(padding, TensorType(tuple(ptr.block_shape), element))
    return ll.load.__wrapped__(pointers, mask, other, cache_modifier, eviction_policy)


def load_block(ptr: BlockPointer, mask: Any, other: Any, boundary_check: Any, padding_option: str,
               cache_modifier: str, eviction_policy: str):
    """tl.load of a block pointer: through pointers, and by TMA too where the block may be a
    box (stage_block_pointers keeps one of the two)."""
    b = sem.builder()
    site = b.block_pointer_maps.get(_map_key(ptr))
    if site is None or b.probing or padding_option not in ("", "zero") or not _open(site):
        return load(ptr, mask, other, boundary_check, padding_option, cache_modifier, eviction_policy)
    pointer_ops = b.push_block()
    tile = load(ptr, mask, other, boundary_check, padding_option, cache_modifier, eviction_policy)
    b.pop_block()
    desc = _tensor_map(ptr, site)
    box_ops = b.push_block()
    box = _box_load(ptr, desc)
    b.pop_block()
    for op in pointer_ops + box_ops:
        b.emit(op)
    b.block_pointer_loads.append(BlockPointerLoad(
        pointer_ops=tuple(pointer_ops), pointer_tile=tile.handle, box_ops=tuple(box_ops), box_tile=box.handle,
        descriptor=desc.handle, descriptor_ops=site.made, base=ptr.base.handle,
        outer_strides=tuple(ptr.strides[d].handle for d in ptr.order[1:]), itemsize=ptr.base.type.pointee.bits // 8))
    return tile


def _box_load(ptr: BlockPointer, desc):
    """The block read by TMA through `desc` (dims reversed `order`), in the block's dims."""
    from .tensor_descriptor import MadeTensorDescriptor, load as load_box

    dims = tuple(reversed(ptr.order))
    box = load_box(MadeTensorDescriptor(desc.handle, desc.shape, desc.strides), [ptr.offsets[d] for d in dims])
    return sem.permute(box, tuple(dims.index(d) for d in py.range(len(dims))))


def store(ptr: BlockPointer, value: Any, mask: Any, boundary_check: Any, cache_modifier: str,
          eviction_policy: str):
    """tl.store to a block pointer."""
    from ..lowlevel import builtins as ll

    if mask is not None:
        raise sem.builder().error("a block pointer store takes no mask", suggestion="use boundary_check=(dims...)")
    pointers, mask = _addresses(ptr, boundary_check, "store")
    if sem.is_tensor(value) and value.type.shape != pointers.type.shape:
        value = sem.broadcast_to(value, pointers.type.shape)
    ll.store.__wrapped__(pointers, value, mask, cache_modifier, eviction_policy)
