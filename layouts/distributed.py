"""The distributed layouts kernels name (Gluon's names and fields): which thread holds
which elements of a tensor.

    L = BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[8, 4],
                      warps_per_cta=[4, 1], order=[1, 0])
    L.to_linear([32, 64])        # what the kernel's tensors of that shape use
    L.reduced(1)                 # SliceLayout(1, L): what a reduction along dim 1 gives

What the shape ops do to a description is a method of it (`reduced`, `expanded`,
`permuted`), so the language ops and the compiler's layout inference name a result's
layout by the same rule; the linear layouts themselves follow rules.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Optional, Sequence

from . import standard
from .description import GivenByBases, LayoutDescription, as_ints, check_powers_of_two, check_rank, shown
from .errors import LayoutError
from .linear_layout import LinearLayout


class DistributedLayout(LayoutDescription):
    """A register layout: which thread holds which elements of a tensor."""

    def reduced(self, axis: int) -> "SliceLayout":
        """The layout of a reduction's result along `axis` (and the layout expand_dims at
        `axis` takes back to this one)."""
        return SliceLayout(axis, self)

    def expanded(self, axis: int) -> Optional["DistributedLayout"]:
        """The layout of expand_dims at `axis`: the parent of SliceLayout(axis, parent);
        None for any other layout (expand_dims needs the slice)."""
        return None

    def permuted(self, order: Sequence[int]) -> Optional["DistributedLayout"]:
        """The same arrangement of threads for a tensor whose dim i is this one's order[i],
        when this kind of layout can say so; else None (a LinearDistributedLayout can)."""
        return None


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
            self._set(f.name, as_ints(getattr(self, f.name), f.name, owner))
        rank = len(self.size_per_thread)
        for f in fields(self):
            if len(getattr(self, f.name)) != rank:
                raise LayoutError(
                    f"{owner}: {f.name} {list(getattr(self, f.name))} has "
                    f"{len(getattr(self, f.name))} entries, size_per_thread has {rank}")
        for name in ("size_per_thread", "threads_per_warp", "warps_per_cta"):
            check_powers_of_two(getattr(self, name), name, owner)
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
        return standard.blocked(check_rank(self, shape), self.size_per_thread,
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
        shape = check_rank(self, shape)
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

    def expanded(self, axis: int) -> Optional[DistributedLayout]:
        return self.parent if axis == self.dim else None

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
            self._set(f.name, as_ints(getattr(self, f.name), f.name, owner))
        if not self.version or self.version[0] not in (2, 3):
            raise LayoutError(f"{owner}: version {list(self.version)} must be [3, 0] (wgmma) "
                              f"or [2, 0] (mma.sync)")
        check_powers_of_two(self.warps_per_cta, "warps_per_cta", owner)
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
        shape = check_rank(self, shape)
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
        check_powers_of_two((self.k_width,), "k_width", owner)

    @property
    def rank(self) -> int:
        return self.parent.rank

    def to_linear(self, shape):
        return standard.dot_operand(check_rank(self, shape), self.parent.warps_per_cta,
                                    self.operand_index, self.k_width, self.parent.version[0])


@dataclass(frozen=True)
class LinearDistributedLayout(GivenByBases, DistributedLayout):
    """Any distributed layout, given by its bases for one fixed `shape`."""

    BASES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("register", "reg_bases"), ("lane", "lane_bases"), ("warp", "warp_bases"), ("block", "block_bases"))
    reg_bases: tuple[tuple[int, ...], ...]
    lane_bases: tuple[tuple[int, ...], ...]
    warp_bases: tuple[tuple[int, ...], ...]
    block_bases: tuple[tuple[int, ...], ...]
    shape: tuple[int, ...]

    def check_bases(self) -> None:
        if len(self.lane_bases) != 5:
            raise LayoutError(f"LinearDistributedLayout: lane_bases has {len(self.lane_bases)} bases; "
                              f"a warp's 32 lanes need exactly 5")


def as_distributed(layout: Any, what: str = "layout") -> DistributedLayout:
    """A distributed layout description from what users may pass: a layout class, or a
    LinearLayout (e.g. `x.type.layout`), which becomes a LinearDistributedLayout."""
    if isinstance(layout, DistributedLayout):
        return layout
    if isinstance(layout, LinearLayout) and "lane" in layout.in_dims:
        return LinearDistributedLayout.from_linear(layout)
    raise LayoutError(f"{what} must be a distributed layout (BlockedLayout, SliceLayout, "
                      f"NVMMADistributedLayout, ...), got {shown(layout)}")
