"""Host addresses kept in the kernel's data (a table of `x.ctypes.data` or `data_ptr()`
values, read and cast to pointers, as Triton tutorial 08's grouped GEMM does).

The emulator addresses buffers by virtual addresses (memory.py), so a host address means
nothing to it unless the array it points into is registered with the launch: each
argument is, and `reachable(*arrays)` adds arrays the kernel reaches only through such a
table. An int cast to a pointer that falls inside one of them becomes its virtual
address; any other int is left as it is (and faults where it is used).

    with emulator.reachable(*a_list, *b_list, *c_list):
        grouped_gemm[grid](a_table, b_table, c_table, ...)
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

_REACHABLE: contextvars.ContextVar[tuple] = contextvars.ContextVar("reachable", default=())


@contextlib.contextmanager
def reachable(*arrays):
    """Launches on the emulator inside this block may reach `arrays` through host addresses."""
    token = _REACHABLE.set(_REACHABLE.get() + tuple(arrays))
    try:
        yield
    finally:
        _REACHABLE.reset(token)


def reachable_arrays() -> tuple:
    return _REACHABLE.get()


def to_virtual(memory, values: np.ndarray) -> np.ndarray:
    """`values` (int64 addresses) with host addresses inside a registered buffer's bytes
    replaced by the virtual ones."""
    values = np.asarray(values, dtype=np.int64)
    out = values.copy()
    for k, buffer in enumerate(memory.buffers):
        start = buffer.raw.ctypes.data
        inside = (values >= start) & (values < start + len(buffer.raw))
        if inside.any():
            out[inside] = values[inside] - start - buffer.origin + memory.base_address(k)
    return out
