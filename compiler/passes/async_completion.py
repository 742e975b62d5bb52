"""Where each asynchronous access of shared memory completes: its bytes stay in use until then.

An async op keeps reading or writing shared memory after it is issued, until an op later in
program order completes the access; allocate_shared_memory must not give those bytes to
another buffer or a scratch area before that point. Besides wgmma (wgmma_retirement.py):

- a TMA store or reduce-add reads its buffer until a `tma_store_wait` leaves fewer bulk
  groups in flight than were issued after it (cp.async.bulk.wait_group.read);
- a cp.async writes its buffer until an `async_copy_wait_group` leaves fewer commit groups
  in flight than were committed after its own;
- a TMA load or bulk copy writes its buffer until an `mbarrier_wait` on its barrier.

The completing op is looked for by walking forward from the issue: through the rest of the
block, then after the enclosing if, round the enclosing loop (its next iterations, until one
issues no group) and after the loop. Waits and issues inside an if count for nothing (the
branch may not run); a loop met on the way is entered (the pipelined loops' waits complete
what their prologue issued). A completion found only inside a loop is taken when none is
found after it: the loop is trusted to run once and to complete its own last accesses, as
the pipelined loops do (they issue no copy for an iteration past the end). A wait found after
the loop wins, since the last iteration's access may run past the loop. An access that
nothing completes lasts to the kernel's end; inside a warp_specialize every access already
lasts the whole warp_specialize. A TMA load is completed by a wait on any barrier of the
same allocation (a ring of barriers), whose buffers a loop keeps live anyway.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..ir import (AsyncBulkCopyGlobalToShared, AsyncCopyCommitGroup, AsyncCopyGlobalToShared, AsyncCopyWaitGroup,
                  Block, Kernel, MBarrierWait, Op, TmaAsyncCopyGlobalToShared, TmaAsyncCopySharedToGlobal,
                  TmaAsyncReduceAdd, TmaStoreWait, Value, WarpgroupMma, WarpSpecialize)
from .wgmma_retirement import retiring_positions

# A completion rule: given an op after the issue and how many groups were issued after the
# issue's own so far, whether the op completes the access; and whether the op issues a group.
Completes = Callable[[Op, int], bool]
IssuesGroup = Callable[[Op], bool]


def completion_positions(kernel: Kernel, positions: dict, roots: Callable[[Value], Value]) -> dict[int, int]:
    """id(async op) -> the program position (`positions[id(op)][0]`) until which the shared
    memory it accesses stays in use. `roots` maps a view to the buffer it views."""
    places = _places(kernel.body, None, {})
    last = max((where[0] for where in positions.values()), default=0)
    completed = dict(retiring_positions(kernel, positions))
    for op in kernel.walk():
        rule = _rule(op, roots)
        if rule is not None:
            found = _walk_forward(op, places, positions, *rule)
        elif isinstance(op, WarpgroupMma) and op.is_async and id(op) not in completed:
            found = None  # no wait lists its result, or the value flow was lost on the way
        else:
            continue
        if found is None and positions[id(op)][2] is None:  # outside a warp_specialize
            found = last
        if found is not None:
            completed[id(op)] = found
    return completed


def _rule(op: Op, roots) -> Optional[tuple[Completes, IssuesGroup, bool]]:
    """How `op`'s access completes: (completes, issues a group, whether the issue's own group
    is still to be closed by a later issue)."""
    if isinstance(op, (TmaAsyncCopySharedToGlobal, TmaAsyncReduceAdd)):  # each one its own bulk group
        return ((lambda later, after: isinstance(later, TmaStoreWait) and later.pending <= after),
                lambda later: isinstance(later, (TmaAsyncCopySharedToGlobal, TmaAsyncReduceAdd)), False)
    if isinstance(op, AsyncCopyGlobalToShared):  # its group is closed by the next commit
        return ((lambda later, after: isinstance(later, AsyncCopyWaitGroup) and later.pending <= after),
                lambda later: isinstance(later, AsyncCopyCommitGroup), True)
    if isinstance(op, (TmaAsyncCopyGlobalToShared, AsyncBulkCopyGlobalToShared)):
        barrier = roots(op.barrier)
        return ((lambda later, after: isinstance(later, MBarrierWait) and roots(later.barrier) is barrier),
                lambda later: False, False)
    return None


def _places(block: Block, holder: Optional[tuple[Op, Block]], found: dict) -> dict:
    """id(op) -> the block it is in; id(block) -> (the op holding it, the block that op is in),
    None for the kernel's body."""
    found[id(block)] = holder
    for op in block.ops:
        found[id(op)] = block
        for region in op.nested_blocks():
            _places(region, (op, block), found)
    return found


# More passes than any wait's `pending` (cp.async: 7, bulk groups: 63) lets in flight.
_MAX_ITERATIONS = 64


def _walk_forward(issue: Op, places: dict, positions: dict, completes: Completes, issues_group: IssuesGroup,
                  unclosed: bool) -> Optional[int]:
    """The position of the first op that completes `issue` on the way forward (see the module
    docstring), or None when none does before the kernel (or warp_specialize) ends."""
    walk = _Walk(positions, completes, issues_group, -1 if unclosed else 0)
    op = issue
    while True:
        block = places[id(op)]
        index = next(i for i, o in enumerate(block.ops) if o is op)
        found = walk.scan(block.ops[index + 1:])
        if found is not None:
            return found
        holder = places[id(block)]
        if holder is None or isinstance(holder[0], WarpSpecialize):
            return walk.in_loop
        if holder[0].LOOP and walk.in_loop is None:  # the next iterations, from the issue's block
            walk.iterate([block], first=block.ops[:index + 1])
        op = holder[0]


class _Walk:
    """Ops scanned in the order they run after an issue, counting the groups issued since.
    `in_loop`: the first completion found only by entering a loop (it may run no iteration),
    taken when the walk finds none after the loop."""

    def __init__(self, positions: dict, completes: Completes, issues_group: IssuesGroup, after: int):
        self.positions, self.completes, self.issues_group = positions, completes, issues_group
        self.after = after  # groups issued after the issue's own
        self.in_loop: Optional[int] = None

    def scan(self, ops, enter_loops: bool = True) -> Optional[int]:
        for later in ops:
            if self.completes(later, self.after):
                return self.positions[id(later)][0]
            if self.issues_group(later):
                self.after += 1
            elif later.LOOP and enter_loops and self.in_loop is None:
                self.iterate(later.nested_blocks())
        return None

    def iterate(self, blocks, first=()) -> None:
        """Run `first`, then `blocks` over and over, until a completion or a pass that issues
        no group; the groups counted stay off the path that leaves the loop."""
        on_exit = self.after
        found = self.scan(first, enter_loops=False)
        for _ in range(_MAX_ITERATIONS):
            if found is not None:
                break
            before = self.after
            for block in blocks:
                found = found if found is not None else self.scan(block.ops, enter_loops=False)
            if self.after == before:
                break
        self.in_loop, self.after = found, on_exit
