"""Emulation rules: mbarriers (init, expect, arrive, wait, invalidate).

An mbarrier is the 8 bytes of a shared i64 [1] buffer; its state lives beside the bytes
(`SharedMemory.mbarriers`, keyed by byte address): the arrival count per phase, pending
arrivals, the transaction count, completed phases, and the clock its arrivals released
(ordering.py). Semantics (PTX ISA, mbarrier; ../shared/HOPPER.md):

- init(count), expect(nbytes) = one arrival plus nbytes more transaction bytes, arrive(n);
  "one thread issues": once per partition execution (arrive first syncs the partition,
  as the backend does). A TMA load completes its box bytes on the barrier (tma.py).
- A phase completes when pending arrivals reach 0 and the transaction count is 0; then
  pending arrivals reset to `count`. wait(phase) passes once the phase of parity
  `phase & 1` has completed: a fresh barrier counts as having completed phase -1.
  An `elected` wait is the issuing thread's alone: only its warp is ordered after the
  phase's arrivals, so another warp's access that the wait was meant to order is a race.
- A TMA load lands (writes its box, completes its bytes) as late as possible: when every
  partition is blocked, oldest load first (`land_next`), or under WEFT_EMULATE_SHUFFLE in
  an order drawn from its seed: the hardware promises no order between loads, and those
  of different tensors meet different cache states. Until then its bytes are in flight,
  so reads that do not wait for the load are caught; shuffled, so is a wait that passes
  on a phase two back because the slot's previous load, issued earlier, lands later.
- A wait that cannot pass blocks its partition (partitions.py). When no partition can
  run and no load is left to land, it can never complete: a deadlock, reported with the
  barrier, the phase and the partition. Using a barrier before init or after invalidate
  is an error.
- In a cluster (memory.SharedMemory), an arrival with `cta=` lands on the barrier at the
  same offset in that rank's window, and a multicast load is one load in flight per
  rank of its mask, each completing on its own CTA's barrier; the cluster's warps share
  one clock space, so what orders a peer's reads before a multicast into its buffer is
  the same arrive -> wait chain as inside a CTA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...compiler import ir
from ...compiler.types import i64
from .async_common import check_rank, in_rank, partition_warps, predicate
from .errors import EmulationError
from .interpreter import SharedRef
from .registers import LANES
from .rules import EMULATION_RULES as RULES

_MAX_COUNT = (1 << 20) - 1
_BARRIER_BYTES = 8


@dataclass(eq=False)
class Waiter:
    """A partition blocked in mbarrier_wait until `barrier` completes phase `target`."""

    partition: str
    op: ir.Op
    barrier: "MBarrier"
    target: int
    parity: int

    def ready(self) -> bool:
        return self.barrier.completed > self.target

    def describe(self, why: bool = True) -> str:
        """`why`: say what keeps the phase incomplete (for a deadlock, not an interrupt)."""
        bar = self.barrier
        text = (f"{self.partition} waits at {self.op.loc} for phase {self.target} (parity "
                f"{self.parity}) of mbarrier {bar.name}")
        if not why:
            return text
        return f"{text}, initialised at {bar.init_op.loc} with count {bar.count}: {bar.why_incomplete()}"


@dataclass(eq=False)
class MBarrier:
    address: int
    name: str
    count: int
    init_op: ir.Op
    column: int          # its clock column (the async copies completing on it)
    phase_epoch: int     # the epoch the current phase publishes when it completes
    release: np.ndarray  # joined clocks of the current phase's arrivals
    pending: int
    tx: int = 0
    completed: int = 0   # phases completed since init
    invalidated_by: Optional[ir.Op] = None
    completions: dict = field(default_factory=dict)  # completed count -> published clock
    # WEFT_EMULATE_RACECHECK: the same as racecheck sees them (racecheck.py)
    racecheck_release: Optional[np.ndarray] = None
    racecheck_completions: dict = field(default_factory=dict)
    epochs: dict = field(default_factory=dict)       # phase epoch -> phase number
    waiters: list = field(default_factory=list)

    def why_incomplete(self) -> str:
        if self.invalidated_by is not None:
            return f"the barrier was invalidated at {self.invalidated_by.loc}"
        parts = []
        if self.pending:
            parts.append(f"{self.pending} of {self.count} arrivals still pending")
        if self.tx > 0:
            parts.append(f"{self.tx} transaction bytes still expected (expect announced more "
                         f"bytes than the TMA loads moved, or a load was never issued)")
        if self.tx < 0:
            parts.append(f"{-self.tx} bytes of TMA loads landed that no mbarrier.expect "
                         f"announced (a missing or too small expect)")
        return ", ".join(parts) or "its phase is complete"


def _allocations(kernel, placements: dict) -> list:
    found = []
    for op in kernel.walk():
        if isinstance(op, ir.AllocateSharedMemory):
            offset = op.offset if op.offset is not None else placements.get(id(op))
            if offset is not None:
                found.append((offset, op.result.type.num_bytes, op))
    return found


def barrier_name(cta, address: int) -> str:
    """`bars[1]` (shared byte 1032, allocated at kernel.py:12:4), for messages; in a
    cluster, with the rank of the CTA whose window holds it."""
    rank, local = divmod(address, cta.shared.window) if cta.shared.ctas > 1 else (0, address)
    where = f" of CTA rank {rank}" if cta.shared.ctas > 1 else ""
    for offset, nbytes, op in cta.memo(cta.kernel, "allocations",
                                       lambda: _allocations(cta.kernel, cta.placements)):
        if offset <= local < offset + nbytes:
            hint = op.result.hint or "mbarrier"
            index = (local - offset) // _BARRIER_BYTES
            shown = hint if op.result.type.num_elements == 1 else f"{hint}[{index}]"
            return f"`{shown}`{where} (shared byte {local}, allocated at {op.loc})"
    return f"at shared byte {local}{where}"


def barrier_address(cta, op, value: ir.Value) -> int:
    ref = cta[value]
    if not isinstance(ref, SharedRef) or ref.type.element != i64 or ref.type.num_elements != 1:
        raise EmulationError(f"`{op.NAME}` needs an mbarrier (a shared i64 [1] buffer), found "
                             f"{getattr(ref, 'type', ref)}", op.loc)
    address = ref.offset + ref.xor * _BARRIER_BYTES
    if address % _BARRIER_BYTES:
        raise EmulationError(f"mbarrier at shared byte {address} is not 8-byte aligned", op.loc)
    return address


def touch(cta, address: int, warps, op, write: bool) -> None:
    """Track an mbarrier op's access to the barrier's bytes (init must be visible first)."""
    warps = np.asarray(warps, dtype=np.int64)
    rows = np.tile(address + np.arange(_BARRIER_BYTES), (len(warps), 1))
    cta.shared.ordering.access(rows, warps, op, write, barrier_op=True)


def live_barrier(cta, op, value: ir.Value, rank: Optional[int] = None) -> MBarrier:
    """The initialised, not invalidated mbarrier `value` names; with `rank`, the one at
    the same offset in that CTA of the cluster."""
    address = barrier_address(cta, op, value)
    if rank is not None:
        address = in_rank(cta, address, rank)
    bar = cta.shared.mbarriers.get(address)
    peer = rank is not None and rank != cta.rank
    if peer and rank in cta.shared.exited:
        raise EmulationError(f"`{op.NAME}` on mbarrier {barrier_name(cta, address)} after CTA rank {rank} "
                             f"exited (its shared memory is gone): end the kernel with ll.cluster_barrier(), "
                             f"so that no CTA exits while a peer still arrives on or loads into it", op.loc)
    if bar is None:
        remedy = ("its CTA initialises it, then ll.cluster_barrier() before any CTA arrives on or loads "
                  "into a peer's barriers" if peer else "initialise it (mbarrier.init) and sync the CTA first")
        raise EmulationError(f"`{op.NAME}` on mbarrier {barrier_name(cta, address)} before "
                             f"mbarrier_init: {remedy}", op.loc)
    if bar.invalidated_by is not None:
        remedy = (": a peer's barriers may be invalidated only after a cluster barrier that follows "
                  "every use of them" if peer else "")
        raise EmulationError(f"`{op.NAME}` on mbarrier {bar.name} after it was invalidated{remedy}",
                             op.loc, other_loc=bar.invalidated_by.loc, other_what="invalidated")
    return bar


def _describe_agent(shared, address: int):
    """For race messages: the TMA load that wrote with a phase epoch of this barrier, and
    whether that phase has completed."""
    def describe(epoch: int) -> tuple[str, bool]:
        bar = shared.mbarriers.get(address)
        if bar is not None and epoch == bar.phase_epoch:
            return f"the TMA load completing phase {bar.completed} of mbarrier {bar.name}", False
        if bar is not None and epoch in bar.epochs:
            return f"the TMA load completing phase {bar.epochs[epoch]} of mbarrier {bar.name}", True
        return f"a TMA load completing on the mbarrier at shared byte {address}", True
    return describe


@dataclass(eq=False)
class TmaInFlight:
    """A TMA load issued but not landed: its box waits to be written and to complete its
    bytes on the barrier."""

    op: ir.Op
    barrier: int         # byte address of the mbarrier it completes on
    record: int          # Ordering record keeping its bytes "being written"
    addresses: np.ndarray
    values: np.ndarray
    element: object
    nbytes: int


def land_next(shared) -> None:
    """An in-flight TMA load lands, the oldest or (`shared.landing`, WEFT_EMULATE_SHUFFLE)
    one drawn at random: its bytes are written and stamped with the phase they complete on
    the barrier, whose transaction count drops by the box bytes.

    Loads land as late as the emulator can make them (when every partition is blocked),
    so a read that does not wait for them sees them still in flight."""
    pick = 0 if shared.landing is None else shared.landing.randrange(len(shared.in_flight))
    load = shared.in_flight.pop(pick)
    bar = shared.mbarriers.get(load.barrier)
    if bar is None or bar.invalidated_by is not None:
        raise EmulationError(f"a TMA load completes on the mbarrier at shared byte {load.barrier}, "
                             f"which is no longer initialised (invalidated before the load landed)",
                             load.op.loc)
    shared.ordering.land(load.record, bar.column, bar.phase_epoch)
    shared.write(load.addresses, load.values, load.element, load.op, lambda position: "TMA box",
                 track=False)
    bar.tx -= load.nbytes
    complete_if_due(shared, load.op, bar)


def _widened(clock: np.ndarray, width: int) -> np.ndarray:
    if len(clock) >= width:
        return clock
    out = np.zeros(width, np.int64)
    out[:len(clock)] = clock
    return out


def arrive(cta, op, bar: MBarrier, count: int, warp: int) -> None:
    """`count` arrivals released by `warp`; completes the phase when it is due."""
    ordering = cta.shared.ordering
    if ordering.racecheck is not None:  # what they publish as racecheck sees it (racecheck.py)
        published = ordering.racecheck.view(warp)
        bar.racecheck_release = published if bar.racecheck_release is None \
            else np.maximum(bar.racecheck_release, published)
    vc = ordering.release(warp)
    bar.release = np.maximum(_widened(bar.release, len(vc)), _widened(vc, len(bar.release)))
    if count > bar.pending:
        raise EmulationError(f"{count} arrival(s) on mbarrier {bar.name} whose phase "
                             f"{bar.completed} has only {bar.pending} of {bar.count} pending: "
                             f"more arrivals than init(count=...) allows", op.loc,
                             other_loc=bar.init_op.loc, other_what="initialised")
    bar.pending -= count
    if cta.shared.sync_trace is not None:
        cta.shared.sync_trace.record([warp], "arrive", bar.address, count, op)
    complete_if_due(cta.shared, op, bar)


def complete_if_due(shared, op, bar: MBarrier) -> None:
    if bar.pending or bar.tx:
        return
    ordering = shared.ordering
    published = _widened(bar.release, ordering.clock.shape[1]).copy()
    published[bar.column] = bar.phase_epoch
    bar.epochs[bar.phase_epoch] = bar.completed
    bar.completed += 1
    bar.completions[bar.completed] = published
    bar.completions.pop(bar.completed - 3, None)
    bar.racecheck_completions[bar.completed] = bar.racecheck_release
    bar.racecheck_completions.pop(bar.completed - 3, None)
    bar.racecheck_release = None
    bar.pending, bar.tx = bar.count, 0
    bar.release = ordering.empty_clock()
    bar.phase_epoch = ordering.reserve()
    for waiter in bar.waiters:
        if waiter.target < bar.completed - 1:
            raise EmulationError(
                f"mbarrier {bar.name} completes phase {bar.completed - 1} while {waiter.partition} "
                f"has not yet seen phase {waiter.target} complete: on the GPU its parity wait can "
                f"miss phase {waiter.target} and hang (arrivals overran the waiter)", op.loc,
                other_loc=waiter.op.loc, other_what=f"{waiter.partition} waits")


@RULES.register(ir.MBarrierInit)
def mbarrier_init(cta, op: ir.MBarrierInit) -> None:
    address = barrier_address(cta, op, op.barrier)
    shared = cta.shared
    old = shared.mbarriers.get(address)
    if old is not None and old.invalidated_by is None:
        raise EmulationError(f"mbarrier {old.name} is initialised again while live; invalidate "
                             f"it first", op.loc, other_loc=old.init_op.loc,
                             other_what="first initialised")
    if not 1 <= op.count <= _MAX_COUNT:
        raise EmulationError(f"mbarrier_init count {op.count} must be in [1, {_MAX_COUNT}]", op.loc)
    touch(cta, address, [cta.warp_base], op, write=True)
    ordering = shared.ordering
    ordering.set_live_barrier(address, True, _BARRIER_BYTES)
    column = ordering.agent_column(address, _describe_agent(shared, address))
    shared.mbarriers[address] = MBarrier(
        address, barrier_name(cta, address), op.count, op, column, ordering.reserve(),
        ordering.empty_clock(), op.count)
    if shared.sync_trace is not None:
        shared.sync_trace.init(address, shared.mbarriers[address])


@RULES.register(ir.MBarrierInvalidate)
def mbarrier_invalidate(cta, op: ir.MBarrierInvalidate) -> None:
    bar = live_barrier(cta, op, op.barrier)
    if bar.waiters:
        waiter = bar.waiters[0]
        raise EmulationError(f"mbarrier {bar.name} is invalidated while {waiter.partition} waits "
                             f"on it", op.loc, other_loc=waiter.op.loc, other_what="waiting")
    touch(cta, bar.address, [cta.warp_base], op, write=True)
    bar.invalidated_by = op
    cta.shared.ordering.set_live_barrier(bar.address, False, _BARRIER_BYTES)


@RULES.register(ir.MBarrierArrive)
def mbarrier_arrive(cta, op: ir.MBarrierArrive) -> None:
    if not predicate(cta, op.pred, op):
        return
    rank = None if op.cta is None else check_rank(cta, int(cta[op.cta]), op, "mbarrier.arrive cta")
    bar = live_barrier(cta, op, op.barrier, rank)
    count = run_time_count(cta, op, op.count, "mbarrier.arrive count", 1, "arriving")
    if op.per_warp or op.per_thread:  # each warp (thread) arrives for itself: its own accesses before
        for warp in partition_warps(cta):
            touch(cta, bar.address, [warp], op, write=False)
            arrive(cta, op, bar, count * (LANES if op.per_thread else 1), warp)
        return
    if cta.num_warps > 1:
        cta.shared.barrier()  # the backend syncs the partition before its one arrival
    touch(cta, bar.address, [cta.warp_base], op, write=False)
    arrive(cta, op, bar, count, cta.warp_base)


def run_time_count(cta, op, value, what: str, low: int, threads: str) -> int:
    """An op's count (arrivals, transaction bytes): a compile-time int, or a run-time i32
    that must be what the hardware takes, one value in [low, 2^20 - 1] across the threads."""
    if isinstance(value, int):
        return value
    counts = np.unique(np.asarray(cta[value]))
    if counts.size != 1 or not low <= int(counts[0]) <= _MAX_COUNT:
        raise EmulationError(f"{what} {counts.tolist()}: it must be one value in [{low}, {_MAX_COUNT}] across "
                             f"the {threads} threads", op.loc)
    return int(counts[0])


@RULES.register(ir.MBarrierExpect)
def mbarrier_expect(cta, op: ir.MBarrierExpect) -> None:
    if not predicate(cta, op.pred, op):
        return
    bar = live_barrier(cta, op, op.barrier)
    touch(cta, bar.address, [cta.warp_base], op, write=False)
    # 0 bytes at run time: a plain arrival, as for a warpgroup whose rows need no load
    nbytes = run_time_count(cta, op, op.nbytes, "mbarrier.expect nbytes", 0, "issuing")
    bar.tx += nbytes
    if cta.shared.sync_trace is not None:
        cta.shared.sync_trace.record([cta.warp_base], "expect", bar.address, nbytes, op)
    arrive(cta, op, bar, 1, cta.warp_base)


def _acquire(cta, warps, bar: MBarrier, completed: int) -> None:
    """`warps` are ordered after the arrivals of the phase whose completion made `completed`."""
    cta.shared.ordering.acquire(warps, bar.completions[completed], bar.racecheck_completions.get(completed))


@RULES.register(ir.MBarrierWait)
def mbarrier_wait(cta, op: ir.MBarrierWait) -> None:
    bar = live_barrier(cta, op, op.barrier)
    parity = int(cta[op.phase]) & 1
    # An elected wait orders only the issuing thread's warp (the others go on).
    warps = np.array([cta.warp_base]) if op.elected else partition_warps(cta)
    touch(cta, bar.address, warps, op, write=False)
    if cta.shared.sync_trace is not None:  # the phases it needs completed
        cta.shared.sync_trace.record(warps, "wait", bar.address, bar.completed + (bar.completed % 2 == parity), op)
    if bar.completed % 2 == parity and cta.scheduler is None:
        # nothing else runs: the copies in flight land (`land_next`) until the phase completes
        target = bar.completed
        while bar.completed == target and cta.shared.in_flight:
            land_next(cta.shared)
        if bar.completed > target:
            _acquire(cta, warps, bar, target + 1)
            return
    if bar.completed % 2 == parity:  # the phase of that parity is the one in progress
        waiter = Waiter(cta.partition, op, bar, bar.completed, parity)
        if cta.scheduler is None:
            raise EmulationError(
                f"deadlock: this wait can never complete: {waiter.describe()}; nothing else in "
                f"the CTA can arrive on it (no other partition runs and no async copy is in "
                f"flight)", op.loc, other_loc=bar.init_op.loc, other_what="mbarrier initialised")
        bar.waiters.append(waiter)
        try:
            cta.scheduler.block(cta, waiter)
        finally:
            bar.waiters.remove(waiter)
        live_barrier(cta, op, op.barrier)
        _acquire(cta, warps, bar, waiter.target + 1)
    elif bar.completed:
        _acquire(cta, warps, bar, bar.completed)
