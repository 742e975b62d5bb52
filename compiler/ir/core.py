"""The IR's core: SSA values, the op base class and blocks (see the package docstring).

Values compare by identity: two values are the same value only if they are the same object.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from ..errors import UNKNOWN_LOC, CompilationError, Loc
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


class VerificationError(CompilationError):
    """Invalid IR: a compiler bug (or a hand-built IR mistake), at the op's location."""


@dataclass(frozen=True, kw_only=True)
class Op:
    """Base of all ops; `NAME` is the op's spelling in the printed IR.

    The class attributes in capitals are facts about every op of a class, read by the
    passes, the backend and the emulator instead of lists of op classes of their own;
    `verify` checks what only this op's class knows (the verifier calls it on every op).
    """

    NAME: ClassVar[str] = "op"
    # Operands and result share shape and layout, element by element.
    ELEMENTWISE: ClassVar[bool] = False
    # Involves no thread outside its own warp and no barrier: register arithmetic (a lane's
    # own values, or its warp's), shared-memory reads and views each thread makes for itself,
    # a thread's own proxy fence. What a per-warp `If` may hold (with in-warp reductions
    # and register-only conversions: `in_warp`).
    IN_WARP: ClassVar[bool] = False
    # May need shared scratch while it runs (`scratch_offset`, set by allocation).
    USES_SCRATCH: ClassVar[bool] = False
    # Ends a block, handing its `values` to the op that holds the block.
    TERMINATOR: ClassVar[bool] = False
    # Runs its body again and again (a loop): uses inside it last the whole loop.
    LOOP: ClassVar[bool] = False
    # Every thread of the CTA (or of the partition) meets here: pending shared accesses settle.
    SYNCS_THREADS: ClassVar[bool] = False
    # Exists only at the `tile` stage: a highlevel pass replaces it before `layout`, so it
    # has no lowering or emulation rule.
    TILE_ONLY: ClassVar[bool] = False
    loc: Loc = UNKNOWN_LOC

    def verify(self) -> None:
        """Raise VerificationError (through `invalid`) where this op breaks its own rules."""

    def invalid(self, message: str) -> VerificationError:
        return VerificationError(f"invalid IR at {self.NAME}: {message}", self.loc)

    @property
    def has_regions(self) -> bool:
        return bool(self._region_fields())

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
