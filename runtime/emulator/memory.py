"""Global memory (the argument buffers) and one CTA's shared memory with race tracking.

Global pointers are int64 *byte addresses* in a virtual space: argument buffer k starts at
(k + 1) << 44, so pointer arithmetic, selects between pointers and bitcasts behave as on
the GPU, and any address decodes back to the buffer it points into (offsets within +-2**43
bytes of a buffer are attributed to it, so a negative index is reported against the right
argument).

Shared memory is one byte array per CTA at the kernel's real byte offsets. A sequential CTA
model cannot lose data to a missing barrier, so accesses are tracked instead: per byte, the
warps that wrote it and the warps that read it since the last barrier. A warp reading bytes
another warp wrote (and it did not write itself), or writing bytes another warp read, since
the last barrier is a race (RAW / WAR), reported with both source lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .dtypes import decode, element_bytes, encode, memory_dtype
from .errors import EmulationError

ADDRESS_SHIFT = 44
_HALF = 1 << (ADDRESS_SHIFT - 1)
POISON_BYTE = 0xFF  # uninitialised shared memory reads as NaN / -1, never as plausible zeros

Describe = Callable[[tuple], str]


@dataclass
class Buffer:
    name: str
    raw: np.ndarray  # uint8 view of every byte the argument spans
    origin: int      # byte position of the argument's element 0 inside `raw`
    element: object  # the pointee type the kernel declared
    length: int      # elements reachable from element 0 (for messages)

    def describe(self) -> str:
        return f"`{self.name}` ({self.length} elements of {self.element})"


def _byte_span(array: np.ndarray) -> tuple[np.ndarray, int]:
    """A uint8 view of the memory an array spans, and the position of its element 0."""
    if array.size == 0:
        return np.zeros(0, np.uint8), 0
    low = sum(st * (n - 1) for st, n in zip(array.strides, array.shape) if st < 0)
    high = sum(st * (n - 1) for st, n in zip(array.strides, array.shape) if st > 0)
    corner = array[tuple(slice(n - 1, n) if st < 0 else slice(0, 1)
                         for st, n in zip(array.strides, array.shape))]
    first = corner.reshape(-1).view(np.uint8)
    span = np.lib.stride_tricks.as_strided(first, shape=(high - low + array.itemsize,), strides=(1,),
                                           writeable=array.flags.writeable)
    return span, -low


def _buffer_ids(ids: np.ndarray, active: np.ndarray):
    """The buffers an access touches (almost always one)."""
    touched = ids[active]
    if touched.size and (touched == touched[0]).all():
        return touched[:1]
    return np.unique(touched)


class GlobalMemory:
    """The argument buffers of one launch, addressed by virtual byte addresses."""

    def __init__(self):
        self.buffers: list[Buffer] = []

    def add(self, name: str, array: np.ndarray, element) -> np.int64:
        raw, origin = _byte_span(array)
        size = element_bytes(element)
        self.buffers.append(Buffer(name, raw, origin, element, (len(raw) - origin) // size))
        return np.int64((len(self.buffers)) << ADDRESS_SHIFT)

    def _locate(self, addresses: np.ndarray, active: np.ndarray, element, what: str, loc,
                describe: Describe) -> tuple[np.ndarray, np.ndarray]:
        size = element_bytes(element)
        ids = ((addresses + _HALF) >> ADDRESS_SHIFT) - 1
        offsets = addresses - ((ids + 1) << ADDRESS_SHIFT)
        valid = (ids >= 0) & (ids < len(self.buffers))
        bad = active & ~valid
        if bad.any():
            position = tuple(int(i[0]) for i in np.nonzero(bad)) if bad.ndim else ()
            raise EmulationError(
                f"{what} through address {int(addresses[position]):#x}, which points into no "
                f"argument buffer ({describe(position)})", loc)
        for k in _buffer_ids(ids, active):
            buffer = self.buffers[int(k)]
            mine = active & (ids == k)
            position_in_raw = offsets + buffer.origin
            outside = mine & ((position_in_raw < 0) | (position_in_raw + size > len(buffer.raw)))
            misaligned = mine & (offsets % size != 0)
            for mask, problem in ((outside, "out of bounds"), (misaligned, "misaligned")):
                if mask.any():
                    position = tuple(int(i[0]) for i in np.nonzero(mask)) if mask.ndim else ()
                    offset = int(offsets[position])
                    index = offset / size if offset % size else offset // size
                    raise EmulationError(
                        f"{what} {problem}: element {index} of {buffer.describe()}, "
                        f"{describe(position)}", loc)
        return ids, offsets

    def load(self, addresses, element, mask, loc, describe: Describe) -> np.ndarray:
        addresses = np.asarray(addresses, dtype=np.int64)
        active = np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(mask, addresses.shape)
        ids, offsets = self._locate(addresses, active, element, "load", loc, describe)
        size = element_bytes(element)
        raw_out = np.zeros(addresses.shape, memory_dtype(element))
        for k in _buffer_ids(ids, active):
            buffer = self.buffers[int(k)]
            mine = active & (ids == k)
            view = buffer.raw[: len(buffer.raw) // size * size].view(memory_dtype(element))
            raw_out[mine] = view[(offsets[mine] + buffer.origin) // size]
        return decode(element, raw_out)

    def store(self, addresses, values, element, mask, loc, describe: Describe) -> None:
        addresses = np.asarray(addresses, dtype=np.int64)
        active = np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(mask, addresses.shape)
        ids, offsets = self._locate(addresses, active, element, "store", loc, describe)
        size = element_bytes(element)
        raw = np.broadcast_to(encode(element, values), addresses.shape)
        for k in _buffer_ids(ids, active):
            buffer = self.buffers[int(k)]
            if not buffer.raw.flags.writeable:
                raise EmulationError(f"store into read-only argument {buffer.describe()}", loc)
            mine = active & (ids == k)
            view = buffer.raw[: len(buffer.raw) // size * size].view(memory_dtype(element))
            view[(offsets[mine] + buffer.origin) // size] = raw[mine]


class SharedMemory:
    """One CTA's shared memory: bytes at their real addresses, plus race tracking."""

    def __init__(self, size: int, num_warps: int):
        self.size = size
        padded = -(-max(size, 1) // 16) * 16
        self.bytes = np.full(padded, POISON_BYTE, dtype=np.uint8)
        self.num_warps = num_warps
        self.writers = np.zeros(padded, dtype=np.uint64)  # warp bit masks since the last barrier
        self.readers = np.zeros(padded, dtype=np.uint64)
        self.writer_op = np.full(padded, -1, dtype=np.int32)
        self.reader_op = np.full(padded, -1, dtype=np.int32)
        self.ops: list = []
        self._op_index: dict[int, int] = {}
        self._dirty = False

    def _op_id(self, op) -> int:
        key = id(op)
        if key not in self._op_index:
            self._op_index[key] = len(self.ops)
            self.ops.append(op)
        return self._op_index[key]

    def reset(self) -> None:
        """Fresh shared memory for the next CTA: poisoned bytes, no pending accesses."""
        self.bytes.fill(POISON_BYTE)
        self._dirty = True
        self.barrier()

    def barrier(self) -> None:
        if self._dirty:
            self.writers[:] = 0
            self.readers[:] = 0
            self._dirty = False

    def _byte_indices(self, addresses: np.ndarray, element, op, what: str, describe: Describe):
        size = element_bytes(element)
        outside = (addresses < 0) | (addresses + size > self.size)
        misaligned = addresses % size != 0
        for mask, problem in ((outside, "out of bounds"), (misaligned, "misaligned")):
            if mask.any():
                position = tuple(int(i[0]) for i in np.nonzero(mask))
                raise EmulationError(
                    f"shared-memory {what} {problem}: byte address {int(addresses[position])} "
                    f"({size}-byte {element}) in {self.size} bytes of shared memory, "
                    f"{describe(position)}", op.loc)
        return size

    def _race(self, kind: str, byte_array: np.ndarray, conflict: np.ndarray, warp: int, op,
              other_ops: np.ndarray, other_masks: np.ndarray):
        position = int(np.flatnonzero(conflict)[0])
        byte = int(byte_array.reshape(-1)[position])
        others = int(other_masks.reshape(-1)[position]) & ~(1 << warp)
        other_warp = (others & -others).bit_length() - 1
        other = self.ops[int(other_ops.reshape(-1)[position])]
        verb, past, participle = ("reads", "wrote", "written") if kind == "RAW" else ("writes", "read", "read")
        raise EmulationError(
            f"shared-memory race ({kind}): warp {warp} {verb} byte {byte}, which warp "
            f"{other_warp} {past} since the last barrier; insert a barrier between them",
            op.loc, other_loc=other.loc, other_what=f"{participle} by warp {other_warp}")

    def write(self, addresses, values, element, op, describe: Describe, track: bool = True) -> None:
        addresses = np.asarray(addresses, dtype=np.int64)
        size = self._byte_indices(addresses, element, op, "store", describe)
        view = self.bytes.view(memory_dtype(element))
        view[addresses // size] = np.broadcast_to(encode(element, values), addresses.shape)
        if track:
            self._track(addresses, size, op, write=True)

    def read(self, addresses, element, op, describe: Describe, track: bool = True) -> np.ndarray:
        addresses = np.asarray(addresses, dtype=np.int64)
        size = self._byte_indices(addresses, element, op, "load", describe)
        if track:
            self._track(addresses, size, op, write=False)
        return decode(element, self.bytes.view(memory_dtype(element))[addresses // size])

    def _track(self, addresses: np.ndarray, size: int, op, write: bool) -> None:
        """Check and record one access; addresses[w] are warp w's (leading axis = warp)."""
        op_id = self._op_id(op)
        warps = addresses.shape[0]
        byte_array = (addresses.reshape(warps, -1)[:, :, None] + np.arange(size)).reshape(warps, -1)
        bits = (np.uint64(1) << np.arange(warps, dtype=np.uint64))[:, None]
        if write:
            others = self.readers[byte_array] & ~bits
            conflict = others != 0
            kind, masks, op_ids, record = "WAR", self.writers, self.writer_op, self.reader_op
        else:
            written_by = self.writers[byte_array]
            conflict = ((written_by & ~bits) != 0) & ((written_by & bits) == 0)
            kind, masks, op_ids, record = "RAW", self.readers, self.reader_op, self.writer_op
        if conflict.any():
            warp = int(np.flatnonzero(conflict.any(axis=1))[0])
            row = byte_array[warp]
            seen = self.readers[row] if write else self.writers[row]
            self._race(kind, row, conflict[warp], warp, op, record[row], seen)
        # several warps may touch one byte (replicated layouts): OR every warp's bit in
        np.bitwise_or.at(masks, byte_array.reshape(-1), np.broadcast_to(bits, byte_array.shape).reshape(-1))
        op_ids[byte_array] = op_id
        self._dirty = True
