"""The module-level ops of `weft.highlevel`, named and called as in Triton's `tl`.

Ops without layouts are lowlevel's own (program ids, math, printing). The ones that made
a layout choice in lowlevel take no layout here (`arange`, `full`, `zeros`), and the ones
that combine several tensors broadcast them to one shape first, then run lowlevel's op.
"""

from __future__ import annotations

import builtins as py
from typing import Any, Optional, Sequence

from ..compiler import ir
from ..compiler.builder import builtin, constexpr_function
from ..compiler.types import ScalarType, TensorType, i32
from ..lowlevel import atomics as ll_atomics
from ..lowlevel import builtins as ll
from ..lowlevel import semantic as ll_sem
from . import semantic as sem

# Ops that never see a layout: lowlevel's, as they are.
program_id, num_programs = ll.program_id, ll.num_programs
exp, exp2, log, log2, rsqrt, erf = ll.exp, ll.exp2, ll.log, ll.log2, ll.rsqrt, ll.erf
sin, cos, floor, ceil, abs = ll.sin, ll.cos, ll.floor, ll.ceil, ll.abs
device_print, device_assert, static_assert, static_print = (
    ll.device_print, ll.device_assert, ll.static_assert, ll.static_print)
debug_barrier = ll.barrier


@builtin
def sqrt(x: Any):
    """Elementwise square root as Triton's `tl.sqrt`: libdevice's sqrtf under Triton's
    flush-to-zero flag, sqrt.approx.ftz.f32 (fp64: rounded to nearest). `tl.sqrt_rn`
    rounds fp32 to nearest."""
    return ll_sem.unary("sqrt_approx", x, "sqrt")


def cdiv(x: Any, y: Any):
    """ceil(x / y) for non-negative ints, in kernels and on the host (`triton.cdiv`)."""
    if not ll_sem.is_value(x) and not ll_sem.is_value(y):
        return -(-x // y)
    return (x + y - 1) // y


cdiv.__weft_builtin__ = True  # callable from kernels, yet usable on the host too


@constexpr_function
def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (`triton.next_power_of_2`), in kernels and on the host."""
    return 1 << py.max(py.int(n) - 1, 0).bit_length()


def _constexpr_int(value: Any, what: str) -> int:
    if isinstance(value, py.bool) or not isinstance(value, py.int):
        raise sem.builder().error(f"{what} must be a compile-time int, found {sem.describe(value)}",
                                  suggestion="pass it as a constexpr parameter (NAME: tl.constexpr)")
    return value


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, py.int) and not isinstance(shape, py.bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise sem.builder().error(f"{what} must be a list of compile-time ints, found {shape!r}")
    result = tuple(_constexpr_int(s, f"{what} entry") for s in shape)
    for s in result:
        if s <= 0 or s & (s - 1):
            raise sem.builder().error(f"{what} {list(result)}: every dim must be a power of two")
    return result


# ------------------------------------------------------------------ tiles
@builtin
def arange(start: int, end: int):
    """The i32 values start, ..., end - 1 in a 1-D tile; end - start must be a power of two."""
    b = sem.builder()
    start = _constexpr_int(start, "arange start")
    end = _constexpr_int(end, "arange end")
    size = end - start
    if size <= 0 or size & (size - 1):
        raise b.error(f"arange({start}, {end}) has {size} elements; the count must be a "
                      f"positive power of two")
    return b.wrap(b.create(ir.Arange, TensorType((size,), i32), start=start, end=end))


@builtin
def full(shape: Sequence[int], value: Any, dtype: ScalarType):
    """A tile of `shape` and `dtype`, every element `value` (a number or a scalar)."""
    b = sem.builder()
    shape = _shape(shape, "full shape")
    if not isinstance(dtype, ScalarType):
        raise b.error(f"full dtype must be an element type such as tl.float32, found {dtype!r}")
    template = TensorType(shape, dtype)
    if ll_sem.is_value(value):
        if ll_sem.is_tensor(value):
            raise b.error(f"full needs a number or a scalar value, found {sem.describe(value)}")
        return ll_sem.splat(ll_sem.cast(value, dtype), template)
    return ll_sem.constant(value, template)


@builtin
def zeros(shape: Sequence[int], dtype: ScalarType):
    """`full(shape, 0, dtype)`."""
    return full.__wrapped__(shape, 0, dtype)


@builtin
def zeros_like(x: Any):
    """Zeros of `x`'s shape and dtype."""
    return full.__wrapped__(x.shape, 0, x.dtype)


# ------------------------------------------------------------------ global memory
@builtin
def load(pointer: Any, mask: Any = None, other: Any = None, cache_modifier: str = "",
         eviction_policy: str = "", boundary_check: Any = (), padding_option: str = ""):
    """Elements at `pointer`; where `mask` is false, `other` (default 0). As in Triton,
    `other` without a mask is ignored; the cache hints are ll.load's. A block pointer
    (tl.make_block_ptr) takes `boundary_check` and `padding_option` instead of a mask."""
    from . import block_pointer

    if isinstance(pointer, block_pointer.BlockPointer):
        return block_pointer.load_block(pointer, mask, other, boundary_check, padding_option, cache_modifier,
                                  eviction_policy)
    other = None if mask is None else other
    pointer, mask, other = sem.broadcast_all(pointer, mask, other, what="load")
    return ll.load.__wrapped__(pointer, mask, other, cache_modifier, eviction_policy)


@builtin
def store(pointer: Any, value: Any, mask: Any = None, cache_modifier: str = "",
          eviction_policy: str = "", boundary_check: Any = ()):
    """Write `value` (converted to the pointee type) at `pointer` where `mask` is true;
    the cache hints are ll.store's. A block pointer takes `boundary_check` instead of a mask."""
    from . import block_pointer

    if isinstance(pointer, block_pointer.BlockPointer):
        block_pointer.store(pointer, value, mask, boundary_check, cache_modifier, eviction_policy)
        return
    pointer, value, mask = sem.broadcast_all(pointer, value, mask, what="store")
    ll.store.__wrapped__(pointer, value, mask, cache_modifier, eviction_policy)


def _atomic(kind: str):
    """tl.atomic_<kind>: ll.atomic_<kind> with the operands broadcast to one shape first."""
    name = "atomic_" + kind
    lowlevel_op = getattr(ll_atomics, name)

    def op(pointer: Any, value: Any, mask: Any = None, sem: Optional[str] = "acq_rel",
           scope: Optional[str] = "gpu"):
        pointer, value, mask = _broadcast(pointer, value, mask, what=name)
        return lowlevel_op.__wrapped__(pointer, value, mask, sem, scope)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = lowlevel_op.__doc__
    return builtin(op)


def _broadcast(*values: Any, what: str) -> list:
    return sem.broadcast_all(*values, what=what)  # here `sem` is the module, not an argument


atomic_add, atomic_max, atomic_min = _atomic("add"), _atomic("max"), _atomic("min")
atomic_and, atomic_or, atomic_xor, atomic_xchg = _atomic("and"), _atomic("or"), _atomic("xor"), _atomic("xchg")


@builtin
def atomic_cas(pointer: Any, cmp: Any, value: Any, sem: Optional[str] = "acq_rel",
               scope: Optional[str] = "gpu", mask: Any = None):
    """ll.atomic_cas with the operands broadcast to one shape first."""
    pointer, cmp, value, mask = _broadcast(pointer, cmp, value, mask, what="atomic_cas")
    return ll_atomics.atomic_cas.__wrapped__(pointer, cmp, value, sem, scope, mask)


# ------------------------------------------------------------------ elementwise
@builtin
def where(condition: Any, x: Any, y: Any):
    """Elementwise `x` where `condition` else `y` (broadcast to one shape)."""
    return ll_sem.where(*sem.broadcast_all(condition, x, y, what="where"))


@builtin
def maximum(x: Any, y: Any):
    """Elementwise maximum (promoted like arithmetic)."""
    return ll_sem.binary("max", *sem.broadcast_all(x, y, what="maximum"), "maximum")


@builtin
def minimum(x: Any, y: Any):
    """Elementwise minimum (promoted like arithmetic)."""
    return ll_sem.binary("min", *sem.broadcast_all(x, y, what="minimum"), "minimum")


@builtin
def fma(x: Any, y: Any, z: Any):
    """Elementwise x * y + z with one rounding."""
    return ll_sem.fma(*sem.broadcast_all(x, y, z, what="fma"))


# ------------------------------------------------------------------ reductions and shapes
@builtin
def sum(x: Any, axis: Optional[int] = None, keep_dims: bool = False, dtype=None):
    """Sum along `axis` (every dim when None)."""
    return sem.reduce(x, axis, "sum", keep_dims, dtype)


@builtin
def max(x: Any, axis: Optional[int] = None, return_indices: bool = False,
        return_indices_tie_break_left: bool = True, keep_dims: bool = False):
    """Maximum along `axis` (every dim when None). For two tensors use tl.maximum."""
    _no_indices(return_indices, "max")
    return sem.reduce(x, axis, "max", keep_dims)


@builtin
def min(x: Any, axis: Optional[int] = None, return_indices: bool = False,
        return_indices_tie_break_left: bool = True, keep_dims: bool = False):
    """Minimum along `axis` (every dim when None). For two tensors use tl.minimum."""
    _no_indices(return_indices, "min")
    return sem.reduce(x, axis, "min", keep_dims)


@builtin
def argmax(x: Any, axis: int, tie_break_left: bool = True, keep_dims: bool = False):
    """Index (i32) of the maximum along `axis`; ties give the smallest index."""
    _left_ties(tie_break_left, "argmax")
    return sem.reduce(x, axis, "argmax", keep_dims)


@builtin
def argmin(x: Any, axis: int, tie_break_left: bool = True, keep_dims: bool = False):
    """Index (i32) of the minimum along `axis`; ties give the smallest index."""
    _left_ties(tie_break_left, "argmin")
    return sem.reduce(x, axis, "argmin", keep_dims)


def _no_indices(return_indices: Any, what: str) -> None:
    if return_indices:
        raise sem.builder().error(f"{what}(..., return_indices=True) is not supported",
                                  suggestion=f"call tl.{what} and tl.arg{what} separately")


def _left_ties(tie_break_left: Any, what: str) -> None:
    if not tie_break_left:
        raise sem.builder().error(f"{what}(..., tie_break_left=False) is not supported")


@builtin
def expand_dims(x: Any, axis: int):
    """A size-1 dim inserted at `axis`."""
    return sem.expand_dims(x, axis)


@builtin
def broadcast_to(x: Any, shape: Sequence[int]):
    """`x` stretched to `shape` along its size-1 dims."""
    return sem.broadcast_to(x, _shape(shape, "broadcast_to shape"))


@builtin
def broadcast(x: Any, y: Any):
    """`x` and `y` broadcast to one shape."""
    return tuple(sem.broadcast_all(x, y, what="broadcast"))


@builtin
def permute(x: Any, *order: int):
    """Dims reordered: result dim i is operand dim order[i]."""
    order = tuple(order[0]) if py.len(order) == 1 and isinstance(order[0], (tuple, list)) else order
    return sem.permute(x, order)


@builtin
def trans(x: Any, *order: int):
    """Dims reversed (a 2-D transpose), or reordered by `order`."""
    order = tuple(order[0]) if py.len(order) == 1 and isinstance(order[0], (tuple, list)) else order
    if not ll_sem.is_tensor(x):
        raise sem.builder().error(f"trans needs a tensor, found {sem.describe(x)}")
    return sem.permute(x, order or tuple(reversed(py.range(py.len(x.type.shape)))))


@builtin
def reshape(input: Any, *shape: int, can_reorder: bool = False):
    """The elements of `input` in row-major order under `shape` (the same count)."""
    return sem.reshape(input, _shape(_dims(shape), "reshape shape"), can_reorder)


@builtin
def view(input: Any, *shape: int):
    """`reshape(input, shape, can_reorder=True)` (Triton's older spelling)."""
    return sem.reshape(input, _shape(_dims(shape), "view shape"), True)


@builtin
def ravel(x: Any, can_reorder: bool = False):
    """`x` as a 1-D tensor, in row-major order."""
    if not ll_sem.is_tensor(x):
        raise sem.builder().error(f"ravel needs a tensor, found {sem.describe(x)}")
    return sem.reshape(x, (x.type.num_elements,), can_reorder)


@builtin
def join(a: Any, b: Any):
    """`a` and `b` stacked along a new last dim of size 2."""
    return sem.join(a, b)


@builtin
def split(a: Any):
    """The two halves of `a` along its last dim (of size 2): join's inverse."""
    return sem.split(a)


@builtin
def interleave(a: Any, b: Any):
    """`a` and `b` interleaved along their last dim: a0, b0, a1, b1, ..."""
    joined = sem.join(a, b)
    shape = joined.type.shape
    return sem.reshape(joined, shape[:-2] + (shape[-2] * 2,))


def _dims(items: tuple) -> tuple:
    """f(x, 1, 2) and f(x, (1, 2)) both mean the dims (1, 2)."""
    return tuple(items[0]) if py.len(items) == 1 and isinstance(items[0], (tuple, list)) else tuple(items)


@builtin
def associative_scan(input: Any, axis: int, combine_fn: Any, reverse: bool = False):
    """Inclusive scan of `input` (a tensor or a tuple of same-shaped tensors) along `axis`
    under `combine_fn`, a @jit function of (left values..., right values...) that is
    associative; `reverse` scans from the end."""
    from . import scan

    inputs = tuple(input) if isinstance(input, (tuple, list)) else (input,)
    result = scan.scan(inputs, axis, scan.jit_combine(combine_fn, inputs, "associative_scan"), reverse,
                       "associative_scan")
    return result if isinstance(input, (tuple, list)) else result[0]


@builtin
def cumsum(input: Any, axis: int = 0, reverse: bool = False, dtype: Any = None):
    """Inclusive prefix sums along `axis`."""
    from . import scan

    return scan.cumsum(input, axis, reverse, dtype)


@builtin
def cumprod(input: Any, axis: int = 0, reverse: bool = False):
    """Inclusive prefix products along `axis`."""
    from . import scan

    return scan.cumprod(input, axis, reverse)
