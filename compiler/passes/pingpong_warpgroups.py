"""pingpong_warpgroups: with the launch option `pingpong=True`, the two consumer warpgroups
of a warp-specialized attention loop take turns at the tensor cores, so that one's
softmax runs while the other's wgmmas do (FlashAttention-3's ping-pong; the lowlevel
flash attention passes the turn on mbarriers between replicated consumers).

pipeline_tma_warp_specialize leaves the consumer partition (8 warps: two warpgroups, each
with 64 rows of the 128-row Q tile and its own wgmmas) running, per key block i,

    wait full[slot]; S_i = Q K_i^T (issued; P V of i - 1 still in flight);
    wait(0) (both); softmax of S_i; acc * alpha; P V_i (issued, left in flight); release

P V_i and the next block's Q K^T are issued back to back, across the back edge. This pass
makes that pair one turn (WarpgroupTurn, named barriers):

    open                                 (before the partition's first loop: warpgroup 1
                                          lets warpgroup 0 go first)
    take                                 (before each loop: the loop's first Q K^T)
    for ...:
        wait full[slot]; S_i = Q K_i^T
        pass                             (the turn goes to the other warpgroup)
        wait(0); softmax; acc * alpha
        take
        P V_i
        ...
    pass                                 (after each loop, once its last P V is waited for)

So while warpgroup 0 waits for its wgmmas and runs its softmax, warpgroup 1 issues its
own, which the tensor cores queue behind; warpgroup 0's next take needs warpgroup 1's
pass, which came right after its issue. Each warpgroup takes and passes alternately, the
same number of times (both run the same loops), so the turns of causal attention's two
loops chain with nothing in between; the last pass is left on warpgroup 0's barrier at
the end, as on the GPU it may be. `pingpong="after_wait"` passes the turn only once the
first wgmma has been waited for instead (the other warpgroup then issues when this one's
wgmmas are done: a gap on the tensor cores, but no wgmma of the other queued while this
one waits). The named barrier ids are immediates: ptxas serializes every wgmma of the
kernel when a bar.arrive whose id is in a register sits between a wgmma and its wait.

A loop that issue_dot_ahead rewrote issues Q K^T of block j and P V of block j - 1 back
to back; the turn then covers that pair, as in FA3 (`turns_around_issues`):

    open
    if lower < upper: ... take; S_0 = Q K_0^T; pass; ...      (block 0, peeled)
    for ...:
        wait full[slot]; take; S_j = Q K_j^T; P V_(j-1); pass
        wait(1) S_j; softmax; wait(0) P V_(j-1); release
    if lower < upper: take; P V_last; pass; ...

No turn is held across the back edge or between loops, so nothing but the issue of the
wgmmas runs under it (`after_wait`: the pass follows the first wait after the issue).

Taken only where it applies: a warp_specialize whose default partition has two
warpgroups, for each top-level loop of it whose body has two top-level wgmmas (the
first's issue, then the second's), ringed over 3 or more stages. With 2 the turns
deadlock on the GPU: warpgroup 0, holding the turn, waits for block i + 1's boxes, which
the producer loads into the slot block i - 1 read once both warpgroups released it, and
warpgroup 1 releases it only after its P V_i, in the turn it waits for. The emulator
reports that deadlock (it replays the split's turns, mbarrier waits and arrivals with the
two warpgroups apart: runtime/emulator/warpgroup_replay.py; tests/runtime/
test_emulator_turns.py forces the turns onto 2 stages); here the split then runs without
turns, and an asked-for pingpong warns at the loop. A 2-stage ring whose consumers hand the
slot of block i - 1 back before P V_i's issue (pipeline_tma_warp_specialize's
`releases_early`: right after the wait that retired P V_(i-1)) takes turns when
pingpong=True asks (no release then waits for a turn), and by default where the first dot
reduces over 128 or more (head_dim 128: `deep_first_dot`). Side by side on H200s (128 x 128
tiles, 2 stages) the turns ran 1.09x-1.10x the split without them at head_dim 128 and
1.05x-1.17x causal, but 0.89x at head_dim 64 (0.95x causal), where a block's wgmmas are
half as long as the softmax around them. The named barriers follow the partitions' own
(one each, from 1).
"""

from __future__ import annotations

import dataclasses

from ..errors import warn_at
from ..hardware import WARPS_PER_WARPGROUP
from ..ir import (Block, ConvertLayout, For, If, Kernel, MBarrierArrive, Op, WarpgroupMma, WarpgroupMmaWait,
                  WarpgroupTurn, WarpSpecialize, Yield)

NAME = "pingpong_warpgroups"


MIN_STAGES = 3  # see the module docstring


def pingpong_warpgroups(kernel: Kernel) -> Kernel:
    """Every split's two-dot consumer loops taking turns, unless the launch said
    pingpong=False. Not given, the turns are taken wherever they apply (in one H200 run
    they were faster than the split without them in every attention row but one, at
    head_dim 64 and 128, causal or not: docs/highlevel.md), and where they do not the
    compile says nothing; asked for, a loop they cannot take warns."""
    if kernel.pingpong is False or kernel.num_warps != 2 * WARPS_PER_WARPGROUP:
        return kernel
    after_wait = kernel.pingpong == "after_wait"
    asked = kernel.pingpong is not None
    ops = [taking_turns(op, kernel.num_stages, after_wait, asked) if isinstance(op, WarpSpecialize) else op
           for op in kernel.body.ops]
    return kernel.with_body(Block(kernel.body.args, tuple(ops)))


def turn_loops(block: Block) -> list[For]:
    """The block's top-level loops whose bodies issue two wgmmas at their top level."""
    return [op for op in block.ops if isinstance(op, For)
            and sum(isinstance(inner, WarpgroupMma) for inner in op.body.ops) == 2
            and sum(isinstance(inner, WarpgroupMma) for inner in op.body.walk()) == 2]


def releases_before_second_dot(loop: For) -> bool:
    """Whether `loop`'s body hands a ring slot back (every warp's arrival) before it
    issues its second wgmma (see the module docstring)."""
    ops = loop.body.ops
    second = [i for i, op in enumerate(ops) if isinstance(op, WarpgroupMma)][1]
    return any(isinstance(op, MBarrierArrive) and op.per_warp for op in ops[:second])


# The reduction length of a loop's first dot from which 2-stage turns are taken unasked
# (see the module docstring).
DEEP_FIRST_DOT = 128


def deep_first_dot(loop: For) -> bool:
    """Whether `loop`'s first wgmma reduces over DEEP_FIRST_DOT or more (attention's head_dim)."""
    first = next(op for op in loop.body.ops if isinstance(op, WarpgroupMma))
    return first.a.type.shape[-1] >= DEEP_FIRST_DOT


def taking_turns(split: WarpSpecialize, launch_stages, after_wait: bool = False,
                 asked: bool = True) -> WarpSpecialize:
    loops = turn_loops(split.default)
    stages = [loop.schedule.num_stages if loop.schedule is not None and loop.schedule.num_stages is not None
              else launch_stages for loop in loops]
    if not loops or any(s is None or s < MIN_STAGES
                        and not ((asked or deep_first_dot(loop)) and releases_before_second_dot(loop))
                        for s, loop in zip(stages, loops)):
        if loops and asked:
            warn_at(loops[0].loc, f"pingpong is not applied to this loop: its ring has {stages[0]} stages and the "
                    f"warpgroups' turns need {MIN_STAGES} or more (with fewer they would deadlock)",
                    f"launch with num_stages={MIN_STAGES}, or without pingpong")
        return split
    barrier = 2 + sum(split.replicas())  # after the partitions' named barriers (from 1, one a copy)
    chosen = {id(loop) for loop in loops}
    ahead = any(issued_together(loop) for loop in loops)
    ops: list[Op] = []
    default = list(split.default.ops)
    at = 0
    while at < len(default):
        op = default[at]
        at += 1
        if ahead and isinstance(op, If) and any(isinstance(inner, WarpgroupMma) for inner in op.then_body.ops):
            _open(ops, barrier, op.loc)  # issue_dot_ahead's block 0 or last P V: its issue is one turn
            ops.append(dataclasses.replace(op, then_body=turns_around_issues(op.then_body, barrier, after_wait)))
            continue
        if id(op) not in chosen:
            ops.append(op)
            continue
        _open(ops, barrier, op.loc)
        if issued_together(op):
            ops.append(dataclasses.replace(op, body=turns_around_issues(op.body, barrier, after_wait)))
            continue
        ops.append(WarpgroupTurn(action="take", barrier=barrier, loc=op.loc))
        ops.append(dataclasses.replace(op, body=turned_body(op.body, barrier, after_wait)))
        drained = past_waits(default, at)  # the pass follows the wait for the loop's last wgmma
        ops.extend(default[at:drained])
        ops.append(WarpgroupTurn(action="pass", barrier=barrier, loc=op.loc))
        at = drained
    return dataclasses.replace(split, default=Block(split.default.args, tuple(ops)))


def past_waits(ops: list, start: int) -> int:
    """The index right after the last wgmma wait among the waits and layout changes from
    `start` (`start` where there is none). The layout changes after that wait stay after
    the pass: one may become a round trip through shared memory with a barrier over both
    warpgroups, which, inside a turn, the other warpgroup waiting to take it never reaches."""
    end = start
    for at in range(start, len(ops)):
        if isinstance(ops[at], WarpgroupMmaWait):
            end = at + 1
        elif not isinstance(ops[at], ConvertLayout):
            break
    return end


def _open(ops: list[Op], barrier: int, loc) -> None:
    """The open before the partition's first turn."""
    if not any(isinstance(done, WarpgroupTurn) for done in ops):
        ops.append(WarpgroupTurn(action="open", barrier=barrier, loc=loc))


def issued_together(loop: For) -> bool:
    """Whether the loop issues its two wgmmas back to back, no wait between them
    (issue_dot_ahead: Q K^T of block j with P V of block j - 1)."""
    ops = loop.body.ops
    first, second = [i for i, op in enumerate(ops) if isinstance(op, WarpgroupMma)]
    return not any(isinstance(op, WarpgroupMmaWait) for op in ops[first:second])


def turns_around_issues(body: Block, barrier: int, after_wait: bool = False) -> Block:
    """A take before each run of wgmmas the block issues back to back (no wait between
    them), a pass right after the run's last issue (FA3's turn over the pair issued
    together), or, `after_wait`, after the wait that follows the run and the waits and
    layout changes right after it."""
    ops: list[Op] = []
    holding = waited = False
    for position, op in enumerate(body.ops):
        if isinstance(op, WarpgroupMma) and not holding:
            ops.append(WarpgroupTurn(action="take", barrier=barrier, loc=op.loc))
            holding, waited = True, False
        ops.append(op)
        if not holding:
            continue
        waited = waited or isinstance(op, WarpgroupMmaWait)
        rest = body.ops[position + 1:]
        if after_wait:
            ends = waited and not (rest and isinstance(rest[0], (WarpgroupMmaWait, ConvertLayout)))
        else:
            following = next((o for o in rest if isinstance(o, (WarpgroupMma, WarpgroupMmaWait))), None)
            ends = isinstance(op, WarpgroupMma) and not isinstance(following, WarpgroupMma)
        if ends or isinstance(rest[0] if rest else None, Yield) or not rest:
            ops.append(WarpgroupTurn(action="pass", barrier=barrier, loc=op.loc))
            holding = False
    return Block(body.args, tuple(ops))


def turned_body(body: Block, barrier: int, after_wait: bool = False) -> Block:
    """The pass after the first wgmma's issue (or, `after_wait`, once it has been waited
    for: after the last of the waits right after it, attention's wait for the carried
    accumulator among them), the take before the second wgmma's issue."""
    first, second = [op for op in body.ops if isinstance(op, WarpgroupMma)]
    at = body.ops.index(first) + 1
    if after_wait:
        at = past_waits(list(body.ops), at)
    ops: list[Op] = []
    for position, op in enumerate(body.ops):
        if position == at:
            ops.append(WarpgroupTurn(action="pass", barrier=barrier, loc=op.loc))
        if op is second:
            ops.append(WarpgroupTurn(action="take", barrier=barrier, loc=op.loc))
        ops.append(op)
    return Block(body.args, tuple(ops))


def pass_after_drain(kernel: Kernel) -> Kernel:
    """Every turn's pass moved up to right after the wgmma wait it follows, past the layout
    changes between them: propagate_layouts places a tensor's conversions where it is
    defined, so a conversion of a drained accumulator (a round trip through shared memory
    with a barrier over both warpgroups) can land between the wait and the pass, where
    the warpgroup holding the turn would wait at that barrier for one waiting to take it.
    Conversions of the loop's other results (a row maximum carried to the epilogue) that
    land between the loop and that wait, feeding none of the waits, follow the pass too."""
    if not any(isinstance(op, WarpgroupTurn) for op in kernel.walk()):
        return kernel

    def block(region: Block) -> Block:
        ops = [op.map_regions(block) for op in region.ops]
        for op in list(ops):
            if not (isinstance(op, WarpgroupTurn) and op.action == "pass"):
                continue
            here = ops.index(op)
            wait = here - 1
            while wait >= 0 and isinstance(ops[wait], ConvertLayout):
                wait -= 1
            if wait >= 0 and isinstance(ops[wait], WarpgroupMmaWait):
                if wait + 1 < here:
                    ops.insert(wait + 1, ops.pop(here))
                _follow_the_pass(ops, wait)
        return Block(region.args, tuple(ops))

    return kernel.with_body(block(kernel.body))


def _follow_the_pass(ops: list, wait: int) -> None:
    """Move the conversions in the run of waits and conversions ending at `wait` (the pass
    right after it) that feed nothing in that run to right after the pass."""
    start = wait
    while start > 0 and isinstance(ops[start - 1], (ConvertLayout, WarpgroupMmaWait)):
        start -= 1
    run = ops[start:wait + 1]
    used = {value for op in run for value in op.uses()}
    moved = [op for op in run if isinstance(op, ConvertLayout) and op.result not in used]
    if not moved:
        return
    kept = [op for op in run if not any(op is m for m in moved)]
    ops[start:wait + 2] = kept + [ops[wait + 1]] + moved
