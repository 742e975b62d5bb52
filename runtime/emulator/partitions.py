"""Emulation rule: warp_specialize, its partitions run as cooperative coroutines.

Each partition (the default block on the kernel's warps, then each worker block on its
own warps) runs in its own Python thread over its own view of the CTA: its warp count
(register arrays are (partition warps, 32, registers)), the CTA warp its warp 0 is, and
its own values (block arguments bound to the captures). A baton (one condition variable)
lets exactly one partition run at a time, so the run is deterministic: the scheduler
starts with the default partition, runs it until it blocks in an mbarrier wait whose
phase has not completed (or ends), then hands the baton to the next partition that can
run, round robin. When every unfinished partition is blocked, the oldest TMA load in
flight lands (loads land as late as possible); when none is left, nothing can wake them:
a deadlock, reported with each partition's barrier, phase and source line.

Inside a partition `barrier` (bar.sync) orders only that partition's warps (the backend
gives it a named barrier). The partitions start without a CTA barrier (the
insert_barriers pass adds one before the split when needed) and end with one. Threads
never outlive the op: on any error the blocked ones are woken to unwind, then joined.
"""

from __future__ import annotations

import copy
import threading
from typing import Optional

import numpy as np

from ...compiler import ir
from ...compiler.types import TensorType
from .errors import EmulationError
from .interpreter import InFlight
from .mbarriers import land_oldest
from .registers import registers_to_tensor, tensor_to_registers
from .rules import EMULATION_RULES as RULES


class _Unwind(BaseException):
    """Raised in a blocked partition's thread to end it when the op is abandoned."""


class Partition:
    def __init__(self, index: int, name: str, cta, block: ir.Block, args: tuple):
        self.index = index
        self.name = name
        self.cta = cta
        self.block = block
        self.args = args
        self.waiting = None  # a mbarriers.Waiter while blocked
        self.finished = False
        self.error: Optional[BaseException] = None
        self.results: tuple = ()
        self.thread: Optional[threading.Thread] = None

    def runnable(self) -> bool:
        return not self.finished and (self.waiting is None or self.waiting.ready())


class Scheduler:
    """Runs partitions one at a time, switching when the running one blocks."""

    def __init__(self, shared, partitions: list[Partition]):
        self.shared = shared
        self.partitions = partitions
        self.baton = threading.Condition()
        self.turn: Optional[Partition] = None  # who may run; None: the scheduler
        self.unwinding = False

    # ------------------------------------------------------- in partition threads
    def _body(self, partition: Partition) -> None:
        try:
            with self.baton:
                while self.turn is not partition:
                    self.baton.wait()
            if not self.unwinding:
                with np.errstate(all="ignore"):
                    terminator = partition.cta.run_block(partition.block, partition.args)
                    if terminator is not None:
                        partition.results = tuple(partition.cta.peek(v) for v in terminator.values)
        except _Unwind:
            pass
        except BaseException as error:  # handed to the scheduler's thread
            partition.error = error
        finally:
            with self.baton:
                partition.finished = True
                self.turn = None
                self.baton.notify_all()

    def block(self, cta, waiter) -> None:
        """Called by the running partition: give up the baton until `waiter` is ready."""
        partition = cta.partition_state
        with self.baton:
            partition.waiting = waiter
            self.turn = None
            self.baton.notify_all()
            while self.turn is not partition:
                self.baton.wait()
            partition.waiting = None
            if self.unwinding:
                raise _Unwind()

    # ------------------------------------------------------- in the scheduler's thread
    def _switch(self, partition: Partition) -> None:
        cta = partition.cta
        self.shared.active = (cta.warp_base, cta.num_warps)
        with self.baton:
            self.turn = partition
            self.baton.notify_all()
            while self.turn is not None:
                self.baton.wait()

    def run(self, op: ir.WarpSpecialize) -> None:
        for partition in self.partitions:
            partition.thread = threading.Thread(target=self._body, args=(partition,), daemon=True,
                                                name=f"weft-emulator {partition.name}")
            partition.thread.start()
        try:
            last = len(self.partitions) - 1
            while True:
                order = self.partitions[last + 1:] + self.partitions[:last + 1]
                ready = next((p for p in order if p.runnable()), None)
                if ready is None:
                    if all(p.finished for p in self.partitions):
                        return
                    if self.shared.in_flight:
                        land_oldest(self.shared)
                        continue
                    raise self._deadlock(op)
                self._switch(ready)
                if ready.error is not None:
                    raise ready.error
                last = ready.index
        finally:
            self._unwind()

    def _unwind(self) -> None:
        self.unwinding = True
        for partition in self.partitions:
            if not partition.finished:
                self._switch(partition)
        for partition in self.partitions:
            partition.thread.join()

    def _deadlock(self, op: ir.WarpSpecialize) -> EmulationError:
        blocked = [p for p in self.partitions if not p.finished]
        lines = [p.waiting.describe() for p in blocked]
        done = [p.name for p in self.partitions if p.finished]
        if done:
            lines.append(f"finished: {', '.join(done)}")
        first = blocked[0].waiting
        return EmulationError(
            "deadlock: every running partition waits on an mbarrier phase that can never "
            "complete (no partition left to arrive, no async copy in flight):\n  "
            + "\n  ".join(lines),
            first.op.loc, other_loc=first.barrier.init_op.loc, other_what="mbarrier initialised")


def _capture(cta, value: ir.Value, arg: ir.Value, num_warps: int, op):
    """A captured value as the partition's block argument sees it."""
    x = cta.peek(value)
    if type(x) is InFlight:
        raise x.error()
    if isinstance(value.type, TensorType) and isinstance(arg.type, TensorType):
        source, target = cta.layout(value.type), cta.layout(arg.type)
        if source != target or num_warps != cta.num_warps:
            x = tensor_to_registers(registers_to_tensor(x, source), target, num_warps)
    return x


def _partition_cta(cta, scheduler, partition_name: str, warp_base: int, num_warps: int):
    child = copy.copy(cta)
    child.env = dict(cta.env)
    child.num_warps = num_warps
    child.warp_base = warp_base
    child.partition = partition_name
    child.scheduler = scheduler
    child.async_state = None
    return child


@RULES.register(ir.WarpSpecialize)
def warp_specialize(cta, op: ir.WarpSpecialize) -> None:
    if cta.scheduler is not None:
        raise EmulationError("warp_specialize inside a warp_specialize partition", op.loc)
    shared = cta.shared
    total = cta.num_warps + op.worker_warps()
    if total > shared.total_warps:
        raise EmulationError(f"warp_specialize needs {total} warps but the CTA has "
                             f"{shared.total_warps}", op.loc)
    # Every copy of a replicated worker runs its block as a partition of its own.
    parts = [(op.default, cta.num_warps, "default partition", 0)]
    for i, (block, count, copies) in enumerate(zip(op.workers, op.worker_num_warps, op.replicas())):
        parts += [(block, count, f"worker {i}" + (f" copy {k}" if copies > 1 else ""), k) for k in range(copies)]
    scheduler = Scheduler(shared, [])
    base = 0
    labels = []
    for index, (block, count, name, copy_index) in enumerate(parts):
        child = _partition_cta(cta, scheduler, f"{name} (warps {base}-{base + count - 1})", base, count)
        child.replica = copy_index
        args = tuple(_capture(cta, v, a, count, op) for v, a in zip(op.captures, block.args))
        partition = Partition(index, name, child, block, args)
        child.partition_state = partition
        scheduler.partitions.append(partition)
        labels += [f"warp {w} ({name})" for w in range(base, base + count)]
        base += count
    outer_active = shared.active
    shared.partitioned = True
    shared.ordering.labels = labels + [f"warp {w}" for w in range(base, shared.total_warps)]
    try:
        scheduler.run(op)
    finally:
        shared.partitioned = False
        shared.active = outer_active
        shared.ordering.labels = None
    shared.barrier()  # the partitions end together
    default = scheduler.partitions[0]
    if len(default.results) != len(op.results):
        raise EmulationError(f"the default partition yields {len(default.results)} values for "
                             f"{len(op.results)} results", op.loc)
    for value, x in zip(op.results, default.results):
        cta.bind(value, x)


@RULES.register(ir.ReplicaIndex)
def replica_index(cta, op: ir.ReplicaIndex) -> None:
    cta.bind(op.result, cta.full(op.result.type, cta.replica))
