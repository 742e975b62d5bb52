"""What every layout description shares: checked fields and a readable str.

A layout description is a frozen value a kernel writes (`BlockedLayout(...)`,
`NVMMASharedLayout(...)`), checked when built, whose `to_linear(shape)` gives the
`LinearLayout` a tensor (or shared buffer) of that shape has. Distributed layouts
(distributed.py) map register/lane/warp/block to tensor coordinates; shared layouts
(shared_layouts.py) map an element offset (and block) to coordinates. Fields are tuples;
lists given by users are converted.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar, Sequence

from .errors import LayoutError
from .linear_layout import LinearLayout


def as_tuple(value: Any, name: str, owner: str) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(as_tuple(v, name, owner) if isinstance(v, (list, tuple)) else v for v in value)
    raise LayoutError(f"{owner}: {name} must be a list of ints, got {value!r}")


def as_ints(value: Any, name: str, owner: str) -> tuple[int, ...]:
    items = as_tuple(value, name, owner)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise LayoutError(f"{owner}: {name} must be a list of ints, got {list(items)}")
    return items


def check_powers_of_two(value: tuple[int, ...], name: str, owner: str) -> None:
    for i, v in enumerate(value):
        if v < 1 or v & (v - 1):
            raise LayoutError(f"{owner}: {name}[{i}] = {v} is not a power of two ({name} {list(value)})")


def show_field(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(show_field(v) for v in value) + "]"
    return str(value)


def check_rank(layout: "LayoutDescription", shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != layout.rank:
        raise LayoutError(f"{layout} is a rank-{layout.rank} layout; the tensor has shape {list(shape)}")
    return shape


class LayoutDescription:
    """Shared behaviour: readable str, and usable from kernels at compile time."""

    __weft_constexpr__ = True
    rank: int

    def to_linear(self, shape: Sequence[int]) -> LinearLayout:
        raise NotImplementedError

    def __str__(self) -> str:
        args = ", ".join(f"{f.name}={show_field(getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({args})"

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class GivenByBases(LayoutDescription):
    """A layout given by the bases of its LinearLayout for one fixed `shape`
    (LinearDistributedLayout, LinearSharedLayout): `BASES` pairs each input dim of the
    LinearLayout, in order, with the field that holds its bases (the fields come in the
    same order, then `shape`)."""

    BASES: ClassVar[tuple[tuple[str, str], ...]]
    shape: tuple[int, ...]

    def __post_init__(self):
        owner = type(self).__name__
        for f in fields(self):
            self._set(f.name, as_tuple(getattr(self, f.name), f.name, owner))
        self.check_bases()
        self.linear  # builds and checks the LinearLayout

    def check_bases(self) -> None:
        """What the kind of layout asks of its bases beyond being a LinearLayout."""

    @property
    def linear(self) -> LinearLayout:
        return LinearLayout({dim: getattr(self, field) for dim, field in self.BASES},
                            [(f"dim{i}", s) for i, s in enumerate(self.shape)])

    @classmethod
    def from_linear(cls, layout: LinearLayout) -> "GivenByBases":
        bases = layout.transpose_outs([f"dim{i}" for i in range(len(layout.out_dims))]).bases
        shape = tuple(layout.out_dims[f"dim{i}"] for i in range(len(layout.out_dims)))
        return cls(*(bases.get(dim, ()) for dim, _ in cls.BASES), shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def to_linear(self, shape):
        if tuple(shape) != self.shape:
            raise LayoutError(f"{self} describes shape {list(self.shape)}, not {list(shape)}")
        return self.linear


def shown(value: Any) -> str:
    return str(value) if isinstance(value, LayoutDescription) else repr(value)
