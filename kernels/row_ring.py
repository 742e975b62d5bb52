"""Row kernels fed by a ring of shared-memory row buffers (softmax, layer norm).

A one-row-per-CTA kernel keeps its row's bytes in flight only while it waits for them,
and registers cap how many CTAs an SM holds, so a bf16 row kernel at 4096 columns has
at most ~9 rows in flight per SM (docs/performance-journal.md). Here each persistent CTA keeps
STAGES rows in flight in shared memory instead: one thread starts a bulk copy
(cp.async.bulk, no tensor map) of a later row into a free slot while every thread
computes the current one, and an mbarrier per slot says when its bytes have landed.

The kernels built on this allocate and start the ring (`start_ring`), then walk rows
`first, first + step, ...` (step = the grid), each taken with `take_row`, which also
refills its slot.
The host side (`_launch.persistent_grid`, `ring_fits`) picks the grid and decides when a ring applies:
rows must start on 16 bytes and span a multiple of 16 bytes (the bulk copy's rules).
"""

from __future__ import annotations

from .. import lowlevel as ll
from ..lowlevel import mbarrier, tma
from ..runtime.host_arrays import item_bytes, rows_start_on_16_bytes

RING_SHARED_BYTES = 200 * 1024  # per SM, for all resident CTAs' rings together


@ll.jit
def start_row(in_ptr, in_row_stride, row, n_rows, row_bytes, slot, landed):
    """Begin copying `row` into `slot`; its bytes complete on `landed`. Rows past the
    end are skipped (no arrival either, so nobody may wait for that phase)."""
    exists = row < n_rows
    mbarrier.expect(landed, row_bytes, pred=exists)
    tma.async_bulk_copy_global_to_shared(in_ptr + row * in_row_stride, landed, slot, row_bytes, pred=exists)


@ll.jit
def start_ring(in_ptr, in_row_stride, n_rows, row_bytes, BLOCK: ll.constexpr, STAGES: ll.constexpr):
    """(ring, landed): STAGES shared-memory rows of BLOCK elements and an mbarrier per
    slot, initialised, with the CTA's first STAGES rows on their way."""
    ring = ll.allocate_shared_memory(in_ptr.dtype.element_ty, [STAGES, BLOCK],
                                     ll.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    landed = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(landed.index(s), count=1)
    for s in ll.static_range(STAGES):
        start_row(in_ptr, in_row_stride, ll.program_id(0) + s * ll.num_programs(0), n_rows, row_bytes,
                  ring.index(s), landed.index(s))
    return ring, landed


@ll.jit
def take_row(in_ptr, in_row_stride, row, n_rows, row_bytes, ring, landed, done, cols, n_cols, fill,
             LAYOUT: ll.constexpr, STAGES: ll.constexpr, EVEN: ll.constexpr):
    """This CTA's `done`-th row (`row`) as fp32 in LAYOUT, columns past n_cols as `fill`
    (the slot's bytes there are another row's, or were never written); its slot is then
    refilled with the row STAGES ahead."""
    slot = done % STAGES
    mbarrier.wait(landed.index(slot), (done // STAGES) & 1)
    x = ring.index(slot).load(LAYOUT).to(ll.float32)
    if not EVEN:
        x = ll.where(cols < n_cols, x, fill)
    # Every thread has read the slot. The fence orders these generic-proxy reads before
    # the copy's async-proxy writes (without it the GPU landed refills under loads still
    # pending); the barrier, before the one thread that issues it.
    ll.fence_async_shared()
    ll.barrier()
    start_row(in_ptr, in_row_stride, row + STAGES * ll.num_programs(0), n_rows, row_bytes, ring.index(slot),
              landed.index(slot))
    return x


def ring_fits(x, n_cols: int, stages: int) -> bool:
    """Whether rows of `x` can stream through a ring of `stages` slots: rows start on 16
    bytes and span a multiple of 16 bytes (the bulk copy's rules), and the slots fit."""
    row_bytes = n_cols * item_bytes(x)
    return rows_start_on_16_bytes(x) and row_bytes % 16 == 0 and 0 < stages * row_bytes <= RING_SHARED_BYTES


