"""mbarrier.arrive(per_thread=True): every thread of a partition arrives for itself, with no
sync, so a waiting partition may read what each of them wrote to shared memory; on the
emulator, through ptxas and on the GPU, with the errors for what it cannot do."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.lowlevel import mbarrier
from weft.compiler.backend import ptxas
from weft.runtime.emulator import EmulationError

RNG = np.random.default_rng(8)
VECTOR = ll.BlockedLayout([1], [32], [4], [0])  # [128] over one warpgroup, one element a thread
SHARED = ll.SwizzledSharedLayout(1, 1, 1, [0])


@ll.jit
def read_when_written(buffer, written, dst_ptr):
    """The default partition: once every thread of the worker has arrived, its values."""
    mbarrier.wait(written, 0)
    ll.store(dst_ptr + ll.arange(0, 128, VECTOR), buffer.load(VECTOR))


@ll.jit
def write_then_arrive(buffer, written, src_ptr):
    """The worker: each thread doubles its value into shared memory and arrives."""
    buffer.store(ll.load(src_ptr + ll.arange(0, 128, VECTOR)) * 2.0)
    mbarrier.arrive(written, per_thread=True)


@ll.jit
def per_thread_exchange(src_ptr, dst_ptr, ARRIVALS: ll.constexpr):
    buffer = ll.allocate_shared_memory(ll.float32, [128], SHARED)
    written = mbarrier.allocate_mbarrier()
    mbarrier.init(written, count=ARRIVALS)
    ll.warp_specialize((buffer, written, dst_ptr), read_when_written, (buffer, written, src_ptr),
                       [write_then_arrive], worker_num_warps=[4], worker_num_regs=[0])
    mbarrier.invalidate(written)


def test_every_thread_arrives_and_its_writes_are_read_after_the_wait():
    src = RNG.standard_normal(128).astype(np.float32)
    dst = np.full_like(src, np.nan)
    per_thread_exchange[(1,)](src, dst, 128, num_warps=4)
    np.testing.assert_array_equal(dst, 2 * src)


def test_a_barrier_counted_per_warp_takes_too_many_arrivals():
    src = RNG.standard_normal(128).astype(np.float32)
    with pytest.raises(EmulationError, match="more arrivals than init"):
        per_thread_exchange[(1,)](src, np.zeros_like(src), 4, num_warps=4)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_each_thread_issues_its_own_arrival():
    """No warp sync (a per-warp arrive's, before its lane 0 arrives) and no named barrier in
    the worker before it: the CTA-wide barrier 0 around warp_specialize is the only one."""
    compiled = per_thread_exchange.compile(signature={"src_ptr": "*fp32", "dst_ptr": "*fp32"},
                                           constexprs={"ARRIVALS": 128}, num_warps=4)
    ptx = compiled.asm["ptx"]
    assert "mbarrier.arrive.shared::cta.b64" in ptx and "bar.warp.sync" not in ptx
    barriers = [line.split()[1] for line in ptx.splitlines() if line.strip().startswith("bar.sync")]
    assert barriers == ["0;", "0;"]


@pytest.mark.gpu
def test_gpu_every_thread_arrives():
    torch = pytest.importorskip("torch")
    src = torch.randn(128, device="cuda")
    dst = torch.full_like(src, float("nan"))
    per_thread_exchange[(1,)](src, dst, 128, num_warps=4)
    torch.cuda.synchronize()
    assert torch.equal(dst, 2 * src)


@ll.jit
def per_thread_and_per_warp():
    done = mbarrier.allocate_mbarrier()
    mbarrier.init(done, count=1)
    mbarrier.arrive(done, per_thread=True, per_warp=True)


@ll.jit
def per_thread_not_a_bool():
    done = mbarrier.allocate_mbarrier()
    mbarrier.init(done, count=1)
    mbarrier.arrive(done, per_thread=1)


def test_misuse_gets_errors_that_say_what_to_change():
    with pytest.raises(CompilationError, match="per_thread=True arrives from every thread.*leave per_warp"):
        per_thread_and_per_warp.compile(signature={}, constexprs={}, num_warps=4)
    with pytest.raises(CompilationError, match="per_thread must be a compile-time True or False"):
        per_thread_not_a_bool.compile(signature={}, constexprs={}, num_warps=4)
