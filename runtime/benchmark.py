"""Timing launches on the GPU with CUDA events, and the buffer resets the autotuner makes
between timed runs (runtime/autotune.py).

`do_bench` follows the method of `triton.testing.do_bench`: one call first (it compiles
and loads the kernel), a few calls to estimate the time of one, then warm-up calls and
timed calls sized from the estimate to fill `warmup` and `rep` milliseconds. Before each
timed call a 256 MiB buffer is zeroed, so no call finds its inputs already in L2 (H100's
L2 holds 50 MiB; a kernel that runs again on a warm L2 looks faster than it will in a
model). It needs only the CUDA driver; torch is not imported.

The buffer helpers take the arrays a kernel is launched with: numpy arrays (the CPU
emulator), torch tensors (through torch, imported only because the caller passed one) and
other CUDA arrays (`__cuda_array_interface__`, through the driver).
"""

from __future__ import annotations

import statistics
import sys
from typing import Callable, Optional, Sequence

import numpy as np

from . import driver
from .host_arrays import is_torch

_FLUSH_BYTES = 256 << 20
_ESTIMATE_CALLS = 5
_flush_buffer: Optional[int] = None


def do_bench(fn: Callable[[], None], warmup: float = 25, rep: float = 100,
             quantiles: Optional[Sequence[float]] = None, return_mode: str = "mean"):
    """Milliseconds one call of `fn` takes on the GPU: the `return_mode` ("mean", "median",
    "min" or "max") of the timed calls, or, with `quantiles`, those quantiles of them (a
    list). `warmup` and `rep` are milliseconds of warm-up and of timed calls."""
    if return_mode not in ("mean", "median", "min", "max"):
        raise ValueError(f"do_bench: return_mode must be mean, median, min or max, got {return_mode!r}")
    stream = _current_stream()
    fn()
    driver.synchronize()
    start, end = driver.create_event(), driver.create_event()
    try:
        driver.record_event(start, stream)
        for _ in range(_ESTIMATE_CALLS):
            _flush_l2(stream)
            fn()
        driver.record_event(end, stream)
        estimate = max(driver.elapsed_ms(start, end) / _ESTIMATE_CALLS, 1e-6)
    finally:
        driver.destroy_event(start)
        driver.destroy_event(end)
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    repeats = max(1, int(rep / estimate))
    starts = [driver.create_event() for _ in range(repeats)]
    ends = [driver.create_event() for _ in range(repeats)]
    try:
        for begin, finish in zip(starts, ends):
            _flush_l2(stream)
            driver.record_event(begin, stream)
            fn()
            driver.record_event(finish, stream)
        times = [driver.elapsed_ms(begin, finish) for begin, finish in zip(starts, ends)]
    finally:
        for event in starts + ends:
            driver.destroy_event(event)
    if quantiles is not None:
        ordered = sorted(times)
        return [float(np.quantile(ordered, q)) for q in quantiles]
    return float({"mean": statistics.fmean, "median": statistics.median,
                  "min": min, "max": max}[return_mode](times))


def _current_stream() -> int:
    """The stream launches go to: torch's current stream when torch is in use (the launcher
    picks it for torch tensors), else the default stream."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_stream().cuda_stream)
    return 0


def _flush_l2(stream: int) -> None:
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = driver.allocate(_FLUSH_BYTES)
    driver.memset_d32_async(_flush_buffer, _FLUSH_BYTES // 4, stream)


# ----------------------------------------------------------------------------- buffers

def zero(array) -> None:
    """Set every element of `array` to zero, in place."""
    if isinstance(array, np.ndarray):
        array[...] = 0
    elif is_torch(array):
        array.zero_()
    else:
        address, nbytes = _cuda_span(array)
        driver.memset_d8_async(address, nbytes, 0)
        driver.synchronize()


def snapshot(array) -> Callable[[], None]:
    """A copy of `array` now; calling the result writes the copy back into `array`."""
    if isinstance(array, np.ndarray):
        saved = array.copy()
        return lambda: np.copyto(array, saved)
    if is_torch(array):
        saved = array.clone()
        return lambda: array.copy_(saved)
    address, nbytes = _cuda_span(array)
    saved_address = driver.allocate(nbytes)
    driver.copy_device_to_device_async(saved_address, address, nbytes, 0)

    def restore() -> None:
        driver.copy_device_to_device_async(address, saved_address, nbytes, 0)
        driver.synchronize()
    restore.release = lambda: driver.free(saved_address)
    return restore


def _cuda_span(array) -> tuple[int, int]:
    """(first byte, bytes up to the last element's end) of a `__cuda_array_interface__`
    array; TypeError for anything else."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        raise TypeError(f"cannot reset or restore a {type(array).__qualname__}: pass numpy "
                        "arrays, torch tensors or CUDA arrays (__cuda_array_interface__)")
    itemsize = int(interface["typestr"][2:])
    shape = tuple(interface["shape"])
    strides = interface.get("strides") or _contiguous_strides(shape, itemsize)
    if any(s < 0 for s in strides):
        raise TypeError("cannot reset or restore a CUDA array with negative strides")
    span = 0 if 0 in shape else sum((n - 1) * s for n, s in zip(shape, strides)) + itemsize
    return int(interface["data"][0]), span


def _contiguous_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
