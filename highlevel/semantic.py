"""The highlevel (`tile`-stage) versions of lowlevel's layout-bearing rules.

Highlevel ops are lowlevel ops whose layout fields start empty (STYLE.md 2): promotion,
numbers next to tensors, casts and splats are `weft.lowlevel.semantic`'s own functions,
which work unchanged on tensors without layouts. What differs is what a layout decided
in lowlevel: inserting a size-1 dim (lowlevel needs a SliceLayout operand), stretching
size-1 dims (lowlevel stretches the operand's layout description) and reducing (the
result is a slice of the operand's layout). Here those only change shapes; the
`propagate_layouts` pass picks the layouts afterwards.

Operands are broadcast to one shape here *before* a lowlevel helper sees them, so its
own broadcasting finds nothing left to do.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..compiler import ir
from ..compiler.types import ScalarType, TensorType, i8, i16, i32, i64
from ..lowlevel import semantic as sem
from ..lowlevel.shape_ops import REDUCE_KINDS, _sum_type

builder = sem.builder
is_tensor = sem.is_tensor


def describe(x: Any) -> str:
    """A value in words (tile tensors have no layout to name yet)."""
    if not sem.is_value(x):
        return repr(x)
    if isinstance(x.type, TensorType):
        return f"a tensor {x.type}"
    return f"a scalar {x.type}"


def _axis(x: Any, axis: Any, rank: int, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise builder().error(f"{what}: axis {axis!r} is not a dim of {describe(x)}",
                              expected=f"a compile-time int from {-rank} to {rank - 1}")
    return axis % rank


def expand_dims(x: Any, axis: int):
    """A size-1 dim inserted at `axis` (negative axes count from the end)."""
    b = builder()
    if not is_tensor(x):
        raise b.error("expand_dims needs a tensor, found " + describe(x))
    rank = len(x.type.shape)
    axis = _axis(x, axis, rank + 1, "expand_dims")
    shape = x.type.shape[:axis] + (1,) + x.type.shape[axis:]
    return b.wrap(b.create(ir.ExpandDims, TensorType(shape, x.type.element), operand=x.handle,
                           axis=axis))


def broadcast_to(x: Any, shape: Sequence[int]):
    """`x` with its size-1 dims stretched to `shape` (missing leading dims added first)."""
    b = builder()
    shape = tuple(shape)
    if not is_tensor(x):
        raise b.error("broadcast_to needs a tensor, found " + describe(x),
                      suggestion="use full(shape, value, dtype) for a number or a scalar")
    if len(x.type.shape) > len(shape):
        raise b.error(f"cannot broadcast {describe(x)} to the lower-rank shape {list(shape)}")
    while len(x.type.shape) < len(shape):
        x = expand_dims(x, 0)
    sem.broadcast_shapes(x.type.shape, shape, "broadcast_to")
    for have, want in zip(x.type.shape, shape):
        if have != want and have != 1:
            raise b.error(f"cannot broadcast {describe(x)} to shape {list(shape)}")
    if x.type.shape == shape:
        return x
    return b.wrap(b.create(ir.Broadcast, TensorType(shape, x.type.element), operand=x.handle))


def broadcast_all(*values: Any, what: str = "operands") -> list:
    """The tensors among `values` broadcast to one shape (numpy's rules); the rest as given."""
    tensors = [v for v in values if is_tensor(v)]
    if len(tensors) < 2:
        return list(values)
    rank = max(len(t.type.shape) for t in tensors)
    shape = (1,) * rank
    for t in tensors:
        padded = (1,) * (rank - len(t.type.shape)) + t.type.shape
        shape = sem.broadcast_shapes(shape, padded, what)
    return [broadcast_to(v, shape) if is_tensor(v) else v for v in values]


def reduce(x: Any, axis: Any, kind: str, keep_dims: bool = False,
           dtype: Optional[ScalarType] = None):
    """Reduce `x` along `axis` (every dim when None); a 1-D tensor reduces to a scalar.
    Sums accumulate small ints in 32 bits (Triton's rule); arg-reductions give i32."""
    b = builder()
    if kind not in REDUCE_KINDS:
        raise b.error(f"unknown reduction {kind!r}")
    if not is_tensor(x):
        raise b.error(f"{kind} needs a tensor, found {describe(x)}")
    if axis is None:
        if kind.startswith("arg"):
            raise b.error(f"{kind} needs an axis")
        result = x
        for _ in range(len(x.type.shape)):
            result = reduce(result, len(result.type.shape) - 1, kind, False, dtype)
        if keep_dims:  # Triton keeps a [1, ..., 1] tensor
            result = sem.splat(result, TensorType((1,) * len(x.type.shape), result.type))
        return result
    axis = _axis(x, axis, len(x.type.shape), kind)
    if kind == "sum":
        x = sem.cast(x, _sum_type(x.type.element, dtype))
    shape = x.type.shape[:axis] + x.type.shape[axis + 1:]
    element = i32 if kind.startswith("arg") else x.type.element
    result_type = TensorType(shape, element) if shape else element
    result = b.wrap(b.create(ir.Reduce, result_type, operand=x.handle, axis=axis, kind=kind))
    if keep_dims:
        result = expand_dims(result, axis) if shape else result
    return result


def permute(x: Any, order: Sequence[int]):
    """Result dim i is operand dim order[i] (no data moves: only the layout is re-indexed)."""
    b = builder()
    order = tuple(order)
    if not is_tensor(x):
        raise b.error(f"permute needs a tensor, found {describe(x)}")
    if sorted(order) != list(range(len(x.type.shape))):
        raise b.error(f"permute order {list(order)} is not a permutation of the "
                      f"{len(x.type.shape)} dims of {describe(x)}")
    if order == tuple(range(len(order))):
        return x
    shape = tuple(x.type.shape[d] for d in order)
    return b.wrap(b.create(ir.Permute, TensorType(shape, x.type.element), operand=x.handle,
                           order=order))


def reshape(x: Any, shape: Sequence[int], can_reorder: bool = False):
    """The elements of `x` in row-major order under a new shape (no data moves: the
    layout is re-indexed by `layouts.rules.reshape_layout`). `can_reorder` lets Triton pick
    another order; weft always keeps row-major order, which is one of the allowed ones."""
    b = builder()
    if not is_tensor(x):
        raise b.error(f"reshape needs a tensor, found {describe(x)}")
    if not isinstance(can_reorder, bool):
        raise b.error(f"reshape(..., can_reorder=) takes True or False, found {can_reorder!r}")
    shape = tuple(shape)
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0 or s & (s - 1):
            raise b.error(f"reshape shape entry must be a compile-time int, a power of two; found {describe(s)}",
                          suggestion="pass the dims as constexpr values (NAME: tl.constexpr)")
    count = 1
    for s in shape:
        count *= s
    if count != x.type.num_elements:
        raise b.error(f"cannot reshape {describe(x)} ({x.type.num_elements} elements) to {list(shape)} "
                      f"({count} elements)", suggestion="keep the number of elements")
    if shape == x.type.shape:
        return x
    return b.wrap(b.create(ir.Reshape, TensorType(shape, x.type.element), operand=x.handle))


def join(a: Any, b: Any):
    """`a` and `b` (broadcast to one shape) side by side along a new minor dim of size 2:
    result[..., 0] is a, result[..., 1] is b. Built from expand_dims, broadcast and where,
    so layout propagation places it like any elementwise code."""
    bld = builder()
    for name, v in (("first", a), ("second", b)):
        if not is_tensor(v):
            raise bld.error(f"join needs two tensors, found {describe(v)} as the {name} operand",
                            suggestion="make a tensor with tl.full(shape, value, dtype)")
    if a.type.element != b.type.element:
        raise bld.error(f"join needs operands of one element type, found {describe(a)} and {describe(b)}",
                        suggestion="convert one with .to(dtype)")
    a, b = broadcast_all(a, b, what="join")
    shape = a.type.shape + (2,)
    first = sem.compare("eq", _minor_index(shape), sem.constant(0, TensorType(shape, i32)), "==")
    axis = len(shape) - 1
    return sem.where(first, broadcast_to(expand_dims(a, axis), shape), broadcast_to(expand_dims(b, axis), shape))


def _minor_index(shape: tuple[int, ...]):
    """Each element's index along the last dim of `shape`, as an i32 tile of that shape."""
    b = builder()
    index = b.wrap(b.create(ir.Arange, TensorType((shape[-1],), i32), start=0, end=shape[-1]))
    while len(index.type.shape) < len(shape):
        index = expand_dims(index, 0)
    return broadcast_to(index, shape)


def split(x: Any):
    """The two halves of `x` along its last dim, which must have size 2 (join's inverse)."""
    b = builder()
    if not is_tensor(x) or x.type.shape[-1] != 2:
        raise b.error(f"split needs a tensor whose last dim has size 2, found {describe(x)}",
                      suggestion="tl.reshape(x, (..., 2)) first, or split with pointer offsets")
    if not isinstance(x.type.element, ScalarType):
        raise b.error(f"split of {describe(x)} is not supported", suggestion="split the offsets, then add them")
    return take_minor(x, 0), take_minor(x, 1)


def take_minor(x: Any, index: int):
    """x[..., index]: a sum over the last dim with every other element zeroed, on the bits
    as integers, so every value (a -0.0 or a NaN included) comes back unchanged."""
    element = x.type.element
    if element.is_bool:
        bits = sem.cast(x, i32)
    elif element.is_float:
        bits = sem.cast(x, _bits_type(element), bitcast=True)
    else:
        bits = x
    shape = x.type.shape
    keep = sem.compare("eq", _minor_index(shape), sem.constant(index, TensorType(shape, i32)), "==")
    zeros = sem.constant(0, TensorType(shape, bits.type.element))
    taken = reduce(sem.where(keep, bits, zeros), len(shape) - 1, "sum", dtype=bits.type.element)
    if element.is_bool:
        return sem.to_bool(taken)
    return sem.cast(taken, element, bitcast=True) if element.is_float else taken


def _bits_type(element: ScalarType) -> ScalarType:
    """The signed integer type as wide as `element`."""
    return {8: i8, 16: i16, 32: i32, 64: i64}[element.bits]


def arange_along(size: int, axis: int, rank: int):
    """0, 1, ..., size - 1 along `axis` of a rank-`rank` tile (size 1 in the other dims)."""
    b = builder()
    index = b.wrap(b.create(ir.Arange, TensorType((size,), i32), start=0, end=size))
    for _ in range(axis):
        index = expand_dims(index, 0)
    while len(index.type.shape) < rank:
        index = expand_dims(index, len(index.type.shape))
    return index
