"""Emulation rule: warpgroup_turn, two warpgroups of a partition taking turns (ping-pong).

The emulator runs a partition's warps in lockstep, so it cannot let one warpgroup run
ahead of the other; what a turn order decides on the GPU is only when each warpgroup
issues, never a value. What can go wrong is the order itself: a take that no pass ever
answers (a deadlock), or a turn passed twice before it is taken (the named barrier would
complete with nobody waiting, and the take after it waits for a pass that already came).
So each warpgroup's turn actions are recorded in program order, as the partition runs
them, and replayed as the two warpgroups would run them on their own: each goes on until
a take finds no pass waiting on its barrier. Both stopped at takes is a deadlock, found
as soon as the second of them is recorded (anything after a stopped take is later in
that warpgroup's order), or one stopped at a take when the partition ends (`finish`);
a second pass onto a barrier still holding one is an error. A pass left over at the end
(the last warpgroup's last pass, which nobody takes) is what the GPU leaves too and is
not reported. What the turns do together with the split's mbarriers (a warpgroup holding
the turn while it waits for a phase the other completes after its take) is checked once
the split has run, with the warpgroups apart: warpgroup_replay.py.
"""

from __future__ import annotations

from ...compiler import ir
from .errors import EmulationError
from .rules import EMULATION_RULES as RULES

_GROUP_WARPS = 4


class TurnOrder:
    """One partition's recorded turn actions per warpgroup and where each stands."""

    def __init__(self):
        self.actions: list[list[tuple[str, ir.WarpgroupTurn]]] = [[], []]
        self.position = [0, 0]
        self.passes = [0, 0]  # passes waiting on warpgroup g's barrier

    def record(self, op: ir.WarpgroupTurn) -> None:
        if op.action == "open":
            self.actions[1].append(("give", op))  # warpgroup 1 gives warpgroup 0 its first turn
        else:
            for group in (0, 1):
                self.actions[group].append((op.action, op))
        self.replay()

    def replay(self) -> None:
        moved = True
        while moved:
            moved = False
            for group in (0, 1):
                while self.position[group] < len(self.actions[group]):
                    action, op = self.actions[group][self.position[group]]
                    if action == "take":
                        if not self.passes[group]:
                            break
                        self.passes[group] -= 1
                    else:
                        target = 0 if action == "give" else 1 - group
                        if self.passes[target]:
                            raise EmulationError(f"warpgroup {group} passes the turn to warpgroup {target} again "
                                                 "before it took the last one (the named barrier would complete "
                                                 "with nobody waiting)", op.loc)
                        self.passes[target] += 1
                    self.position[group] += 1
                    moved = True
        stuck = [self.actions[g][self.position[g]][1] for g in (0, 1) if self.position[g] < len(self.actions[g])]
        if len(stuck) == 2:
            raise EmulationError("deadlock: both warpgroups wait for their turn (warpgroup_turn take) and neither "
                                 f"will pass it; warpgroup 0 at line {stuck[0].loc.line if stuck[0].loc else '?'}, "
                                 f"warpgroup 1 at line {stuck[1].loc.line if stuck[1].loc else '?'}", stuck[0].loc)


def finish(cta) -> None:
    """At the end of a partition: a warpgroup still waiting for its turn never gets it."""
    order = getattr(cta, "turn_order", None)
    if order is None:
        return
    for group in (0, 1):
        if order.position[group] < len(order.actions[group]):
            op = order.actions[group][order.position[group]][1]
            raise EmulationError(f"deadlock: warpgroup {group} waits for a turn (warpgroup_turn take) that the "
                                 "other warpgroup never passes", op.loc)


@RULES.register(ir.WarpgroupTurn)
def warpgroup_turn(cta, op: ir.WarpgroupTurn) -> None:
    if not getattr(cta, "in_partition", False) or cta.num_warps != 2 * _GROUP_WARPS:
        raise EmulationError("warpgroup_turn needs a warp_specialize partition of two warpgroups", op.loc)
    order = getattr(cta, "turn_order", None)
    if order is None:
        order = cta.turn_order = TurnOrder()
    order.record(op)
    if cta.shared.sync_trace is not None:
        cta.shared.sync_trace.turn(cta.warp_base, op)
