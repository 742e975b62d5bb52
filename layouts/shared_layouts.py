"""The shared-memory layouts kernels name (Gluon's names and fields): at which offset
each element of a buffer is stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

from . import standard
from .description import GivenByBases, LayoutDescription, as_ints, check_powers_of_two, shown
from .distributed import LinearDistributedLayout
from .errors import LayoutError
from .linear_layout import LinearLayout


class SharedLayout(LayoutDescription):
    """A shared-memory layout: at which offset each element of a buffer is stored."""


def with_buffers(inner: LinearLayout, shape: tuple[int, ...], rank: int) -> LinearLayout:
    """`inner` (for the last `rank` dims) repeated over the leading dims, outermost in
    memory: buffer i of a multi-buffered allocation starts at i * (inner size).

    A leading dim that is not a power of two (3 pipeline stages) is laid out as the next
    power of two; the buffers past the shape are never addressed or allocated.
    """
    lead = len(shape) - rank
    if lead == 0:
        return inner
    padded = [1 << (s - 1).bit_length() if s > 0 else 0 for s in shape[:lead]]
    check_powers_of_two(tuple(padded), "shape", "shared layout")
    bases = [tuple([0] * lead + list(b)) for b in inner.bases["offset"]]
    for d in reversed(range(lead)):
        bases += [tuple((1 << bit) if i == d else 0 for i in range(len(shape)))
                  for bit in range(padded[d].bit_length() - 1)]
    sizes = padded + list(shape[lead:])
    return LinearLayout({"offset": bases, "block": inner.bases.get("block", ())},
                        [(f"dim{i}", s) for i, s in enumerate(sizes)])


def check_shared_rank(layout: "SharedLayout", shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) < layout.rank:
        raise LayoutError(f"{layout} is a rank-{layout.rank} layout; the buffer has shape "
                          f"{list(shape)}")
    return shape


@dataclass(frozen=True)
class SwizzledSharedLayout(SharedLayout):
    """Generic XOR swizzle: column c of row r moves to c XOR (vec * ((r / per_phase) %
    max_phase)); dims stored in `order` (minor first)."""

    vec: int
    per_phase: int
    max_phase: int
    order: tuple[int, ...]

    def __post_init__(self):
        owner = "SwizzledSharedLayout"
        self._set("order", as_ints(self.order, "order", owner))
        check_powers_of_two((self.vec, self.per_phase, self.max_phase), "vec/per_phase/max_phase", owner)
        if sorted(self.order) != list(range(len(self.order))):
            raise LayoutError(f"{owner}: order {list(self.order)} is not a permutation")

    @property
    def rank(self) -> int:
        return len(self.order)

    def to_linear(self, shape):
        shape = check_shared_rank(self, shape)
        inner = standard.swizzled_shared(shape[len(shape) - self.rank:], self.vec,
                                         self.per_phase, self.max_phase, self.order)
        return with_buffers(inner, shape, self.rank)


@dataclass(frozen=True)
class NVMMASharedLayout(SharedLayout):
    """The wgmma/TMA swizzled layout (`swizzle_byte_width` 0, 32, 64 or 128) for elements
    of `element_bitwidth` bits; leading dims beyond `rank` are separate buffers."""

    swizzle_byte_width: int
    element_bitwidth: int
    rank: int = 2
    transposed: bool = False

    def __post_init__(self):
        owner = "NVMMASharedLayout"
        if self.swizzle_byte_width not in (0, 32, 64, 128):
            raise LayoutError(f"{owner}: swizzle_byte_width {self.swizzle_byte_width!r} must "
                              f"be 0, 32, 64 or 128")
        if self.element_bitwidth not in (8, 16, 32, 64):
            raise LayoutError(f"{owner}: element_bitwidth {self.element_bitwidth!r} must be "
                              f"8, 16, 32 or 64")
        if not isinstance(self.rank, int) or self.rank < 1:
            raise LayoutError(f"{owner}: rank {self.rank!r} must be at least 1")
        if self.rank == 1 and (self.swizzle_byte_width or self.transposed):
            raise LayoutError(f"{owner}: a rank-1 layout has no rows to swizzle or transpose; "
                              f"use swizzle_byte_width=0, transposed=False")

    @staticmethod
    def get_default_for(shape: Sequence[int], element_bitwidth: Any,
                        transposed: bool = False) -> "NVMMASharedLayout":
        """The widest swizzle that fits rows of `shape` (Gluon's get_default_for);
        `element_bitwidth` in bits, or the element type (ll.float16) as Gluon passes it."""
        element_bitwidth = getattr(element_bitwidth, "bits", element_bitwidth)
        if len(shape) == 1:  # a row on its own: contiguous, as a rank-1 TMA box lands
            return NVMMASharedLayout(0, element_bitwidth, 1)
        swizzle = standard.default_nvmma_swizzle(shape, element_bitwidth, transposed)
        return NVMMASharedLayout(swizzle, element_bitwidth, len(shape), transposed)

    def to_linear(self, shape):
        shape = check_shared_rank(self, shape)
        if self.rank == 1:
            return with_buffers(standard.swizzled_shared(shape[-1:], 1, 1, 1, (0,)), shape, 1)
        inner = standard.nvmma_shared(shape[len(shape) - self.rank:], self.swizzle_byte_width,
                                      self.element_bitwidth, self.transposed)
        return with_buffers(inner, shape, self.rank)


@dataclass(frozen=True)
class MBarrierLayout(SharedLayout):
    """The layout of mbarrier buffers: one i64 [1], or [n, 1] for n barriers stored one
    after another (`bars.index(i)`)."""

    rank: int = 1

    def to_linear(self, shape):
        shape = check_shared_rank(self, shape)
        if shape[-1] != 1:
            raise LayoutError(f"an mbarrier buffer has shape [1] or [n, 1], not {list(shape)}")
        inner = standard.swizzled_shared(shape[-1:], 1, 1, 1, (0,))
        return with_buffers(inner, shape, 1)


@dataclass(frozen=True)
class LinearSharedLayout(GivenByBases, SharedLayout):
    """Any shared layout, given by its offset (and block) bases for one fixed `shape`."""

    BASES: ClassVar[tuple[tuple[str, str], ...]] = (("offset", "offset_bases"), ("block", "block_bases"))
    offset_bases: tuple[tuple[int, ...], ...]
    block_bases: tuple[tuple[int, ...], ...]
    shape: tuple[int, ...]


def as_shared(layout: Any, what: str = "layout") -> SharedLayout:
    if isinstance(layout, SharedLayout):
        return layout
    if isinstance(layout, LinearLayout) and "offset" in layout.in_dims:
        return LinearSharedLayout.from_linear(layout)
    raise LayoutError(f"{what} must be a shared layout (NVMMASharedLayout, "
                      f"SwizzledSharedLayout, LinearSharedLayout), got {shown(layout)}")


def describe(encoding: Optional[Any], layout: Optional[LinearLayout] = None) -> str:
    """A layout in words for messages: the user's description when known."""
    if encoding is not None:
        return str(encoding)
    if layout is not None:
        return str(LinearDistributedLayout.from_linear(layout)) if "lane" in layout.in_dims \
            else str(LinearSharedLayout.from_linear(layout))
    return "no layout"
