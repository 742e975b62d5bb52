"""WEFT_EMULATE_RACECHECK: the emulator also reports what compute-sanitizer's racecheck
would, accesses the hardware orders only through a partition's named barrier and ONE
thread's mbarrier arrive (runtime/emulator/racecheck.py). A handoff of ordinary stores
(RAW) and of ordinary loads before a rewrite (WAR): with one arrival each is a racecheck
hazard, yet runs clean without the flag; with every thread arriving (per_thread) it is
clean either way, and the values are right."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler import config
from weft.lowlevel import mbarrier
from weft.runtime.emulator import EmulationError

RNG = np.random.default_rng(41)
VECTOR = ll.BlockedLayout([1], [32], [4], [0])  # [128] over one warpgroup, one element a thread
SHARED = ll.SwizzledSharedLayout(1, 1, 1, [0])


@ll.jit
def release(bar, PER_THREAD: ll.constexpr):
    if PER_THREAD:
        mbarrier.arrive(bar, per_thread=True)
    else:
        mbarrier.arrive(bar)  # a named barrier over the partition, then one thread's arrival


@ll.jit
def writer(buffer, written, read, src_ptr, PER_THREAD: ll.constexpr):
    """The default partition: src into the buffer (handed over), then once it is read, 2 src."""
    offsets = ll.arange(0, 128, VECTOR)
    buffer.store(ll.load(src_ptr + offsets))
    release(written, PER_THREAD)
    mbarrier.wait(read, 0)
    buffer.store(ll.load(src_ptr + offsets) * 2.0)


@ll.jit
def reader(buffer, written, read, dst_ptr, PER_THREAD: ll.constexpr):
    """The worker: the buffer into dst. Its warp w reads what the writer's warp w wrote: warps
    1-3 of each are ordered only through the named barrier before one thread's arrival."""
    mbarrier.wait(written, 0)
    values = buffer.load(VECTOR)
    release(read, PER_THREAD)
    ll.store(dst_ptr + ll.arange(0, 128, VECTOR), values)


@ll.jit
def handoff(src_ptr, dst_ptr, PER_THREAD: ll.constexpr):
    buffer = ll.allocate_shared_memory(ll.float32, [128], SHARED)
    written = mbarrier.allocate_mbarrier()
    read = mbarrier.allocate_mbarrier()
    mbarrier.init(written, count=128 if PER_THREAD else 1)
    mbarrier.init(read, count=128 if PER_THREAD else 1)
    ll.warp_specialize((buffer, written, read, src_ptr, PER_THREAD), writer,
                       (buffer, written, read, dst_ptr, PER_THREAD), [reader], worker_num_warps=[4],
                       worker_num_regs=[0])
    mbarrier.invalidate(written)
    mbarrier.invalidate(read)


def _run(per_thread: bool) -> np.ndarray:
    src = RNG.standard_normal(128).astype(np.float32)
    dst = np.full_like(src, np.nan)
    handoff[(1,)](src, dst, per_thread, num_warps=4)
    np.testing.assert_array_equal(dst, src)
    return dst


@pytest.mark.parametrize("per_thread", [False, True])
def test_without_the_flag_both_releases_run_clean(monkeypatch, per_thread):
    monkeypatch.delenv("WEFT_EMULATE_RACECHECK", raising=False)
    _run(per_thread)


def test_one_threads_arrival_is_a_racecheck_hazard(monkeypatch):
    monkeypatch.setenv("WEFT_EMULATE_RACECHECK", "1")
    with pytest.raises(EmulationError, match=r"racecheck hazard \(RAW\): warp [5-7] \(worker 0\) reads byte \d+, which "
                                             r"warp [123] \(default partition\) wrote.*per_thread=True"):
        _run(False)


@ll.jit
def reader_per_thread_writer_once(src_ptr, dst_ptr):
    """The RAW handoff by every thread, the WAR one (the reader's release) by one."""
    buffer = ll.allocate_shared_memory(ll.float32, [128], SHARED)
    written = mbarrier.allocate_mbarrier()
    read = mbarrier.allocate_mbarrier()
    mbarrier.init(written, count=128)
    mbarrier.init(read, count=1)
    ll.warp_specialize((buffer, written, read, src_ptr, True), writer,
                       (buffer, written, read, dst_ptr, False), [reader], worker_num_warps=[4],
                       worker_num_regs=[0])
    mbarrier.invalidate(written)
    mbarrier.invalidate(read)


def test_a_read_released_by_one_thread_before_a_rewrite_is_a_racecheck_hazard(monkeypatch):
    monkeypatch.setenv("WEFT_EMULATE_RACECHECK", "1")
    src = RNG.standard_normal(128).astype(np.float32)
    with pytest.raises(EmulationError, match=r"racecheck hazard \(WAR\): warp [1-3] \(default partition\) writes "
                                             r"byte \d+, which warp [5-7] \(worker 0\) read"):
        reader_per_thread_writer_once[(1,)](src, np.zeros_like(src), num_warps=4)


def test_every_thread_arriving_is_racecheck_clean(monkeypatch):
    monkeypatch.setenv("WEFT_EMULATE_RACECHECK", "1")
    _run(True)


def test_the_flag_is_read_from_the_environment():
    assert config.current({"WEFT_EMULATE_RACECHECK": "1"}).emulate_racecheck
    assert not config.current({}).emulate_racecheck
