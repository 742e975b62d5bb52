"""Block pointers: `tl.make_block_ptr`, `tl.advance`, and `tl.load` / `tl.store` of them
with `boundary_check` and `padding_option`, as Triton defines them.

A block pointer names the tile `block_shape` at `offsets` of a tensor of `shape` and
`strides` at `base`. Here it becomes pointer arithmetic: each element's address is
base + sum over d of (offsets[d] + i_d) * strides[d], and the dims in `boundary_check`
mask the elements outside [0, shape[d]) (loads read `padding_option` there: zero, or NaN
for "nan"). The staging pass (docs/design.md, planned) may later turn such loads into TMA.

`BlockPointer` is an aggregate, so a loop that advances it carries its offsets.
"""

from __future__ import annotations

import builtins as py
from typing import Any, Optional, Sequence

from ..compiler.aggregates import aggregate
from ..compiler.builder import builtin
from ..compiler.types import PointerType, ScalarType, TensorType, i32, i64
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
    return BlockPointer(base, shape, strides, offsets, block_shape, order)


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
