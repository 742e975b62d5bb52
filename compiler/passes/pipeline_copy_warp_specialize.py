"""pipeline_dot_loops, for cp.async ring loops written `tl.range(..., warp_specialize=True)`:
a producer partition issues the pointer loads' copies while the kernel's warps only wait,
multiply and release (the TMA split's form, pipeline_tma_warp_specialize, with copies
in place of boxes).

    rings (pipeline_dot_loops' ring_allocations), bars, empties allocated and initialised:
        bars[s] count = the producer's threads, empties[s] count = the consumer warps
    warp_specialize captures {
      default (the kernel's num_warps warps: the consumers):
        for iv ... (slot, phase):
            mbarrier_wait bars[slot], phase; fence_async_shared
            acc = warpgroup_mma ring_a[slot], ring_b[slot], acc; acc = warpgroup_mma_wait 1 acc
            mbarrier_arrive per_warp empties[(slot + S - 1) % S]   (pred: iteration i - 1 exists)
        acc = warpgroup_mma_wait 0 acc
        the epilogue (warp_specialize_epilogues)
    } worker (4 warps: the producer) {
        for iv ... (slot, phase, the pointers the loads read):
            mbarrier_wait empties[slot], phase ^ 1
            async_copy ring[slot] <- pointers (masked as the loads were)
            async_copy_mbarrier_arrive bars[slot]        (each thread, once its copies landed)
            pointers += their steps
    }

Decisions and why:
- The producer is one warpgroup (setmaxnreg acts on whole warpgroups, and ptxas caps
  every thread at the launch's REGISTER_FILE / threads: a second producer warpgroup
  beside 8 consumer warps would leave 128, below what a 128 x 256 wgmma needs). Its
  copies are tensors of pointers coalesced over the kernel's warps; their layouts are
  made again over the producer's 4 warps with the same vector per thread
  (over_producer_warps), and propagate_layouts places the rest of the producer from
  them. Its budget (PRODUCER_REGS) holds each thread's share of the pointers and masks
  (a 128 x 64 A and a 64 x 256 B tile of fp16 assemble without spills at 88); the
  consumers get what the launch's pool leaves, as in the TMA split.
- The full barrier counts every producer thread's arrival (cp.async.mbarrier.arrive.noinc):
  each thread's copies complete on it, so no commit group, wait_group or CTA barrier is
  needed on either side. The consumers keep the body's proxy fence after their wait: the
  copies are generic-proxy writes that wgmma reads through the async proxy.
- Every iteration the producer runs exists, so its copies need no guard; masked-off
  elements zero-fill as the one-partition ring's do (a load's `other` must be 0).
- The consumer loop drops the pointers it no longer reads (the producer carries them),
  so they take no consumer registers; the loop's results for them must be unused.
- Only loads through a carried pointer or a computed address (pipeline_dot_loops'
  StagedOperand) are split; pointers recomputed from carried state (the flattened
  persistent matmul) keep the one-partition ring. A split of cp.async rings does not join
  other loops' splits (SplitGroup).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ...layouts import BlockedLayout
from ..errors import warn_at
from ..hardware import MAX_REGISTERS, REGISTER_FILE, SHARED_LIMIT, WARPS_PER_WARPGROUP
from ..ir import (AddPtr, AsyncCopyMBarrierArrive, Binary, Block, Cast, Compare, ConvertLayout, For, MBarrierArrive,
                  MBarrierWait, Op, SharedIndex, Store, Value, WarpgroupMma, WarpgroupMmaWait, Yield)
from ..types import i1, i32
from .coalesce import blocked
from .pipeline_dot_loops import Emitter, LoopPipeliner, clone, deferred_wait, ring_views, substitute
from .pipeline_tma_loops import SlotBarriers
from .pipeline_tma_warp_specialize import MAX_CONSUMER_REGS, split_captures

PRODUCER_WARPS = WARPS_PER_WARPGROUP
PRODUCER_REGS = 88


class WarpSpecializedCopyLoop(SlotBarriers, LoopPipeliner):
    """The rewrite of a cp.async ring loop into producer and consumer partitions
    (rewrite_split drives it as it drives a WarpSpecializedTmaLoop)."""

    warp_specialized = True
    joins_groups = False  # a split of its own (see the module docstring)

    def __init__(self, *args):
        super().__init__(*args)
        wgmma = next(op for op in self.loop.body.ops if isinstance(op, WarpgroupMma))
        self.readers = wgmma.result.type.layout.in_dim_size("warp")
        self.producer_threads = 32 * PRODUCER_WARPS
        self.pointer_args = tuple(operand.carried for operand in self.operands if operand.computed is None)

    # ---------------------------------------------------------------- the split's shape
    def worker_partitions(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(warps, register budget) of each worker partition: the producer alone."""
        return (PRODUCER_WARPS,), (PRODUCER_REGS,)

    def consumer_registers(self) -> int:
        """What the launch's registers leave the consumers beside the producer's budget:
        the CTA launches with REGISTER_FILE / threads each (a multiple of 8, at most
        MAX_REGISTERS), and setmaxnreg only moves registers within that pool."""
        threads = self.producer_threads + 32 * self.readers
        pool = min(MAX_REGISTERS, REGISTER_FILE // threads) // 8 * 8 * threads
        share = (pool - self.producer_threads * PRODUCER_REGS) // (32 * self.readers)
        return min(MAX_CONSUMER_REGS, share - share % 8)

    def shares_ring_of(self, earlier) -> bool:
        return False

    def kept_results(self) -> tuple[Value, ...]:
        """The loop's results the consumer loop still yields (not the dropped pointers)."""
        return tuple(v for i, v in enumerate(self.loop.results) if i + 1 not in self.pointer_args)

    # ---------------------------------------------------------------- barriers
    def allocations(self, out: Emitter) -> None:
        """The full and empty barriers of every slot, initialised (the rings are the
        buffers' allocations, widened by pipeline_dot_loops)."""
        self.allocate_barriers(out, full_count=self.producer_threads)

    # ---------------------------------------------------------------- consumers
    def ringed_loop(self, out: Emitter, start: tuple[Value, Value], replaced=None) -> For:
        """The consumers' loop: wait for the slot's copies, run the dots from the slot,
        hand the previous iteration's slot back once its wgmma retired."""
        loop, stages = self.loop, self.stages
        body = loop.body
        iv = body.args[0]
        slot, phase = Value(i32, "slot"), Value(i32, "phase")
        buffers = [operand.store.buffer for operand in self.operands]
        dropped = {id(op) for operand in self.operands for op in operand.dropped} | \
            {id(op) for index in self.pointer_args for op in self.pointer_ops(index)}
        first_store = min(body.ops.index(operand.store) for operand in self.operands)
        reading = ring_views(body, buffers)
        last_read = max(position for position, op in enumerate(body.ops)
                        if id(op) not in dropped and any(value in reading for value in op.uses()))
        self.deferred = deferred_wait(body, last_read, self.uses) if stages >= 3 else None
        views: dict[Value, Value] = {}
        body_out = Emitter(loop.loc)
        for position, op in enumerate(body.ops):
            if self.deferred is not None and op is self.deferred.wait:
                continue  # issued with pending=1 right after the wgmma, below
            if position == first_store:
                body_out.ops.append(MBarrierWait(barrier=self.bar(body_out, slot), phase=phase, loc=loop.loc))
                for buffer in buffers:
                    views[buffer] = body_out.emit(SharedIndex, buffer.type, buffer.hint, buffer=self.rings[buffer],
                                                  index=slot)
            if id(op) in dropped:
                continue
            if isinstance(op, Yield):
                kept = tuple(v for i, v in enumerate(op.values) if i + 1 not in self.pointer_args)
                body_out.ops.append(Yield(values=kept + self.advance(body_out, slot, phase), loc=op.loc))
                continue
            body_out.ops.append(substitute(op, views))
            if position == last_read:
                if self.deferred is not None:
                    body_out.ops.append(dataclasses.replace(self.deferred.wait, pending=1))
                started = body_out.emit(Compare, i1, predicate="ne", lhs=iv, rhs=loop.lower)
                previous = self.refill_slot(body_out, slot)
                body_out.ops.append(MBarrierArrive(barrier=self.empty(body_out, previous), pred=started,
                                                   per_warp=True, loc=loop.loc))
        if self.deferred is not None:  # its index among the yielded values, less the dropped pointers
            self.deferred = dataclasses.replace(self.deferred, carried=self.deferred.carried - sum(
                index - 1 < self.deferred.carried for index in self.pointer_args))
        args = tuple(arg for i, arg in enumerate(body.args) if i not in self.pointer_args)
        inits = tuple((replaced or {}).get(v, v) for i, v in enumerate(loop.inits) if i + 1 not in self.pointer_args)
        extra = (Value(i32, "slot"), Value(i32, "phase"))
        self.consumer_results = self.kept_results() + extra
        return dataclasses.replace(loop, body=Block(args + (slot, phase), tuple(body_out.ops)),
                                   inits=inits + start, results=self.consumer_results)

    def drain(self, after: Emitter) -> dict[Value, Value]:
        """After the consumers' loop: the wait for the wgmma left in flight."""
        if self.deferred is None:
            return {}
        result = self.kept_results()[self.deferred.carried]
        placed = self.deferred.wait.results[0].type
        in_flight = after.emit(ConvertLayout, placed, result.hint, operand=result)
        waited = Value(placed, result.hint)
        after.ops.append(WarpgroupMmaWait(results=(waited,), deps=(in_flight,), pending=0, loc=self.deferred.wait.loc))
        return {result: after.emit(ConvertLayout, result.type, result.hint, operand=waited)}

    def advance_of(self, index: int) -> Op:
        """The body's AddPtr that steps carried pointer `index`."""
        yielded = self.loop.body.ops[-1].values[index - 1]
        return next(op for op in self.loop.body.ops if yielded in op.defines())

    def pointer_ops(self, index: int) -> list[Op]:
        """The body's ops that read carried pointer `index`, its load aside: its step, and
        the conversion of its layout for the load."""
        arg = self.loop.body.args[index]
        loads = {id(operand.load) for operand in self.operands}
        return [op for op in self.loop.body.ops if id(op) not in loads and any(v is arg for v in op.uses())]

    # ---------------------------------------------------------------- producer
    def producer_loop(self, out: Emitter, start: tuple[Value, Value]) -> tuple[Value, Value]:
        """Every iteration's copies into its slot once the consumers released it, each
        thread arriving on the slot's full barrier when its copies landed."""
        loop = self.loop
        deltas = dict(zip(self.pointer_args, self.deltas(out)))
        states = sorted({advance.index for operand in self.operands if operand.computed is not None
                         for advance in operand.computed.advances if advance.delta is not None} | set(self.pointer_args))
        body = Emitter(loop.loc)
        iv, slot, phase = Value(i32, loop.body.args[0].hint), Value(i32, "slot"), Value(i32, "phase")
        carried = {index: Value(loop.body.args[index].type, loop.body.args[index].hint) for index in states}
        outside = {index: loop.inits[index - 1] for index in range(1, len(loop.body.args)) if index not in states}
        released = body.emit(Binary, i32, "released", kind="xor", lhs=phase, rhs=body.int(1))
        body.ops.append(MBarrierWait(barrier=self.empty(body, slot), phase=released, loc=loop.loc))
        for operand in self.operands:
            if operand.computed is None:
                self.copy(body, operand, slot, carried[operand.carried], iv)
            else:
                self.copy_computed(body, operand, slot, iv, {**outside, **carried}, 0)
        body.ops.append(AsyncCopyMBarrierArrive(barrier=self.bar(body, slot), loc=loop.loc))
        stepped = []
        for index in states:
            value = carried[index]
            if index in deltas:
                stepped.append(body.emit(AddPtr, value.type, value.hint, pointer=value, offset=deltas[index]))
                continue
            advance = self.state_advance(index)
            mapping: dict[Value, Value] = {}
            body.ops.extend(clone(advance.delta_ops, mapping))
            delta = mapping.get(advance.delta, advance.delta)
            stepped.append(body.emit(AddPtr, value.type, value.hint, pointer=value, offset=delta) if advance.is_pointer
                           else body.binary("add", value, delta, value.hint))
        body.ops.append(Yield(values=tuple(stepped) + self.advance(body, slot, phase), loc=loop.loc))
        body.ops = over_producer_warps(body.ops)
        ends = tuple(Value(carried[index].type, carried[index].hint) for index in states) + \
            (Value(i32, "slot"), Value(i32, "phase"))
        inits = tuple(loop.inits[index - 1] for index in states) + tuple(start)
        out.ops.append(For(results=ends, lower=loop.lower, upper=loop.upper, step=loop.step, inits=inits,
                           body=Block((iv,) + tuple(carried[index] for index in states) + (slot, phase),
                                      tuple(body.ops)), loc=loop.loc))
        return ends[-2:]

    def state_advance(self, index: int):
        return next(advance for operand in self.operands if operand.computed is not None
                    for advance in operand.computed.advances if advance.index == index)


def plan_copy_split(pipeliner: LoopPipeliner, defs, uses) -> Optional[WarpSpecializedCopyLoop]:
    """The split of `pipeliner`'s loop (its tl.range asked for one), or None where the
    one-partition ring stays (see the module docstring)."""
    loop = pipeliner.loop
    if type(pipeliner) is not LoopPipeliner or not loop.results or loop.results[0] not in uses.top_level:
        return None
    split = WarpSpecializedCopyLoop(loop, pipeliner.stages, pipeliner.operands, pipeliner.step, pipeliner.rings, uses)
    if split.readers % 4 or any(uses.readers[loop.results[index - 1]] for index in split.pointer_args):
        return None
    loads = tuple(operand.load for operand in split.operands)
    for index in split.pointer_args:
        advance = split.advance_of(index)
        if not (isinstance(advance, AddPtr) and uses.only_by(advance.result, (loop.body.ops[-1],))):
            return None
        for op in split.pointer_ops(index):
            if op is not advance and not (isinstance(op, ConvertLayout) and uses.only_by(op.result, loads)):
                return None  # the body reads the pointer beside its load
    ring, staged = ring_bytes(split), epilogue_bytes(split, uses)
    if ring + staged > SHARED_LIMIT:
        warn_at(loop.loc, f"warp_specialize=True is not applied to this loop: its rings ({ring} bytes) and the "
                f"accumulator staged for the code after it ({staged} bytes) would not both fit a CTA's "
                f"{SHARED_LIMIT} bytes of shared memory (a split keeps the rings for its whole length); it runs "
                "as one partition", "use fewer stages, a smaller tile, or store a narrower type")
        pipeliner.split_refused = True
        return None
    captures = split_captures(loop, defs, uses)
    if captures is None:
        return None
    split.outer_slices, split.earlier_results, split.outer_order = captures
    if split.earlier_results:
        return None
    return split


def over_producer_warps(ops: list[Op]) -> list[Op]:
    """`ops` with the layouts their conversions name (the copies' pointers and masks,
    coalesced over the kernel's warps) made again over the producer's warps, each thread
    keeping its vector (propagate_layouts places the rest from these)."""
    out, mapping = [], {}
    for op in ops:
        op = substitute(op, mapping)
        encoding = op.result.type.encoding if isinstance(op, ConvertLayout) else None
        if isinstance(encoding, BlockedLayout) and math.prod(encoding.warps_per_cta) != PRODUCER_WARPS:
            placement = blocked(op.result.type.shape, encoding.size_per_thread, encoding.order, PRODUCER_WARPS)
            result = Value(placement.on(op.result.type), op.result.hint)
            mapping[op.result] = result
            op = dataclasses.replace(op, result=result)
        out.append(op)
    return out


def ring_bytes(split: WarpSpecializedCopyLoop) -> int:
    return sum(split.rings[operand.store.buffer].type.num_bytes for operand in split.operands)


def epilogue_bytes(split: WarpSpecializedCopyLoop, uses) -> int:
    """What the code after the loop may stage of the accumulator through shared memory
    (a layout conversion before its store: scratch that, inside the consumer partition,
    cannot reuse the rings): the accumulator's elements in the widest type it is stored
    as (through casts and conversions), else as the accumulator."""
    wgmma = next(op for op in split.loop.body.ops if isinstance(op, WarpgroupMma))
    elements = wgmma.result.type.num_elements
    widest, pending, seen = 0, list(split.loop.results), set()
    while pending:
        value = pending.pop()
        for reader in uses.readers[value]:
            if isinstance(reader, Store):
                widest = max(widest, reader.value.type.element.bits // 8)
            elif isinstance(reader, (Cast, ConvertLayout, WarpgroupMmaWait)) and id(reader) not in seen:
                seen.add(id(reader))
                pending.extend(reader.defines())
    return elements * (widest or wgmma.result.type.element.bits // 8)
