"""Scans: `tl.associative_scan`, `tl.cumsum`, `tl.cumprod` along any axis of a tile.

A scan is built from ops the layout passes already place, no scan op of its own: the
Sklansky prefix network. The axis is moved last; then for block sizes s = 1, 2, 4, ...
the axis is viewed as (blocks, 2, s) (a reshape: no data moves), its two halves are split,
and the upper half of every block is combined with the last element of the lower one (for
a reverse scan, the lower half with the first element of the upper one). After log2(n)
steps every element holds its inclusive prefix. Each step combines left operands that hold
earlier elements with right ones that hold later elements, in that order, so the combine
function needs to be associative only, as Triton requires, not commutative.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..compiler.types import ScalarType, bf16, fp32
from ..lowlevel import semantic as ll_sem
from ..lowlevel.shape_ops import _sum_type
from . import semantic as sem

Combine = Callable[[tuple, tuple], tuple]


def scan(values: tuple, axis: Any, combine: Combine, reverse: bool, what: str) -> tuple:
    """Inclusive scans of the same-shaped tiles `values` along `axis` under `combine`."""
    b = sem.builder()
    for value in values:
        if not sem.is_tensor(value):
            raise b.error(f"{what} needs tensors, found {sem.describe(value)}")
        if value.type.shape != values[0].type.shape:
            raise b.error(f"{what}: the inputs have different shapes, {sem.describe(values[0])} and "
                          f"{sem.describe(value)}")
    if not isinstance(reverse, bool):
        raise b.error(f"{what}(..., reverse=) takes True or False, found {reverse!r}")
    shape = values[0].type.shape
    axis = sem._axis(values[0], axis, len(shape), what)
    order = tuple(d for d in range(len(shape)) if d != axis) + (axis,)
    values = tuple(sem.permute(v, order) for v in values)
    lead, n = values[0].type.shape[:-1], shape[axis]
    size = 1
    while size < n:
        values = _step(values, lead, n, size, combine, reverse)
        size *= 2
    inverse = tuple(order.index(d) for d in range(len(shape)))
    return tuple(sem.permute(v, inverse) for v in values)


def _step(values: tuple, lead: tuple, n: int, size: int, combine: Combine, reverse: bool) -> tuple:
    """One level of the network: blocks of 2 * size, halves combined across."""
    rank = len(lead)
    swap = tuple(range(rank)) + (rank, rank + 2, rank + 1)  # (blocks, 2, size) -> (blocks, size, 2)
    lows, highs = [], []
    for value in values:
        halves = sem.permute(sem.reshape(value, lead + (n // (2 * size), 2, size)), swap)
        low, high = sem.split(halves)
        lows.append(low)
        highs.append(high)
    source, target = (highs, lows) if reverse else (lows, highs)
    carries = tuple(_edge(v, 0 if reverse else size - 1) for v in source)
    combined = combine(carries, tuple(target))
    if reverse:
        lows = combined
    else:
        highs = combined
    return tuple(sem.reshape(sem.permute(sem.join(low, high), swap), lead + (n,))
                 for low, high in zip(lows, highs))


def _edge(value: Any, index: int):
    """value[..., index], repeated along the last dim."""
    if value.type.shape[-1] == 1:
        return value
    edge = sem.expand_dims(sem.take_minor(value, index), len(value.type.shape) - 1)
    return sem.broadcast_to(edge, value.type.shape)


def jit_combine(combine_fn: Any, inputs: tuple, what: str) -> Combine:
    """`combine_fn` (a @jit function of 2k values returning k) as a Combine, its results
    checked against the inputs' types."""
    b = sem.builder()

    def apply(left: tuple, right: tuple) -> tuple:
        result = b.inline_function(combine_fn, [*left, *right], {})
        result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        if len(result) != len(left):
            raise b.error(f"{what}: combine_fn returned {len(result)} values for {len(left)} inputs",
                          suggestion="return one value per scanned input")
        checked = []
        for got, want in zip(result, left):
            if not ll_sem.is_value(got):
                got = ll_sem.to_value(got, want.type.element)
            if not sem.is_tensor(got):
                got = ll_sem.splat(got, want.type)
            if got.type.element != want.type.element:
                raise b.error(f"{what}: combine_fn returned {got.type.element} values for an input of "
                              f"{want.type.element}", suggestion=f"return {want.type.element} values "
                                                                 f"(.to(...) converts)")
            checked.append(got)
        return tuple(checked)

    return apply


def _promote_bf16(x: Any):
    return ll_sem.cast(x, fp32) if x.type.element == bf16 else x


def cumsum(x: Any, axis: Any = 0, reverse: bool = False, dtype: Optional[ScalarType] = None):
    """Inclusive prefix sums along `axis` (Triton's types: small ints accumulate in 32 bits,
    bf16 in fp32)."""
    if not sem.is_tensor(x):
        raise sem.builder().error(f"cumsum needs a tensor, found {sem.describe(x)}")
    x = _promote_bf16(x)
    x = ll_sem.cast(x, _sum_type(x.type.element, dtype))
    return scan((x,), axis, lambda a, b: (a[0] + b[0],), reverse, "cumsum")[0]


def cumprod(x: Any, axis: Any = 0, reverse: bool = False):
    """Inclusive prefix products along `axis` (bf16 multiplies in fp32)."""
    if not sem.is_tensor(x):
        raise sem.builder().error(f"cumprod needs a tensor, found {sem.describe(x)}")
    x = _promote_bf16(x)
    return scan((x,), axis, lambda a, b: (a[0] * b[0],), reverse, "cumprod")[0]
