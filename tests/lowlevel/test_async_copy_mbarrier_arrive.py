"""async_copy.mbarrier_arrive (cp.async.mbarrier.arrive.noinc): a worker's threads copy by
cp.async and each arrives on a barrier once its copies landed, with no commit group,
wait_group or barrier; a partition waiting for the phase reads every thread's copies. On
the emulator (masked-off elements zero-filled; a barrier counting fewer arrivals than the
threads, and a read without the wait, reported), through ptxas, and on the GPU."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.lowlevel import async_copy, mbarrier
from weft.runtime.emulator import EmulationError

RNG = np.random.default_rng(9)
TILE = ll.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [32, 32] fp16 over one warpgroup, 16-byte rows
SHARED = ll.SwizzledSharedLayout(1, 1, 1, [1, 0])


@ll.jit
def read_when_landed(buffer, landed, dst_ptr, WAIT: ll.constexpr):
    """The default partition: once every copying thread arrived, the tile."""
    if WAIT:
        mbarrier.wait(landed, 0)
    rows = ll.arange(0, 32, ll.SliceLayout(1, TILE))
    cols = ll.arange(0, 32, ll.SliceLayout(0, TILE))
    ll.store(dst_ptr + rows[:, None] * 32 + cols[None, :], buffer.load(TILE))


@ll.jit
def copy_then_arrive(buffer, landed, src_ptr, n):
    """The worker: each thread copies its elements (those below n) and arrives for them."""
    rows = ll.arange(0, 32, ll.SliceLayout(1, TILE))
    cols = ll.arange(0, 32, ll.SliceLayout(0, TILE))
    offsets = rows[:, None] * 32 + cols[None, :]
    async_copy.async_copy_global_to_shared(buffer, src_ptr + offsets, offsets < n)
    async_copy.mbarrier_arrive(landed)


@ll.jit
def handoff(src_ptr, dst_ptr, n, ARRIVALS: ll.constexpr, WAIT: ll.constexpr):
    buffer = ll.allocate_shared_memory(ll.float16, [32, 32], SHARED)
    landed = mbarrier.allocate_mbarrier()
    mbarrier.init(landed, count=ARRIVALS)
    ll.warp_specialize((buffer, landed, dst_ptr, WAIT), read_when_landed, (buffer, landed, src_ptr, n),
                       [copy_then_arrive], worker_num_warps=[4], worker_num_regs=[0])
    mbarrier.invalidate(landed)


def test_every_thread_arrives_once_its_copies_landed():
    src = RNG.standard_normal((32, 32)).astype(np.float16)
    dst = np.full_like(src, np.nan)
    handoff[(1,)](src, dst, 1000, 128, True, num_warps=4)
    np.testing.assert_array_equal(dst, np.where(np.arange(32 * 32).reshape(32, 32) < 1000, src, 0))


def test_a_barrier_counting_fewer_arrivals_than_threads_is_reported():
    src = RNG.standard_normal((32, 32)).astype(np.float16)
    with pytest.raises(EmulationError, match="more arrivals than init"):
        handoff[(1,)](src, np.zeros_like(src), 1024, 4, True, num_warps=4)


def test_reading_without_the_wait_is_a_race():
    src = RNG.standard_normal((32, 32)).astype(np.float16)
    with pytest.raises(EmulationError, match="race|still writing"):
        handoff[(1,)](src, np.zeros_like(src), 1024, 128, False, num_warps=4)


def compiled_ptx(aligned: bool) -> str:
    specialization = {"src_ptr": "divisible_by_16", "n": "divisible_by_16"} if aligned else {}
    return handoff.compile(signature={"src_ptr": "*fp16", "dst_ptr": "*fp16", "n": "i32"}, num_warps=4,
                           specialization=specialization, constexprs={"ARRIVALS": 128, "WAIT": True}).asm["ptx"]


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_aligned_copies_arrive_by_one_noinc_instruction():
    ptx = compiled_ptx(aligned=True)
    arrive = ptx.index("cp.async.mbarrier.arrive.noinc.shared::cta.b64")
    assert "cp.async.cg.shared.global" in ptx[:arrive] and "st.shared" not in ptx[:arrive]
    assert "mbarrier.arrive.shared" not in ptx and "cp.async.wait_group" not in ptx


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_copies_through_registers_are_released_by_an_arrive_of_their_own():
    """Rows of unknown alignment copy 2 bytes at a time through registers: shared stores
    that the async arrival does not order, so the thread also arrives by mbarrier.arrive
    (release), the async one holding the phase for its copies without counting."""
    ptx = compiled_ptx(aligned=False)
    held = ptx.index("cp.async.mbarrier.arrive.shared::cta.b64")
    assert "st.shared.b16" in ptx[:held] and ".noinc" not in ptx
    assert "mbarrier.arrive.shared::cta.b64 _," in ptx[held:]


@pytest.mark.gpu
def test_on_the_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    src = torch.randn(32, 32, device="cuda", dtype=torch.float16)
    dst = torch.full_like(src, float("nan"))
    handoff[(1,)](src, dst, 1000, 128, True, num_warps=4)
    torch.cuda.synchronize()
    expected = torch.where(torch.arange(32 * 32, device="cuda").reshape(32, 32) < 1000, src, 0)
    assert torch.equal(dst, expected)
