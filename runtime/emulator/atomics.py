"""Emulation rule for atomics, with the backend's issue and broadcast (compiler/atomics.py).

The replica of each element with every free index bit clear issues the atomic where the
mask holds; the updates of one op apply in thread order (warp, lane, register), which
is one of the orders the GPU may pick. Where the backend passes old values through
scratch (`scratch_offset` set), the issuing threads write them to shared memory, the
partition synchronises, and every thread reads the values of the elements it holds, so
missing barriers around the scratch are caught as races; otherwise each repeated
register copies its owner register.

Global memory has no race tracking here (CTAs run one after another), so atomics of
different programs on one address need no special case.
"""

from __future__ import annotations

import numpy as np

from ...compiler import atomics, ir
from ...compiler.types import TensorType
from .dtypes import element_bytes, finish, storage_dtype
from .errors import EmulationError
from .registers import LANES, num_registers, thread_elements
from .rules import EMULATION_RULES as RULES


def _register_shape(cta, type_) -> tuple[int, int, int]:
    return cta.register_shape(type_) if isinstance(type_, TensorType) else (cta.num_warps, LANES, 1)


def _issuing(type_, num_warps: int) -> np.ndarray:
    """True where a thread's register issues its element's atomic (a scalar: thread 0)."""
    if not isinstance(type_, TensorType):
        issuing = np.zeros((num_warps, LANES, 1), bool)
        issuing[0, 0, 0] = True
        return issuing
    masks = atomics.replica_masks(type_.layout, num_warps)
    warps = np.arange(num_warps)[:, None, None] & masks["warp"]
    lanes = np.arange(LANES)[None, :, None] & masks["lane"]
    registers = np.arange(num_registers(type_.layout))[None, None, :] & masks["register"]
    return (warps == 0) & (lanes == 0) & (registers == 0)


def _combine(op, old, value, compare):
    kind = atomics.kind_of(op)
    if kind == "add":
        return old + value
    if kind in ("max", "min"):
        return (np.maximum if kind == "max" else np.minimum)(old, value)
    if kind in ("and", "or", "xor"):
        return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[kind](old, value)
    if kind == "xchg":
        return value
    return np.where(old == compare, value, old)


def _apply(cta, op, element, addresses, values, compare) -> np.ndarray:
    """Each (address, value) in turn; the old values. Updates of distinct addresses are
    independent, so each round applies the first pending update of every address."""
    old = np.zeros(addresses.size, storage_dtype(element))
    pending = np.arange(addresses.size)
    what = lambda position: "atomic"  # noqa: E731  (addresses were checked already)
    while pending.size:
        _, first = np.unique(addresses[pending], return_index=True)
        now = pending[first]
        current = cta.memory.load(addresses[now], element, None, op.loc, what)
        old[now] = current
        updated = _combine(op, current, values[now], None if compare is None else compare[now])
        cta.memory.store(addresses[now], finish(element, updated), element, None, op.loc, what)
        keep = np.ones(pending.size, bool)
        keep[first] = False
        pending = pending[keep]
    return old


def _through_scratch(cta, op, element, old, issuing) -> np.ndarray:
    """The issuing threads write each element's old value at its row-major slot; after
    the partition's barrier every thread reads the slots of the elements it holds."""
    type_ = op.result.type
    shape = old.shape
    if isinstance(type_, TensorType):
        elements = thread_elements(type_.layout, cta.num_warps)
    else:
        elements = np.zeros(shape, np.int64)
    size = element_bytes(element)
    slots = cta.shared_base + op.scratch_offset + elements * size  # in the CTA's window of a cluster's
    describe = cta.describe(type_)
    shared = cta.shared
    shared.write(slots[issuing], old[issuing], element, op, describe, track=False)
    for warp in np.unique(np.nonzero(issuing)[0]):
        rows = (slots[warp][issuing[warp]][:, None] + np.arange(size)).reshape(1, -1)
        shared.ordering.access(rows, np.array([shared.active[0] + warp]), op, write=True)
    shared.barrier()
    return shared.read(slots, element, op, describe)


@RULES.register(ir.AtomicRMW, ir.AtomicCAS)
def atomic(cta, op) -> None:
    element = atomics.element_of(op)
    type_ = op.pointer.type
    shape = _register_shape(cta, type_)
    issuing = cta.memo(op, "issuing", lambda: _issuing(type_, cta.num_warps))
    active = issuing if op.mask is None else issuing & np.broadcast_to(np.asarray(cta[op.mask], bool), shape)
    addresses = np.broadcast_to(np.asarray(cta[op.pointer], np.int64), shape)
    name = f"atomic_{atomics.kind_of(op)}"
    cta.memory.check(addresses, element, active, name, op.loc, cta.describe(type_))
    order = np.flatnonzero(active)  # C order: warp, lane, register
    values = np.broadcast_to(cta[op.value], shape).reshape(-1)[order]
    compare = None if not isinstance(op, ir.AtomicCAS) else np.broadcast_to(cta[op.compare], shape).reshape(-1)[order]
    old = _apply(cta, op, element, addresses.reshape(-1)[order], values, compare)
    if op.result is None:
        return
    held = np.zeros(shape, storage_dtype(element))
    held.reshape(-1)[order] = old
    if op.scratch_offset is not None:
        held = _through_scratch(cta, op, element, held, issuing)
    elif atomics.replicated_across_threads(op.result.type, cta.num_warps):
        raise EmulationError(f"`{op.NAME}` needs scratch to pass old values to the threads that hold "
                             f"copies, but has no scratch offset (run allocate_shared_memory)", op.loc)
    else:
        held = held[..., list(atomics.owner_registers(type_.layout))]
    held = finish(element, held)
    cta.bind(op.result, held if isinstance(op.result.type, TensorType) else held[0, 0, 0])
