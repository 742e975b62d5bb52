"""The IR's core: SSA values, the op base class and blocks (see the package docstring).

Values compare by identity: two values are the same value only if they are the same object.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from ..errors import UNKNOWN_LOC, Loc
from ..types import SharedType, TensorType, Type

_value_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """An SSA value. `hint` is the Python name it was bound to, kept for readable dumps."""

    type: Type
    hint: str = ""
    id: int = field(default_factory=lambda: next(_value_ids), compare=False)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"Value(%{self.hint or self.id}: {self.type})"


@dataclass(frozen=True, kw_only=True)
class Op:
    """Base of all ops; `NAME` is the op's spelling in the printed IR."""

    NAME: ClassVar[str] = "op"
    loc: Loc = UNKNOWN_LOC

    def defines(self) -> tuple[Value, ...]:
        """The values this op defines (its `result` or `results` field)."""
        found = []
        for f in dataclasses.fields(self):
            if f.name == "result":
                if getattr(self, f.name) is not None:  # an atomic whose old value is unused
                    found.append(getattr(self, f.name))
            elif f.name == "results":
                found.extend(getattr(self, f.name))
        return tuple(found)

    def uses(self) -> tuple[Value, ...]:
        """The operand values this op reads, in field order."""
        found = []
        for f in dataclasses.fields(self):
            if f.name in ("result", "results"):
                continue
            item = getattr(self, f.name)
            if isinstance(item, Value):
                found.append(item)
            elif isinstance(item, tuple) and item and all(isinstance(v, Value) for v in item):
                found.extend(item)
        return tuple(found)

    def nested_blocks(self) -> tuple["Block", ...]:
        found = []
        for item in self._region_fields().values():
            found.extend(item if isinstance(item, tuple) else (item,))
        return tuple(found)

    def _region_fields(self) -> dict[str, Any]:
        """Fields holding a Block or a tuple of Blocks (warp_specialize's workers)."""
        out = {}
        for f in dataclasses.fields(self):
            item = getattr(self, f.name)
            if isinstance(item, Block) or (
                    isinstance(item, tuple) and item and all(isinstance(b, Block) for b in item)):
                out[f.name] = item
        return out

    def map_regions(self, fn) -> "Op":
        """This op with each nested block replaced by `fn(block)` (itself when it has none)."""
        changes = {name: tuple(fn(b) for b in item) if isinstance(item, tuple) else fn(item)
                   for name, item in self._region_fields().items()}
        return dataclasses.replace(self, **changes) if changes else self

    def attributes(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            item = getattr(self, f.name)
            if f.name in ("result", "results", "loc") or isinstance(item, (Value, Block)):
                continue
            if isinstance(item, tuple) and item and all(isinstance(v, (Value, Block)) for v in item):
                continue
            if item is None and f.name in _OPTIONAL_OPERANDS:
                continue
            if not f.metadata.get("printed", True):
                continue  # a derived record too big for a dump line (a reduction's plan)
            if f.default is not dataclasses.MISSING and item == f.default:
                continue  # dumps show only what differs from an op's defaults
            out[f.name] = item
        return out


# Optional operand fields: when None they are simply absent, not an attribute.
_OPTIONAL_OPERANDS = {"mask", "other", "init", "index", "pred", "use_acc"}


@dataclass(frozen=True)
class Block:
    """A straight-line list of ops with block arguments (loop induction and carried values)."""

    args: tuple[Value, ...] = ()
    ops: tuple[Op, ...] = ()

    def walk(self) -> Iterator[Op]:
        """Every op in this block and its nested regions, in program order."""
        for op in self.ops:
            yield op
            for region in op.nested_blocks():
                yield from region.walk()


def is_tensor(value: Value) -> bool:
    return isinstance(value.type, TensorType)


def is_shared(value: Value) -> bool:
    return isinstance(value.type, SharedType)
