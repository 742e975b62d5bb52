"""pipeline_dot_loops: the operand loads of a dot loop become cp.async copies into rings of
`num_stages` buffers, issued num_stages - 1 iterations ahead.

accelerate_dots leaves each loop iteration loading its operands into registers and storing
them to one buffer per operand. For a `for` loop with num_stages = S from 2 to
MAX_STAGES (from `tl.range(num_stages=)`, else the launch's `num_stages=`) and a constant
positive step, whose operand loads read through loop-carried pointers advanced by a
loop-invariant offset, this pass makes

    ring = allocate_shared_memory [S, ...]       (in place of the one buffer)
    for j in 0 .. S-2:                           (prologue: iterations 0 .. S-2)
        if lower + j * step < upper:
            async_copy ring[j] <- p + j * delta
        async_copy_commit_group
    for iv ... (slot, ahead):                    (slot = i % S; ahead = pointers of i + S - 1)
        async_copy_wait_group S-2                (this thread's copies of iteration i landed;
        view = shared_index ring, slot            insert_barriers adds the barrier after which
        fence_async_shared                        every thread's have)
        acc = warpgroup_mma view ..., acc
        acc = warpgroup_mma_wait 1 acc           (iteration i - 1's wgmma retired, i's runs on)
        if iv + (S-1) * step < upper:            (iteration i + S - 1, into the slot iteration
            async_copy ring[(slot + S-1) % S] <- ahead     i - 1 read: its wgmma just retired;
        async_copy_commit_group                   insert_barriers adds the barrier after which
                                                  it has in every warpgroup)
    acc = warpgroup_mma_wait 0 acc               (after the loop: the last wgmma retired)

One wgmma stays in flight across the back edge, so the tensor cores never wait for the
issue of the next. The slot refilled in iteration i is (i - 1) % S = (i + S - 1) % S, the
one iteration i's wgmma does not read and iteration i - 1's, retired by the wait(1), did.
The accumulator leaves the loop still in flight: the wait(0) after the loop is the value
the rest of the kernel reads. With S = 2 the same arithmetic is safe, but ptxas
serializes that loop's wgmmas ("non wgmma instructions defining accumulator registers"),
so S = 2 keeps the wait(0) form below.

Copies are issued only for iterations that exist, so none is in flight after the loop
(each thread's last wait retired the last real one: the groups after it are empty), and
a short loop (trip count below S - 1, or 0) reads nothing past its end. The commit is
unconditional: wait_group counts groups, empty or not. Masked-off elements are zero-filled
by cp.async, as a load's zero `other` would fill them; each copy's mask is the load's,
computed again for the copy's own iteration.

A load may also read an address computed in the body (`ComputedAddress`): from the
induction variable, values from outside the loop, and carried values the body advances by a
loop-invariant step (block pointers' offsets after `tl.advance`, integer counters, pointers).
Its copy for iteration i + j computes the pointer and mask again with the induction variable
of that iteration and each advanced value stepped j times; nothing more is carried.
Pointers and masks computed afresh each iteration from carried values that advance without
side effects but by no loop-invariant step (the flattened persistent matmul's tile change)
are copied from a second copy of those values kept S - 1 iterations ahead: see
pipeline_carried_state.

A loop whose loads cannot be moved (a non-zero `other`, an address that reads a carried
value the body changes otherwise, a loaded tile used for more than the store, a runtime
step) is left as accelerate_dots made it. With 3 or more stages, a body whose last wgmma
accumulates into a value it reads only after an earlier wait(0) (attention's two dots, the
accumulator rescaled between them) leaves that wgmma in flight across the back edge, and
the earlier wait retires it (pipeline_chained_dots). A loop of 2 stages, or another body
(an accumulator read before any wait, mma.sync), keeps its wait(0) in each iteration and
issues the copies before it, while the last wgmma runs.

A loop's row loads (rank-1 loads read every iteration: attention backward's lse and delta)
are first routed through buffers of their own (pipeline_row_loads), so they are copied
into rings with the tiles; that is kept only where the loop is then pipelined.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from typing import Optional

from ..errors import warn_at
from ..ir import (AddPtr, AllocateSharedMemory, Arange, AsyncCopyCommitGroup, AsyncCopyGlobalToShared,
                  AsyncCopyWaitGroup, AxisHint, Binary, Bitcast, Block, Broadcast, Cast, Compare, Constant,
                  ConvertLayout, ExpandDims, For, If, Kernel, Load, NumPrograms, Op, Permute, ProgramId, Reshape,
                  SharedIndex, SharedPermute, SharedStore, Splat, Unary, Value, WarpgroupMma, WarpgroupMmaWait, Where,
                  Yield)
from ..types import SharedType, i1, i32
from .pipeline_carried_state import StatePipeliner, match_recomputed, match_state
from .pipeline_chained_dots import accumulator_wait, chained_wait, drop_repeated_fences
from .pipeline_row_loads import plan_with_row_loads

NAME = "pipeline_dot_loops"

# The loop waits with wait_group(S - 2); wait counts stay within the 0-7 that lowlevel's wait_group takes.
MAX_STAGES = 9

# Ops without side effects, safe to compute again for another iteration.
PURE_OPS = (Constant, Splat, Arange, Binary, Unary, Compare, Where, Cast, Bitcast, AddPtr, ExpandDims, Broadcast,
            Reshape, Permute, AxisHint, ConvertLayout, ProgramId, NumPrograms)


@dataclasses.dataclass(frozen=True)
class StagedOperand:
    """One operand load of a loop and what pipelining it needs: a load through a
    loop-carried pointer (`carried`), or through an address computed in the body
    (`computed`, then `carried` is None)."""

    store: SharedStore
    load: Load
    dropped: tuple[Op, ...]     # the load, and the conversion between it and the store
    carried: Optional[int]      # index in the body's args of the pointer the load reads
    delta: Optional[Value]      # the loop-invariant offset that pointer advances by
    delta_ops: tuple[Op, ...]   # the body's ops computing `delta` (to compute it before the loop)
    mask_ops: tuple[Op, ...]    # the body's ops computing the load's mask (from iv)
    computed: Optional["ComputedAddress"] = None


@dataclasses.dataclass(frozen=True)
class Advance:
    """A loop-carried value the body advances by a loop-invariant `delta` each iteration
    (an integer add, or add_ptr: block-pointer offsets, pointers), or keeps (delta None)."""

    index: int                  # in the body's args
    delta: Optional[Value]
    delta_ops: tuple[Op, ...]   # the body's ops computing `delta`
    is_pointer: bool


@dataclasses.dataclass(frozen=True)
class ComputedAddress:
    """A load's pointer and mask computed in the body from the induction variable, values
    from outside and carried values that advance by loop-invariant steps (`advances`): the
    copy for iteration i + j computes them again with each advanced value stepped j times."""

    ops: tuple[Op, ...]         # the body's ops computing the pointer and the mask, in order
    advances: tuple[Advance, ...]


class Uses:
    """Every op that reads each value, over the whole kernel."""

    def __init__(self, kernel: Kernel):
        self.readers: dict[Value, list[Op]] = defaultdict(list)
        self.top_level = {value for op in kernel.body.ops for value in op.defines()}  # values of top-level ops
        for op in kernel.walk():
            for value in op.uses():
                self.readers[value].append(op)

    def only_by(self, value: Value, ops) -> bool:
        return all(any(reader is op for op in ops) for reader in self.readers[value])


class Definitions:
    """Which op defines each value: `body`'s own ops first, then the kernel's (`outer`)."""

    def __init__(self, body: Block, outer: dict[Value, Op]):
        self.body, self.outer = body, outer
        self.inside = {value: op for op in body.ops for value in op.defines()}

    def get(self, value: Value) -> Optional[Op]:
        """The body's op defining `value` (None for values from outside the body)."""
        return self.inside.get(value)

    def anywhere(self, value: Value) -> Optional[Op]:
        return self.inside.get(value) or self.outer.get(value)


def _slice(value: Value, defs: Definitions, allowed: tuple[Value, ...]) -> Optional[list[Op]]:
    """The pure body ops computing `value`, in program order, or None when it reads a body
    argument outside `allowed` or an op with effects. Values from outside the body are free."""
    needed: dict[int, Op] = {}
    pending = [value]
    while pending:
        current = pending.pop()
        op = defs.get(current)
        if op is None:
            if current in defs.body.args and current not in allowed:
                return None
            continue
        if id(op) in needed:
            continue
        if not isinstance(op, PURE_OPS):
            return None
        needed[id(op)] = op
        pending.extend(op.uses())
    order = {id(op): index for index, op in enumerate(defs.body.ops)}
    return sorted(needed.values(), key=lambda op: order[id(op)])


def _is_zero(value: Optional[Value], defs: Definitions) -> bool:
    while value is not None:
        op = defs.anywhere(value)
        if isinstance(op, (ConvertLayout, Splat)):
            value = op.operand
            continue
        return isinstance(op, Constant) and op.value == 0
    return True


def match_operand(loop: For, store: SharedStore, defs: Definitions, uses: Uses) -> Optional[StagedOperand]:
    """The StagedOperand of `store`'s value, or None when it cannot be pipelined."""
    body = loop.body
    dropped = [store]
    value = store.value
    op = defs.get(value)
    if isinstance(op, ConvertLayout) and uses.only_by(value, (store,)):
        dropped.append(op)
        value = op.operand
        op = defs.get(value)
    if not isinstance(op, Load) or not uses.only_by(value, dropped) or not _is_zero(op.other, defs):
        return None
    load = op
    pointer = load.pointer
    if isinstance(defs.get(pointer), ConvertLayout):
        pointer = defs.get(pointer).operand
    if pointer not in body.args[1:]:
        computed = match_computed_address(loop, load, defs)
        if computed is None:
            return None
        dropped.append(load)
        return StagedOperand(store, load, tuple(dropped), None, None, (), (), computed)
    carried = body.args.index(pointer)
    advanced = defs.get(body.ops[-1].values[carried - 1])
    if not (isinstance(advanced, AddPtr) and advanced.pointer is pointer):
        return None
    delta_ops = _slice(advanced.offset, defs, ())
    mask_ops = () if load.mask is None else _slice(load.mask, defs, body.args[:1])
    if delta_ops is None or mask_ops is None:
        return None
    dropped.append(load)
    return StagedOperand(store, load, tuple(dropped), carried, advanced.offset, tuple(delta_ops), tuple(mask_ops))


def match_advance(loop: For, index: int, defs: Definitions) -> Optional[Advance]:
    """The Advance of body arg `index`, or None when the body changes it otherwise."""
    arg = loop.body.args[index]
    yielded = loop.body.ops[-1].values[index - 1]
    if yielded is arg:
        return Advance(index, None, (), False)
    op = defs.get(yielded)
    if isinstance(op, AddPtr) and op.pointer is arg:
        delta, is_pointer = op.offset, True
    elif isinstance(op, Binary) and op.kind == "add" and arg in (op.lhs, op.rhs) and op.lhs is not op.rhs:
        delta, is_pointer = (op.rhs if op.lhs is arg else op.lhs), False
    else:
        return None
    delta_ops = _slice(delta, defs, ())
    return None if delta_ops is None else Advance(index, delta, tuple(delta_ops), is_pointer)


def match_computed_address(loop: For, load: Load, defs: Definitions) -> Optional[ComputedAddress]:
    """The ComputedAddress of `load`, or None when its pointer or mask reads a carried value
    that does not advance by a loop-invariant step."""
    body = loop.body
    pointer_reads = _slice(load.pointer, defs, body.args)
    mask_reads = [] if load.mask is None else _slice(load.mask, defs, body.args)
    if pointer_reads is None or mask_reads is None:
        return None
    order = {id(op): position for position, op in enumerate(body.ops)}
    ops = sorted({id(op): op for op in pointer_reads + mask_reads}.values(), key=lambda op: order[id(op)])
    read_args = {value for op in ops for value in op.uses() if value in body.args[1:]}
    read_args |= {value for value in (load.pointer, load.mask) if value in body.args[1:]}
    advances = []
    for arg in read_args:
        advance = match_advance(loop, body.args.index(arg), defs)
        if advance is None:
            return None
        advances.append(advance)
    return ComputedAddress(tuple(ops), tuple(sorted(advances, key=lambda a: a.index)))


def clone(ops, mapping: dict[Value, Value]) -> list[Op]:
    """`ops` again with fresh results, reading `mapping`'s values in place of its keys."""
    out = []
    for op in ops:
        changes = {}
        for field in dataclasses.fields(op):
            item = getattr(op, field.name)
            if field.name == "result":
                fresh = Value(item.type, item.hint)
                mapping[item] = fresh
                changes["result"] = fresh
            elif isinstance(item, Value):
                changes[field.name] = mapping.get(item, item)
        out.append(dataclasses.replace(op, **changes))
    return out


def substitute(op: Op, mapping: dict[Value, Value]) -> Op:
    """`op` reading `mapping`'s values in place of its keys (its results kept)."""
    changes = {}
    for field in dataclasses.fields(op):
        item = getattr(op, field.name)
        if field.name in ("result", "results"):
            continue
        if isinstance(item, Value) and item in mapping:
            changes[field.name] = mapping[item]
        elif isinstance(item, tuple) and any(isinstance(v, Value) and v in mapping for v in item):
            changes[field.name] = tuple(mapping.get(v, v) for v in item)
    return dataclasses.replace(op, **changes) if changes else op


class Emitter:
    """Ops appended to a list, each returning its result."""

    def __init__(self, loc):
        self.ops: list[Op] = []
        self.loc = loc

    def emit(self, op_class, type_, hint: str = "", **fields) -> Value:
        value = Value(type_, hint)
        self.ops.append(op_class(result=value, loc=self.loc, **fields))
        return value

    def int(self, number: int) -> Value:
        return self.emit(Constant, i32, value=number)

    def binary(self, kind: str, lhs: Value, rhs: Value, hint: str = "") -> Value:
        return self.emit(Binary, lhs.type, hint, kind=kind, lhs=lhs, rhs=rhs)


@dataclasses.dataclass(frozen=True)
class DeferredWait:
    """The wgmma wait a loop can leave to its next iteration: the body's `wait` (pending=0)
    of the async wgmma right before it, whose result reaches the yield's value `carried`
    (an index in its values), and whose accumulator is that value's body argument, each
    directly or through one ConvertLayout, read by nothing else."""

    wait: WarpgroupMmaWait
    carried: int


def _through_convert(value: Value, uses: Uses) -> tuple[Value, list[Op]]:
    """`value`, or the result of the one ConvertLayout that alone reads it; and its readers."""
    readers = uses.readers[value]
    if len(readers) == 1 and isinstance(readers[0], ConvertLayout):
        value = readers[0].result
    return value, uses.readers[value]


def deferred_wait(body: Block, last_read: int, uses: Uses) -> Optional[DeferredWait]:
    """The DeferredWait of a body whose last read of the rings is at `last_read`, or None
    when its accumulator is read in the loop or its wgmma is not alone (see the module
    docstring)."""
    ops = body.ops
    wgmma, wait = ops[last_read], ops[last_read + 1] if last_read + 1 < len(ops) else None
    if not (isinstance(wgmma, WarpgroupMma) and wgmma.is_async and isinstance(wait, WarpgroupMmaWait)
            and wait.pending == 0 and wait.deps == (wgmma.result,) and uses.only_by(wgmma.result, (wait,))):
        return None
    if sum(isinstance(op, (WarpgroupMma, WarpgroupMmaWait)) for op in body.walk()) != 2:
        return None
    value, readers = _through_convert(wait.results[0], uses)
    yield_ = ops[-1]
    if readers != [yield_] or list(yield_.values).count(value) != 1:
        return None
    carried = yield_.values.index(value)
    value, readers = _through_convert(body.args[1 + carried], uses)
    if readers != [wgmma] or wgmma.acc is not value:
        return None
    return DeferredWait(wait, carried)


def ring_views(body: Block, buffers: list[Value]) -> set[Value]:
    """`buffers` and the body's transposed views of them (a folded `tl.trans`): the dot that
    reads a view reads its ring slot, so the slot's refill waits until it is issued."""
    views = set(buffers)
    for op in body.ops:
        if isinstance(op, SharedPermute) and op.buffer in views:
            views.add(op.result)
    return views


class LoopPipeliner:
    """The rewrite of one loop, once its operands matched."""

    def __init__(self, loop: For, stages: int, operands: list[StagedOperand], step: int,
                 rings: dict[Value, Value], uses: Uses):
        self.loop, self.stages, self.operands, self.step = loop, stages, operands, step
        self.rings, self.uses = rings, uses
        self.deferred: Optional[DeferredWait] = None  # set by body()
        self.chained = None  # set by body(): a ChainedWait (pipeline_chained_dots)

    def ahead_args(self) -> tuple[Value, ...]:
        """The body's new args: each carried-pointer operand's pointer S - 1 iterations ahead."""
        body = self.loop.body
        return tuple(Value(body.args[operand.carried].type, "ahead") for operand in self.operands
                     if operand.computed is None)

    def issue(self, out: Emitter, iv: Value, slot: Value, pointers, deltas, carried: dict[int, Value],
              steps: int) -> tuple[Value, ...]:
        """The copies of the iteration at `iv` into ring slot `slot`, from `pointers` (the
        carried-pointer operands'), and their commit group; the copies only where that
        iteration exists (the group, empty or not, always: wait_group counts groups).
        Computed addresses read the carried values `carried` stepped `steps` times. Returns
        the pointers advanced by `deltas`."""
        copies = Emitter(self.loop.loc)
        advanced = []
        pointers, deltas = iter(pointers), iter(deltas)
        for operand in self.operands:
            if operand.computed is not None:
                self.copy_computed(copies, operand, slot, iv, carried, steps)
                continue
            pointer, delta = next(pointers), next(deltas)
            self.copy(copies, operand, slot, pointer, iv)
            advanced.append(out.emit(AddPtr, pointer.type, pointer.hint, pointer=pointer, offset=delta))
        exists = out.emit(Compare, i1, predicate="lt", lhs=iv, rhs=self.loop.upper)
        out.ops.append(If(results=(), condition=exists, then_body=Block((), tuple(copies.ops) + (Yield(loc=out.loc),)),
                          else_body=Block((), (Yield(loc=out.loc),)), loc=out.loc))
        out.ops.append(AsyncCopyCommitGroup(loc=self.loop.loc))
        return tuple(advanced)

    def copy(self, out: Emitter, operand: StagedOperand, slot: Value, pointer: Value, iv: Value) -> None:
        """Operand's copy for the iteration at `iv` from `pointer` into ring slot `slot`."""
        load, buffer = operand.load, operand.store.buffer
        view = out.emit(SharedIndex, buffer.type, buffer.hint, buffer=self.rings[buffer], index=slot)
        mask = None
        if load.mask is not None:
            mapping = {self.loop.body.args[0]: iv}
            out.ops.extend(clone(operand.mask_ops, mapping))
            mask = mapping.get(load.mask, load.mask)
        if pointer.type != load.pointer.type:
            pointer = out.emit(ConvertLayout, load.pointer.type, operand=pointer)
        out.ops.append(AsyncCopyGlobalToShared(buffer=view, pointer=pointer, mask=mask, loc=load.loc))

    def copy_computed(self, out: Emitter, operand: StagedOperand, slot: Value, iv: Value,
                      carried: dict[int, Value], steps: int) -> None:
        """Operand's copy for the iteration at `iv`, its address computed again from the
        carried values `carried` (body arg index -> value) each stepped `steps` times."""
        body = self.loop.body
        mapping = {body.args[0]: iv}
        for advance in operand.computed.advances:
            value = carried[advance.index]
            if advance.delta is not None and steps:
                delta_at: dict[Value, Value] = {}
                out.ops.extend(clone(advance.delta_ops, delta_at))
                delta = delta_at.get(advance.delta, advance.delta)
                if steps > 1:
                    count = out.emit(Constant, delta.type, value=steps)
                    delta = out.binary("mul", delta, count)
                value = (out.emit(AddPtr, value.type, value.hint, pointer=value, offset=delta) if advance.is_pointer
                         else out.binary("add", value, delta, value.hint))
            mapping[body.args[advance.index]] = value
        out.ops.extend(clone(operand.computed.ops, mapping))
        load, buffer = operand.load, operand.store.buffer
        view = out.emit(SharedIndex, buffer.type, buffer.hint, buffer=self.rings[buffer], index=slot)
        mask = None if load.mask is None else mapping.get(load.mask, load.mask)
        out.ops.append(AsyncCopyGlobalToShared(buffer=view, pointer=mapping.get(load.pointer, load.pointer), mask=mask,
                                               loc=load.loc))

    def deltas(self, out: Emitter) -> list[Value]:
        """Each carried-pointer operand's pointer step, computed again at this point."""
        found = []
        for operand in self.operands:
            if operand.computed is not None:
                continue
            mapping: dict[Value, Value] = {}
            out.ops.extend(clone(operand.delta_ops, mapping))
            found.append(mapping.get(operand.delta, operand.delta))
        return found

    def prologue(self, out: Emitter) -> tuple[Value, ...]:
        """Copies of iterations 0 .. S-2; returns the pointers of iteration S-1."""
        loop = self.loop
        deltas = self.deltas(out)
        pointers = tuple(loop.inits[operand.carried - 1] for operand in self.operands if operand.computed is None)
        initial = {index: loop.inits[index - 1] for index in range(1, len(loop.body.args))}
        for j in range(self.stages - 1):
            iv = loop.lower if j == 0 else out.binary("add", loop.lower, out.int(j * self.step))
            pointers = self.issue(out, iv, out.int(j), pointers, deltas, initial, j)
        return pointers

    def body(self) -> Block:
        """The loop body: wait for this iteration's copies, run the dot from this
        iteration's slot, and while the wgmma runs issue the copies S - 1 iterations on
        into the slot the last iteration read: after wait(1) retired the last iteration's
        wgmma where the wait can be deferred (`self.deferred`), else before this
        iteration's wait(0) (every warp passed this iteration's barrier after its wait(0)
        of the last one)."""
        loop, stages = self.loop, self.stages
        body = loop.body
        iv = body.args[0]
        slot = Value(i32, "slot")
        ahead = self.ahead_args()
        buffers = [operand.store.buffer for operand in self.operands]
        dropped = {id(op) for operand in self.operands for op in operand.dropped}
        first_store = min(body.ops.index(operand.store) for operand in self.operands)
        reading = ring_views(body, buffers)
        last_read = max(position for position, op in enumerate(body.ops)
                        if id(op) not in dropped and any(value in reading for value in op.uses()))
        self.deferred = deferred_wait(body, last_read, self.uses) if stages >= 3 else None
        if self.deferred is not None and any(isinstance(v.type, SharedType) and v not in reading
                                             for v in body.ops[last_read].uses()):
            self.deferred = None  # it also reads a buffer refilled every iteration (a desc.load's TMA box)
        if self.deferred is None and stages >= 3 and all(
                v in buffers for v in body.ops[last_read].uses() if isinstance(v.type, SharedType)):
            self.chained = chained_wait(body, last_read, self.uses)  # left in flight, it reads only the rings
        views: dict[Value, Value] = {}  # also the values the body reads in place of the chained wait's
        next_ahead = ahead  # replaced where the copies are issued, before the yield
        out = Emitter(loop.loc)
        for position, op in enumerate(body.ops):
            if self.deferred is not None and op is self.deferred.wait:
                continue  # issued with pending=1 right after the wgmma, below
            if self.chained is not None and op is self.chained.wait:
                views[op.results[0]] = op.deps[0]  # yielded in flight
                continue
            if position == first_store:
                out.ops.append(AsyncCopyWaitGroup(pending=stages - 2, loc=loop.loc))
                for buffer in buffers:
                    views[buffer] = out.emit(SharedIndex, buffer.type, buffer.hint, buffer=self.rings[buffer],
                                             index=slot)
            if id(op) in dropped:
                continue
            if isinstance(op, Yield):
                next_slot = out.binary("mod", out.binary("add", slot, out.int(1)), out.int(stages), "slot")
                out.ops.append(Yield(values=op.values + (next_slot,) + next_ahead, loc=op.loc))
                continue
            out.ops.append(substitute(op, views))
            if self.chained is not None and op is self.chained.earlier:
                arg = body.args[1 + self.chained.carried]
                views[arg] = accumulator_wait(self.chained, arg, out.ops)
            if self.deferred is not None and position == last_read:
                out.ops.append(dataclasses.replace(self.deferred.wait, pending=1))
            if position == last_read:
                lead = stages - 1
                ahead_iv = out.binary("add", iv, out.int(lead * self.step))
                current = {index: body.args[index] for index in range(1, len(body.args))}
                next_ahead = self.issue(out, ahead_iv, self.refill_slot(out, slot), ahead, self.deltas(out),
                                        current, lead)
        return Block(body.args + (slot,) + ahead, tuple(drop_repeated_fences(out.ops)))

    def refill_slot(self, out: Emitter, slot: Value) -> Value:
        """The slot iteration i (reading `slot` = i % S) fills for iteration i + S - 1: the
        one iteration i - 1 read, (i - 1) % S = (slot + S - 1) % S."""
        return out.binary("mod", out.binary("add", slot, out.int(self.stages - 1)), out.int(self.stages))

    def rewrite(self) -> tuple[list[Op], dict[Value, Value]]:
        """The ops in place of the loop, and the values the ops after it read in place of
        the loop's results (the accumulator after its last wgmma's wait)."""
        out = Emitter(self.loop.loc)
        ahead = self.prologue(out)
        body = self.body()
        extra = tuple(Value(arg.type, arg.hint) for arg in body.args[len(self.loop.body.args):])
        loop = dataclasses.replace(self.loop, body=body, inits=self.loop.inits + (out.int(0),) + ahead,
                                   results=self.loop.results + extra)
        ops, replaced = out.ops + [loop], {}
        in_flight_out = self.deferred or self.chained  # the accumulator leaves the loop in flight
        if in_flight_out is not None:
            after = Emitter(self.loop.loc)
            result = self.loop.results[in_flight_out.carried]
            placed = in_flight_out.wait.results[0].type
            in_flight = after.emit(ConvertLayout, placed, result.hint, operand=result)
            waited = Value(placed, result.hint)
            after.ops.append(WarpgroupMmaWait(results=(waited,), deps=(in_flight,), pending=0,
                                              loc=in_flight_out.wait.loc))
            replaced[result] = after.emit(ConvertLayout, result.type, result.hint, operand=waited)
            ops += after.ops
        return ops, replaced


class StateLoopPipeliner(StatePipeliner, LoopPipeliner):
    """The rewrite of a loop whose operands are computed from carried state
    (pipeline_carried_state): its prologue, copies and ahead values are the state's."""

    def __init__(self, state, *args):
        super().__init__(*args)
        self.state = state


def plan_loop(loop: For, outer: dict, uses: Uses, rings: dict[Value, Value],
              launch_stages: Optional[int], split_by_default: bool = False) -> Optional[LoopPipeliner]:
    """The LoopPipeliner of `loop`, or None when it is left as it is. Its stages: what
    tl.range(num_stages=) asked, else the launch's num_stages. `split_by_default`: a
    loop that is warp-specialized where that pays unless it says warp_specialize=False
    (pipeline_tma_warp_specialize.default_split_loops)."""
    stages = loop.schedule.num_stages if loop.schedule is not None else None
    stages = launch_stages if stages is None else stages
    step = outer.get(loop.step)
    if stages is None or not 2 <= stages <= MAX_STAGES or not isinstance(step, Constant) or step.value <= 0 \
            or loop.body.args[0].type != i32:
        return None
    defs = Definitions(loop.body, outer)
    stores = [op for op in loop.body.ops if isinstance(op, SharedStore)]
    from .pipeline_tma_loops import plan_tma_loop, transposes_a_box
    # Operands that desc.load brought by TMA (some transposed through registers): TMA rings.
    if all(transposes_a_box(store, defs) for store in stores):
        return plan_tma_loop(loop, stages, step.value, defs, uses, split_by_default, rings)
    operands = []
    for store in stores:
        allocation = outer.get(store.buffer)
        if not isinstance(allocation, AllocateSharedMemory) or allocation.init is not None \
                or not uses.only_by(store.buffer, loop.body.ops):
            return None
        operands.append(match_operand(loop, store, defs, uses))
    pipeliner = LoopPipeliner
    if None in operands:  # pointers computed afresh each iteration: from carried state?
        operands = [match_recomputed(store, defs, uses) for store in stores]
        state = None if None in operands else match_state(loop, [operand.load for operand in operands])
        if state is None:
            return None
        pipeliner = functools.partial(StateLoopPipeliner, state)
    if not operands or len({id(operand.store.buffer) for operand in operands}) != len(operands):
        return None
    for operand in operands:
        buffer = operand.store.buffer
        buffer_type: SharedType = buffer.type
        shape = (stages,) + buffer_type.shape
        rings[buffer] = Value(SharedType(shape, buffer_type.element, buffer_type.encoding.to_linear(shape),
                                         buffer_type.encoding), buffer.hint)
    pipeliner = pipeliner(loop, stages, operands, step.value, rings, uses)
    if loop.schedule is not None and loop.schedule.warp_specialize is True:  # asked: a producer partition
        from .pipeline_copy_warp_specialize import plan_copy_split
        return plan_copy_split(pipeliner, defs, uses) or pipeliner
    return pipeliner


def pipeline_dot_loops(kernel: Kernel) -> Kernel:
    """Every dot loop that can be pipelined, pipelined (see the module docstring)."""
    uses = Uses(kernel)
    rings: dict[Value, Value] = {}
    outer: dict = {}
    for op in kernel.walk():
        for value in op.defines():
            outer[value] = op

    replaced: dict[Value, Value] = {}  # loop results read after their wait, by everything after the loop
    pipelined = []
    from .pipeline_tma_warp_specialize import SplitGroup, default_split_loops
    default_splits = default_split_loops(kernel)  # the first results of the loops split unless they say not

    def block(region: Block) -> Block:
        ops: list[Op] = []
        group = SplitGroup(kernel.dot_ahead)  # warp-specialized loops in a row, split together (pipeline_tma_warp_specialize)

        def flush() -> None:
            if group.loops:
                rewritten, waited = group.rewrite()
                ops.extend(rewritten + group.held)
                replaced.update(waited)
            group.loops.clear()
            group.held.clear()

        def place(original: Op) -> None:
            op = substitute(original, replaced).map_regions(block)
            if group.hoists(op):
                group.held.append(op)  # before the group's split if another loop joins it, else after
                return
            pipeliner, allocations = None, []
            if isinstance(op, For):  # its row loads staged with the tiles where that pipelines it
                split = bool(op.results) and op.results[0] in default_splits
                op, pipeliner, allocations = plan_with_row_loads(
                    op, outer, uses, lambda loop: plan_loop(loop, outer, uses, rings, kernel.num_stages, split))
            if getattr(pipeliner, "warp_specialized", False) and group.take(pipeliner):
                ops.extend(group.held + list(allocations))
                group.held.clear()
                pipelined.append(op)  # split with the group's loops, once the group is complete
                return
            if group.loops:  # it cannot join: the group's split goes first, then this op again
                flush()
                place(original)
                return
            ops.extend(allocations)
            if getattr(pipeliner, "warp_specialized", False):
                pipeliner = pipeliner.one_partition()  # it reads another loop's results and cannot join it
            if isinstance(op, For) and op.schedule is not None and op.schedule.warp_specialize is True \
                    and not getattr(pipeliner, "warp_specialized", False) \
                    and not getattr(pipeliner, "split_refused", False):  # which warned why
                warn_at(op.loc, "warp_specialize=True is not applied to this loop: weft splits only a loop at the "
                        "kernel's top level whose dots read rings of num_stages >= 2 (desc.load boxes, or "
                        "pointer loads with other=0 through pointers the loop steps); it runs as one partition",
                        "load the operands with tensor descriptors or such pointer loads, or drop the flag")
            if pipeliner is None:
                ops.append(op)
                return
            rewritten, waited = pipeliner.rewrite()
            pipelined.append(op)
            ops.extend(rewritten)
            replaced.update(waited)

        for original in region.ops:
            if not group.may_extend(original):
                flush()
            place(original)
        flush()
        return Block(region.args, tuple(ops))

    body = block(kernel.body)
    if not pipelined:
        return kernel

    def ring_allocations(region: Block) -> Block:
        ops = []
        for op in region.ops:
            op = op.map_regions(ring_allocations)
            if isinstance(op, AllocateSharedMemory) and op.result in rings:
                op = dataclasses.replace(op, result=rings[op.result])
            ops.append(op)
        return Block(region.args, tuple(ops))

    return kernel.with_body(ring_allocations(body))
