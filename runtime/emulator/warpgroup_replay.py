"""The synchronization of a warp_specialize whose partition takes warpgroup turns, replayed
with that partition's two warpgroups running on their own.

The emulator runs a partition's warps in lockstep (one register array per value), which
is exact for values but not for time: on the GPU the two warpgroups of a ping-pong
consumer drift half an iteration apart at their turns (warpgroup_turn) and may wait at
different mbarrier phases. A program can then deadlock on the GPU that runs to the end
in lockstep: warpgroup 0, holding the turn, waits for a ring slot that the producer
refills only once warpgroup 1 released it, which warpgroup 1 does after the turn it is
waiting for (pingpong_warpgroups with a 2-stage ring).

So while such a split runs, every unit records, in program order, what orders it against
the others: each warpgroup of the turn-taking partition on its own, each other partition
as one. The record is the synchronization skeleton (control flow is uniform and its
trip counts are the values the lockstep run computed):

    wait (barrier, the phase count it needs)     arrive (barrier, arrivals)
    expect (barrier, transaction bytes)          load (barrier, bytes a TMA load completes)
    sync (the partition's bar.sync: both warpgroups meet)
    take / pass / give (warpgroup_turn; `open` is warpgroup 1 giving warpgroup 0 the first)

When the partitions have finished, the record is replayed from the barriers' states at the
split (TMA loads still in flight there counted as landed): each unit runs on until its next event cannot happen yet (a wait whose phase has
not completed, a take with no pass waiting, a sync its sibling has not reached), round
and round until none moves. A TMA load completes as soon as it is issued (nothing but
its issue orders it, and completing earlier only lets waits pass sooner). Arrivals,
completions and passes only ever enable events, never disable one, so the order the
replay picks does not matter: a unit left stopped is stopped in every order, and that
is a deadlock on the GPU, reported with the line every stopped unit waits at.

Values are not replayed: a race that only the drifted order exposes is not looked for
here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...compiler import ir
from .errors import EmulationError, source_lines

_GROUP_WARPS = 4


@dataclass(eq=False)
class Unit:
    """A warpgroup of the turn-taking partition, or a whole partition."""

    name: str
    first_warp: int
    events: list = field(default_factory=list)  # (kind, key, amount, op, what)
    position: int = 0
    sibling: "Unit | None" = None  # the other warpgroup of a split partition
    passes: int = 0  # turns passed to this warpgroup and not yet taken

    def current(self):
        return self.events[self.position] if self.position < len(self.events) else None


@dataclass(eq=False)
class BarrierState:
    name: str
    count: int
    pending: int
    tx: int
    completed: int

    def settle(self) -> None:
        if self.pending <= 0 and self.tx == 0:
            self.completed += 1
            self.pending += self.count


def takes_turns(split: ir.WarpSpecialize) -> bool:
    return any(isinstance(op, ir.WarpgroupTurn) for block in (split.default, *split.workers) for op in block.walk())


class SyncReplay:
    """The record of one warp_specialize (see the module docstring). `partitions`: each
    partition's (name, first CTA warp, warp count, takes turns); only one of two warpgroups
    is split (warpgroup_turn refuses any other)."""

    def __init__(self, shared, partitions: list[tuple[str, int, int, bool]]):
        self.barriers = {address: BarrierState(bar.name, bar.count, bar.pending, bar.tx, bar.completed)
                         for address, bar in shared.mbarriers.items() if bar.invalidated_by is None}
        for load in shared.in_flight:  # issued before the split: landed as soon as issued, as within it
            bar = self.barriers.get(load.barrier)
            if bar is not None:
                bar.tx -= load.nbytes
                bar.settle()
        self.units: list[Unit] = []
        self.running = None  # the CTA view of the partition running (set by the scheduler)
        self.by_warp: dict[int, Unit] = {}
        for name, first, count, split in partitions:
            split = split and count == 2 * _GROUP_WARPS
            if split:
                groups = [Unit(f"{name}, warpgroup {g} (warps {first + g * _GROUP_WARPS}-"
                               f"{first + (g + 1) * _GROUP_WARPS - 1})", first + g * _GROUP_WARPS)
                          for g in (0, 1)]
                groups[0].sibling, groups[1].sibling = groups[1], groups[0]
            else:
                groups = [Unit(name, first)]
            for unit in groups:
                self.units.append(unit)
                span = count if not split else _GROUP_WARPS
                for warp in range(unit.first_warp, unit.first_warp + span):
                    self.by_warp[warp] = unit

    # ------------------------------------------------------------------ recording
    def _units(self, warps) -> list[Unit]:
        found = []
        for warp in warps:
            unit = self.by_warp.get(int(warp))
            if unit is not None and unit not in found:
                found.append(unit)
        return found

    def record(self, warps, kind: str, key=None, amount: int = 0, op=None, what: str = "") -> None:
        for unit in self._units(warps):
            unit.events.append((kind, key, amount, op, what))

    def init(self, address: int, bar) -> None:
        self.barriers[address] = BarrierState(bar.name, bar.count, bar.pending, bar.tx, bar.completed)

    def sync(self, first: int, count: int) -> None:
        """bar.sync over the running partition (`running`, its CTA view): a meeting only
        for a split one."""
        units = self._units(range(first, first + count))
        if len(units) > 1:
            for unit in units:
                unit.events.append(("sync", None, 0, self.running.current_op, "bar.sync of the partition"))

    def turn(self, first_warp: int, op: ir.WarpgroupTurn) -> None:
        group0 = self.by_warp[first_warp]
        if op.action == "open":
            group0.sibling.events.append(("give", None, 0, op, "warpgroup_turn open"))
        else:
            for unit in (group0, group0.sibling):
                unit.events.append((op.action, None, 0, op, f"warpgroup_turn {op.action}"))

    # ------------------------------------------------------------------ replaying
    def _happens(self, unit: Unit, event) -> bool:
        kind, key, amount, _, _ = event
        if kind == "wait":
            bar = self.barriers.get(key)
            return bar is not None and bar.completed >= amount
        if kind in ("arrive", "expect", "load"):
            bar = self.barriers.get(key)
            if bar is None:
                return True  # the lockstep run has reported a barrier used before init
            if kind == "arrive":
                bar.pending -= amount
            else:
                bar.tx += amount if kind == "expect" else -amount
            bar.settle()
            return True
        if kind == "take":
            if not unit.passes:
                return False
            unit.passes -= 1
            return True
        if kind == "pass":
            unit.sibling.passes += 1
            return True
        if kind == "give":
            unit.sibling.passes += 1
            return True
        if kind == "sync":
            mate = unit.sibling.current()
            if mate is None or mate[0] != "sync":
                return False
            unit.sibling.position += 1
            return True
        raise AssertionError(kind)

    def check(self) -> None:
        """Replay the record; raise if some unit can never finish it."""
        moved = True
        while moved:
            moved = False
            for unit in self.units:
                while (event := unit.current()) is not None and self._happens(unit, event):
                    unit.position += 1
                    moved = True
        stopped = [unit for unit in self.units if unit.current() is not None]
        if not stopped:
            return
        lines = []
        for unit in stopped:
            kind, key, amount, op, what = unit.current()
            if kind == "wait":
                bar = self.barriers.get(key)
                what = (f"mbarrier_wait for phase {amount - 1} of mbarrier {bar.name} ({bar.completed} "
                        f"phases completed)" if bar is not None else "mbarrier_wait")
            lines.append(f"{unit.name} waits at {op.loc}: {what}")
            lines += ["  " + line for line in source_lines(op.loc)]
        first = next((u for u in stopped if u.sibling is not None), stopped[0])
        raise EmulationError(
            "deadlock on the GPU: the warpgroups of a partition that takes turns (warpgroup_turn) run "
            "independently there, and in that order these never get past their waits (the emulator ran the "
            "warpgroups together, then replayed their turns and mbarrier waits and arrivals on their own):\n  "
            + "\n  ".join(lines)
            + "\nA warpgroup holding the turn must not wait for what the other does only after its next take "
            "(for pingpong_warpgroups: ring the loop over 3 or more stages).",
            first.current()[3].loc)
