"""Emulation rules: cp.async (Gluon's `async_copy` module) and its commit and wait groups.

What is modelled is *when the bytes may be used* (ordering.py tracks it per byte): each
thread copies its elements (masked-off ones as zeros) at issue; the bytes stay in flight
until a wait_group retires their commit group, after which they count as the issuing
thread's own (generic-proxy) writes.

cp.async.mbarrier.arrive.noinc is modelled as the copies landing at the arrive: every
copy the partition issued so far retires (as a wait_group(0) would), then each thread
arrives once on the barrier, publishing the bytes to whoever waits for the phase. The
hardware's arrival comes later, when the copies land; a waiter sees the phase complete
only after both, so what the model lets a waiter read, the hardware lets it read too.
"""

from __future__ import annotations

import numpy as np

from ...compiler import ir
from ...compiler.types import TensorType
from .async_common import async_state, byte_rows, partition_warps
from .dtypes import element_bytes
from .errors import EmulationError
from .global_memory import _check_vector
from .interpreter import SharedRef
from .mbarrier import arrive, live_barrier, touch
from .registers import LANES
from .rules import EMULATION_RULES as RULES
from .shared_memory import _addresses


@RULES.register(ir.AsyncCopyGlobalToShared)
def async_copy_global_to_shared(cta, op: ir.AsyncCopyGlobalToShared) -> None:
    ref = cta[op.buffer]
    if not isinstance(ref, SharedRef):
        raise EmulationError(f"`{op.NAME}` needs a shared buffer, found {ref!r}", op.loc)
    pointer_type = op.pointer.type
    if not isinstance(pointer_type, TensorType):
        raise EmulationError(f"`{op.NAME}` needs a tensor of pointers", op.loc)
    element = ref.type.element
    size = element_bytes(element)
    pointers = cta[op.pointer]
    mask = None if op.mask is None else np.broadcast_to(np.asarray(cta[op.mask], dtype=bool),
                                                         pointers.shape)
    _check_vector(cta, op, pointers, mask, size, "cp.async (global side)")
    addresses = _addresses(cta, op, ref, pointer_type)
    _check_vector(cta, op, addresses, mask, size, "cp.async (shared side)")
    values = cta.memory.load(pointers, element, mask, op.loc, cta.describe(pointer_type))
    if mask is not None:
        values = np.where(mask, values, 0)
    warps = addresses.shape[0]
    rows = byte_rows(addresses, size).reshape(warps, -1)
    record = cta.shared.ordering.async_write(rows, cta.warp_base + np.arange(warps), op,
                                             "cp.async", "async_copy.wait_group")
    cta.shared.write(addresses, values, element, op, cta.describe(pointer_type), track=False)
    async_state(cta).copies.append(record)


@RULES.register(ir.AsyncCopyCommitGroup)
def async_copy_commit_group(cta, op: ir.AsyncCopyCommitGroup) -> None:
    state = async_state(cta)
    state.copy_groups.append(state.copies)
    state.copies = []


@RULES.register(ir.AsyncCopyWaitGroup)
def async_copy_wait_group(cta, op: ir.AsyncCopyWaitGroup) -> None:
    groups = async_state(cta).copy_groups
    while len(groups) > op.pending:
        for record in groups.pop(0):
            cta.shared.ordering.retire(record)


@RULES.register(ir.AsyncCopyMBarrierArrive)
def async_copy_mbarrier_arrive(cta, op: ir.AsyncCopyMBarrierArrive) -> None:
    bar = live_barrier(cta, op, op.barrier)
    state = async_state(cta)
    for record in [record for group in state.copy_groups for record in group] + state.copies:
        cta.shared.ordering.retire(record)
    state.copy_groups, state.copies = [], []
    for warp in partition_warps(cta):  # each thread of the warp arrives for its own copies
        touch(cta, bar.address, [warp], op, write=False)
        arrive(cta, op, bar, LANES, warp)
