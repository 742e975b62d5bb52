"""insert_barriers: put a CTA barrier before every shared-memory hazard.

A hazard is a read or write of bytes that another thread may have written since the
last barrier (RAW, WAW), or a write of bytes that another thread may still be reading
(WAR). Loops are walked twice so hazards across the back edge are seen; an `if` leaves
the union of both branches pending. Ops that use scratch (reductions across warps,
conversions through shared memory, atomics passing old values to copies) synchronise
inside themselves; here they count as a write of their scratch, a full barrier, then a
pending read.

Async ops (shared_accesses.Access says which):
- a TMA load writes its buffer: it needs a barrier after other warps' reads of the bytes
  (the previous iteration's wgmma), but its own readers wait on its mbarrier, so it
  leaves nothing for a barrier to settle;
- wgmma operand reads, TMA store reads and cp.async writes go on after the op returns.
  They stay in flight, out of any barrier's reach, until their wait (warpgroup_mma_wait,
  store_wait, wait_group) retires them in the waiting thread; only a barrier after that
  wait covers them for the other warps. A barrier between the op and its wait settles
  nothing of theirs.
Proxy fences (fence_async_shared) are the kernel author's, as in Gluon: the emulator
checks them. The one exception is scratch: a conversion or reduction through shared
memory writes and reads its scratch through the generic proxy inside the op, where no
author can fence it, and allocation may give those bytes to a later TMA load (a box
loaded again each iteration, after the previous one's column sum). Before such a load a
fence_async_shared goes with the barrier (the scratch's readers fence, then hand the
bytes over), unless a fence came after the scratch's last use.

A loop's body is walked until the state at its head stops growing: the union of what is
pending on entry and after each walked iteration. Twice is not enough once async work
outlives an iteration: a wgmma issued at the end of one iteration, retired by the wait of
the next, is read-pending only from there, and the hazard it makes (the TMA load that
refills its buffer) comes a third iteration on. Groups older than the newest N+1, where N
is the largest count any wait of their kind leaves in flight, are merged into one: every
wait retires them together, so the merge loses nothing and the walk ends.

Three refinements keep barriers out of hot loops:
- ops that one elected thread issues (mbarrier init/arrive/invalidate, TMA) never
  conflict with each other: it is the same thread;
- an arrival from every warp on an mbarrier (per warp or per thread) releases what they
  did so far, and an elected wait on that barrier orders the elected thread after it:
  what was released no longer conflicts with that thread's issues (a ring's "empty"
  barrier frees the slot for its TMA refill). The barriers are told apart by buffer (a
  slot view counts as its whole ring of barriers), so the pass trusts the phases: it is
  the pipeliner's job to wait for the phase that the arrivals it means complete;
- a hazard between something before a loop and an op inside it gets one barrier before
  the loop, not one per iteration.

A branch taken warp by warp (`if ll.warp_any(...)`) may read shared memory but holds no
barrier: one its reads need goes before the branch. (It cannot need one inside: the
frontend lets such a branch read shared memory, never write it.)
"""

from __future__ import annotations

import dataclasses

from ..ir import Barrier, Block, FenceAsyncShared, If, Kernel, Op, WarpSpecialize
from .shared_accesses import ASYNC_KINDS, Access, BufferRanges, ByteRange, access_of

NAME = "insert_barriers"


# An access still in flight: ("read" | "write" | "solo_read", bytes).
_Effect = tuple[str, ByteRange]
_Group = frozenset[_Effect]


def _align_newest(a: tuple[_Group, ...], b: tuple[_Group, ...]) -> tuple[_Group, ...]:
    """Groups of two paths merged newest with newest: a wait for N retires all but the
    newest N groups on either path."""
    n = max(len(a), len(b))
    a = (frozenset(),) * (n - len(a)) + a
    b = (frozenset(),) * (n - len(b)) + b
    return tuple(x | y for x, y in zip(a, b))


def _merge_oldest(groups: tuple[_Group, ...], depth: int) -> tuple[_Group, ...]:
    """At most `depth` groups: the oldest ones merged into one (see the module docstring
    for why no wait can tell them apart)."""
    if len(groups) <= depth:
        return groups
    cut = len(groups) - depth + 1
    return (frozenset().union(*groups[:cut]),) + groups[cut:]


def _group_depths(kernel: Kernel) -> dict[str, int]:
    """Per async kind, how many groups in flight a walk must keep apart: one more than the
    most any wait of that kind leaves in flight, plus one for all the older ones."""
    left = {kind: 0 for kind in ASYNC_KINDS}
    for op in kernel.walk():
        retires = access_of(op, BufferRanges(), kernel.num_warps).retires
        if retires is not None:
            left[retires[0]] = max(left[retires[0]], retires[1])
    return {kind: n + 2 for kind, n in left.items()}


class _Pending:
    """Accesses since the last barrier: by any threads, and by the elected thread alone;
    and async accesses still in flight, which no barrier settles until their wait."""

    def __init__(self, depths: dict[str, int], reads=(), writes=(), solo_reads=(), solo_writes=(), groups=None,
                 uncommitted=(), solo_settled=(), released=None, unfenced=()):
        self.depths = depths  # per async kind, the groups kept apart (_group_depths)
        self.reads: set[ByteRange] = set(reads)
        self.writes: set[ByteRange] = set(writes)
        self.solo_reads: set[ByteRange] = set(solo_reads)
        self.solo_writes: set[ByteRange] = set(solo_writes)
        # Per async kind, the groups in flight, oldest first.
        self.groups: dict[str, tuple[_Group, ...]] = dict(groups or {kind: () for kind in ASYNC_KINDS})
        self.uncommitted: _Group = frozenset(uncommitted)  # cp.async copies in no group yet
        # Of reads/writes, those the elected thread is ordered after (an elected mbarrier
        # wait); and per barrier, those its all-warp arrivals released.
        self.solo_settled: set[_Effect] = set(solo_settled)
        self.released: dict[ByteRange, frozenset[_Effect]] = dict(released or {})
        # Scratch bytes used through the generic proxy with no proxy fence since: a barrier
        # does not settle them for a TMA load (see the module docstring).
        self.unfenced: set[ByteRange] = set(unfenced)

    def copy(self) -> "_Pending":
        return _Pending(self.depths, self.reads, self.writes, self.solo_reads, self.solo_writes, self.groups,
                        self.uncommitted, self.solo_settled, self.released, self.unfenced)

    def union(self, other: "_Pending") -> "_Pending":
        groups = {kind: _align_newest(self.groups[kind], other.groups[kind]) for kind in ASYNC_KINDS}
        released = {bar: self.released[bar] & other.released[bar] for bar in self.released.keys() & other.released}
        return _Pending(self.depths, self.reads | other.reads, self.writes | other.writes,
                        self.solo_reads | other.solo_reads, self.solo_writes | other.solo_writes,
                        groups, self.uncommitted | other.uncommitted, self.solo_settled & other.solo_settled,
                        released, self.unfenced | other.unfenced)

    def state(self) -> tuple:
        """Everything that decides where later barriers go, for the loop walk's fixpoint."""
        return (frozenset(self.reads), frozenset(self.writes), frozenset(self.solo_reads),
                frozenset(self.solo_writes), tuple(self.groups[kind] for kind in ASYNC_KINDS), self.uncommitted,
                frozenset(self.solo_settled), frozenset(self.released.items()), frozenset(self.unfenced))

    def empty(self) -> bool:
        """Whether a barrier here would settle nothing."""
        return not (self.reads or self.writes or self.solo_reads or self.solo_writes)

    def clear(self) -> None:
        """What a barrier does: settles every access done so far; those in flight go on."""
        for group in (self.reads, self.writes, self.solo_reads, self.solo_writes, self.solo_settled):
            group.clear()
        self.released.clear()

    def take(self, other: "_Pending") -> None:
        self.reads, self.writes = other.reads, other.writes
        self.solo_reads, self.solo_writes = other.solo_reads, other.solo_writes
        self.groups, self.uncommitted = dict(other.groups), other.uncommitted
        self.solo_settled, self.released = set(other.solo_settled), dict(other.released)
        self.unfenced = set(other.unfenced)

    def conflicts(self, access: Access) -> bool:
        if access.solo:
            writes = {w for w in self.writes if ("write", w) not in self.solo_settled}
            reads = {r for r in self.reads if ("read", r) not in self.solo_settled}
        else:
            writes, reads = self.writes | self.solo_writes, self.reads | self.solo_reads
        for r in access.reads:
            if any(r.overlaps(w) for w in writes):
                return True
        for w in access.writes:
            if any(w.overlaps(x) for x in writes | reads):
                return True
        return False

    def apply(self, access: Access) -> None:
        if access.syncs:
            self.clear()
            self.reads.update(access.pending_reads)
            self.unfenced.update(access.pending_reads)
            return
        if access.releases is not None:
            self.released[access.releases] = frozenset([("read", r) for r in self.reads] +
                                                       [("write", w) for w in self.writes])
        if access.settles_for_solo is not None:
            self.solo_settled |= self.released.get(access.settles_for_solo, frozenset())
        if access.in_flight is not None:
            read = "solo_read" if access.solo else "read"
            started = frozenset([(read, r) for r in access.reads] + [("write", w) for w in access.writes])
            if access.in_flight == "cp_async":
                self.uncommitted |= started
            else:  # a wgmma or a TMA store is a group of its own
                self._start_group(access.in_flight, started)
            return
        if access.hands_off_copies:  # the copies complete on an mbarrier their readers wait for
            self.uncommitted, self.groups["cp_async"] = frozenset(), ()
        if access.commits:  # with no copies since the last, still a group wait_group counts
            self._start_group("cp_async", self.uncommitted)
            self.uncommitted = frozenset()
        if access.retires is not None:
            self._retire(*access.retires)
        if access.on_mbarrier:  # its readers wait on the mbarrier; nothing to settle
            self.solo_reads.update(access.reads)
            return
        if access.solo:
            self.solo_reads.update(access.reads)
            self.solo_writes.update(access.writes)
        else:
            for r in access.reads:
                self._add("read", r)
            for w in access.writes:
                self._add("write", w)

    def _add(self, effect: str, byte_range: ByteRange) -> None:
        """A read or write by every thread, done now: nothing released or settled covers it."""
        (self.reads if effect == "read" else self.writes).add(byte_range)
        self.solo_settled.discard((effect, byte_range))
        for bar, released in self.released.items():
            if (effect, byte_range) in released:
                self.released[bar] = released - {(effect, byte_range)}

    def _start_group(self, kind: str, group: _Group) -> None:
        self.groups[kind] = _merge_oldest(self.groups[kind] + (group,), self.depths[kind])

    def _retire(self, kind: str, left_in_flight: int) -> None:
        """A wait: all but the newest `left_in_flight` groups of `kind` are done in this
        thread; other threads see them done after the next barrier."""
        groups = self.groups[kind]
        split = len(groups) - min(left_in_flight, len(groups))
        done, self.groups[kind] = groups[:split], groups[split:]
        for group in done:
            for effect, byte_range in group:
                if effect == "solo_read":
                    self.solo_reads.add(byte_range)
                else:
                    self._add(effect, byte_range)


def _touches(block: Block, pending: _Pending, buffers: BufferRanges, num_warps: int) -> bool:
    """Whether any op in `block` (or its regions) conflicts with `pending`."""
    for op in block.ops:
        buffers.define(op)
        if any(_touches(region, pending, buffers, num_warps) for region in op.nested_blocks()):
            return True
        if pending.conflicts(access_of(op, buffers, num_warps)):
            return True
    return False


def _walk(block: Block, pending: _Pending, buffers: BufferRanges, num_warps: int) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        buffers.define(op)
        if op.SYNCS_THREADS:
            pending.clear()
            ops.append(op)
            continue
        if op.LOOP:
            if not pending.empty() and any(_touches(b, pending, buffers, num_warps)
                                           for b in op.nested_blocks()):
                ops.append(Barrier(loc=op.loc))  # once, before the loop
                pending.clear()
            entry = pending.copy()
            # Walk iterations until the state at the loop head stops growing (see the
            # module docstring); the last walk, from that state, places the barriers.
            state = entry
            while True:
                probe = state.copy()
                for b in op.nested_blocks():
                    _walk(b, probe, buffers, num_warps)
                grown = state.union(probe)
                if grown.state() == state.state():
                    break
                state = grown
            state = state.copy()
            op = op.map_regions(lambda region: _walk(region, state, buffers, num_warps))
            pending.take(entry.union(state))
            ops.append(op)
            continue
        if isinstance(op, If):
            if op.per_warp and not pending.empty() and any(_touches(b, pending, buffers, num_warps)
                                                           for b in op.nested_blocks()):
                # Warps that skip a per-warp branch would leave a barrier inside it short
                # of threads: its shared reads get theirs before it.
                ops.append(Barrier(loc=op.loc))
                pending.clear()
            then_state, else_state = pending.copy(), pending.copy()
            then_body = _walk(op.then_body, then_state, buffers, num_warps)
            else_body = _walk(op.else_body, else_state, buffers, num_warps)
            op = dataclasses.replace(op, then_body=then_body, else_body=else_body)
            pending.take(then_state.union(else_state))
            ops.append(op)
            continue
        if isinstance(op, WarpSpecialize):
            # Partitions start together and end together (the backend joins them with a
            # full barrier), so whatever is pending is settled before the split; inside,
            # each partition only orders its own threads (its barriers are named ones).
            if not pending.empty():
                ops.append(Barrier(loc=op.loc))
            warps = iter((num_warps,) + tuple(op.worker_num_warps))
            op = op.map_regions(lambda region: _walk(region, _Pending(pending.depths), buffers, next(warps)))
            pending.clear()
            ops.append(op)
            continue
        if isinstance(op, FenceAsyncShared):
            pending.unfenced.clear()
        access = access_of(op, buffers, num_warps)
        if access.on_mbarrier and any(w.overlaps(u) for w in access.writes for u in pending.unfenced):
            ops += [FenceAsyncShared(loc=op.loc), Barrier(loc=op.loc)]  # see the module docstring
            pending.clear()
            pending.unfenced.clear()
        if pending.conflicts(access):
            ops.append(Barrier(loc=op.loc))
            pending.clear()
        pending.apply(access)
        ops.append(op)
    return Block(block.args, tuple(ops))


def insert_barriers(kernel: Kernel) -> Kernel:
    body = _walk(kernel.body, _Pending(_group_depths(kernel)), BufferRanges(), kernel.num_warps)
    return kernel.with_body(body)
