"""Emulation rules: pointer arithmetic and global loads/stores.

A vectorised access (`vector` > 1) is checked the way the hardware needs it: each group
of `vector` consecutive registers must address consecutive elements, start on a
`vector * element`-byte boundary and be masked as a whole; otherwise the GPU's wide ld/st
would read or write the wrong bytes, so the emulator reports the access instead.
"""

from __future__ import annotations

import numpy as np

from ...compiler import ir
from ...compiler.types import element_of
from .dtypes import element_bytes, finish
from .errors import EmulationError
from .rules import EMULATION_RULES as RULES


@RULES.register(ir.AddPtr)
def add_ptr(cta, op: ir.AddPtr) -> None:
    pointer_type = element_of(op.pointer.type)
    step = np.int64(element_bytes(pointer_type.pointee))
    offset = np.asarray(cta[op.offset]).astype(np.int64)
    cta.bind(op.result, finish(element_of(op.result.type), cta[op.pointer] + offset * step))


def _check_vector(cta, op, addresses, mask, size: int, what: str) -> None:
    vector = op.vector
    if vector <= 1 or np.ndim(addresses) != 3:
        return
    registers = addresses.shape[2]
    if registers % vector:
        raise EmulationError(f"{what} of {vector}-element vectors over {registers} registers", op.loc)
    groups = addresses.reshape(addresses.shape[:2] + (registers // vector, vector))
    active = np.ones(groups.shape, bool) if mask is None else \
        np.broadcast_to(mask, addresses.shape).reshape(groups.shape)
    if (active != active[..., :1]).any():
        position = np.argwhere((active != active[..., :1]).any(-1))[0]
        raise EmulationError(
            f"{what} with vector={vector}: the mask differs within the vector of registers "
            f"{position[2] * vector}..{position[2] * vector + vector - 1} (warp {position[0]} "
            f"lane {position[1]}); the access must be masked as a whole", op.loc)
    expected = groups[..., :1] + size * np.arange(vector)
    bad = active[..., 0] & (((groups != expected).any(-1)) | (groups[..., 0] % (size * vector) != 0))
    if bad.any():
        w, l, g = (int(i) for i in np.argwhere(bad)[0])
        raise EmulationError(
            f"{what} with vector={vector}: registers {g * vector}..{g * vector + vector - 1} of "
            f"warp {w} lane {l} are not {vector} consecutive elements aligned to "
            f"{size * vector} bytes (byte offsets {[int(a) & 0xFFFFFFFFFFF for a in groups[w, l, g]]})",
            op.loc)


def _check_unreduced(cta, op, addresses, mask, element, what: str) -> None:
    """A plain access of an element that a TMA reduce-add of this launch adds into races
    with the add: the sums are in global memory only once the kernel has ended. (CTAs run
    one after another here: an access before another CTA's add goes unseen.)"""
    reduced = cta.memory.reduced
    if reduced is None:
        return
    active = np.ones(np.shape(addresses), bool) if mask is None else np.broadcast_to(mask, np.shape(addresses))
    describe = cta.describe(op.pointer.type)
    hit = active & np.isin(cta.memory.host_addresses(addresses, element, mask, op.loc, describe), reduced)
    if hit.any():
        position = tuple(int(i) for i in np.argwhere(hit)[0])
        raise EmulationError(f"a {what} of global memory that a TMA reduce-add of this launch adds into "
                             f"({describe(position)}): the sums land only when the kernel ends; read them "
                             f"in a later launch", op.loc)


@RULES.register(ir.Load)
def load(cta, op: ir.Load) -> None:
    element = element_of(op.result.type)
    addresses = cta[op.pointer]
    mask = None if op.mask is None else np.asarray(cta[op.mask], dtype=bool)
    _check_vector(cta, op, addresses, mask, element_bytes(element), "load")
    _check_unreduced(cta, op, addresses, mask, element, "load")
    loaded = cta.memory.load(addresses, element, mask, op.loc, cta.describe(op.pointer.type))
    if mask is not None:
        other = 0 if op.other is None else cta[op.other]
        loaded = np.where(mask, loaded, other)
    cta.bind(op.result, finish(element, loaded))


@RULES.register(ir.Store)
def store(cta, op: ir.Store) -> None:
    element = element_of(op.value.type)
    addresses = cta[op.pointer]
    mask = None if op.mask is None else np.asarray(cta[op.mask], dtype=bool)
    _check_vector(cta, op, addresses, mask, element_bytes(element), "store")
    _check_unreduced(cta, op, addresses, mask, element, "store")
    cta.memory.store(addresses, cta[op.value], element, mask, op.loc, cta.describe(op.pointer.type))


@RULES.register(ir.PrefetchL2)
def prefetch_l2(cta, op: ir.PrefetchL2) -> None:
    # A hint that moves no data; only the GPU's requirement on the address is checked.
    nbytes = int(cta[op.nbytes]) & ~15
    address = int(cta[op.pointer])
    if nbytes > 0 and address % 16:
        raise EmulationError(f"prefetch_l2 address {address:#x} is not 16-byte aligned "
                             "(cp.async.bulk.prefetch needs 16-byte alignment)", op.loc)
