"""drop_deadlocking_turns: a split's warpgroup turns removed where a barrier over its whole
consumer partition lies between a warpgroup's take and its pass.

Such a barrier (bar.sync of the partition: one insert_barriers placed, a conversion or a
reduction through shared memory, an atomic handing back old values through scratch, the
partition's single mbarrier arrive) needs both warpgroups. The one holding the turn waits
there for the other, which waits at its take for the pass that comes only after the
barrier: a deadlock on the GPU (the emulator's warpgroup replay reports it). The end of
the partition is such a barrier too (the partitions join at bar.sync 0).

pingpong_warpgroups places the turns before layouts, scratch and barriers exist, and
pass_after_drain moves the passes it can see past; this pass runs once every barrier is
placed and checks what is left. Turns only order the warpgroups' issues, never a value,
so dropping all of a split's turns is always safe: the split runs as it would have with
pingpong=False. Launched with pingpong asked for, the loop warns and says what to change;
by default (no option) it says nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..errors import warn_at
from ..ir import (Block, Kernel, MBarrierArrive, Op, TensormapFence, WarpgroupTurn, WarpSpecialize)

NAME = "drop_deadlocking_turns"


def syncs_partition(op: Op) -> bool:
    """Whether the backend lowers `op` (itself, not its regions) with a bar.sync over every
    warp running it."""
    if op.SYNCS_THREADS or isinstance(op, TensormapFence):
        return True
    if op.USES_SCRATCH and getattr(op, "scratch_offset", None) is not None:
        return True
    return isinstance(op, MBarrierArrive) and not (op.per_warp or op.per_thread)


def _first_sync_held(block: Block, holding: bool) -> tuple[Optional[Op], bool]:
    """The first partition-wide barrier reached while holding the turn (None if none) and
    whether the turn is held after `block`, entered holding it or not. A region is walked
    from the state before it (a loop twice: its body also starts from its own end), and
    the turn counts as held after it when it may be on any path."""
    for op in block.ops:
        if isinstance(op, WarpgroupTurn):
            holding = {"take": True, "pass": False}.get(op.action, holding)
            continue
        if holding and syncs_partition(op):
            return op, holding
        regions = op.nested_blocks()
        after = holding if op.LOOP or not regions else False  # a loop may run no iteration
        for region in regions:
            found, end = _first_sync_held(region, holding)
            if found is None and op.LOOP and end != holding:
                found, end = _first_sync_held(region, end)
            if found is not None:
                return found, True
            after = after or end
        holding = after
    return None, holding


def _without_turns(block: Block) -> Block:
    ops = tuple(op.map_regions(_without_turns) for op in block.ops if not isinstance(op, WarpgroupTurn))
    return Block(block.args, ops)


def _enclosing_loop_loc(split: WarpSpecialize, op: Op):
    """Where to warn: the consumer's top-level op holding `op` (its loop), else `op`."""
    for top in split.default.ops:
        if top is op or any(inner is op for region in top.nested_blocks() for inner in region.walk()):
            return top.loc
    return op.loc


def _what(op: Op) -> str:
    if op.USES_SCRATCH:
        return f"the `{op.NAME}` through shared memory"
    if isinstance(op, MBarrierArrive):
        return "the partition's single mbarrier arrive"
    return f"a `{op.NAME}`"


def checked_split(split: WarpSpecialize, asked: bool) -> WarpSpecialize:
    """`split` without its turns when a barrier of the partition falls inside one."""
    if not any(isinstance(op, WarpgroupTurn) for op in split.default.walk()):
        return split
    found, held_at_end = _first_sync_held(split.default, False)
    if found is None and not held_at_end:
        return split
    if asked:
        if found is None:
            warn_at(split.loc, "pingpong is not applied to this loop: the consumer partition ends holding the "
                    "turn, and the partitions' join would deadlock", "launch without pingpong")
        else:
            warn_at(_enclosing_loop_loc(split, found),
                    f"pingpong is not applied to this loop: {_what(found)} at line {found.loc.line} is a bar.sync "
                    f"of both consumer warpgroups, reached while one holds the turn and the other waits to take "
                    f"it (they would deadlock)",
                    "launch without pingpong, or move that line out of the loop or above the loop's second dot")
    return dataclasses.replace(split, default=_without_turns(split.default))


def drop_deadlocking_turns(kernel: Kernel) -> Kernel:
    if not any(isinstance(op, WarpgroupTurn) for op in kernel.walk()):
        return kernel
    asked = kernel.pingpong is not None and kernel.pingpong is not False

    def block(region: Block) -> Block:
        ops = tuple(checked_split(op, asked) if isinstance(op, WarpSpecialize) else op.map_regions(block)
                    for op in region.ops)
        return Block(region.args, ops)

    return kernel.with_body(block(kernel.body))
