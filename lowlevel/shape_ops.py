"""Ops that change a tensor's shape or layout: reductions, reshape, permute,
convert_layout. Each computes its result layout with `layouts.rules` (the rules
the verifier re-checks) and gives the result a layout description users can name.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..compiler import ir
from ..layouts import rules as layout_rules
from ..compiler.types import ScalarType, TensorType, i32, u32
from ..layouts import LayoutError, LinearDistributedLayout, LinearLayout, as_distributed
from ..layouts.gf2 import XorBasis
from . import semantic as sem

REDUCE_KINDS = ("sum", "max", "min", "argmax", "argmin")


def distributed_layout(layout: Any, shape: Sequence[int], what: str) -> tuple[Any, LinearLayout]:
    """(description, linear layout) of a user-given distributed layout for `shape`,
    checked against the kernel's warp count."""
    b = sem.builder()
    try:
        encoding = as_distributed(layout, what)
        linear = encoding.to_linear(tuple(shape))
    except LayoutError as error:
        raise b.error(str(error))
    warps = linear.in_dims.get("warp", 1)
    if warps != b.num_warps:
        raise b.error(f"{what} {encoding} spans {warps} warps, but the kernel runs with "
                      f"num_warps={b.num_warps}",
                      suggestion=f"launch with num_warps={warps}, or make warps_per_cta "
                                 f"multiply to {b.num_warps}")
    return encoding, linear


def _axis(x, axis: Any, what: str) -> int:
    rank = len(x.type.shape)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise sem.builder().error(f"{what}: axis {axis!r} is not a dim of a rank-{rank} tensor",
                                  expected="a compile-time int axis")
    return axis % rank


def _sum_type(element: ScalarType, dtype: Optional[ScalarType]) -> ScalarType:
    """Triton's sum accumulator: small ints accumulate in 32 bits, floats as they are."""
    if dtype is not None:
        return dtype
    if element.is_int and element.bits < 32:
        return i32 if element.is_signed or element.is_bool else u32
    return element


def reduce(x: Any, axis: Any, kind: str, keep_dims: bool = False,
           dtype: Optional[ScalarType] = None):
    """Reduce `x` along `axis` (all dims when None); the result is in SliceLayout(axis, x's
    layout), and a 1-D tensor reduces to a scalar."""
    b = sem.builder()
    if not sem.is_tensor(x):
        raise b.error(f"{kind} needs a tensor, found {sem.describe(x)}")
    if axis is None:
        if kind.startswith("arg"):
            raise b.error(f"{kind} needs an axis")
        result = x
        for _ in range(len(x.type.shape)):
            result = reduce(result, len(result.type.shape) - 1, kind, False, dtype)
        return result
    axis = _axis(x, axis, kind)
    if kind == "sum":
        x = sem.cast(x, _sum_type(x.type.element, dtype))
    try:
        result_layout = layout_rules.reduce_layout(x.type.layout, axis)
    except LayoutError as error:
        raise b.error(str(error), found=sem.describe(x))
    shape = x.type.shape[:axis] + x.type.shape[axis + 1:]
    element = i32 if kind.startswith("arg") else x.type.element
    if not shape:
        result_type = element
    else:
        encoding = x.type.encoding.reduced(axis) if x.type.encoding is not None else None
        try:
            agrees = encoding is not None and encoding.to_linear(shape) == result_layout
        except LayoutError:
            agrees = False
        if not agrees:  # a layout whose slice has no simpler description
            encoding = LinearDistributedLayout.from_linear(result_layout)
        result_type = TensorType(shape, element, result_layout, encoding)
    result = b.wrap(b.create(ir.Reduce, result_type, operand=x.handle, axis=axis, kind=kind))
    if keep_dims:
        result = sem.expand_dims(result, axis) if shape else result
    return result


def reshape(x: Any, shape: Sequence[int]):
    """The same elements in row-major order under a new shape; no data moves, so the
    result's layout is the operand's, re-indexed (described as a LinearDistributedLayout)."""
    b = sem.builder()
    shape = tuple(shape)
    if not sem.is_tensor(x):
        raise b.error(f"reshape needs a tensor, found {sem.describe(x)}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        raise b.error(f"reshape needs a compile-time shape, found {list(shape)}")
    count = 1
    for s in shape:
        count *= s
    if count != x.numel:
        raise b.error(f"cannot reshape {list(x.type.shape)} ({x.numel} elements) to "
                      f"{list(shape)} ({count} elements)")
    if shape == x.type.shape:
        return x
    try:
        layout = layout_rules.reshape_layout(x.type.layout, shape)
    except LayoutError as error:
        raise b.error(str(error))
    result_type = TensorType(shape, x.type.element, layout, LinearDistributedLayout.from_linear(layout))
    return b.wrap(b.create(ir.Reshape, result_type, operand=x.handle))


def permute(x: Any, order: Sequence[int]):
    """Result dim i is operand dim order[i]; no data moves."""
    b = sem.builder()
    order = tuple(order)
    if not sem.is_tensor(x):
        raise b.error(f"permute needs a tensor, found {sem.describe(x)}")
    if sorted(order) != list(range(len(x.type.shape))):
        raise b.error(f"permute order {list(order)} is not a permutation of the "
                      f"{len(x.type.shape)} dims of {sem.describe(x)}")
    layout = layout_rules.permute_layout(x.type.layout, order)
    shape = tuple(x.type.shape[d] for d in order)
    encoding = x.type.encoding.permuted(order) if x.type.encoding is not None else None
    if encoding is None or encoding.to_linear(shape) != layout:
        encoding = LinearDistributedLayout.from_linear(layout)
    result_type = TensorType(shape, x.type.element, layout, encoding)
    return b.wrap(b.create(ir.Permute, result_type, operand=x.handle, order=order))


def is_trivial_conversion(source: LinearLayout, target: LinearLayout) -> bool:
    """True when every thread already holds the elements it holds under `target`: lane,
    warp and block bases agree and the registers span the same elements (only register
    numbering changes)."""
    src, dst = source.bases, target.bases
    for dim in ("lane", "warp", "block"):
        if tuple(src.get(dim, ())) != tuple(dst.get(dim, ())):
            return False
    regs_s = [source.flatten_basis(r) for r in src.get("register", ())]
    regs_d = [source.flatten_basis(r) for r in dst.get("register", ())]
    rank = XorBasis(regs_s).rank
    return rank == XorBasis(regs_d).rank == XorBasis(regs_s + regs_d).rank


def convert_layout(x: Any, layout: Any, assert_trivial: bool = False):
    """`x` moved to `layout` (registers, shuffles or shared memory: planned by a pass)."""
    b = sem.builder()
    if not sem.is_tensor(x):
        raise b.error(f"convert_layout needs a tensor, found {sem.describe(x)}")
    encoding, linear = distributed_layout(layout, x.type.shape, "convert_layout layout")
    target = linear.transpose_outs(x.type.layout.out_dim_names)
    if assert_trivial and not is_trivial_conversion(x.type.layout, target):
        raise b.error(f"convert_layout with assert_trivial=True moves data between threads: "
                      f"{sem.describe(x)} to {encoding}",
                      suggestion="drop assert_trivial, or pick a target layout whose lanes "
                                 "and warps hold the same elements")
    if linear == x.type.layout and x.type.encoding == encoding:
        return x
    result_type = TensorType(x.type.shape, x.type.element, linear, encoding)
    return b.wrap(b.create(ir.ConvertLayout, result_type, operand=x.handle))
