"""pipeline_dot_loops, for dot loops whose operands are `desc.load`s: rings filled by TMA.

After accelerate_dots, a loop iteration of such a loop loads each operand box the way
`desc.load` wrote it (highlevel/tensor_descriptor.py), and its wgmma reads the boxes:

    box = allocate_shared_memory; bar = allocate_shared_memory (an mbarrier)
    mbarrier_init bar; mbarrier_expect bar, bytes; tma_copy desc, coords(iv) -> box on bar
    mbarrier_wait bar, 0; [shared_load box: unused]; fence; mbarrier_invalidate bar
    ...
    acc = warpgroup_mma box_a, box_b, acc; acc = warpgroup_mma_wait 0 acc

With num_stages = S this becomes (coords(iv) recomputed for the iteration each copy is for)

    ring_a, ring_b = allocate_shared_memory [S, ...]
    bars, empties = allocate_shared_memory [S, 1]        ("full" and "empty" per slot)
    mbarrier_init bars[s] (count 1), empties[s] (count = warps) for every s
    for j in 0 .. S-2:                                  (prologue; pred: iteration j exists)
        mbarrier_expect bars[j], bytes of all boxes; tma_copy -> ring[j] on bars[j]
    for iv ... (slot, phase):
        mbarrier_wait bars[slot], phase                 (this iteration's boxes landed)
        acc = warpgroup_mma ring_a[slot], ring_b[slot], acc
        acc = warpgroup_mma_wait 1 acc                  (iteration i - 1's wgmma retired)
        r = (slot + S - 1) % S                          (the slot iteration i - 1 read)
        mbarrier_arrive per_warp empties[r]             (pred: iteration i - 1 exists)
        mbarrier_wait elected empties[r], phase ^ (slot == 0)
        mbarrier_expect / tma_copy for iteration i + S - 1 into slot r on bars[r]
            (pred: that iteration exists)
        slot = (slot + 1) % S; phase ^= (slot == 0)
    acc = warpgroup_mma_wait 0 acc; mbarrier_invalidate bars[s], empties[s] for every s

Decisions and why:
- Every thread waits on the full barrier itself, so the boxes need no CTA barrier to be
  seen (the cp.async rings do: each thread waits only for its own copies).
- The refill needs no CTA barrier either. The wait(1) retires iteration i - 1's wgmma only
  in the thread that waits, and other warps may still be reading its slot; so each warp,
  past its own wait, arrives on the slot's empty barrier (per warp: one arrival from lane
  0 after a warp sync, count = the warps the accumulator spans, which all run the wgmma),
  and only the elected thread, which issues the TMA, waits for the phase those arrivals
  complete (an `elected` wait: the other warps go straight on to the next full barrier).
  insert_barriers follows this pair (an all-warp arrival releases, an elected wait on
  the same barriers settles for the issuing thread) and adds no barrier in the loop. The
  empty phase is iteration i - 1's round of its slot: `phase`, flipped when iteration i
  opens a round (slot 0). In iteration 0 nothing is released (the arrival is predicated
  off) and the refilled slot, S - 1, was never filled: the wait is for parity 1, which a
  fresh barrier passes.
- The arrival is predicated rather than dropped from the first iteration so that the
  loop body stays one block with no peeled copy.
- The wait scheme is the cp.async rings' (pipeline_dot_loops): one wgmma in flight across
  the back edge where the loop allows it, else the wait(0) stays in the body and the
  copies go out before it (the empty barrier then releases the slot the previous
  iteration's wait(0) retired).
- Copies are issued only for iterations that exist, so no box lands after the loop and
  both barrier sets can be retired.

A loop is taken when its body's wgmmas (at its top level) read boxes that TMA fills in
this form with coordinates computed from the induction variable and loop-invariant values
alone. With several wgmmas (attention: S = Q K^T, then P V), an operand made before the
loop and read only by wgmmas in it (Q's box) stays one buffer, the boxes of every wgmma
share the slot's full barrier (one expect for all their bytes), and the slot is released
after the body's last read of the ring; the last wgmma, accumulating into a value the body
rescales before it, stays in flight across the back edge as with cp.async rings
(pipeline_chained_dots: the next iteration's first wait retires it); in a split's
consumers also with 2 stages, where the previous iteration's slot then goes back right
after that wait (`releases_early`, pipeline_tma_warp_specialize).

A staged operand: an 8-bit B box [K, N], which accelerate_dots copies through registers
into a K-major buffer (wgmma reads such B K-major only), is ringed like the others; its
register read stays in the body, reading the slot, and its buffer becomes two, written and
read by alternate iterations, so that the wgmma can stay in flight while the next
iteration transposes (with one buffer its store would overwrite what that wgmma reads).
The slot is released with the others' after the wgmma (they share its empty barrier), and
such a loop stays in one partition.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ...layouts import MBarrierLayout
from ..ir import (AllocateSharedMemory, Binary, Block, Cast, Compare, ConvertLayout, FenceAsyncShared, For,
                  MBarrierArrive, MBarrierExpect, MBarrierInit, MBarrierInvalidate, MBarrierWait, Op, Permute,
                  SharedIndex, SharedLoad,
                  SharedPermute, SharedStore, TmaAsyncCopyGlobalToShared, Value, WarpgroupMma, WarpgroupMmaWait,
                  Yield)
from ..types import SharedType, i1, i32, i64


@dataclasses.dataclass(frozen=True)
class TmaOperand:
    """One wgmma operand box that TMA fills in the loop body."""

    buffer: Value                 # the box the wgmma reads
    copy: TmaAsyncCopyGlobalToShared
    nbytes: int                   # what the box's expect-tx counts
    dropped: tuple[Op, ...]       # the body ops made for the box, replaced by the ring
    coord_ops: tuple[Op, ...]     # the body's ops computing the copy's coordinates (from iv)
    # The store of the box's register read into the buffer the wgmma reads, when the box is
    # copied through registers to be transposed (an 8-bit B box [K, N]: wgmma reads it
    # K-major only); None when the wgmma reads the box itself.
    staged: Optional[SharedStore] = None


def staged_box(store: SharedStore, defs) -> Optional[Value]:
    """The box whose register read (through layout conversions) `store` writes, or None."""
    op = defs.get(store.value)
    while isinstance(op, ConvertLayout):
        op = defs.get(op.operand)
    return op.buffer if isinstance(op, SharedLoad) else None


def match_staged_tma_operand(operand: Value, defs, uses) -> Optional[TmaOperand]:
    """The TmaOperand of a wgmma operand buffer made before the loop that the body fills
    only by storing a TMA box's register read (accelerate_dots' transposition of an 8-bit
    B box [K, N]), or None. The box gets a ring; the store stays in the body, reading the
    slot, and writes the one buffer the wgmma reads."""
    if defs.get(operand) is not None:
        return None
    inside = {id(op) for op in defs.body.ops}
    writers = [op for op in uses.readers[operand] if isinstance(op, SharedStore)]
    if len(writers) != 1 or id(writers[0]) not in inside or \
            not all(isinstance(op, (SharedStore, WarpgroupMma)) for op in uses.readers[operand]):
        return None
    box = staged_box(writers[0], defs)
    if box is None:
        return None
    found = match_tma_operand(box, defs, uses, staged=writers[0])
    return None if found is None else dataclasses.replace(found, staged=writers[0])


def transposes_a_box(store: SharedStore, defs) -> bool:
    """True when `store` writes a TMA box's register read (see match_staged_tma_operand)."""
    return staged_box(store, defs) is not None


def match_tma_operand(operand: Value, defs, uses, staged: Optional[SharedStore] = None) -> Optional[TmaOperand]:
    """The TmaOperand of the wgmma operand `operand` (a box, or a permuted view of one),
    or None when it is not a box TMA fills in the body as desc.load does. With `staged`,
    `operand` is a box read into registers only for that store."""
    from .pipeline_dot_loops import _slice

    body = defs.body
    view = defs.get(operand)
    buffer = view.buffer if isinstance(view, SharedPermute) else operand
    if not isinstance(defs.get(buffer), AllocateSharedMemory) or defs.get(buffer).init is not None:
        return None
    readers = uses.readers[buffer]
    copies = [op for op in readers if isinstance(op, TmaAsyncCopyGlobalToShared)]
    reads = [op for op in readers if isinstance(op, SharedLoad)]
    others = [op for op in readers if not isinstance(op, (TmaAsyncCopyGlobalToShared, SharedLoad))]
    if len(copies) != 1 or copies[0].pred is not None or copies[0].multicast is not None or \
            len(others) != (staged is None) or (isinstance(view, SharedPermute) and others[0] is not view):
        return None  # the box must be filled once and read only by the wgmma (or its view)
    copy = copies[0]
    bar = copy.barrier
    if not isinstance(defs.get(bar), AllocateSharedMemory):
        return None
    bar_ops = uses.readers[bar]
    expects = [op for op in bar_ops if isinstance(op, MBarrierExpect)]
    waits = [op for op in bar_ops if isinstance(op, MBarrierWait)]
    if len(bar_ops) != 5 or len(expects) != 1 or len(waits) != 1 or not isinstance(expects[0].nbytes, int) \
            or expects[0].pred is not None \
            or sum(isinstance(op, (MBarrierInit, MBarrierInvalidate)) for op in bar_ops) != 2:
        return None
    unused = _unused_reads(reads, uses) if staged is None else _staging_reads(reads, staged, uses)
    if unused is None:
        return None  # the box is read into registers too: keep it as it is
    coord_ops = []
    for coord in copy.coords:
        ops = _slice(coord, defs, body.args[:1])
        if ops is None:
            return None
        coord_ops += [op for op in ops if all(op is not other for other in coord_ops)]
    order = {id(op): i for i, op in enumerate(body.ops)}
    coord_ops.sort(key=lambda op: order[id(op)])
    dropped = [defs.get(buffer), defs.get(bar), *bar_ops, copy, *unused]
    if any(id(op) not in order for op in dropped):
        return None  # something of it sits in a nested region
    return TmaOperand(buffer, copy, expects[0].nbytes, tuple(dropped), tuple(coord_ops))


# What desc.load's unused register read may pass through before nothing reads it.
_PURE_READS = (SharedLoad, ConvertLayout, Permute)


def _unused_reads(reads: list[Op], uses) -> Optional[list[Op]]:
    """The register reads of a box and every op computing from them, when nothing but such
    ops reads them (the dot reads the box instead); None when something uses the values."""
    found, pending = [], list(reads)
    while pending:
        op = pending.pop()
        if not isinstance(op, _PURE_READS):
            return None
        if all(op is not seen for seen in found):
            found.append(op)
            pending.extend(uses.readers[op.result])
    return found


def _staging_reads(reads: list[Op], staged: SharedStore, uses) -> Optional[list[Op]]:
    """The box's register reads other than the one that reaches `staged` alone (through
    layout conversions) when nothing uses them (desc.load's own read), else None."""
    for read in reads:
        op = read
        while op is not staged:
            readers = uses.readers[op.result]
            if len(readers) != 1 or not isinstance(readers[0], (ConvertLayout, SharedStore)):
                break
            op = readers[0]
        if op is staged:
            return _unused_reads([other for other in reads if other is not read], uses)
    return None


class SlotBarriers:
    """A ring's two mbarriers a slot, for a pipeliner with `stages`, `readers` (the warps
    that release a slot) and `loop`: `full` (the slot's data has landed: `full_count`
    arrivals, the expect of the thread issuing TMA or every copying thread) and `empty`
    (every reader has released it); and the (slot, phase) a loop over the ring carries."""

    def allocate_barriers(self, out, full_count: int) -> None:
        barrier = MBarrierLayout(rank=1)
        shape = (self.stages, 1)
        self.bars = out.emit(AllocateSharedMemory, SharedType(shape, i64, barrier.to_linear(shape), barrier), "bars")
        self.empties = out.emit(AllocateSharedMemory, SharedType(shape, i64, barrier.to_linear(shape), barrier),
                                "empties")
        self.bar_type = SharedType((1,), i64, barrier.to_linear((1,)), barrier)
        for s in range(self.stages):
            out.ops.append(MBarrierInit(barrier=self.bar(out, out.int(s)), count=full_count, loc=self.loop.loc))
            out.ops.append(MBarrierInit(barrier=self.empty(out, out.int(s)), count=self.readers, loc=self.loop.loc))

    def bar(self, out, slot: Value) -> Value:
        return out.emit(SharedIndex, self.bar_type, "bar", buffer=self.bars, index=slot)

    def empty(self, out, slot: Value) -> Value:
        return out.emit(SharedIndex, self.bar_type, "empty", buffer=self.empties, index=slot)

    def retire_barriers(self, after) -> None:
        for s in range(self.stages):
            after.ops.append(MBarrierInvalidate(barrier=self.bar(after, after.int(s)), loc=self.loop.loc))
            after.ops.append(MBarrierInvalidate(barrier=self.empty(after, after.int(s)), loc=self.loop.loc))

    def advance(self, out, slot: Value, phase: Value) -> tuple[Value, Value]:
        """The next iteration's (slot, phase): the phase flips where the slot wraps to 0."""
        next_slot = out.binary("mod", out.binary("add", slot, out.int(1)), out.int(self.stages), "slot")
        wrapped = out.emit(Cast, i32, operand=out.emit(Compare, i1, predicate="eq", lhs=next_slot, rhs=out.int(0)))
        return next_slot, out.emit(Binary, i32, "phase", kind="xor", lhs=phase, rhs=wrapped)


class TmaLoopPipeliner(SlotBarriers):
    """The rewrite of one loop whose wgmma operands are TMA boxes."""

    warp_specialized = False  # the consumer half of a split (pipeline_tma_warp_specialize)
    # Whether the previous iteration's slot goes back right after the wait that retired
    # its last reader rather than after this iteration's reads (a split's 2-stage ring).
    releases_early = False

    def __init__(self, loop: For, stages: int, step: int, operands: list[TmaOperand], uses):
        self.loop, self.stages, self.step, self.operands, self.uses = loop, stages, step, operands, uses
        self.nbytes = sum(operand.nbytes for operand in operands)
        self.deferred = None
        self.chained = None  # set by body(): a ChainedWait (pipeline_chained_dots)
        # A staged operand's buffer -> its two buffers, alternate iterations' (plan_tma_loop):
        # iteration i + 1 stores into one while iteration i's wgmma may still read the other.
        self.transposed: dict[Value, Value] = {}
        wgmma = next(op for op in loop.body.ops if isinstance(op, WarpgroupMma))
        # Every warp of the kernel runs the wgmma (its accumulator spans them) and releases the slot.
        self.readers = wgmma.result.type.layout.in_dim_size("warp")

    def allocations(self, out) -> None:
        """The rings and their barriers, before the loop, the barriers initialised."""
        self.rings = {}
        for operand in self.operands:
            box: SharedType = operand.buffer.type
            shape = (self.stages,) + box.shape
            self.rings[operand.buffer] = out.emit(AllocateSharedMemory, SharedType(
                shape, box.element, box.encoding.to_linear(shape), box.encoding), operand.buffer.hint)
        self.allocate_barriers(out, full_count=1)  # the expect of the thread that issues the copies

    def release(self, out, iv: Value, previous: Value) -> None:
        """Iteration i - 1's slot (`previous`), whose wgmma has retired: every warp hands it
        back on its empty barrier (when iteration i - 1 exists)."""
        started = out.emit(Compare, i1, predicate="ne", lhs=iv, rhs=self.loop.lower)
        out.ops.append(MBarrierArrive(barrier=self.empty(out, previous), pred=started, per_warp=True,
                                      loc=self.loop.loc))

    def acquire(self, out, slot: Value, phase: Value, refill: Value) -> None:
        """The elected thread waits for the release of `refill` (iteration i - 1's slot).
        The phase is iteration i - 1's: `phase`, flipped when iteration i opens a round of
        the ring (slot 0). In iteration 0 the wait is for parity 1, which a fresh barrier
        passes (the slot it refills was never filled)."""
        opens = out.emit(Cast, i32, operand=out.emit(Compare, i1, predicate="eq", lhs=slot, rhs=out.int(0)))
        released = out.emit(Binary, i32, "released", kind="xor", lhs=phase, rhs=opens)
        out.ops.append(MBarrierWait(barrier=self.empty(out, refill), phase=released, elected=True,
                                    loc=self.loop.loc))

    def issue(self, out, iv: Value, slot: Value) -> None:
        """The boxes of the iteration at `iv` into ring slot `slot`, if that iteration exists."""
        from .pipeline_dot_loops import clone

        exists = out.emit(Compare, i1, predicate="lt", lhs=iv, rhs=self.loop.upper)
        bar = self.bar(out, slot)
        out.ops.append(MBarrierExpect(barrier=bar, nbytes=self.nbytes, pred=exists, loc=self.loop.loc))
        for operand in self.operands:
            mapping = {self.loop.body.args[0]: iv}
            out.ops.extend(clone(operand.coord_ops, mapping))
            view = out.emit(SharedIndex, operand.buffer.type, operand.buffer.hint,
                            buffer=self.rings[operand.buffer], index=slot)
            out.ops.append(dataclasses.replace(operand.copy, coords=tuple(mapping.get(c, c) for c in operand.copy.coords),
                                               barrier=bar, buffer=view, pred=exists))

    def prologue(self, out) -> None:
        loop = self.loop
        self.allocations(out)
        for j in range(self.stages - 1):
            iv = loop.lower if j == 0 else out.binary("add", loop.lower, out.int(j * self.step))
            self.issue(out, iv, out.int(j))

    def body(self) -> Block:
        from .pipeline_chained_dots import accumulator_wait, chained_wait
        from .pipeline_dot_loops import Emitter, deferred_wait, substitute

        loop, stages = self.loop, self.stages
        body = loop.body
        iv = body.args[0]
        slot, phase = Value(i32, "slot"), Value(i32, "phase")
        dropped = {id(op) for operand in self.operands for op in operand.dropped}
        first = min(i for i, op in enumerate(body.ops) if id(op) in dropped)
        buffers = [operand.buffer for operand in self.operands]
        buffers += [op.result for op in body.ops if isinstance(op, SharedPermute) and op.buffer in buffers]
        last_read = max(i for i, op in enumerate(body.ops) if id(op) not in dropped and
                        not isinstance(op, SharedPermute) and any(v in buffers for v in op.uses()))
        staged = any(operand.staged is not None for operand in self.operands)
        self.deferred = deferred_wait(body, last_read, self.uses) if stages >= 3 else None
        if self.deferred is None and not staged and (stages >= 3 or self.warp_specialized):
            self.chained = chained_wait(body, last_read, self.uses)  # attention's P V, left in flight
        # With no generic-proxy store in the body, its fences guarded only the boxes.
        unfenced = not any(isinstance(op, SharedStore) for op in body.walk())
        # The fence after a staged operand's store (before the wgmma) orders every generic
        # access of the slots before it, the staging reads included, before the refills.
        fenced_by = max((i for i, op in enumerate(body.ops) if any(op is operand.staged for operand in self.operands)),
                        default=-1)
        views: dict[Value, Value] = {}
        out = Emitter(loop.loc)
        for position, op in enumerate(body.ops):
            if self.deferred is not None and op is self.deferred.wait:
                continue
            if self.chained is not None and op is self.chained.wait:
                views[op.results[0]] = op.deps[0]  # yielded in flight
                continue
            if position == first:
                out.ops.append(MBarrierWait(barrier=self.bar(out, slot), phase=phase, loc=loop.loc))
                for operand in self.operands:
                    views[operand.buffer] = out.emit(SharedIndex, operand.buffer.type, operand.buffer.hint,
                                                     buffer=self.rings[operand.buffer], index=slot)
                self.alternate(out, iv, views)
            if id(op) in dropped or isinstance(op, FenceAsyncShared) and (unfenced and position < last_read
                                                                          or position < fenced_by):
                continue  # no generic-proxy access of the boxes is left to fence
            if isinstance(op, Yield):
                next_slot = out.binary("mod", out.binary("add", slot, out.int(1)), out.int(stages), "slot")
                wrapped = out.emit(Cast, i32, operand=out.emit(Compare, i1, predicate="eq", lhs=next_slot,
                                                                rhs=out.int(0)))
                next_phase = out.emit(Binary, i32, "phase", kind="xor", lhs=phase, rhs=wrapped)
                out.ops.append(Yield(values=op.values + (next_slot, next_phase), loc=op.loc))
                continue
            out.ops.append(substitute(op, views))
            if self.chained is not None and op is self.chained.earlier:
                arg = body.args[1 + self.chained.carried]
                views[arg] = accumulator_wait(self.chained, arg, out.ops)
                if self.releases_early:  # that wait retired the previous iteration's P V
                    self.after_reads(out, iv, slot, phase)
            if position == last_read:
                if self.deferred is not None:
                    out.ops.append(dataclasses.replace(self.deferred.wait, pending=1))
                if not (self.releases_early and self.chained is not None):
                    self.after_reads(out, iv, slot, phase)
        return Block(body.args + (slot, phase), tuple(out.ops))

    def alternate(self, out, iv: Value, views: dict[Value, Value]) -> None:
        """The staged buffers' halves this iteration writes and its wgmma reads: the
        iteration's number, (iv - lower) // step, mod 2."""
        if not self.transposed:
            return
        number = out.binary("floordiv", out.binary("sub", iv, self.loop.lower), out.int(self.step))
        parity = out.binary("mod", number, out.int(2), "parity")
        for buffer, halves in self.transposed.items():
            views[buffer] = out.emit(SharedIndex, buffer.type, buffer.hint, buffer=halves, index=parity)

    def after_reads(self, out, iv: Value, slot: Value, phase: Value) -> None:
        """After the iteration's last read of its slot (and wait): release the previous
        iteration's slot and refill it for iteration i + S - 1."""
        ahead = out.binary("add", iv, out.int((self.stages - 1) * self.step))
        refill = self.refill_slot(out, slot)
        self.release(out, iv, refill)
        self.acquire(out, slot, phase, refill)
        self.issue(out, ahead, refill)

    def refill_slot(self, out, slot: Value) -> Value:
        """The slot iteration i (reading `slot`) fills for iteration i + S - 1: the one
        iteration i - 1 read, (slot + S - 1) % S."""
        return out.binary("mod", out.binary("add", slot, out.int(self.stages - 1)), out.int(self.stages))

    def rewrite(self) -> tuple[list[Op], dict[Value, Value]]:
        from .pipeline_dot_loops import Emitter

        out = Emitter(self.loop.loc)
        self.prologue(out)
        loop = self.ringed_loop(out)
        after = Emitter(self.loop.loc)
        replaced = self.drain(after)
        self.retire_barriers(after)
        return out.ops + [loop] + after.ops, replaced

    def ringed_loop(self, out, start: Optional[tuple[Value, Value]] = None, replaced=None) -> For:
        """The loop reading its slots (body()), slot and phase carried from `start` (0, 0
        by default: a fresh ring), its inits read through `replaced`."""
        body = self.body()
        extra = (Value(i32, "slot"), Value(i32, "phase"))
        start = start or (out.int(0), out.int(0))
        inits = tuple((replaced or {}).get(v, v) for v in self.loop.inits)
        return dataclasses.replace(self.loop, body=body, inits=inits + start, results=self.loop.results + extra)

    def drain(self, after) -> dict[Value, Value]:
        """After the loop: the wait for the wgmma left in flight; the loop results it replaces."""
        in_flight_out = self.deferred or self.chained
        if in_flight_out is None:
            return {}
        result = self.loop.results[in_flight_out.carried]
        placed = in_flight_out.wait.results[0].type
        in_flight = after.emit(ConvertLayout, placed, result.hint, operand=result)
        waited = Value(placed, result.hint)
        after.ops.append(WarpgroupMmaWait(results=(waited,), deps=(in_flight,), pending=0,
                                          loc=in_flight_out.wait.loc))
        return {result: after.emit(ConvertLayout, result.type, result.hint, operand=waited)}



def plan_tma_loop(loop: For, stages: int, step: int, defs, uses, split_by_default: bool = False,
                  rings: Optional[dict] = None) -> Optional[TmaLoopPipeliner]:
    """The TmaLoopPipeliner of `loop` (stages and step already checked), or None; split
    into partitions where it asks or `split_by_default` (pipeline_tma_warp_specialize).
    A staged operand's buffer becomes two (`rings`: their allocation replaces its own)."""
    wgmmas = [op for op in loop.body.walk() if isinstance(op, WarpgroupMma)]
    top_level = {id(op) for op in loop.body.ops}
    if not wgmmas or any(id(op) not in top_level for op in wgmmas):
        return None
    operands = []
    for wgmma in wgmmas:
        for buffer in (wgmma.a, wgmma.b):
            if not isinstance(buffer.type, SharedType) or len(wgmmas) > 1 and loop_invariant(buffer, defs, uses):
                continue
            operand = match_tma_operand(buffer, defs, uses) or match_staged_tma_operand(buffer, defs, uses)
            if operand is None:
                return None
            operands.append(operand)
    if not operands:
        return None
    pipeliner = TmaLoopPipeliner(loop, stages, step, operands, uses)
    staged = [operand.staged.buffer for operand in operands if operand.staged is not None]
    if staged:
        for buffer in staged:
            rings[buffer] = pipeliner.transposed[buffer] = Value(SharedType(
                (2,) + buffer.type.shape, buffer.type.element, buffer.type.encoding.to_linear((2,) + buffer.type.shape),
                buffer.type.encoding), buffer.hint)
        return pipeliner  # the transposing store runs in the one partition
    ringed = {id(operand.copy) for operand in operands}
    if any(isinstance(op, TmaAsyncCopyGlobalToShared) and id(op) not in ringed for op in loop.body.walk()):
        # A box the ring does not take (a transposed A read into registers) is copied again
        # each iteration after its generic reads; in a split's consumers nothing orders those
        # reads' fence before that copy, so the loop stays one partition.
        return pipeliner
    from .pipeline_tma_warp_specialize import plan_warp_specialized
    return plan_warp_specialized(pipeliner, defs, uses, split_by_default) or pipeliner


def loop_invariant(buffer: Value, defs, uses) -> bool:
    """True when the loop body only lets wgmmas read `buffer`, made before the loop (Q of
    attention, read by the first of two dots): it stays one buffer beside the rings."""
    inside = {id(op) for op in defs.body.walk()}
    return defs.get(buffer) is None and all(isinstance(op, WarpgroupMma) for op in uses.readers[buffer]
                                            if id(op) in inside)
