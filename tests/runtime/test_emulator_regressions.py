"""Regressions of the emulator (issue 38): a Ctrl-C in warp-specialized partitions ends the
run at once saying where each partition was; and the emulator is no stricter than the
hardware (a wait for 0 outstanding wgmma groups retires them all; an op predicated off
touches nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import weft
from weft import lowlevel as ll
from weft.lowlevel import mbarrier, tma
from weft.runtime.emulator import EmulationError

# ------------------------------------------------------------------ Ctrl-C in partitions
# An emulated warp-specialized matmul (a TMA producer warp and wgmma consumer warps) long
# enough to be interrupted; it says when a partition first waits (the scheduler is running).
_INTERRUPTED_MATMUL = textwrap.dedent("""
    import signal
    import sys
    import numpy as np
    # Python's own Ctrl-C handler, even where the test process hands down an ignored SIGINT
    # (a child inherits SIG_IGN, and Python then installs no handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from weft.kernels.matmul import matmul
    from weft.runtime.emulator import partitions

    block = partitions.Scheduler.block

    def announced_block(self, cta, waiter):
        if not getattr(partitions, "announced", False):
            partitions.announced = True
            sys.stderr.write("partitions started\\n")
            sys.stderr.flush()
        return block(self, cta, waiter)

    partitions.Scheduler.block = announced_block
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1024, 1024)).astype(np.float16)
    b = rng.standard_normal((1024, 1024)).astype(np.float16)
    matmul(a, b)
    sys.stderr.write("the matmul finished before the interrupt\\n")
""")


# Interrupts at different moments: a partition running an op, or both blocked in waits.
@pytest.mark.parametrize("delay_s", [0.0, 0.25, 0.6, 1.0, 1.5])
def test_ctrl_c_in_a_warp_specialized_kernel_ends_it_saying_where_each_partition_was(delay_s):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(weft.__file__)))
    process = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_MATMUL], env=env,
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        started = process.stderr.readline()
        assert started == "partitions started\n", started + process.stderr.read()
        time.sleep(delay_s)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        try:
            _, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the emulator hung after SIGINT (this process's SIGINT handler: "
                        f"{signal.getsignal(signal.SIGINT)!r})")
        took = time.monotonic() - interrupted
    finally:
        process.kill()
        process.wait()
    assert process.returncode != 0, stderr
    assert took < 5, f"{took:.1f} s to stop"
    assert "KeyboardInterrupt: the emulator was interrupted in warp_specialize" in stderr, stderr
    report = stderr[stderr.index("KeyboardInterrupt: the emulator"):]
    default, worker = [line for line in report.splitlines() if line.startswith("  partition ")]
    assert default.startswith("  partition 0, default partition (warps 0-7)"), report
    assert worker.startswith("  partition 1, worker 0 (warps 8-11)"), report
    # each partition that has run names the wait it is blocked in or the op it stopped
    # before, with its line in the matmul kernel (at once, the worker may not have run yet)
    for line in (default, worker) if delay_s > 0 else (default,):
        assert " waits at " in line or ": stopped before `" in line, report
        assert "matmul/kernels.py:" in line, report


# ------------------------------------------------------------------ wgmma waits
RNG = np.random.default_rng(38)
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
ACC = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 16])


@ll.jit
def tile_offsets(ROWS: ll.constexpr, COLS: ll.constexpr, layout: ll.constexpr):
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, layout))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, layout))
    return rows[:, None] * COLS + cols[None, :]


@ll.jit
def chained_after_a_dropped_wait(a_ptr, c_ptr, PENDING: ll.constexpr, READ: ll.constexpr):
    """acc = A @ A + A @ A: two async wgmmas; after the first, a wait whose result is
    dropped; the second chains from the first's own (InFlight) value."""
    a = ll.load(a_ptr + tile_offsets(64, 64, BLOCKED))
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16), a)
    ll.fence_async_shared()
    acc = ll.warpgroup_mma(smem, smem, ll.zeros([64, 64], ll.float32, ACC), is_async=True)
    ll.warpgroup_mma_wait(0, (acc,))  # retires every group: its result need not be used
    second = ll.warpgroup_mma(smem, smem, acc, is_async=True)
    third = ll.warpgroup_mma(smem, smem, second, is_async=True)
    ll.warpgroup_mma_wait(PENDING, (second, third))  # PENDING 1 leaves `third` in flight
    if READ == 1:
        ll.store(c_ptr + tile_offsets(64, 64, ACC), third)
    if READ == 2:
        ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)
    third = ll.warpgroup_mma_wait(0, (third,))
    ll.store(c_ptr + tile_offsets(64, 64, ACC), third)


def _chained(pending, read):
    a = RNG.standard_normal((64, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    chained_after_a_dropped_wait[(1,)](a, c, pending, read)
    return a, c


@pytest.mark.parametrize("pending", [0, 1])
def test_chaining_from_an_accumulator_retired_by_a_dropped_wait_0(pending):
    a, c = _chained(pending, 0)
    square = a.astype(np.float64) @ a.astype(np.float64)
    np.testing.assert_allclose(c, 3 * square, rtol=1e-5, atol=1e-3)


def test_reading_a_result_a_wait_1_left_in_flight_is_still_caught():
    with pytest.raises(EmulationError, match="before a warpgroup_mma_wait that lists it") as info:
        _chained(1, 1)  # two groups in flight, wait(1): the second is still running
    assert "third = ll.warpgroup_mma(smem, smem, second" in str(info.value)


def test_reading_a_retired_result_past_the_wait_that_returns_it_says_what_to_read():
    """The registers are final, but only reads of the wait's result are ordered after it."""
    with pytest.raises(EmulationError, match="read the value the wait returns instead"):
        _chained(0, 2)


# ------------------------------------------------------------------ ops predicated off
@ll.jit
def predicated_ring(desc, out, STAGES: ll.constexpr, ALWAYS: ll.constexpr):
    """Stage i's TMA load and expect run for i < STAGES; the arrive on stage i - 1's `done`
    for i > 0: the views at index STAGES and -1 are computed but never used (unless ALWAYS
    drops the arrive's predicate)."""
    ring = ll.allocate_shared_memory(desc.dtype, [STAGES, 64, 64], desc.layout)
    loaded = mbarrier.allocate_mbarrier(batch=STAGES)
    done = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(loaded.index(s), count=1)
        mbarrier.init(done.index(s), count=1)
    for i in range(STAGES + 1):
        mbarrier.expect(loaded.index(i), desc.nbytes, pred=i < STAGES)
        tma.async_copy_global_to_shared(desc, [i * 64, 0], loaded.index(i), ring.index(i),
                                        pred=i < STAGES)
        mbarrier.arrive(done.index(i - 1), pred=(i > 0) | ALWAYS)
    for s in ll.static_range(STAGES):
        mbarrier.wait(loaded.index(s), 0)
        mbarrier.wait(done.index(s), 0)
        ll.store(out + s * 64 * 64 + tile_offsets(64, 64, BLOCKED), ring.index(s).load(BLOCKED))


def _predicated_ring(always):
    x = RNG.standard_normal((3 * 64, 64)).astype(np.float16)
    out = np.zeros_like(x)
    predicated_ring[(1,)](ll.TensorDescriptor.from_tensor(x, [64, 64]), out, 3, always)
    return x, out


def test_ops_predicated_off_touch_nothing_at_out_of_range_indices():
    x, out = _predicated_ring(False)
    np.testing.assert_array_equal(out, x)


def test_an_op_that_runs_on_an_out_of_range_view_is_refused_at_its_line():
    with pytest.raises(EmulationError, match=r"uses a view with shared_index -1 out of range for "
                                             r"a buffer of 3 stages") as info:
        _predicated_ring(True)
    text = str(info.value)
    assert "mbarrier.arrive(done.index(i - 1), pred=(i > 0) | ALWAYS)" in text
    assert "view taken at" in text


# ------------------------------------------------------------------ errors in partitions
@ll.jit
def faulting_worker(bar, src, FAULT: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [1], [0])
    offsets = ll.arange(0, 32, layout)
    x = ll.load(src + offsets + (1 << 20 if FAULT else 0))  # far outside `src` when FAULT
    ll.store(src + offsets, x + 1.0)
    mbarrier.arrive(bar)


@ll.jit
def waiting_default(bar, src, FAULT: ll.constexpr):
    mbarrier.wait(bar, 0)


@ll.jit
def fault_in_a_worker(src, FAULT: ll.constexpr):
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    ll.warp_specialize((bar, src, FAULT), waiting_default, (bar, src, FAULT), [faulting_worker],
                       worker_num_warps=[1], worker_num_regs=[0])


def test_an_error_in_a_partition_unwinds_every_partition():
    threads = threading.active_count()
    src = np.zeros(32, np.float32)
    fault_in_a_worker[(1,)](src, False)
    np.testing.assert_array_equal(src, np.ones(32))
    started = time.monotonic()
    with pytest.raises(EmulationError, match="out of bounds") as info:
        fault_in_a_worker[(1,)](src, True)  # the default partition is blocked in its wait
    assert time.monotonic() - started < 5
    assert "ll.load(src + offsets + (1 << 20 if FAULT else 0))" in str(info.value)
    assert threading.active_count() == threads  # both partition threads are joined
