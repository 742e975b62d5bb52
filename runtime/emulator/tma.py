"""Emulation rules: TMA copies (Gluon's `tma` module) and the bulk copy, with their
completion points.

What is modelled is *when the bytes may be used* (ordering.py tracks it per byte):

- TMA load: one thread of the partition issues; the box (out-of-range elements zero) is
  read from global memory then, and lands later (mbarrier.land_next: as late as the
  emulator can, when every partition is blocked) at the buffer's real (swizzled) byte
  offsets, completing its bytes on the barrier's transaction count. Until it lands its
  bytes are in flight; after, they carry the epoch the barrier's phase publishes, so
  only warps that waited for that phase may read them. A bulk copy lands the same way.
- TMA store: reads the buffer (a read by the issuing warp through the async proxy: the
  bytes must be fenced and ordered before it) and writes the box's in-range elements to
  global memory; the read stays in flight until a store_wait retires its group.
- TMA reduce-add: as a TMA store, adding the buffer into the box instead of writing it.
"""

from __future__ import annotations

import numpy as np

from ...compiler import ir
from ...layouts.rules import shared_addressing
from .async_common import async_state, byte_rows, cluster_ranks, in_rank, predicate, view_addresses
from .descriptors import SWIZZLE_ALIGNMENT, EmulatedDescriptor
from .dtypes import element_bytes, finish
from .errors import EmulationError
from .interpreter import SharedRef
from .mbarrier import TmaInFlight, live_barrier, touch
from .rules import EMULATION_RULES as RULES
from .tensormaps import published_tensor_map


def _box_buffer(cta, op, desc: EmulatedDescriptor, ref) -> np.ndarray:
    """The buffer's element addresses, checked against where the TMA unit puts the box."""
    if not isinstance(ref, SharedRef):
        raise EmulationError(f"`{op.NAME}` needs a shared buffer, found {ref!r}", op.loc)
    box = desc.type
    if tuple(ref.type.shape) != tuple(box.block_shape) or ref.type.element != box.element:
        raise EmulationError(f"`{op.NAME}`: buffer {ref.type} does not hold the descriptor's box "
                             f"{list(box.block_shape)} of {box.element}", op.loc)
    addresses = view_addresses(cta, op, ref)
    size = element_bytes(box.element)
    start = int(addresses.reshape(-1)[0])
    alignment = SWIZZLE_ALIGNMENT.get(desc.swizzle, 128)
    if start % alignment:
        raise EmulationError(f"`{op.NAME}`: the buffer starts at shared byte {start}, but a TMA box "
                             f"with the {desc.swizzle}B swizzle needs {alignment}-byte alignment "
                             f"(the swizzle is taken from the address bits)", op.loc)
    tma_offsets = cta.memo(op, ("tma", id(box.layout)), lambda: _box_offsets(box))
    if not np.array_equal(addresses - start, tma_offsets * size):
        raise EmulationError(f"`{op.NAME}`: the buffer's shared layout places the box differently "
                             f"from the descriptor's layout ({desc.swizzle}B swizzle); TMA writes "
                             f"the box in the descriptor's layout", op.loc)
    return addresses


def _box_offsets(box) -> np.ndarray:
    addressing = shared_addressing(box.layout)
    grids = np.meshgrid(*(np.arange(s) for s in box.block_shape), indexing="ij")
    (flat,) = addressing(**{f"dim{i}": g for i, g in enumerate(grids)})
    return np.asarray(flat, dtype=np.int64)


def _descriptor(cta, op) -> EmulatedDescriptor:
    desc = cta[op.descriptor]
    if isinstance(desc, (int, np.integer)):  # a tensor map the kernel wrote in global memory
        desc = published_tensor_map(cta, int(desc), op)
    if not isinstance(desc, EmulatedDescriptor):
        raise EmulationError(f"`{op.NAME}` needs a tensor descriptor, found {desc!r}", op.loc)
    return desc


def _where(what: str):
    return lambda position: what


@RULES.register(ir.TmaAsyncCopyGlobalToShared)
def tma_async_copy_global_to_shared(cta, op: ir.TmaAsyncCopyGlobalToShared) -> None:
    if not predicate(cta, op.pred, op):
        return
    ranks = [cta.rank]
    if op.multicast is not None:  # the box lands in each of these CTAs, on each one's barrier
        ranks = cluster_ranks(cta, int(cta[op.multicast]), op, "tma.async_copy_global_to_shared multicast")
    desc = _descriptor(cta, op)
    coords = [int(cta[c]) for c in op.coords]
    addresses = _box_buffer(cta, op, desc, cta[op.buffer])
    element = desc.type.element
    size = element_bytes(element)
    issuer = cta.warp_base
    global_addresses, inside = desc.box(coords)
    values = cta.memory.load(global_addresses, element, inside, op.loc,
                             _where(f"box at {coords} of {desc.describe()}"))
    values = np.where(inside, values, 0)
    for rank in ranks:
        bar = live_barrier(cta, op, op.barrier, rank)
        touch(cta, bar.address, [issuer], op, write=False)
        landing = in_rank(cta, addresses, rank)
        record = cta.shared.ordering.async_write(
            byte_rows(landing, size)[None, :], np.array([issuer]), op, "TMA load",
            f"wait on mbarrier {bar.name}", async_proxy=True)
        cta.shared.in_flight.append(TmaInFlight(op, bar.address, record, landing, values, element,
                                                desc.type.box_bytes))
        if cta.shared.sync_trace is not None:
            cta.shared.sync_trace.record([issuer], "load", bar.address, desc.type.box_bytes, op)


@RULES.register(ir.AsyncBulkCopyGlobalToShared)
def async_bulk_copy_global_to_shared(cta, op: ir.AsyncBulkCopyGlobalToShared) -> None:
    if not predicate(cta, op.pred, op):
        return
    ref = cta[op.buffer]
    if not isinstance(ref, SharedRef):
        raise EmulationError(f"`{op.NAME}` needs a shared buffer, found {ref!r}", op.loc)
    element = ref.type.element
    size = element_bytes(element)
    nbytes = int(cta[op.nbytes])
    source = int(cta[op.pointer])
    addresses = view_addresses(cta, op, ref).reshape(-1)
    if nbytes <= 0 or nbytes % 16 or nbytes > addresses.size * size:
        raise EmulationError(f"bulk copy of {nbytes} bytes into a {addresses.size * size}-byte buffer: "
                             "the count must be a positive multiple of 16 that fits", op.loc)
    if source % 16 or addresses[0] % 16:
        raise EmulationError(f"bulk copy from global address {source:#x} to shared byte {addresses[0]}: "
                             "both must be 16-byte aligned", op.loc)
    addresses = addresses[:nbytes // size]
    bar = live_barrier(cta, op, op.barrier)
    issuer = cta.warp_base
    touch(cta, bar.address, [issuer], op, write=False)
    values = cta.memory.load(source + np.arange(addresses.size, dtype=np.int64) * size, element, None,
                             op.loc, _where(f"{nbytes} bytes at {source:#x}"))
    record = cta.shared.ordering.async_write(
        byte_rows(addresses, size)[None, :], np.array([issuer]), op, "bulk copy",
        f"wait on mbarrier {bar.name}", async_proxy=True)
    cta.shared.in_flight.append(TmaInFlight(op, bar.address, record, addresses, values, element, nbytes))
    if cta.shared.sync_trace is not None:
        cta.shared.sync_trace.record([issuer], "load", bar.address, nbytes, op)


def _read_box_for_global(cta, op, what: str):
    """A TMA store's or reduce-add's source box: its values, read now, with the read kept in
    flight until tma.store_wait retires its group; and where in global memory they go."""
    desc = _descriptor(cta, op)
    coords = [int(cta[c]) for c in op.coords]
    if min(coords) < 0:
        # On the GPU a store box at a negative coordinate traps ("illegal instruction"),
        # even partly inside; loads there read zeros, and stores past the end are clipped
        # (benchmarks/probe_tma_negative.py).
        raise EmulationError(f"`{op.NAME}` at coordinates {coords} of {desc.describe()}: a {what} "
                             f"box may not start at a negative coordinate (the GPU traps); skip "
                             f"the store, or start the box at 0", op.loc)
    addresses = _box_buffer(cta, op, desc, cta[op.buffer])
    element = desc.type.element
    record = cta.shared.ordering.async_read(
        byte_rows(addresses, element_bytes(element)), np.array([cta.warp_base]), op,
        what, "tma.store_wait")
    async_state(cta).store_groups.append(record)
    values = cta.shared.read(addresses, element, op, _where("TMA box"), track=False)
    global_addresses, inside = desc.box(coords)
    return values, element, global_addresses, inside, _where(f"box at {coords} of {desc.describe()}")


@RULES.register(ir.TmaAsyncCopySharedToGlobal)
def tma_async_copy_shared_to_global(cta, op: ir.TmaAsyncCopySharedToGlobal) -> None:
    values, element, global_addresses, inside, where = _read_box_for_global(cta, op, "TMA store")
    cta.memory.store(global_addresses, values, element, inside, op.loc, where)


@RULES.register(ir.TmaAsyncReduceAdd)
def tma_async_reduce_add(cta, op: ir.TmaAsyncReduceAdd) -> None:
    """As a TMA store, adding instead of writing. The sums are applied at issue: adds
    commute, and a source rewritten before its read retires is reported as a race, never
    read, so no result depends on when the unit reads it."""
    values, element, global_addresses, inside, where = _read_box_for_global(cta, op, "TMA reduce-add")
    memory = cta.memory
    old = memory.load(global_addresses, element, inside, op.loc, where)
    memory.store(global_addresses, finish(element, old + values), element, inside, op.loc, where)
    targets = memory.host_addresses(global_addresses, element, inside, op.loc, where)[inside]
    memory.reduced = targets if memory.reduced is None else np.union1d(memory.reduced, targets)


@RULES.register(ir.TmaStoreWait)
def tma_store_wait(cta, op: ir.TmaStoreWait) -> None:
    groups = async_state(cta).store_groups
    while len(groups) > op.pending:
        cta.shared.ordering.retire(groups.pop(0))
