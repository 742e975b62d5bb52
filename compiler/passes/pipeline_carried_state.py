"""pipeline_dot_loops for loops whose operand pointers are computed afresh each iteration
from carried state: the flattened persistent matmul, one loop over tiles x K steps,

    for _ in range(0, k_tiles * tiles_here):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:                       (a new tile: its row and column offsets)
            tile_id += NUM_SMS
            offs_am = ...; offs_bn = ...
        a_ptrs = a_ptr + offs_am[:, None] * stride_am + (ki * BLOCK_K + ks)[None, :]
        a = tl.load(a_ptrs, mask=..ki..); b = ...
        acc = tl.dot(a, b, acc)
        if ki == k_tiles - 1:             (the tile's epilogue)
            ...store acc...; acc = 0

The pointers are no carried pointer advanced by a fixed step, but everything they and
their masks read is: the induction variable and carried values (here ki, tile_id, the
offsets) whose next values are computed from the same set by ops without side effects
(a branch of such ops included). This module finds that set, the carried state, and the
pipeliner keeps a second copy of it running S - 1 iterations ahead: the prologue computes
iterations 0 .. S-2's state from the loop's initial values, copying each one's operands,
and every iteration computes the state of iteration i + S - 1 from that of i + S - 2 and
copies its operands from there into the ring slot iteration i - 1 read. The body itself is
unchanged: it still computes its own state, which the epilogue and the dot read.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..ir import (AsyncCopyCommitGroup, AsyncCopyGlobalToShared, Block, Compare, ConvertLayout, For, If, Load, Op,
                  SharedIndex, SharedStore, Value, Yield)
from ..types import i1


@dataclasses.dataclass(frozen=True)
class RecomputedOperand:
    """One operand load whose pointer and mask are computed from the carried state."""

    store: SharedStore
    load: Load
    dropped: tuple[Op, ...]     # the load, and the conversion between it and the store


def _pure(op: Op) -> bool:
    """An op without side effects: a pure op, or a branch holding only pure ops."""
    from .pipeline_dot_loops import PURE_OPS  # that module builds on this one

    if isinstance(op, If):
        return all(isinstance(inner, Yield) or _pure(inner) for region in op.nested_blocks()
                   for inner in region.ops)
    return isinstance(op, PURE_OPS)


def _reads(op: Op) -> list[Value]:
    """The values `op` reads, its regions' reads of values from outside them included."""
    found = list(op.uses())
    for region in op.nested_blocks():
        inside = set(region.args)
        for inner in region.ops:
            found.extend(v for v in _reads(inner) if v not in inside)
            inside.update(inner.defines())
    return found


class StateSlice:
    """The body ops computing some values, and the body arguments they read."""

    def __init__(self, body: Block):
        self.body = body
        self.defined = {value: op for op in body.ops for value in op.defines()}

    def of(self, values) -> Optional[tuple[list[Op], set[Value]]]:
        """The ops computing `values` in program order and the body args they read, or None
        when one of them has side effects."""
        needed: dict[int, Op] = {}
        args: set[Value] = set()
        pending = list(values)
        while pending:
            current = pending.pop()
            op = self.defined.get(current)
            if op is None:
                if current in self.body.args:
                    args.add(current)
                continue
            if id(op) in needed:
                continue
            if not _pure(op):
                return None
            needed[id(op)] = op
            pending.extend(_reads(op))
        order = {id(op): index for index, op in enumerate(self.body.ops)}
        return sorted(needed.values(), key=lambda op: order[id(op)]), args


@dataclasses.dataclass(frozen=True)
class CarriedState:
    """What a loop's copies are computed from: the carried values (indices into the
    body's args, the induction variable excluded), and the body ops computing the
    operands' pointers and masks and those values' next values from them."""

    indices: tuple[int, ...]
    ops: tuple[Op, ...]


def match_state(loop: For, loads: list[Load]) -> Optional[CarriedState]:
    """The CarriedState the `loads`' pointers and masks need, or None when some value
    they depend on is computed with side effects (a load, a dot) or from such a value."""
    body = loop.body
    yield_ = body.ops[-1]
    slicer = StateSlice(body)
    roots = [v for load in loads for v in (load.pointer, load.mask) if v is not None]
    indices: set[int] = set()
    while True:
        found = slicer.of(roots + [yield_.values[i - 1] for i in indices])
        if found is None:
            return None
        ops, args = found
        wanted = {body.args.index(a) for a in args} - {0}
        if wanted <= indices:
            return CarriedState(tuple(sorted(indices)), tuple(ops))
        indices |= wanted


def clone_deep(ops, mapping: dict[Value, Value]) -> list[Op]:
    """`ops` again, regions included, with fresh results, reading `mapping`'s values in
    place of its keys (it learns each old result's fresh value)."""
    out = []
    for op in ops:
        changes = {}
        for field in dataclasses.fields(op):
            item = getattr(op, field.name)
            if field.name == "result" and item is not None:
                changes["result"] = mapping[item] = Value(item.type, item.hint)
            elif field.name == "results":
                changes["results"] = tuple(mapping.setdefault(v, Value(v.type, v.hint)) for v in item)
            elif isinstance(item, Value):
                changes[field.name] = mapping.get(item, item)
            elif isinstance(item, tuple) and item and all(isinstance(v, Value) for v in item):
                changes[field.name] = tuple(mapping.get(v, v) for v in item)
            elif isinstance(item, Block):
                args = tuple(mapping.setdefault(a, Value(a.type, a.hint)) for a in item.args)
                changes[field.name] = Block(args, tuple(clone_deep(item.ops, mapping)))
        out.append(dataclasses.replace(op, **changes))
    return out


class StatePipeliner:
    """Mixed into pipeline_dot_loops.LoopPipeliner: the prologue, the ahead values and the
    copies of a loop whose operands are computed from carried state (`self.state`)."""

    state: CarriedState

    def ahead_args(self) -> tuple[Value, ...]:
        body = self.loop.body
        return tuple(Value(body.args[i].type, "ahead") for i in self.state.indices)

    def deltas(self, out) -> list[Value]:
        return []

    def prologue(self, out) -> tuple[Value, ...]:
        """Copies of iterations 0 .. S-2; returns the state of iteration S-1."""
        loop = self.loop
        state = tuple(loop.inits[i - 1] for i in self.state.indices)
        for j in range(self.stages - 1):
            iv = loop.lower if j == 0 else out.binary("add", loop.lower, out.int(j * self.step))
            state = self.issue(out, iv, out.int(j), state, (), {}, j)
        return state

    def issue(self, out, iv: Value, slot: Value, state, deltas, carried=None, steps: int = 0) -> tuple[Value, ...]:
        """The copies of the iteration at `iv` (whose carried state is `state`) into ring
        slot `slot` where that iteration exists, their commit group, and the next
        iteration's state (LoopPipeliner.issue's `carried` and `steps` are for computed
        addresses, which this state replaces)."""
        body = self.loop.body
        mapping = {body.args[0]: iv, **{body.args[i]: v for i, v in zip(self.state.indices, state)}}
        out.ops.extend(clone_deep(self.state.ops, mapping))
        copies = []
        for operand in self.operands:
            load, buffer = operand.load, operand.store.buffer
            view = out.emit(SharedIndex, buffer.type, buffer.hint, buffer=self.rings[buffer], index=slot)
            pointer = mapping.get(load.pointer, load.pointer)
            mask = None if load.mask is None else mapping.get(load.mask, load.mask)
            copies.append(AsyncCopyGlobalToShared(buffer=view, pointer=pointer, mask=mask, loc=load.loc))
        exists = out.emit(Compare, i1, predicate="lt", lhs=iv, rhs=self.loop.upper)
        out.ops.append(If(results=(), condition=exists, then_body=Block((), tuple(copies) + (Yield(loc=out.loc),)),
                          else_body=Block((), (Yield(loc=out.loc),)), loc=out.loc))
        out.ops.append(AsyncCopyCommitGroup(loc=self.loop.loc))
        yielded = body.ops[-1].values
        return tuple(mapping.get(yielded[i - 1], yielded[i - 1]) for i in self.state.indices)


def match_recomputed(store: SharedStore, defs, uses) -> Optional[RecomputedOperand]:
    """`store`'s operand load (through at most one conversion), zero-filled, read by
    nothing else; or None."""
    from .pipeline_dot_loops import _is_zero  # that module builds on this one

    dropped = [store]
    value, op = store.value, defs.get(store.value)
    if isinstance(op, ConvertLayout) and uses.only_by(value, (store,)):
        dropped.append(op)
        value, op = op.operand, defs.get(op.operand)
    if not isinstance(op, Load) or not uses.only_by(value, dropped) or not _is_zero(op.other, defs):
        return None
    return RecomputedOperand(store, op, tuple(dropped) + (op,))
