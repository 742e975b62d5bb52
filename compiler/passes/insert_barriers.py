"""insert_barriers: put a CTA barrier before every shared-memory hazard.

A hazard is a read or write of bytes that another thread may have written since the
last barrier (RAW, WAW), or a write of bytes that another thread may still be reading
(WAR). Loops are walked twice so hazards across the back edge are seen; an `if` leaves
the union of both branches pending. Ops that use scratch (reductions across warps,
conversions through shared memory) synchronise inside themselves; here they count as a
write of their scratch, a full barrier, then a pending read.
"""

from __future__ import annotations

import dataclasses

from ..ir import Barrier, Block, For, If, Kernel, Op, WarpSpecialize, While
from .shared_accesses import Access, BufferRanges, ByteRange, access_of

NAME = "insert_barriers"


class _Pending:
    def __init__(self, reads=(), writes=()):
        self.reads: set[ByteRange] = set(reads)
        self.writes: set[ByteRange] = set(writes)

    def copy(self) -> "_Pending":
        return _Pending(self.reads, self.writes)

    def union(self, other: "_Pending") -> "_Pending":
        return _Pending(self.reads | other.reads, self.writes | other.writes)

    def conflicts(self, access: Access) -> bool:
        for r in access.reads:
            if any(r.overlaps(w) for w in self.writes):
                return True
        for w in access.writes:
            if any(w.overlaps(x) for x in self.writes | self.reads):
                return True
        return False

    def apply(self, access: Access) -> None:
        if access.syncs:
            self.reads.clear()
            self.writes.clear()
            self.reads.update(access.pending_reads)
            return
        self.reads.update(access.reads)
        self.writes.update(access.writes)


def _walk(block: Block, pending: _Pending, buffers: BufferRanges, num_warps: int) -> Block:
    ops: list[Op] = []
    for op in block.ops:
        buffers.define(op)
        if isinstance(op, Barrier):
            pending.reads.clear()
            pending.writes.clear()
            ops.append(op)
            continue
        if isinstance(op, (For, While)):
            blocks = op.nested_blocks()
            entry = pending.copy()
            # First pass finds what is pending at the end of an iteration; the second
            # starts from that too, so hazards across the back edge get barriers.
            probe = entry.copy()
            for b in blocks:
                _walk(b, probe, buffers, num_warps)
            state = entry.union(probe)
            new_blocks = []
            for b in blocks:
                new_blocks.append(_walk(b, state, buffers, num_warps))
            names = [f.name for f in dataclasses.fields(op) if isinstance(getattr(op, f.name), Block)]
            op = dataclasses.replace(op, **dict(zip(names, new_blocks)))
            merged = entry.union(state)
            pending.reads, pending.writes = merged.reads, merged.writes
            ops.append(op)
            continue
        if isinstance(op, If):
            then_state, else_state = pending.copy(), pending.copy()
            then_body = _walk(op.then_body, then_state, buffers, num_warps)
            else_body = _walk(op.else_body, else_state, buffers, num_warps)
            op = dataclasses.replace(op, then_body=then_body, else_body=else_body)
            merged = then_state.union(else_state)
            pending.reads, pending.writes = merged.reads, merged.writes
            ops.append(op)
            continue
        if isinstance(op, WarpSpecialize):
            # Partitions start together and end together (the backend joins them with a
            # full barrier), so whatever is pending is settled before the split; inside,
            # each partition only orders its own threads (its barriers are named ones).
            if pending.reads or pending.writes:
                ops.append(Barrier(loc=op.loc))
            warps = (num_warps,) + tuple(op.worker_num_warps)
            bodies = iter(warps)
            op = op.map_regions(lambda region: _walk(region, _Pending(), buffers, next(bodies)))
            pending.reads.clear()
            pending.writes.clear()
            ops.append(op)
            continue
        access = access_of(op, buffers, num_warps)
        if pending.conflicts(access):
            ops.append(Barrier(loc=op.loc))
            pending.reads.clear()
            pending.writes.clear()
        pending.apply(access)
        ops.append(op)
    return Block(block.args, tuple(ops))


def insert_barriers(kernel: Kernel) -> Kernel:
    body = _walk(kernel.body, _Pending(), BufferRanges(), kernel.num_warps)
    return kernel.with_body(body)
