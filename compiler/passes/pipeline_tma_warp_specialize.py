"""pipeline_dot_loops, for TMA ring loops written `tl.range(..., warp_specialize=True)`
and, by default, for the kernel's top-level TMA ring dot loops where it pays
(`default_split_loops`):
a producer partition fills the ring while the kernel's warps only wait, multiply and
release (the form of the lowlevel `warp_specialized_matmul`). `warp_specialize=False`
keeps a loop in one partition.

pipeline_tma_loops builds the ring; here its loop is split into the two halves of a
lowlevel `warp_specialize`:

    rings, bars, empties allocated and initialised as in pipeline_tma_loops
    results = warp_specialize captures {
      default (the kernel's num_warps warps: the consumers):
        for iv ... (slot, phase):
            mbarrier_wait bars[slot], phase
            acc = warpgroup_mma ring_a[slot], ring_b[slot], acc; acc = warpgroup_mma_wait 1 acc
            mbarrier_arrive per_warp empties[(slot + S - 1) % S]   (pred: iteration i - 1 exists)
        acc = warpgroup_mma_wait 0 acc
        the code after the loop (the epilogue; warp_specialize_epilogues moves it here)
    } worker (1 warp: the producer) {
        for iv ... (slot, phase):
            mbarrier_wait empties[slot], phase ^ 1          (iteration i - S released the slot)
            mbarrier_expect bars[slot], bytes; tma_copy coords(iv) -> ring[slot] on bars[slot]
    } idle workers (2 + 1 warps: the rest of the producer's warpgroup)
    mbarrier_invalidate bars[s], empties[s]

Decisions and why:
- One producer warp: one thread issues every TMA copy and expect; more warps would only
  idle. setmaxnreg acts on whole warpgroups, so idle partitions fill the producer's
  warpgroup (as lowlevel's warp_specialize does) and take its budget.
- Budgets: the producer's warpgroup gets PRODUCER_REGS (it holds a few coordinates, the
  slot and the phase; the lowlevel matmul's producer budget); the consumers get what the
  register file has left per thread, at most MAX_CONSUMER_REGS and a multiple of 8 (the
  rule of lowlevel's warp_specialize), for the accumulator.
- The producer has no prologue and no lookahead count: it runs as far ahead as the empty
  barriers let it, S slots. Its first round waits for parity 1, which fresh barriers
  pass. The consumers release iteration i - 1's slot after their wait(1) retired its
  wgmma (or, where the loop keeps no wgmma in flight, after the previous iteration's
  wait(0)): the same per-warp arrivals as the one-partition ring, empties initialised for
  num_warps of them. The last iteration's slot is never released: no refill waits for it.
- A 2-stage ring of a chained-dot loop (attention's 128 x 128 tiles at head_dim 128,
  whose 64 KB of K and V a stage fit only twice beside Q and O) keeps P V in flight as
  deeper rings do, and the consumers release the previous iteration's slot right after
  the wait that retires that P V, before the softmax: released after this iteration's
  reads, as deeper rings have it, both slots would be held until the iteration's end
  and the producer could not fill the next block while the iteration runs. Not under
  dot_ahead, whose rewrite puts the release after the P V it issues late
  (issue_dot_ahead).
- The barriers are retired after the partitions join: the producer's last copies name
  their full barrier after its expect released what it did, so no wait of the
  consumers orders that access before an invalidate of theirs.
- The epilogue goes into the consumer partition (`warp_specialize_epilogues`, right after
  this pass) rather than taking the accumulator out as a result: a result lives across
  the partitions' join in every warp, the producer's 40-register warps included, and
  ptxas spills it. So only loops at the top level of the kernel are split, and one split
  per kernel (partitions do not nest). A loop body that reads tensors made before the
  loop gets them made again inside the consumer partition when they are pure functions
  of scalars (attention's row and column offsets, the initial m and l); anything else
  keeps the one-partition ring (a captured tensor would have to be laid out over the
  producer's warps too).
- Loops asking for a split one after the other at the top level, with only pure ops
  between them that read none of their results (causal attention's loop left of the
  diagonal, then the diagonal's, the second starting from the first's m, l and acc), are
  one split (`SplitGroup`, `rewrite_split`): the consumers run the loops in order, the
  producer walks every loop's boxes in the same order, and the pure ops go before the
  split. One split rather than one per loop because a loop's results would cross a
  join (the spills above) and because two splits would be two setmaxnreg round trips
  and the second producer could not run ahead into the second loop while the consumers
  finish the first. A loop whose boxes have the first's shapes fills the same ring: its
  (slot, phase) starts where the loop before stopped, on both sides, so no more shared
  memory is taken (at head_dim 128 two rings would not fit beside Q), and the producer
  streams the second loop's first boxes while the consumers run the first's last. The
  first loop's last slot, which no later iteration of that loop releases, is handed back
  by every consumer warp after the loop's drain (when the loop ran at all), before the
  second loop, whose own first release stays predicated off.
- By default (warp_specialize not given) the split is taken where it applies and costs
  no occupancy: the producer warp keeps the copies off the consumers' issue slots, but
  the setmaxnreg budgets give the CTA the whole register file, so a split kernel runs
  one CTA per SM. So the default asks for a ring too large for two CTAs' shared memory
  (DEFAULT_SPLIT_RING_BYTES), where the one-partition kernel runs one CTA per SM anyway:
  the large tiles that reach the tensor cores' peak (128x256x64 fp16 in 3 stages,
  128x128x64 in 4). And only where nothing can make it fail later: one top-level dot
  loop in the kernel (a second split is an error, and which to pick is not obvious),
  and an epilogue that warp_specialize_epilogues can move.
- Loops of two chained dots (attention: the second dot's A operand is computed in
  registers from the first's result, P from S) are split by default with two consumer
  warpgroups (num_warps 8) from a smaller ring, DEFAULT_SPLIT_CHAINED_RING_BYTES, and
  so are such loops in a row at the top level (causal attention's two key loops, one
  SplitGroup as when both ask): their consumers take turns at the tensor cores
  (pingpong_warpgroups), one warpgroup's softmax beside the other's wgmmas, which the
  one partition cannot do. What decides whether that pays is the size of the K and V
  boxes: on an H200 (128 x 64 tiles, 3 stages) the split ran 1.20x the one partition at
  head_dim 128 (32 KB of boxes a stage, a 96 KB ring; 1.24x causal), and 0.97x at
  head_dim 64 (16 KB a stage, 48 KB), where two CTAs of the one-partition kernel fit
  an SM's shared memory (64 KB each with Q) and the split's register budgets allow one.
  So the line is drawn above a 64 KB ring: head_dim 64 boxes stay one partition up to
  4 stages, head_dim 128 ones split from 3 (at 2 no ping-pong applies). Larger rings
  split by the rule above at any warp count.
  Where the default does not apply, nothing is said; an explicit request that cannot
  be honoured still warns (pipeline_dot_loops).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..errors import CompilationError
from ..hardware import REGISTER_FILE, SHARED_LIMIT, SHARED_RESERVED_PER_CTA, SM_SHARED, WARPS_PER_WARPGROUP
from ..ir import (Binary, Block, Compare, Constant, For, Kernel, MBarrierArrive, MBarrierInvalidate,
                  MBarrierWait, Op, SharedIndex, Value, WarpgroupMma, WarpSpecialize, Yield)
from .pipeline_carried_state import clone_deep
from ..types import SharedType, TensorType, i1, i32
from .pipeline_tma_loops import TmaLoopPipeliner

PRODUCER_WARPS = 1
PRODUCER_REGS = 40
MAX_CONSUMER_REGS = 240
IDLE_WARPS = (2, 1)  # the rest of the producer's warpgroup, as powers of two
# The smallest ring split by default: more than half an SM's shared memory (each CTA's
# 1 KB reserve included), so no second CTA would fit beside the one-partition kernel.
DEFAULT_SPLIT_RING_BYTES = SM_SHARED // 2 - SHARED_RESERVED_PER_CTA + 1
# The smallest ring of a chained-dot loop split by default with two consumer warpgroups:
# above head_dim 64's K and V boxes at 4 stages (see the module docstring).
DEFAULT_SPLIT_CHAINED_RING_BYTES = 64 * 1024 + 1
DEFAULT_SPLIT_CHAINED_READERS = 2 * WARPS_PER_WARPGROUP


def consumer_registers(num_warps: int) -> int:
    """The consumers' setmaxnreg budget: the register file less the producer warpgroup's,
    shared by the num_warps consumer warps."""
    share = (REGISTER_FILE - 32 * WARPS_PER_WARPGROUP * PRODUCER_REGS) // (32 * num_warps)
    return min(MAX_CONSUMER_REGS, share - share % 8)


class WarpSpecializedTmaLoop(TmaLoopPipeliner):
    """The rewrite of a TMA ring loop into producer and consumer partitions."""

    warp_specialized = True
    joins_groups = True  # loops in a row at the top level split together (SplitGroup)

    def worker_partitions(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(warps, register budget) of each worker partition: the producer warp, then
        the idle warps that fill its warpgroup."""
        return (PRODUCER_WARPS, *IDLE_WARPS), (PRODUCER_REGS,) * (1 + len(IDLE_WARPS))

    def consumer_registers(self) -> int:
        return consumer_registers(self.readers)

    def kept_results(self) -> tuple[Value, ...]:
        return self.loop.results

    def after_reads(self, out, iv: Value, slot: Value, phase: Value) -> None:
        """The consumers only hand the previous iteration's slot back; the producer refills it."""
        self.release(out, iv, self.refill_slot(out, slot))

    def producer_loop(self, out, start: tuple[Value, Value]) -> tuple[Value, Value]:
        """Every iteration's boxes, each into its slot once the consumers released it, from
        (slot, phase) `start`; returns the (slot, phase) after the last."""
        from .pipeline_dot_loops import Emitter

        loop = self.loop
        body = Emitter(loop.loc)
        iv, slot, phase = Value(i32, loop.body.args[0].hint), Value(i32, "slot"), Value(i32, "phase")
        released = body.emit(Binary, i32, "released", kind="xor", lhs=phase, rhs=body.int(1))
        body.ops.append(MBarrierWait(barrier=self.empty(body, slot), phase=released, loc=loop.loc))
        self.issue(body, iv, slot)
        next_slot, next_phase = self.advance(body, slot, phase)
        body.ops.append(Yield(values=(next_slot, next_phase), loc=loop.loc))
        ends = (Value(i32, "slot"), Value(i32, "phase"))
        out.ops.append(For(results=ends, lower=loop.lower, upper=loop.upper, step=loop.step, inits=start,
                           body=Block((iv, slot, phase), tuple(body.ops)), loc=loop.loc))
        return ends

    def shares_ring_of(self, earlier: "WarpSpecializedTmaLoop") -> bool:
        """True when this loop's boxes fit `earlier`'s ring slot for slot (the causal
        attention's two loops over the same K and V boxes)."""
        return isinstance(earlier, WarpSpecializedTmaLoop) and self.stages == earlier.stages and \
            self.readers == earlier.readers and \
            [(o.buffer.type, o.nbytes) for o in self.operands] == [(o.buffer.type, o.nbytes) for o in earlier.operands]

    def take_ring(self, earlier: "WarpSpecializedTmaLoop") -> None:
        """Use `earlier`'s rings and barriers (shares_ring_of holds)."""
        self.rings = {mine.buffer: earlier.rings[theirs.buffer] for mine, theirs in zip(self.operands, earlier.operands)}
        self.bars, self.empties, self.bar_type = earlier.bars, earlier.empties, earlier.bar_type

    def release_last(self, out, ends: tuple[Value, Value]) -> None:
        """After the loop and its drain, in the consumers: the last iteration's slot handed
        back (when the loop ran), for a later loop that fills the same ring."""
        ran = out.emit(Compare, i1, predicate="lt", lhs=self.loop.lower, rhs=self.loop.upper)
        last = self.refill_slot(out, ends[0])
        out.ops.append(MBarrierArrive(barrier=self.empty(out, last), pred=ran, per_warp=True, loc=self.loop.loc))

    def rewrite(self) -> tuple[list[Op], dict[Value, Value]]:
        return rewrite_split([self])

    def one_partition(self) -> TmaLoopPipeliner:
        """The one-partition ring of the same loop."""
        return TmaLoopPipeliner(self.loop, self.stages, self.step, self.operands, self.uses)

class SplitGroup:
    """Warp-specialized loops in a row at the top level of the kernel (causal attention's
    two key loops), split into one warp_specialize by rewrite_split: pipeline_dot_loops
    holds each planned split here until an op comes that cannot go with them. Pure ops
    between two of them that read none of their results go before them."""

    def __init__(self, dot_ahead=None):
        self.dot_ahead = dot_ahead  # the launch's option: issue_dot_ahead matches late releases only
        self.loops: list[WarpSpecializedTmaLoop] = []
        self.held: list[Op] = []  # pure ops after the last loop: before the next one that joins, else after

    def results(self) -> set[Value]:
        return {value for split in self.loops for value in split.loop.results}

    def may_extend(self, op: Op) -> bool:
        """False when `op` surely ends the group: neither a loop asking for a split (with
        no loop inside it) nor a pure op that hoists."""
        if not self.loops:
            return True
        if isinstance(op, For):
            return asked_split(op) is not False and not any(isinstance(inner, For) for inner in op.body.walk())
        return self.hoists(op)

    def hoists(self, op: Op) -> bool:
        from .pipeline_dot_loops import PURE_OPS

        results = self.results()
        return bool(self.loops) and isinstance(op, PURE_OPS) and not any(value in results for value in op.uses())

    def take(self, split: WarpSpecializedTmaLoop) -> bool:
        """True when `split` joins the group: the results of earlier loops it reads are the group's."""
        if not split.earlier_results <= self.results():
            return False
        if self.loops and not (split.joins_groups and self.loops[0].joins_groups):
            return False
        split.releases_early = releases_early(split, self.dot_ahead)
        self.loops.append(split)
        return True

    def rewrite(self) -> tuple[list[Op], dict[Value, Value]]:
        return rewrite_split(self.loops)


def releases_early(split: WarpSpecializedTmaLoop, dot_ahead) -> bool:
    """Whether the consumers of `split` release the previous iteration's slot right after
    the wait that retires its last reader (see the module docstring): 2-stage rings, not
    under the launch option `dot_ahead`."""
    return split.stages == 2 and dot_ahead in (None, False)


def rewrite_split(loops: list[WarpSpecializedTmaLoop]) -> tuple[list[Op], dict[Value, Value]]:
    """The ops in place of `loops` (consecutive top-level loops, each planned for a split)
    and what reads their results in their place: one warp_specialize whose consumers run
    the loops in order and whose producer fills every loop's boxes, in the same order.
    A loop whose boxes fit the ring before it fills that ring, its (slot, phase) carried
    on from where the earlier loop stopped on both sides (see the module docstring)."""
    from .pipeline_dot_loops import Emitter

    first = loops[0]
    loc = first.loop.loc
    out, consumer, producer = Emitter(loc), Emitter(loc), Emitter(loc)
    owners, replaced = [], {}
    earlier, consumer_at, producer_at = None, None, None
    for split in loops:
        if earlier is not None and split.shares_ring_of(earlier):
            split.take_ring(earlier)
            earlier.release_last(consumer, consumer_at)
        else:
            split.allocations(out)
            owners.append(split)
            zero = producer.int(0)
            consumer_at, producer_at = (consumer.int(0), consumer.int(0)), (zero, zero)
        ringed = split.ringed_loop(consumer, consumer_at, replaced)
        consumer.ops.append(ringed)
        consumer_at = ringed.results[-2:]
        replaced.update(split.drain(consumer))
        producer_at = split.producer_loop(producer, producer_at)
        earlier = split
    results = tuple(v for split in loops for v in split.kept_results())
    consumer.ops.append(Yield(values=tuple(replaced.get(v, v) for v in results), loc=loc))
    producer.ops.append(Yield(loc=loc))
    default_ops = remade_tensors(consumer.ops, loops)
    producer_ops = producer.ops  # a cp.async producer reads tensors too: made again there
    if any(isinstance(v.type, TensorType) for v in free_values(producer_ops)):
        producer_ops = remade_tensors(producer_ops, loops)
    captures = free_values(default_ops + producer_ops)
    default = captured_block(default_ops, captures)
    warps, budget = first.worker_partitions()
    workers = [captured_block(producer_ops, captures)]
    workers += [Block(tuple(Value(v.type, v.hint) for v in captures), (Yield(loc=loc),)) for _ in warps[1:]]
    outputs = tuple(Value(v.type, v.hint) for v in results)
    split = WarpSpecialize(results=outputs, captures=captures, default=default, workers=tuple(workers),
                           worker_num_warps=warps, worker_num_regs=budget,
                           default_num_regs=first.consumer_registers(), loc=loc)
    after = Emitter(loc)
    for owner in owners:
        owner.retire_barriers(after)
    return out.ops + [split] + after.ops, dict(zip(results, outputs))


def remade_tensors(ops: list[Op], loops: list[WarpSpecializedTmaLoop]) -> list[Op]:
    """`ops` preceded by the tensors they read from outside, computed again from scalars
    (see the module docstring)."""
    slices = {value: found for split in loops for value, found in split.outer_slices.items()}
    remade = []
    for value in free_values(ops):
        if isinstance(value.type, TensorType):
            remade += [op for op in slices[value] if all(op is not seen for seen in remade)]
    order = loops[0].outer_order
    remade.sort(key=lambda op: order[id(op)])
    mapping: dict[Value, Value] = {}
    return clone_deep(remade, mapping) + clone_deep(ops, mapping)


def free_values(ops: list[Op], bound=()) -> tuple[Value, ...]:
    """The values `ops` (regions included) read but neither define nor find in `bound`
    (their block's args), in first-read order."""
    defined: set[Value] = set(bound)
    found: dict[Value, None] = {}

    def visit(block_ops) -> None:
        for op in block_ops:
            for value in op.uses():
                if value not in defined:
                    found.setdefault(value, None)
            for region in op.nested_blocks():
                defined.update(region.args)
                visit(region.ops)
            defined.update(op.defines())

    visit(ops)
    return tuple(found)


def captured_block(ops: list[Op], captures: tuple[Value, ...]) -> Block:
    """`ops` as a partition block whose args stand for `captures`."""
    args = tuple(Value(v.type, v.hint) for v in captures)
    return Block(args, tuple(clone_deep(ops, dict(zip(captures, args)))))


def asked_split(loop: For) -> Optional[bool]:
    """What the loop's tl.range(warp_specialize=) said; None where it said nothing."""
    return None if loop.schedule is None else loop.schedule.warp_specialize


def plan_warp_specialized(pipeliner: TmaLoopPipeliner, defs, uses,
                          split_by_default: bool = False) -> Optional[WarpSpecializedTmaLoop]:
    """The split of `pipeliner`'s loop, when it asked for one (or is the kernel's default
    split and did not refuse it) and can have it (see the module docstring), else None
    (the one-partition ring stays)."""
    loop = pipeliner.loop
    asked = asked_split(loop)
    if not (asked or asked is None and split_by_default and pays_by_default(pipeliner)):
        return None
    if not loop.results or loop.results[0] not in uses.top_level or pipeliner.readers % WARPS_PER_WARPGROUP:
        return None
    captures = split_captures(loop, defs, uses)
    if captures is None:
        return None
    split = WarpSpecializedTmaLoop(loop, pipeliner.stages, pipeliner.step, pipeliner.operands, pipeliner.uses)
    split.outer_slices, split.earlier_results, split.outer_order = captures
    return split


def split_captures(loop: For, defs, uses) -> Optional[tuple[dict, set, dict]]:
    """What a split of `loop` reads from before it: the pure ops remaking each tensor,
    the earlier loops' results it reads, and the kernel's op order; None when a tensor
    it reads comes from an op with effects (see the module docstring)."""
    slices, earlier = {}, set()
    for value in free_values(list(loop.body.ops), loop.body.args) + loop.inits:
        if isinstance(value.type, TensorType):
            op = defs.anywhere(value)
            if isinstance(op, For) and value in uses.top_level:
                earlier.add(value)  # an earlier loop's result: joins only that loop's split
                continue
            found = tensor_slice(value, defs.outer)
            if found is None:
                return None
            slices[value] = found
    return slices, earlier, {id(op): i for i, op in enumerate(defs.outer.values())}


def pays_by_default(pipeliner: TmaLoopPipeliner) -> bool:
    """True when the default splits `pipeliner`'s loop: a ring too large for two CTAs an
    SM, or a chained-dot loop's ring of large boxes read by two consumer warpgroups
    (see the module docstring)."""
    return fits_beside_epilogue(pipeliner) and ring_split_by_default(
        pipeliner.stages * pipeliner.nbytes, chained_dots(pipeliner.loop), pipeliner.readers)


def ring_split_by_default(ring_bytes: int, chained: bool, readers: int) -> bool:
    """pays_by_default's line for a ring of `ring_bytes` whose slots `readers` warps release,
    in a loop of chained dots or not (also asked before the rings exist:
    stage_block_pointers)."""
    return ring_bytes >= DEFAULT_SPLIT_RING_BYTES or chained and readers == DEFAULT_SPLIT_CHAINED_READERS \
        and ring_bytes >= DEFAULT_SPLIT_CHAINED_RING_BYTES


def fits_beside_epilogue(pipeliner: TmaLoopPipeliner) -> bool:
    """True when the ring, the boxes its wgmmas read from before the loop and a 16-bit copy
    of the largest accumulator fit in shared memory together: a split's producer runs to the
    kernel's end, so its ring is never reused by the epilogue's layout conversions (the
    one-partition ring is, past the loop: attention's 128 x 128 boxes in 3 stages at
    head_dim 128 fit only so)."""
    wgmmas = [op for op in pipeliner.loop.body.walk() if isinstance(op, WarpgroupMma)]
    ringed = {id(operand.buffer) for operand in pipeliner.operands}
    # Views made in the body (a transposed box read as B) are of the ring, not held boxes.
    in_body = {id(value) for op in pipeliner.loop.body.walk() for value in op.defines()}
    invariant = {id(buffer): buffer for op in wgmmas for buffer in (op.a, op.b)
                 if isinstance(buffer.type, SharedType) and id(buffer) not in ringed | in_body}
    def nbytes(value: Value, bits: int) -> int:
        return math.prod(value.type.shape) * bits // 8
    accumulator = max(nbytes(op.result, 16) for op in wgmmas)
    held = sum(nbytes(buffer, buffer.type.element.bits) for buffer in invariant.values())
    return pipeliner.stages * pipeliner.nbytes + held + accumulator <= SHARED_LIMIT


def chained_dots(loop: For) -> bool:
    """True when `loop`'s body holds two wgmmas, the second's A operand a tensor in
    registers computed from the first's result (attention's P from S)."""
    wgmmas = [op for op in loop.body.walk() if isinstance(op, WarpgroupMma)]
    return len(wgmmas) == 2 and isinstance(wgmmas[1].a.type, TensorType) \
        and computed_from(wgmmas[1].a, wgmmas[0].result, loop.body)


def computed_from(value: Value, source: Value, body: Block) -> bool:
    """Whether `value` is `source` or is computed from it by ops of `body`."""
    defined = {result: op for op in body.walk() for result in op.defines()}
    seen, pending = set(), [value]
    while pending:
        value = pending.pop()
        if value is source:
            return True
        op = defined.get(value)
        if op is not None and value not in seen:
            seen.add(value)
            pending.extend(op.uses())
    return False


def tensor_slice(value: Value, outer: dict) -> Optional[list[Op]]:
    """The pure ops computing tensor `value` from scalars (which the partitions capture),
    or None when a tensor on the way comes from an op with effects."""
    from .pipeline_dot_loops import PURE_OPS

    needed: dict[int, Op] = {}
    pending = [value]
    while pending:
        current = pending.pop()
        if not isinstance(current.type, TensorType):
            continue
        op = outer.get(current)
        if not isinstance(op, PURE_OPS):
            return None
        if id(op) not in needed:
            needed[id(op)] = op
            pending.extend(op.uses())
    return list(needed.values())


def default_split_loops(kernel: Kernel) -> set[Value]:
    """The first results of the loops split by default (see the module docstring): the
    one top-level loop with a wgmma, or top-level chained-dot loops in a row with only
    pure ops between them that read none of their results (causal attention), whose
    tl.range said nothing about warp_specialize, when no other top-level loop has a
    wgmma and the code after the last reads only results of the loops, scalars, and
    tensors that are pure functions of scalars. Whether a loop's operands are TMA rings
    and its ring pays, pipeline_dot_loops finds out."""
    from .pipeline_dot_loops import PURE_OPS, Definitions, _slice

    ops = list(kernel.body.ops)
    dot_loops = [i for i, op in enumerate(ops) if isinstance(op, For)
                 and any(isinstance(inner, WarpgroupMma) for inner in op.body.walk())]
    if not dot_loops:
        return set()
    loops = [ops[i] for i in dot_loops]
    if any(asked_split(loop) is not None or not loop.results for loop in loops):
        return set()
    if len(loops) > 1:
        if not all(chained_dots(loop) and not any(isinstance(inner, For) for inner in loop.body.walk())
                   for loop in loops):
            return set()
        results = set()
        for at in range(dot_loops[0], dot_loops[-1] + 1):
            op = ops[at]
            if at in dot_loops:
                results.update(op.results)
            elif not isinstance(op, PURE_OPS) or any(value in results for value in op.uses()):
                return set()
    results = {value for loop in loops for value in loop.results}
    defs = Definitions(kernel.body, {})
    for value in free_values(ops[dot_loops[-1] + 1:]):
        if isinstance(value.type, TensorType) and value not in results \
                and _slice(value, defs, kernel.body.args) is None:
            return set()
    return {loop.results[0] for loop in loops}


def warp_specialize_epilogues(kernel: Kernel) -> Kernel:
    """The code after a warp-specialized loop moved into its consumer partition, which
    yields nothing then (see the module docstring). Tensors it reads from before the
    loop are made again inside when they are pure functions of scalars; a second
    warp-specialized loop after the first is refused."""
    from .pipeline_dot_loops import Definitions, _slice

    ops = list(kernel.body.ops)
    splits = [i for i, op in enumerate(ops) if isinstance(op, WarpSpecialize) and op.results]
    if not splits:
        return kernel
    at = splits[0]
    split, rest = ops[at], ops[at + 1:]
    retired = 0  # the barriers' invalidation stays after the join (see the module docstring)
    while retired < len(rest) and isinstance(rest[retired], (Constant, SharedIndex, MBarrierInvalidate)):
        retired += 1
    retire, rest = rest[:retired], rest[retired:]
    later = [op for op in rest for inner in [op, *(x for r in op.nested_blocks() for x in r.walk())]
             if isinstance(inner, WarpSpecialize)]
    if later:
        raise CompilationError("only one loop of a kernel can be warp-specialized (warp_specialize=True)",
                               later[0].loc, suggestion="drop warp_specialize=True from all loops but one")
    defs = Definitions(kernel.body, {})
    remade: list[Op] = []
    for value in free_values(rest):
        if isinstance(value.type, TensorType) and value not in split.results:
            pure = _slice(value, defs, kernel.body.args)
            if pure is None:
                raise CompilationError("the code after a warp-specialized loop reads a tensor computed "
                                       "from memory before the loop", split.loc,
                                       suggestion="compute it after the loop, or drop warp_specialize=True")
            remade += [op for op in pure if all(op is not seen for seen in remade)]
    order = {id(op): i for i, op in enumerate(ops)}
    remade.sort(key=lambda op: order[id(op)])
    *consumer_ops, yielded = split.default.ops
    mapping = dict(zip(split.results, yielded.values))
    mapping.update(zip(split.captures, split.default.args))
    moved = clone_deep(remade + rest, mapping)
    inside = list(consumer_ops) + moved + [Yield(loc=yielded.loc)]
    args = set(split.default.args)
    fresh = tuple(v for v in free_values(inside) if v not in args)
    captures = split.captures + fresh

    def widened(block: Block, block_ops) -> Block:
        extra = tuple(Value(v.type, v.hint) for v in fresh)
        return Block(block.args + extra, tuple(clone_deep(block_ops, dict(zip(fresh, extra)))))

    default = widened(split.default, inside)
    workers = tuple(widened(worker, list(worker.ops)) for worker in split.workers)
    split = dataclasses.replace(split, results=(), captures=captures, default=default, workers=workers)
    return kernel.with_body(Block(kernel.body.args, tuple(ops[:at]) + (split,) + tuple(retire)))
