"""Global memory (the argument buffers) and one CTA's shared memory with race tracking.

Global pointers are int64 *byte addresses* in a virtual space: argument buffer k starts at
(k + 1) << 44, so pointer arithmetic, selects between pointers and bitcasts behave as on
the GPU, and any address decodes back to the buffer it points into (offsets within +-2**43
bytes of a buffer are attributed to it, so a negative index is reported against the right
argument).

Shared memory is one byte array per CTA at the kernel's real byte offsets. A sequential CTA
model cannot lose data to a missing barrier, so accesses are tracked instead (ordering.py):
a warp reading bytes another warp wrote (and it did not write itself), or writing bytes
another warp read, with no barrier or mbarrier wait ordering the two is a race (RAW /
WAR), reported with both source lines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ...compiler import config
from .dtypes import decode, element_bytes, encode, memory_dtype
from .errors import EmulationError
from .ordering import Ordering

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
        # Host addresses of the elements that TMA reduce-adds of this launch add into
        # (emulator/tma.py): their sums land by the kernel's end only, so plain accesses race.
        self.reduced: Optional[np.ndarray] = None
        # Tensor maps kernels wrote in global memory (emulator/tensormaps.py), by address.
        self.tensor_maps: dict = {}

    def host_addresses(self, addresses, element, mask, loc, describe: Describe) -> np.ndarray:
        """The host memory addresses of the elements at `addresses` where `mask` holds (0
        elsewhere): one array passed both as a pointer and inside a descriptor is two
        argument buffers, at one host address."""
        addresses = np.asarray(addresses, dtype=np.int64)
        active = np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(mask, addresses.shape)
        ids, offsets = self._locate(addresses, active, element, "access", loc, describe)
        host = np.zeros(addresses.shape, np.int64)
        for k in _buffer_ids(ids, active):
            buffer = self.buffers[int(k)]
            mine = active & (ids == k)
            host[mine] = buffer.raw.ctypes.data + buffer.origin + offsets[mine]
        return host

    def add(self, name: str, array: np.ndarray, element) -> np.int64:
        raw, origin = _byte_span(array)
        size = element_bytes(element)
        self.buffers.append(Buffer(name, raw, origin, element, (len(raw) - origin) // size))
        return self.base_address(len(self.buffers) - 1)

    @staticmethod
    def base_address(index: int) -> np.int64:
        """The virtual address of buffer `index`'s element 0."""
        return np.int64((index + 1) << ADDRESS_SHIFT)

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

    def check(self, addresses, element, mask, what: str, loc, describe: Describe) -> None:
        """Raise as an access `what` would where `mask` holds: an address outside every
        argument buffer, out of bounds or misaligned (atomics check before updating)."""
        addresses = np.asarray(addresses, dtype=np.int64)
        active = np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(mask, addresses.shape)
        self._locate(addresses, active, element, what, loc, describe)

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


WINDOW_ALIGN = 1024  # a cluster CTA's shared window: the largest alignment a buffer needs


class SharedMemory:
    """One CTA's shared memory: bytes at their real addresses, plus race tracking
    (ordering.py) and the state of the mbarriers living in it (mbarrier.py).

    For a cluster of `ctas` CTAs, theirs side by side, as in the shared::cluster window:
    rank r's bytes start at r * `window` and its warps at r * total_warps, so one clock
    space orders the warps of the whole cluster (a multicast load into a peer, an arrival
    on a peer's barrier, a cluster barrier) and one list holds the loads in flight."""

    def __init__(self, size: int, num_warps: int, total_warps: Optional[int] = None, ctas: int = 1):
        # A CTA's window keeps its buffers' alignment (swizzles come from address bits):
        # on the GPU rank r's starts at r << 24.
        align = 16 if ctas == 1 else WINDOW_ALIGN
        self.window = -(-max(size, 1) // align) * align
        self.cta_size = size  # the kernel's shared bytes: each CTA's buffers lie within them
        self.size = size if ctas == 1 else self.window * ctas
        self.ctas = ctas
        padded = self.window * ctas
        self.bytes = np.full(padded, POISON_BYTE, dtype=np.uint8)
        self.num_warps = num_warps
        self.total_warps = total_warps or num_warps
        self.ordering = Ordering(padded, self.total_warps * ctas, racecheck=config.emulate_racecheck())
        if ctas > 1:
            self.ordering.window = self.window
        self.cta_warps = (0, self.total_warps)  # the running CTA's first warp and warp count
        self.exited: set[int] = set()  # ranks of the cluster's CTAs that have ended
        self.mbarriers: dict = {}  # byte address -> mbarrier.MBarrier
        self.in_flight: list = []  # mbarrier.TmaInFlight, oldest first
        # Which load lands next (mbarrier.land_next): the oldest, or under
        # WEFT_EMULATE_SHUFFLE one drawn from this generator, the same order on every run.
        seed = config.emulate_shuffle()
        self.landing = None if seed is None else random.Random(seed)
        # The running partition's first warp and warp count (register arrays' leading
        # axis); `partitioned` while warp_specialize partitions run.
        self.active = (0, num_warps)
        self.partitioned = False
        # While a split whose warpgroups take turns runs: warpgroup_replay.SyncReplay.
        self.sync_trace = None

    def reset(self) -> None:
        """Fresh shared memory for the next CTA: poisoned bytes, no pending accesses."""
        self.bytes.fill(POISON_BYTE)
        self.mbarriers.clear()
        self.in_flight.clear()
        self.ordering.new_cta()
        self.active = (0, self.num_warps)
        self.partitioned = False
        self.cta_warps = (0, self.total_warps)
        self.exited.clear()

    def active_warps(self) -> np.ndarray:
        first, count = self.active
        return np.arange(first, first + count)

    def barrier(self) -> None:
        """bar.sync: the whole CTA (every warp, workers included, as the backend launches
        them), or inside a warp_specialize partition a named barrier over its warps."""
        first, count = self.active if self.partitioned else self.cta_warps
        self.ordering.join(np.arange(first, first + count))
        if self.sync_trace is not None and self.partitioned:
            self.sync_trace.sync(first, count)

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

    def write(self, addresses, values, element, op, describe: Describe, track: bool = True,
              writers: Optional[np.ndarray] = None) -> None:
        """`writers`: which warps (of the leading axis) write; None: all of them."""
        addresses = np.asarray(addresses, dtype=np.int64)
        size = self._byte_indices(addresses, element, op, "store", describe)
        values = np.broadcast_to(encode(element, values), addresses.shape)
        if writers is not None:
            addresses, values = addresses[writers], values[writers]
        view = self.bytes.view(memory_dtype(element))
        view[addresses // size] = values
        if track:
            self._track(addresses, size, op, write=True, warps=None if writers is None else np.flatnonzero(writers))

    def read(self, addresses, element, op, describe: Describe, track: bool = True) -> np.ndarray:
        addresses = np.asarray(addresses, dtype=np.int64)
        size = self._byte_indices(addresses, element, op, "load", describe)
        if track:
            self._track(addresses, size, op, write=False)
        return decode(element, self.bytes.view(memory_dtype(element))[addresses // size])

    def _track(self, addresses: np.ndarray, size: int, op, write: bool, warps=None) -> None:
        """Check and record one access; addresses[k] are the running partition's warp
        warps[k]'s (default: warp k's)."""
        count = addresses.shape[0]
        byte_array = (addresses.reshape(count, -1)[:, :, None] + np.arange(size)).reshape(count, -1)
        self.ordering.access(byte_array, self.active[0] + (np.arange(count) if warps is None else warps), op, write)
