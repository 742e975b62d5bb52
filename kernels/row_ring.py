"""Row kernels fed by a ring of shared-memory row buffers (softmax, layer norm).

A one-row-per-CTA kernel keeps its row's bytes in flight only while it waits for them,
and registers cap how many CTAs an SM holds, so a bf16 row kernel at 4096 columns has
at most ~9 rows in flight per SM (benchmarks/NOTES.md). Here each persistent CTA keeps
STAGES rows in flight in shared memory instead: one thread starts a bulk copy
(cp.async.bulk, no tensor map) of a later row into a free slot while every thread
computes the current one, and an mbarrier per slot says when its bytes have landed.

The kernels built on this walk rows `first, first + step, ...` (step = the grid) and
call `start_row` for the row STAGES ahead as soon as the current slot has been read.
The host side (`ring_grid`, `ring_fits`) picks the grid and decides when a ring applies:
rows must start on 16 bytes and span a multiple of 16 bytes (the bulk copy's rules).
"""

from __future__ import annotations

from .. import lowlevel as ll
from ..lowlevel import mbarrier, tma
from ._launch import data_address, is_torch, row_stride

RING_SHARED_BYTES = 200 * 1024  # per SM, for all resident CTAs' rings together


@ll.jit
def start_row(in_ptr, in_row_stride, row, n_rows, row_bytes, slot, landed):
    """Begin copying `row` into `slot`; its bytes complete on `landed`. Rows past the
    end are skipped (no arrival either, so nobody may wait for that phase)."""
    exists = row < n_rows
    mbarrier.expect(landed, row_bytes, pred=exists)
    tma.async_bulk_copy_global_to_shared(in_ptr + row * in_row_stride, landed, slot, row_bytes, pred=exists)


@ll.jit
def start_ring(in_ptr, in_row_stride, n_rows, row_bytes, ring, landed, STAGES: ll.constexpr):
    """Initialise the slots' mbarriers and start the CTA's first STAGES rows."""
    for s in ll.static_range(STAGES):
        mbarrier.init(landed.index(s), count=1)
    for s in ll.static_range(STAGES):
        start_row(in_ptr, in_row_stride, ll.program_id(0) + s * ll.num_programs(0), n_rows, row_bytes,
                  ring.index(s), landed.index(s))


def ring_fits(x, n_cols: int, stages: int) -> bool:
    """Whether rows of `x` can stream through a ring of `stages` slots: rows start on 16
    bytes and span a multiple of 16 bytes (the bulk copy's rules), and the slots fit."""
    item = x.element_size() if is_torch(x) else x.itemsize
    row_bytes = n_cols * item
    return (data_address(x) % 16 == 0 and (row_stride(x) * item) % 16 == 0 and row_bytes % 16 == 0
            and 0 < stages * row_bytes <= RING_SHARED_BYTES)


EMULATED_CTAS = 3  # on the CPU emulator: a few CTAs, so each walks several rows
_RESIDENT: dict = {}


def ring_grid(kernel, x, n_rows: int, args: tuple, constexprs: dict, num_warps: int) -> int:
    """CTAs to launch: as many as the SMs hold at once (every CTA resident, so none
    waits for another to finish), but no more than there are rows."""
    if not (is_torch(x) and x.is_cuda):
        return max(1, min(n_rows, EMULATED_CTAS))
    from ..runtime import driver

    device = x.device.index or 0
    key = (kernel, str(x.dtype), tuple(sorted(constexprs.items())), num_warps, device)
    resident = _RESIDENT.get(key)
    if resident is None:
        resident = _RESIDENT[key] = kernel.resident_ctas(*args, **constexprs, num_warps=num_warps)
    return max(1, min(n_rows, driver.device_properties(device).sm_count * resident))
