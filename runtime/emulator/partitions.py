"""Emulation rule: warp_specialize, its partitions run as cooperative coroutines.

Each partition (the default block on the kernel's warps, then each worker block on its
own warps) runs in its own Python thread over its own view of the CTA: its warp count
(register arrays are (partition warps, 32, registers)), the CTA warp its warp 0 is, and
its own values (block arguments bound to the captures). A baton (one condition variable)
lets exactly one partition run at a time, so the run is deterministic: the scheduler
starts with the default partition, runs it until it blocks in an mbarrier wait whose
phase has not completed (or ends), then hands the baton to the next partition that can
run, round robin. When every unfinished partition is blocked, a TMA load in flight
lands, the oldest unless WEFT_EMULATE_SHUFFLE says otherwise (loads land as late as
possible); when none is left, nothing can wake them:
a deadlock, reported with each partition's barrier, phase and source line.

Inside a partition `barrier` (bar.sync) orders only that partition's warps (the backend
gives it a named barrier). The partitions start without a CTA barrier (the
insert_barriers pass adds one before the split when needed) and end with one. Threads
never outlive the op: on any error, or a KeyboardInterrupt (which Python delivers to the
scheduler's thread while a partition runs), the running partition stops at its next op,
the blocked ones are woken to unwind, and all are joined; an interrupt is re-raised
saying where each partition was.

A cluster of CTAs (`run_cluster`) runs under one scheduler of the same kind: each CTA's
kernel body is a unit from the start, and a CTA reaching warp_specialize adds its
partitions as units and waits for them. A CTA blocks in an mbarrier wait as a partition
does, and in a cluster barrier until every CTA of the cluster has reached it.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Optional

import numpy as np

from ...compiler import ir
from ...compiler.types import TensorType
from .errors import EmulationError, source_lines
from .interpreter import InFlight
from .mbarrier import land_next
from .registers import registers_to_tensor, tensor_to_registers
from .rules import EMULATION_RULES as RULES
from . import turns
from .warpgroup_replay import SyncReplay, takes_turns


class _Unwind(BaseException):
    """Raised in a partition's thread to end it when the op is abandoned."""


# How long an interrupted run waits for the running partition to reach its next op (one op
# of a tile is milliseconds); past it, the report names the partition as still running.
_STOP_GRACE_S = 0.5


class Partition:
    """A unit of the scheduler: a warp_specialize partition, or a cluster CTA's kernel body.
    `cta_warps`: the first warp and warp count of the CTA it belongs to."""

    def __init__(self, index: int, name: str, cta, block: ir.Block, args: tuple,
                 cta_warps: tuple[int, int], in_partition: bool = True):
        self.index = index
        self.name = name
        self.cta = cta
        self.block = block
        self.args = args
        self.cta_warps = cta_warps
        self.in_partition = in_partition
        self.waiting = None  # a mbarrier.Waiter while blocked
        self.started = False
        self.finished = False
        self.abandoned = False  # ended by _Unwind, not by reaching its end
        self.error: Optional[BaseException] = None
        self.results: tuple = ()
        self.thread: Optional[threading.Thread] = None

    def runnable(self) -> bool:
        return not self.finished and (self.waiting is None or self.waiting.ready())

    def whereabouts(self) -> str:
        """Where the partition is (or ended), for an interrupted run's report."""
        if self.waiting is not None:
            text, op = f"partition {self.index}, {self.waiting.describe(why=False)}", self.waiting.op
        else:
            who, op = f"partition {self.index}, {self.cta.partition}", self.cta.current_op
            if not self.started or op is None:
                return f"  {who}: not started"
            if self.finished and not self.abandoned:
                return f"  {who}: finished"
            verb = "stopped before" if self.abandoned else "still running"
            text = f"{who}: {verb} `{op.NAME}` at {op.loc}"
        return "\n".join(["  " + text] + source_lines(op.loc))


class Scheduler:
    """Runs partitions one at a time, switching when the running one blocks.

    `turn` says who may run: a partition, or None for the scheduler (the thread that called
    `run`). Whatever ends a run early, an error in a partition, in the scheduler (a TMA
    landing), or a KeyboardInterrupt (delivered to the scheduler's thread while a partition
    runs), sets `unwinding`: the running partition stops at its next op or wait, then each
    blocked one is handed the turn to end, and every thread is joined."""

    def __init__(self, shared, partitions: list[Partition]):
        self.shared = shared
        self.partitions = partitions
        self.baton = threading.Condition()
        self.turn: Optional[Partition] = None  # who may run; None: the scheduler
        self.unwinding = False
        self.failed: Optional[Partition] = None  # the unit whose error ends the run
        self.cluster_arrivals = 0    # CTAs at the current cluster barrier
        self.cluster_generation = 0  # cluster barriers completed

    def add(self, partition: Partition) -> None:
        """A unit joining a running scheduler (a cluster CTA's partitions): called by the
        running unit, which then blocks until they are done."""
        partition.index = len(self.partitions)
        self.partitions.append(partition)
        self._start(partition)

    def _start(self, partition: Partition) -> None:
        partition.thread = threading.Thread(target=self._body, args=(partition,), daemon=True,
                                            name=f"weft-emulator {partition.name}")
        partition.thread.start()

    # ------------------------------------------------------- in partition threads
    def _body(self, partition: Partition) -> None:
        try:
            with self.baton:
                while self.turn is not partition:
                    self.baton.wait()
            if not self.unwinding:
                partition.started = True
                with np.errstate(all="ignore"):
                    terminator = partition.cta.run_block(partition.block, partition.args)
                    if terminator is not None:
                        partition.results = tuple(partition.cta.peek(v) for v in terminator.values)
        except _Unwind:
            partition.abandoned = True
        except BaseException as error:  # handed to the scheduler's thread
            partition.error = error
        finally:
            with self.baton:
                partition.finished = True
                if not partition.in_partition:  # a cluster CTA has exited
                    self.shared.exited.add(partition.cta.rank)
                self.turn = None
                self.baton.notify_all()

    def block(self, cta, waiter) -> None:
        """Called by the running partition: give up the baton until `waiter` is ready."""
        partition = cta.partition_state
        with self.baton:
            partition.waiting = waiter
            if self.unwinding:
                raise _Unwind()
            self.turn = None
            self.baton.notify_all()
            while self.turn is not partition:
                self.baton.wait()
            if self.unwinding:
                raise _Unwind()  # `waiting` stays: where it was, for the report
            partition.waiting = None

    def stop_here(self) -> None:
        """Called by the running partition between ops while the run unwinds."""
        raise _Unwind()

    # ------------------------------------------------------- in the scheduler's thread
    def _hand_over(self, partition: Partition) -> None:
        with self.baton:
            self.turn = partition
            self.baton.notify_all()
            while self.turn is not None:
                self.baton.wait()

    def _switch(self, partition: Partition) -> None:
        cta = partition.cta
        self.shared.active = (cta.warp_base, cta.num_warps)
        self.shared.partitioned = partition.in_partition
        self.shared.cta_warps = partition.cta_warps
        if self.shared.sync_trace is not None:
            self.shared.sync_trace.running = cta
        self._hand_over(partition)

    def run(self) -> None:
        try:
            for partition in list(self.partitions):
                self._start(partition)
            self._schedule()
        except KeyboardInterrupt:
            stopped = self._stop_running()
            where = "\n".join(p.whereabouts() for p in self.partitions)
            if stopped:
                self._unwind()
            raise KeyboardInterrupt("the emulator was interrupted in warp_specialize; its "
                                    "partitions were at:\n" + where) from None
        except BaseException:
            if self._stop_running():
                self._unwind()
            raise
        self._unwind()

    def _schedule(self) -> None:
        last = len(self.partitions) - 1
        while True:
            order = self.partitions[last + 1:] + self.partitions[:last + 1]
            ready = next((p for p in order if p.runnable()), None)
            if ready is None:
                if all(p.finished for p in self.partitions):
                    return
                if self.shared.in_flight:
                    land_next(self.shared)
                    continue
                raise self._deadlock()
            self._switch(ready)
            if ready.error is not None:
                self.failed = ready
                raise ready.error
            last = ready.index

    def _stop_running(self) -> bool:
        """Set `unwinding` and wait for the partition holding the turn (if the run was
        interrupted while one ran) to stop at its next op. False if it has not stopped
        within the grace period: its thread (a daemon) is left to end on its own."""
        deadline = time.monotonic() + _STOP_GRACE_S
        with self.baton:
            self.unwinding = True
            while self.turn is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.baton.wait(left)
        return True

    def _unwind(self) -> None:
        """End every unfinished partition (each is blocked, or not started) and join them."""
        self.unwinding = True
        for partition in self.partitions:
            if partition.thread is None:  # interrupted before its thread started
                partition.finished = True
            elif not partition.finished:
                self._hand_over(partition)
        for partition in self.partitions:
            if partition.thread is not None:
                partition.thread.join()

    def _deadlock(self) -> EmulationError:
        blocked = [p for p in self.partitions if not p.finished]
        lines = [p.waiting.describe() for p in blocked]
        done = [p.name for p in self.partitions if p.finished]
        if done:
            lines.append(f"finished: {', '.join(done)}")
        # Point at a wait on an mbarrier or a cluster barrier, not at a CTA waiting for
        # its own partitions.
        first = next((p for p in blocked if not isinstance(p.waiting, PartitionsDone)), blocked[0])
        self.failed = first
        waiting = first.waiting
        barrier = getattr(waiting, "barrier", None)
        return EmulationError(
            "deadlock: every running partition waits on a barrier that can never complete (no "
            "partition left to arrive, no async copy in flight):\n  " + "\n  ".join(lines),
            waiting.op.loc, other_loc=None if barrier is None else barrier.init_op.loc,
            other_what="mbarrier initialised")

    # ------------------------------------------------------- cluster barriers
    def cluster_barrier(self, cta, op, ctas: int) -> None:
        """barrier.cluster for the running CTA: the last of the cluster's CTAs to arrive
        orders every warp of the cluster after every other; the others wait for it. The
        last one yields too, so the others run on first (a CTA that exits early while this
        one still uses its shared memory is caught rather than hidden by the order)."""
        generation = self.cluster_generation
        self.cluster_arrivals += 1
        if self.cluster_arrivals == ctas:
            self.cluster_arrivals = 0
            self.cluster_generation += 1
            self.shared.ordering.join(np.arange(ctas * self.shared.total_warps))
        self.block(cta, ClusterBarrierWaiter(self, generation, cta.partition, op, ctas))


class ClusterBarrierWaiter:
    """A CTA in a cluster barrier, until every CTA of the cluster has reached it."""

    def __init__(self, scheduler: Scheduler, generation: int, who: str, op, ctas: int):
        self.scheduler, self.generation, self.who, self.op, self.ctas = scheduler, generation, who, op, ctas

    def ready(self) -> bool:
        return self.scheduler.cluster_generation > self.generation

    def describe(self, why: bool = True) -> str:
        return (f"{self.who} waits at {self.op.loc} in a cluster barrier that "
                f"{self.scheduler.cluster_arrivals} of the cluster's {self.ctas} CTAs have reached")


class PartitionsDone:
    """A cluster CTA in warp_specialize, until its partitions have all finished."""

    def __init__(self, partitions: list, who: str, op):
        self.partitions, self.who, self.op = partitions, who, op

    def ready(self) -> bool:
        return all(p.finished for p in self.partitions)

    def describe(self, why: bool = True) -> str:
        return f"{self.who} waits at {self.op.loc} for its warp_specialize partitions"


def run_cluster(shared, ctas: list, body: ir.Block, args: tuple) -> None:
    """Run the kernel body of each CTA of a cluster (rank order) under one scheduler."""
    scheduler = Scheduler(shared, [])
    warps = shared.total_warps
    shared.ordering.labels = [f"CTA rank {cta.rank} warp {w}" for cta in ctas for w in range(warps)]
    for cta in ctas:
        cta.partition = f"CTA rank {cta.rank}"
        cta.scheduler = scheduler
        unit = Partition(len(scheduler.partitions), cta.partition, cta, body, args,
                         (cta.warp_base, warps), in_partition=False)
        cta.partition_state = unit
        scheduler.partitions.append(unit)
    try:
        scheduler.run()
    except EmulationError as error:
        program = scheduler.failed.cta.program_id if scheduler.failed is not None else None
        raise (error if program is None else error.with_program(program)) from error.__cause__


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
    child.in_partition = True
    child.async_state = None
    return child


@RULES.register(ir.WarpSpecialize)
def warp_specialize(cta, op: ir.WarpSpecialize) -> None:
    if cta.in_partition:
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
    in_cluster = cta.scheduler is not None  # a cluster's scheduler runs this CTA already
    scheduler = cta.scheduler if in_cluster else Scheduler(shared, [])
    prefix = f"{cta.partition}, " if in_cluster else ""
    cta_warps = (cta.warp_base, shared.total_warps)
    base = 0
    labels = []
    partitions = []
    replay = None
    for index, (block, count, name, copy_index) in enumerate(parts):
        child = _partition_cta(cta, scheduler, f"{prefix}{name} (warps {base}-{base + count - 1})",
                               cta.warp_base + base, count)
        child.replica = copy_index
        args = tuple(_capture(cta, v, a, count, op) for v, a in zip(op.captures, block.args))
        partition = Partition(index, prefix + name, child, block, args, cta_warps)
        child.partition_state = partition
        partitions.append(partition)
        labels += [f"{prefix}warp {w} ({name})" for w in range(base, base + count)]
        base += count
    labels += [f"{prefix}warp {w}" for w in range(base, shared.total_warps)]
    if in_cluster:
        _run_in_cluster(cta, op, scheduler, partitions, labels)
    else:
        outer_active = shared.active
        shared.partitioned = True
        shared.ordering.labels = labels
        scheduler.partitions.extend(partitions)
        replay = _sync_replay(cta, op, partitions)
        shared.sync_trace = replay
        try:
            scheduler.run()
        finally:
            shared.sync_trace = None
            shared.partitioned = False
            shared.active = outer_active
            shared.ordering.labels = None
    shared.barrier()  # the partitions end together
    for partition in partitions:
        turns.finish(partition.cta)
    if replay is not None:
        replay.check()
    default = partitions[0]
    if len(default.results) != len(op.results):
        raise EmulationError(f"the default partition yields {len(default.results)} values for "
                             f"{len(op.results)} results", op.loc)
    for value, x in zip(op.results, default.results):
        cta.bind(value, x)


def _sync_replay(cta, op: ir.WarpSpecialize, partitions: list) -> Optional[SyncReplay]:
    """A record of the split's synchronization with the turn-taking warpgroups apart
    (warpgroup_replay.py), if any partition takes turns."""
    if not cta.memo(op, "takes_turns", lambda: takes_turns(op)):
        return None
    return SyncReplay(cta.shared, [(p.name, p.cta.warp_base, p.cta.num_warps,
                                    any(isinstance(o, ir.WarpgroupTurn) for o in p.block.walk()))
                                   for p in partitions])


def _run_in_cluster(cta, op, scheduler: Scheduler, partitions: list, labels: list) -> None:
    """A cluster CTA's partitions join the cluster's scheduler; the CTA waits for them
    (the scheduler switches back to it with its own warps active)."""
    shared = cta.shared
    first, count = cta.warp_base, shared.total_warps
    outer = shared.ordering.labels[first:first + count]
    shared.ordering.labels[first:first + count] = labels
    try:
        for partition in partitions:
            scheduler.add(partition)
        scheduler.block(cta, PartitionsDone(partitions, cta.partition, op))
    finally:
        shared.ordering.labels[first:first + count] = outer


@RULES.register(ir.ReplicaIndex)
def replica_index(cta, op: ir.ReplicaIndex) -> None:
    cta.bind(op.result, cta.full(op.result.type, cta.replica))
