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
from ..compiler.types import ScalarType, TensorType, i32
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
