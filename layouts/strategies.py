"""Hypothesis strategies that draw only valid layouts, for property tests of layout code.

Every strategy here returns layouts that satisfy the conventions of `weft.layouts`:
distributed layouts map in-dims `register`, `lane` (always 32), `warp` and `block` onto
out-dims `dim0`, `dim1`, ... and cover the whole tensor (surjective); shared layouts map
`offset` (in elements) and `block` onto the tensor one-to-one (invertible). Shapes are
tuples of powers of two. Shrinking goes towards small, plain layouts (few registers, no
broadcast, no XOR mixing), so a failing example is readable.

Use them in your own tests (hypothesis is a test extra, so this module is not imported by
`weft.layouts` itself)::

    import numpy as np
    from hypothesis import given
    from weft.layouts import collect, distribute, execute_plan, plan_conversion
    from weft.layouts.strategies import distributed_layouts

    @given(distributed_layouts(shape=(64, 64), num_warps=4),
           distributed_layouts(shape=(64, 64), num_warps=4))
    def test_conversion_moves_every_element(src, dst):
        x = np.arange(64 * 64).reshape(64, 64)
        plan = plan_conversion(src, dst, element_bits=16)
        registers = execute_plan(plan, distribute(x, src), src, dst)
        assert (collect(registers, dst) == x).all()

The building blocks: `shapes(rank, max_elements)`, `distributed_layouts(...)` (random
bit assignments, optionally XOR-mixed and with broadcast bases), `blocked_layouts(shape,
num_warps)` (through `blocked` with random parameters), `shared_layouts(shape,
element_bits)` (random bijections, `swizzled_shared`, `nvmma_shared`), and
`linear_layouts(in_dims, out_dims)` (any matrix at all, for algebra laws).
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Mapping, Optional, Sequence

from hypothesis import strategies as st

from .errors import LayoutError
from .linear_layout import LinearLayout
from .standard import blocked, nvmma_shared, swizzled_shared

LANES = 32
LANE_BITS = 5
MAX_EXTRA_REGISTER_BITS = 2

__all__ = [
    "blocked_layouts",
    "distributed_layouts",
    "linear_layouts",
    "shapes",
    "shared_layouts",
]


def _check_power_of_two(value: int, what: str) -> int:
    if not isinstance(value, int) or value < 1 or value & (value - 1):
        raise LayoutError(f"{what} must be a power of two, got {value!r}")
    return value.bit_length() - 1


def _check_shape(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    if not shape:
        raise LayoutError("shape must have at least one dim")
    for axis, size in enumerate(shape):
        _check_power_of_two(size, f"shape[{axis}] (dim{axis})")
    return shape


def _out_dims(shape: Sequence[int]) -> dict[str, int]:
    return {f"dim{axis}": size for axis, size in enumerate(shape)}


def _unit_bits(shape: Sequence[int]) -> list[tuple[int, ...]]:
    """The basis of each tensor bit: (dim0 bit 0, dim0 bit 1, ..., dim1 bit 0, ...)."""
    units = []
    for axis, size in enumerate(shape):
        for bit in range(size.bit_length() - 1):
            units.append(tuple((1 << bit) if a == axis else 0 for a in range(len(shape))))
    return units


def _xor(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(x ^ y for x, y in zip(a, b))


# --------------------------------------------------------------------------- shapes
def shapes(rank: Optional[int] = 2, max_elements: int = 1 << 12, min_elements: int = 1):
    """Tuples of `rank` powers of two whose product lies in [min_elements, max_elements].

    With `rank=None` the rank is drawn from 1..3 as well.
    """
    max_bits = _check_power_of_two(max_elements, "max_elements")
    min_bits = _check_power_of_two(min_elements, "min_elements")
    if min_bits > max_bits:
        raise LayoutError(f"min_elements {min_elements} exceeds max_elements {max_elements}")
    if rank is not None and rank < 1:
        raise LayoutError(f"rank must be at least 1, got {rank}")

    @st.composite
    def draw_shape(draw):
        r = rank if rank is not None else draw(st.integers(1, 3))
        total = draw(st.integers(min_bits, max_bits))
        # Deal the bits out one by one to random dims: every split is reachable.
        bits = [0] * r
        for _ in range(total):
            bits[draw(st.integers(0, r - 1))] += 1
        return tuple(1 << b for b in bits)

    return draw_shape()


# --------------------------------------------------------------- generic matrices
def linear_layouts(in_dims: Mapping[str, int], out_dims: Mapping[str, int]):
    """Any linear layout between the given dims: arbitrary bases, no validity beyond range.

    This is the strategy for algebra laws (composition, inversion, ...), which must hold
    for every matrix, not only for the layouts hardware uses. Bases are biased towards
    unit vectors and zeros so that permutations and broadcasts show up often.
    """
    for name, size in {**in_dims, **out_dims}.items():
        _check_power_of_two(size, f"size of dim {name!r}")
    out_items = tuple(out_dims.items())
    units = _unit_bits([size for _, size in out_items])
    coordinate = st.tuples(*(st.integers(0, size - 1) for _, size in out_items))
    zero = tuple(0 for _ in out_items)
    basis = st.one_of(st.just(zero), st.sampled_from(units), coordinate) if units else st.just(zero)

    @st.composite
    def draw_layout(draw):
        bases = {}
        for name, size in in_dims.items():
            bases[name] = [draw(basis) for _ in range(size.bit_length() - 1)]
        return LinearLayout(bases, out_items)

    return draw_layout()


@st.composite
def _mixing(draw, units: list[tuple[int, ...]]):
    """A random invertible map of the tensor bits, as the image of each unit bit.

    A product of elementary operations `bit i ^= bit j`, so it is always invertible; zero
    operations (the shrink target) leave the plain bit placement.
    """
    images = list(units)
    if len(units) < 2:
        return images
    for _ in range(draw(st.integers(0, 2 * len(units)))):
        i, j = draw(st.integers(0, len(units) - 1)), draw(st.integers(0, len(units) - 1))
        if i != j:
            images[i] = _xor(images[i], images[j])
    return images


@st.composite
def _dense_mixing(draw, units: list[tuple[int, ...]]):
    """A random invertible map of the tensor bits in which any bit may mix with any other:
    a product of a random lower and a random upper unit-triangular matrix (all-False draws,
    the shrink target, leave the plain bit placement). Elementary mixing rarely makes three
    images with dependent projections, such as (1, 1), (2, 2), (0, 3) sliced along dim0."""
    n = len(units)
    images = list(units)
    for lower in (True, False):
        mixed = []
        for i in range(n):
            image = images[i]
            for j in (range(i) if lower else range(i + 1, n)):
                if draw(st.booleans()):
                    image = _xor(image, images[j])
            mixed.append(image)
        images = mixed
    return images


# ------------------------------------------------------------ distributed layouts
def distributed_layouts(
    shape: Optional[Sequence[int]] = None,
    num_warps: Optional[int] = None,
    rank: Optional[int] = None,
    allow_broadcast: bool = True,
    max_elements: int = 1 << 12,
    dense_mixing: bool = False,
):
    """Random surjective layouts register x lane x warp x block -> dim0 x dim1 x ...

    Lanes are always 32; `num_warps` (a power of two) is drawn from 1..8 when not given,
    and `shape` from `shapes(rank, max_elements)`. Each tensor bit is given to a distinct
    hardware bit (a random assignment, optionally XOR-mixed); the remaining hardware bits
    are broadcasts: zero bases, duplicates, or combinations of other bits. With
    `allow_broadcast=False` there are no such bits and the layout is invertible, which
    needs at least 32 * num_warps elements. With `dense_mixing=True` the XOR mixing, when
    drawn, may combine any tensor bits with any others (`_dense_mixing`) instead of a few,
    and a broadcast register may repeat a combination of the thread's other registers.
    """
    if shape is not None:
        shape = _check_shape(shape)
        if rank is not None and rank != len(shape):
            raise LayoutError(f"rank {rank} disagrees with shape {shape}")
    if num_warps is not None:
        _check_power_of_two(num_warps, "num_warps")
    if shape is not None and not allow_broadcast:
        shape_bits = sum(s.bit_length() - 1 for s in shape)
        warp_bits = 0 if num_warps is None else num_warps.bit_length() - 1
        if shape_bits < LANE_BITS + warp_bits:
            raise LayoutError(
                f"shape {shape} has {1 << shape_bits} elements, fewer than the "
                f"{LANES << warp_bits} threads, so every layout of it broadcasts; "
                f"pass allow_broadcast=True or a larger shape"
            )

    @st.composite
    def draw_layout(draw):
        warp_bits = None if num_warps is None else num_warps.bit_length() - 1
        if shape is not None:
            the_shape = shape
        else:
            min_bits = LANE_BITS + (warp_bits or 0) if not allow_broadcast else 0
            max_bits = max(max_elements.bit_length() - 1, min_bits)
            the_shape = draw(shapes(rank, 1 << max_bits, 1 << min_bits))
        shape_bits = sum(s.bit_length() - 1 for s in the_shape)
        if warp_bits is None:
            limit = 3 if allow_broadcast else max(0, min(3, shape_bits - LANE_BITS))
            warp_bits = draw(st.integers(0, limit))
        hardware_bits = LANE_BITS + warp_bits
        register_bits = max(0, shape_bits - hardware_bits)
        if allow_broadcast:
            register_bits += draw(st.integers(0, MAX_EXTRA_REGISTER_BITS))
        total_bits = register_bits + hardware_bits

        units = _unit_bits(the_shape)
        mixing = _dense_mixing if dense_mixing else _mixing
        images = draw(mixing(units)) if draw(st.booleans()) else units
        zero = tuple(0 for _ in the_shape)
        # Which hardware bit carries which tensor bit: a random injection.
        slots = draw(st.permutations(range(total_bits)))[: len(images)]
        bases: list = [None] * total_bits
        for image, slot in zip(images, slots):
            bases[slot] = image
        held = [b for b in bases[:register_bits] if b is not None]
        for slot in range(total_bits):
            if bases[slot] is None:
                # A register may also repeat a combination of the thread's other registers
                # (an element it holds twice, whose slice is in the span of theirs).
                options = [_broadcast_basis(images, zero)]
                if slot < register_bits and dense_mixing and len(held) >= 2:
                    options.append(_broadcast_basis(held, zero))
                bases[slot] = draw(st.one_of(*options))
        layout_bases = {
            "register": bases[:register_bits],
            "lane": bases[register_bits : register_bits + LANE_BITS],
            "warp": bases[register_bits + LANE_BITS :],
            "block": [],
        }
        return LinearLayout(layout_bases, _out_dims(the_shape))

    return draw_layout()


def _broadcast_basis(images: list[tuple[int, ...]], zero: tuple[int, ...]):
    """A basis for a hardware bit that holds no new tensor bit."""
    if not images:
        return st.just(zero)
    combination = st.lists(st.sampled_from(images), min_size=2, max_size=3).map(
        lambda picked: _combine(picked, zero)
    )
    return st.one_of(st.just(zero), st.sampled_from(images), combination)


def _combine(picked: list[tuple[int, ...]], zero: tuple[int, ...]) -> tuple[int, ...]:
    result = zero
    for image in picked:
        result = _xor(result, image)
    return result


# ---------------------------------------------------------------- blocked layouts
def _split_bits(draw, total: int, limits: Sequence[int]) -> list[int]:
    """Deal `total` bits to dims, each dim taking at most its limit (when possible)."""
    bits = [0] * len(limits)
    for _ in range(total):
        open_dims = [d for d in range(len(limits)) if bits[d] < limits[d]]
        choices = open_dims or list(range(len(limits)))
        bits[draw(st.sampled_from(choices))] += 1
    return bits


def blocked_layouts(shape: Sequence[int], num_warps: int):
    """`blocked(shape, size_per_thread, threads_per_warp, warps_per_cta, order)` with random
    valid parameters: 32 threads per warp, `num_warps` warps, any order and per-thread tile.

    Threads and warps go to dims with room left first, so the CTA tile covers the shape
    whenever the shape has enough elements; otherwise the layout wraps (broadcasts), as
    `blocked` defines for small tensors.
    """
    shape = _check_shape(shape)
    warp_bits = _check_power_of_two(num_warps, "num_warps")
    dim_bits = [s.bit_length() - 1 for s in shape]

    @st.composite
    def draw_layout(draw):
        order = tuple(draw(st.permutations(range(len(shape)))))
        free = sum(dim_bits)
        per_thread_total = draw(st.integers(0, max(0, min(4, free - LANE_BITS - warp_bits))))
        per_thread = _split_bits(draw, per_thread_total, dim_bits)
        room = [max(0, d - p) for d, p in zip(dim_bits, per_thread)]
        threads = _split_bits(draw, LANE_BITS, room)
        room = [max(0, r - t) for r, t in zip(room, threads)]
        warps = _split_bits(draw, warp_bits, room)
        return blocked(
            list(shape),
            [1 << b for b in per_thread],
            [1 << b for b in threads],
            [1 << b for b in warps],
            list(order),
        )

    return draw_layout()


# ----------------------------------------------------------------- shared layouts
def shared_layouts(shape: Sequence[int], element_bits: int = 16):
    """Invertible `offset` x `block` -> dims layouts of `shape`: random bijections (any
    bit permutation, optionally XOR-mixed like a swizzle), and every `swizzled_shared`
    and `nvmma_shared` configuration that this shape and element size allow.
    """
    shape = _check_shape(shape)
    if element_bits not in (8, 16, 32, 64):
        raise LayoutError(f"element_bits must be 8, 16, 32 or 64, got {element_bits!r}")
    named = _named_shared_layouts(shape, element_bits)
    random = _random_shared_layouts(shape)
    return st.one_of(random, st.sampled_from(named)) if named else random


def _random_shared_layouts(shape: tuple[int, ...]):
    @st.composite
    def draw_layout(draw):
        units = _unit_bits(shape)
        images = draw(_mixing(units)) if draw(st.booleans()) else units
        order = draw(st.permutations(range(len(images))))
        return LinearLayout(
            {"offset": [images[i] for i in order], "block": []}, _out_dims(shape)
        )

    return draw_layout()


@lru_cache(maxsize=64)
def _named_shared_layouts(shape: tuple[int, ...], element_bits: int) -> tuple[LinearLayout, ...]:
    """All standard shared layouts the constructors accept for this shape (deduplicated)."""
    found: dict[LinearLayout, None] = {}

    def attempt(make):
        try:
            layout = make()
        except LayoutError:
            return
        if layout.is_invertible():
            found.setdefault(layout)

    if len(shape) >= 2:
        for swizzle, transposed in itertools.product((0, 32, 64, 128), (False, True)):
            attempt(lambda: nvmma_shared(list(shape), swizzle, element_bits, transposed))
    powers = [1 << b for b in range(0, 4)]
    for order in itertools.permutations(range(len(shape))):
        for vec, per_phase, max_phase in itertools.product(
            [v for v in (1, 2, 4, 8) if v <= max(shape)], powers, powers
        ):
            attempt(lambda: swizzled_shared(list(shape), vec, per_phase, max_phase, list(order)))
    return tuple(found)
