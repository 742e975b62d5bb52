"""pipeline_dot_loops, for TMA ring loops written `tl.range(..., warp_specialize=True)`
and, by default, for the kernel's one top-level TMA ring dot loop (`default_split_loop`):
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
- The barriers are retired after the partitions join: the producer's last copies name
  their full barrier after its expect released what it did, so no wait of the
  consumers orders that access before an invalidate of theirs.
- The epilogue goes into the consumer partition (`warp_specialize_epilogues`, right after
  this pass) rather than taking the accumulator out as a result: a result lives across
  the partitions' join in every warp, the producer's 40-register warps included, and
  ptxas spills it. So only loops at the top level of the kernel are split, and one per
  kernel (partitions do not nest). A loop body that reads tensors made before the loop
  gets them made again inside the consumer partition when they are constants; anything
  else keeps the one-partition ring (a captured tensor would have to be laid out over the
  producer's warps too).
- By default (warp_specialize not given) the split is taken where it applies and costs
  no occupancy: the producer warp keeps the copies off the consumers' issue slots, but
  the setmaxnreg budgets give the CTA the whole register file, so a split kernel runs
  one CTA per SM. So the default asks for a ring too large for two CTAs' shared memory
  (DEFAULT_SPLIT_RING_BYTES), where the one-partition kernel runs one CTA per SM anyway:
  the large tiles that reach the tensor cores' peak (128x256x64 fp16 in 3 stages,
  128x128x64 in 4). And only where nothing can make it fail later: one top-level dot
  loop in the kernel (a second split is an error, and which to pick is not obvious),
  and an epilogue that warp_specialize_epilogues can move.
  Where the default does not apply, nothing is said; an explicit request that cannot
  be honoured still warns (pipeline_dot_loops).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..errors import CompilationError
from ..hardware import REGISTER_FILE, SM_SHARED, WARPS_PER_WARPGROUP
from ..ir import (Binary, Block, Cast, Compare, Constant, For, Kernel, MBarrierInvalidate, MBarrierWait, Op,
                  SharedIndex, Value, WarpgroupMma, WarpSpecialize, Yield)
from .pipeline_carried_state import clone_deep
from ..types import TensorType, i1, i32
from .pipeline_tma_loops import TmaLoopPipeliner

PRODUCER_WARPS = 1
PRODUCER_REGS = 40
MAX_CONSUMER_REGS = 240
IDLE_WARPS = (2, 1)  # the rest of the producer's warpgroup, as powers of two
# The smallest ring split by default: more than half an SM's shared memory (each CTA's
# 1 KB reserve included), so no second CTA would fit beside the one-partition kernel.
DEFAULT_SPLIT_RING_BYTES = SM_SHARED // 2 - 1024 + 1


def consumer_registers(num_warps: int) -> int:
    """The consumers' setmaxnreg budget: the register file less the producer warpgroup's,
    shared by the num_warps consumer warps."""
    share = (REGISTER_FILE - 32 * WARPS_PER_WARPGROUP * PRODUCER_REGS) // (32 * num_warps)
    return min(MAX_CONSUMER_REGS, share - share % 8)


class WarpSpecializedTmaLoop(TmaLoopPipeliner):
    """The rewrite of a TMA ring loop into producer and consumer partitions."""

    warp_specialized = True

    def after_reads(self, out, iv: Value, slot: Value, phase: Value) -> None:
        """The consumers only hand the previous iteration's slot back; the producer refills it."""
        self.release(out, iv, self.refill_slot(out, slot))

    def producer_loop(self) -> list[Op]:
        """Every iteration's boxes, each into its slot once the consumers released it."""
        from .pipeline_dot_loops import Emitter

        loop = self.loop
        out = Emitter(loop.loc)
        iv, slot, phase = Value(i32, loop.body.args[0].hint), Value(i32, "slot"), Value(i32, "phase")
        released = out.emit(Binary, i32, "released", kind="xor", lhs=phase, rhs=out.int(1))
        out.ops.append(MBarrierWait(barrier=self.empty(out, slot), phase=released, loc=loop.loc))
        self.issue(out, iv, slot)
        next_slot, next_phase = self.advance(out, slot, phase)
        out.ops.append(Yield(values=(next_slot, next_phase), loc=loop.loc))
        start = Emitter(loop.loc)
        zero = start.int(0)
        return start.ops + [For(results=(Value(i32, "slot"), Value(i32, "phase")), lower=loop.lower,
                                upper=loop.upper, step=loop.step, inits=(zero, zero),
                                body=Block((iv, slot, phase), tuple(out.ops)), loc=loop.loc)]

    def advance(self, out, slot: Value, phase: Value) -> tuple[Value, Value]:
        """The next iteration's (slot, phase): the phase flips where the slot wraps to 0."""
        next_slot = out.binary("mod", out.binary("add", slot, out.int(1)), out.int(self.stages), "slot")
        wrapped = out.emit(Cast, i32, operand=out.emit(Compare, i1, predicate="eq", lhs=next_slot, rhs=out.int(0)))
        return next_slot, out.emit(Binary, i32, "phase", kind="xor", lhs=phase, rhs=wrapped)

    def rewrite(self) -> tuple[list[Op], dict[Value, Value]]:
        from .pipeline_dot_loops import Emitter

        loop = self.loop
        out = Emitter(loop.loc)
        self.allocations(out)
        consumer = Emitter(loop.loc)
        ringed = self.ringed_loop(consumer)
        consumer.ops.append(ringed)
        replaced = self.drain(consumer)
        results = tuple(replaced.get(v, v) for v in loop.results)
        consumer.ops.append(Yield(values=results, loc=loop.loc))
        default_ops = self.remade_tensors(consumer.ops)
        producer_ops = self.producer_loop() + [Yield(loc=loop.loc)]
        captures = free_values(default_ops + producer_ops)
        default = captured_block(default_ops, captures)
        producer = captured_block(producer_ops, captures)
        idle = [Block(tuple(Value(v.type, v.hint) for v in captures), (Yield(loc=loop.loc),)) for _ in IDLE_WARPS]
        outputs = tuple(Value(v.type, v.hint) for v in loop.results)
        budget = (PRODUCER_REGS,) * (1 + len(IDLE_WARPS))
        split = WarpSpecialize(results=outputs, captures=captures, default=default, workers=(producer, *idle),
                               worker_num_warps=(PRODUCER_WARPS, *IDLE_WARPS), worker_num_regs=budget,
                               default_num_regs=consumer_registers(self.readers), loc=loop.loc)
        after = Emitter(loop.loc)
        self.retire_barriers(after)
        return out.ops + [split] + after.ops, dict(zip(loop.results, outputs))

    def remade_tensors(self, ops: list[Op]) -> list[Op]:
        """`ops` preceded by the constant tensors they read from outside (see the module docstring)."""
        remade, mapping = [], {}
        for value in free_values(ops):
            if isinstance(value.type, TensorType):
                op = self.outer_constants[value]
                fresh = Value(value.type, value.hint)
                remade.append(dataclasses.replace(op, result=fresh))
                mapping[value] = fresh
        return remade + clone_deep(ops, mapping)


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
    ring_bytes = pipeliner.stages * sum(operand.nbytes for operand in pipeliner.operands)
    if not (asked or asked is None and split_by_default and ring_bytes >= DEFAULT_SPLIT_RING_BYTES):
        return None
    if not loop.results or loop.results[0] not in uses.top_level or pipeliner.readers % WARPS_PER_WARPGROUP:
        return None
    constants = {}
    for value in free_values(list(loop.body.ops), loop.body.args) + loop.inits:
        if isinstance(value.type, TensorType):
            op = defs.anywhere(value)
            if not isinstance(op, Constant):
                return None
            constants[value] = op
    split = WarpSpecializedTmaLoop(loop, pipeliner.stages, pipeliner.step, pipeliner.operands, pipeliner.uses)
    split.outer_constants = constants
    return split


def default_split_loop(kernel: Kernel) -> Optional[Value]:
    """The first result of the loop split by default (see the module docstring), or None:
    the one top-level loop with a wgmma whose tl.range said nothing about
    warp_specialize, when no other top-level loop has a wgmma and the code after it reads
    only results of the loop, scalars, and tensors that are pure functions of scalars.
    Whether its operands are TMA rings, pipeline_dot_loops finds out."""
    from .pipeline_dot_loops import Definitions, _slice

    ops = list(kernel.body.ops)
    dot_loops = [i for i, op in enumerate(ops) if isinstance(op, For)
                 and any(isinstance(inner, WarpgroupMma) for inner in op.body.walk())]
    if len(dot_loops) != 1:
        return None
    at = dot_loops[0]
    loop = ops[at]
    if asked_split(loop) is not None or not loop.results:
        return None
    defs = Definitions(kernel.body, {})
    for value in free_values(ops[at + 1:]):
        if isinstance(value.type, TensorType) and value not in loop.results \
                and _slice(value, defs, kernel.body.args) is None:
            return None
    return loop.results[0]


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
