"""The layouts users name in lowlevel kernels (Gluon's names and fields).

Each class is a frozen description, checked when built, whose `to_linear(shape)` gives
the `LinearLayout` a tensor (or shared buffer) of that shape has. Distributed layouts
map register/lane/warp/block to tensor coordinates; shared layouts map an element offset
(and block) to coordinates. Fields are tuples; lists given by users are converted.

    L = BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[8, 4],
                      warps_per_cta=[4, 1], order=[1, 0])
    L.to_linear([32, 64])        # what the kernel's tensors of that shape use
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence

from ..layouts import standard
from ..layouts import LayoutError, LinearLayout


def _tuple(value: Any, name: str, owner: str) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(_tuple(v, name, owner) if isinstance(v, (list, tuple)) else v for v in value)
    raise LayoutError(f"{owner}: {name} must be a list of ints, got {value!r}")


def _ints(value: Any, name: str, owner: str) -> tuple[int, ...]:
    items = _tuple(value, name, owner)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise LayoutError(f"{owner}: {name} must be a list of ints, got {list(items)}")
    return items


def _powers_of_two(value: tuple[int, ...], name: str, owner: str) -> None:
    for i, v in enumerate(value):
        if v < 1 or v & (v - 1):
            raise LayoutError(f"{owner}: {name}[{i}] = {v} is not a power of two ({name} {list(value)})")


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _check_rank(layout: "_Layout", shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != layout.rank:
        raise LayoutError(f"{layout} is a rank-{layout.rank} layout; the tensor has shape {list(shape)}")
    return shape


class _Layout:
    """Shared behaviour: readable str, and usable from kernels at compile time."""

    __weft_constexpr__ = True

    def __str__(self) -> str:
        args = ", ".join(f"{f.name}={_show(getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({args})"

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class DistributedLayout(_Layout):
    """A register layout: which thread holds which elements of a tensor."""

    rank: int

    def to_linear(self, shape: Sequence[int]) -> LinearLayout:
        raise NotImplementedError


class SharedLayout(_Layout):
    """A shared-memory layout: at which offset each element of a buffer is stored."""

    rank: int

    def to_linear(self, shape: Sequence[int]) -> LinearLayout:
        raise NotImplementedError


# ------------------------------------------------------------------ distributed layouts
@dataclass(frozen=True)
class BlockedLayout(DistributedLayout):
    """Each thread holds a `size_per_thread` box; lanes then warps tile boxes in `order`
    (minor dim first). Larger shapes repeat in registers, smaller ones wrap."""

    size_per_thread: tuple[int, ...]
    threads_per_warp: tuple[int, ...]
    warps_per_cta: tuple[int, ...]
    order: tuple[int, ...]

    def __post_init__(self):
        owner = "BlockedLayout"
        for f in fields(self):
            self._set(f.name, _ints(getattr(self, f.name), f.name, owner))
        rank = len(self.size_per_thread)
        for f in fields(self):
            if len(getattr(self, f.name)) != rank:
                raise LayoutError(
                    f"{owner}: {f.name} {list(getattr(self, f.name))} has "
                    f"{len(getattr(self, f.name))} entries, size_per_thread has {rank}")
        for name in ("size_per_thread", "threads_per_warp", "warps_per_cta"):
            _powers_of_two(getattr(self, name), name, owner)
        if math.prod(self.threads_per_warp) != 32:
            raise LayoutError(f"{owner}: threads_per_warp {list(self.threads_per_warp)} covers "
                              f"{math.prod(self.threads_per_warp)} lanes; a warp has 32")
        if sorted(self.order) != list(range(rank)):
            raise LayoutError(f"{owner}: order {list(self.order)} must list each of the "
                              f"{rank} dims once, minor dim first")

    @property
    def rank(self) -> int:
        return len(self.order)

    @property
    def num_warps(self) -> int:
        return math.prod(self.warps_per_cta)

    def to_linear(self, shape):
        return standard.blocked(_check_rank(self, shape), self.size_per_thread,
                                self.threads_per_warp, self.warps_per_cta, self.order)

    def permuted(self, order: Sequence[int]) -> "BlockedLayout":
        """The same thread arrangement for a tensor whose dim i is this layout's order[i]."""
        where = {old: new for new, old in enumerate(order)}
        return BlockedLayout([self.size_per_thread[d] for d in order],
                             [self.threads_per_warp[d] for d in order],
                             [self.warps_per_cta[d] for d in order],
                             [where[d] for d in self.order])


@dataclass(frozen=True)
class SliceLayout(DistributedLayout):
    """The parent layout with tensor dim `dim` removed: what a reduction along `dim`
    produces, and what `expand_dims(x, dim)` needs."""

    dim: int
    parent: DistributedLayout

    def __post_init__(self):
        if not isinstance(self.parent, DistributedLayout):
            raise LayoutError(f"SliceLayout: parent must be a distributed layout, got {self.parent!r}")
        if not isinstance(self.dim, int) or not 0 <= self.dim < self.parent.rank:
            raise LayoutError(f"SliceLayout: dim {self.dim!r} is not a dim of the rank-"
                              f"{self.parent.rank} parent {self.parent}")

    @property
    def rank(self) -> int:
        return self.parent.rank - 1

    def parent_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The parent shape the slice is taken from: size 1 along `dim` (any size gives the
        same slice for the standard layouts, which drop wrapped registers)."""
        shape = _check_rank(self, shape)
        fixed = getattr(self.parent, "shape", None)
        if fixed is not None:
            expected = fixed[:self.dim] + fixed[self.dim + 1:]
            if shape != expected:
                raise LayoutError(f"{self} covers shape {list(expected)}, not {list(shape)}")
            return fixed
        return shape[:self.dim] + (1,) + shape[self.dim:]

    def to_linear(self, shape):
        # slice_layout is the rule reductions use, so a reduction's result and a tensor
        # built in the same SliceLayout always agree.
        return standard.slice_layout(self.parent.to_linear(self.parent_shape(shape)), self.dim)

    def __str__(self) -> str:
        return f"SliceLayout(dim={self.dim}, parent={self.parent})"


@dataclass(frozen=True)
class NVMMADistributedLayout(DistributedLayout):
    """A tensor-core accumulator: version [3, 0] is the wgmma m64nNk16 layout (instr_shape
    [16, N, K]); version [2, 0] the mma.sync m16n8 layout (instr_shape [16, 8])."""

    version: tuple[int, ...]
    warps_per_cta: tuple[int, ...]
    instr_shape: tuple[int, ...]

    def __post_init__(self):
        owner = "NVMMADistributedLayout"
        for f in fields(self):
            self._set(f.name, _ints(getattr(self, f.name), f.name, owner))
        if not self.version or self.version[0] not in (2, 3):
            raise LayoutError(f"{owner}: version {list(self.version)} must be [3, 0] (wgmma) "
                              f"or [2, 0] (mma.sync)")
        _powers_of_two(self.warps_per_cta, "warps_per_cta", owner)
        if self.version[0] == 3 and (len(self.instr_shape) != 3 or self.instr_shape[0] != 16):
            raise LayoutError(f"{owner}: wgmma instr_shape {list(self.instr_shape)} must be "
                              f"[16, N, K] (one warp's rows, the wgmma n, the k)")
        if self.version[0] == 2 and tuple(self.instr_shape[:2]) != (16, 8):
            raise LayoutError(f"{owner}: mma.sync instr_shape {list(self.instr_shape)} must "
                              f"be [16, 8]")

    @property
    def rank(self) -> int:
        return len(self.warps_per_cta)

    @property
    def num_warps(self) -> int:
        return math.prod(self.warps_per_cta)

    def to_linear(self, shape):
        shape = _check_rank(self, shape)
        if self.version[0] == 3:
            return standard.wgmma_accumulator(shape, self.warps_per_cta, self.instr_shape[1])
        return standard.mma_v2(shape, self.warps_per_cta, self.instr_shape[:2])


@dataclass(frozen=True)
class DotOperandLayout(DistributedLayout):
    """Operand `operand_index` (0: A [M, K], 1: B [K, N]) of an MMA with layout `parent`
    held in registers, `k_width` consecutive K elements per thread."""

    operand_index: int
    parent: DistributedLayout
    k_width: int

    def __post_init__(self):
        owner = "DotOperandLayout"
        if self.operand_index not in (0, 1):
            raise LayoutError(f"{owner}: operand_index {self.operand_index!r} must be 0 (A) or 1 (B)")
        if not isinstance(self.parent, NVMMADistributedLayout):
            raise LayoutError(f"{owner}: parent must be an NVMMADistributedLayout, got {self.parent}")
        _powers_of_two((self.k_width,), "k_width", owner)

    @property
    def rank(self) -> int:
        return self.parent.rank

    def to_linear(self, shape):
        return standard.dot_operand(_check_rank(self, shape), self.parent.warps_per_cta,
                                    self.operand_index, self.k_width, self.parent.version[0])


@dataclass(frozen=True)
class LinearDistributedLayout(DistributedLayout):
    """Any distributed layout, given by its bases for one fixed `shape`."""

    reg_bases: tuple[tuple[int, ...], ...]
    lane_bases: tuple[tuple[int, ...], ...]
    warp_bases: tuple[tuple[int, ...], ...]
    block_bases: tuple[tuple[int, ...], ...]
    shape: tuple[int, ...]

    def __post_init__(self):
        owner = "LinearDistributedLayout"
        for f in fields(self):
            self._set(f.name, _tuple(getattr(self, f.name), f.name, owner))
        if len(self.lane_bases) != 5:
            raise LayoutError(f"{owner}: lane_bases has {len(self.lane_bases)} bases; a warp's "
                              f"32 lanes need exactly 5")
        self.linear  # builds and checks the LinearLayout

    @property
    def linear(self) -> LinearLayout:
        return LinearLayout(
            {"register": self.reg_bases, "lane": self.lane_bases, "warp": self.warp_bases,
             "block": self.block_bases},
            [(f"dim{i}", s) for i, s in enumerate(self.shape)])

    @classmethod
    def from_linear(cls, layout: LinearLayout) -> "LinearDistributedLayout":
        bases = layout.transpose_outs([f"dim{i}" for i in range(len(layout.out_dims))]).bases
        shape = tuple(layout.out_dims[f"dim{i}"] for i in range(len(layout.out_dims)))
        return cls(bases.get("register", ()), bases.get("lane", ()), bases.get("warp", ()),
                   bases.get("block", ()), shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def to_linear(self, shape):
        if tuple(shape) != self.shape:
            raise LayoutError(f"{self} describes shape {list(self.shape)}, not {list(shape)}")
        return self.linear


# ----------------------------------------------------------------------- shared layouts
def _with_buffers(inner: LinearLayout, shape: tuple[int, ...], rank: int) -> LinearLayout:
    """`inner` (for the last `rank` dims) repeated over the leading dims, outermost in
    memory: buffer i of a multi-buffered allocation starts at i * (inner size).

    A leading dim that is not a power of two (3 pipeline stages) is laid out as the next
    power of two; the buffers past the shape are never addressed or allocated.
    """
    lead = len(shape) - rank
    if lead == 0:
        return inner
    padded = [1 << (s - 1).bit_length() if s > 0 else 0 for s in shape[:lead]]
    _powers_of_two(tuple(padded), "shape", "shared layout")
    bases = [tuple([0] * lead + list(b)) for b in inner.bases["offset"]]
    for d in reversed(range(lead)):
        bases += [tuple((1 << bit) if i == d else 0 for i in range(len(shape)))
                  for bit in range(padded[d].bit_length() - 1)]
    sizes = padded + list(shape[lead:])
    return LinearLayout({"offset": bases, "block": inner.bases.get("block", ())},
                        [(f"dim{i}", s) for i, s in enumerate(sizes)])


def _check_shared_rank(layout: "SharedLayout", shape: Sequence[int]) -> tuple[int, ...]:
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
        self._set("order", _ints(self.order, "order", owner))
        _powers_of_two((self.vec, self.per_phase, self.max_phase), "vec/per_phase/max_phase", owner)
        if sorted(self.order) != list(range(len(self.order))):
            raise LayoutError(f"{owner}: order {list(self.order)} is not a permutation")

    @property
    def rank(self) -> int:
        return len(self.order)

    def to_linear(self, shape):
        shape = _check_shared_rank(self, shape)
        inner = standard.swizzled_shared(shape[len(shape) - self.rank:], self.vec,
                                         self.per_phase, self.max_phase, self.order)
        return _with_buffers(inner, shape, self.rank)


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
        shape = _check_shared_rank(self, shape)
        if self.rank == 1:
            return _with_buffers(standard.swizzled_shared(shape[-1:], 1, 1, 1, (0,)), shape, 1)
        inner = standard.nvmma_shared(shape[len(shape) - self.rank:], self.swizzle_byte_width,
                                      self.element_bitwidth, self.transposed)
        return _with_buffers(inner, shape, self.rank)


@dataclass(frozen=True)
class MBarrierLayout(SharedLayout):
    """The layout of mbarrier buffers: one i64 [1], or [n, 1] for n barriers stored one
    after another (`bars.index(i)`)."""

    rank: int = 1

    def to_linear(self, shape):
        shape = _check_shared_rank(self, shape)
        if shape[-1] != 1:
            raise LayoutError(f"an mbarrier buffer has shape [1] or [n, 1], not {list(shape)}")
        inner = standard.swizzled_shared(shape[-1:], 1, 1, 1, (0,))
        return _with_buffers(inner, shape, 1)


@dataclass(frozen=True)
class LinearSharedLayout(SharedLayout):
    """Any shared layout, given by its offset (and block) bases for one fixed `shape`."""

    offset_bases: tuple[tuple[int, ...], ...]
    block_bases: tuple[tuple[int, ...], ...]
    shape: tuple[int, ...]

    def __post_init__(self):
        owner = "LinearSharedLayout"
        for f in fields(self):
            self._set(f.name, _tuple(getattr(self, f.name), f.name, owner))
        self.linear

    @property
    def linear(self) -> LinearLayout:
        return LinearLayout({"offset": self.offset_bases, "block": self.block_bases},
                            [(f"dim{i}", s) for i, s in enumerate(self.shape)])

    @classmethod
    def from_linear(cls, layout: LinearLayout) -> "LinearSharedLayout":
        bases = layout.transpose_outs([f"dim{i}" for i in range(len(layout.out_dims))]).bases
        shape = tuple(layout.out_dims[f"dim{i}"] for i in range(len(layout.out_dims)))
        return cls(bases.get("offset", ()), bases.get("block", ()), shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def to_linear(self, shape):
        if tuple(shape) != self.shape:
            raise LayoutError(f"{self} describes shape {list(self.shape)}, not {list(shape)}")
        return self.linear


def as_distributed(layout: Any, what: str = "layout") -> DistributedLayout:
    """A distributed layout description from what users may pass: a layout class, or a
    LinearLayout (e.g. `x.type.layout`), which becomes a LinearDistributedLayout."""
    if isinstance(layout, DistributedLayout):
        return layout
    if isinstance(layout, LinearLayout) and "lane" in layout.in_dims:
        return LinearDistributedLayout.from_linear(layout)
    raise LayoutError(f"{what} must be a distributed layout (BlockedLayout, SliceLayout, "
                      f"NVMMADistributedLayout, ...), got {_describe(layout)}")


def as_shared(layout: Any, what: str = "layout") -> SharedLayout:
    if isinstance(layout, SharedLayout):
        return layout
    if isinstance(layout, LinearLayout) and "offset" in layout.in_dims:
        return LinearSharedLayout.from_linear(layout)
    raise LayoutError(f"{what} must be a shared layout (NVMMASharedLayout, "
                      f"SwizzledSharedLayout, LinearSharedLayout), got {_describe(layout)}")


def _describe(value: Any) -> str:
    return str(value) if isinstance(value, _Layout) else repr(value)


def describe(encoding: Optional[Any], layout: Optional[LinearLayout] = None) -> str:
    """A layout in words for messages: the user's description when known."""
    if encoding is not None:
        return str(encoding)
    if layout is not None:
        return str(LinearDistributedLayout.from_linear(layout)) if "lane" in layout.in_dims \
            else str(LinearSharedLayout.from_linear(layout))
    return "no layout"
