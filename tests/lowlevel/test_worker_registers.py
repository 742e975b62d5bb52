"""Register budgets for worker partitions smaller than a warpgroup (Gluon's
`worker_num_warps=[1], worker_num_regs=[24]`): setmaxnreg acts on whole warpgroups, so
idle warps fill the producer's warpgroup and take its budget, and one-warp workers that
share a warpgroup share its largest budget. On the emulator (a one-warp TMA producer
feeding an mbarrier ring), in the IR, through ptxas and on the GPU."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.lowlevel import mbarrier, tma

RNG = np.random.default_rng(24)
ROWS, COLS, STAGES = 32, 32, 2
TILE = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])  # [ROWS, COLS] over the default warpgroup
SWIZZLED = ll.NVMMASharedLayout(128, 32)


@ll.jit
def load_tiles(desc, tiles, ready, empty, count):
    """One warp: TMA loads of `count` row tiles into the ring, each once its slot is free."""
    for i in range(count):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), (i // STAGES & 1) ^ 1)
        mbarrier.expect(ready.index(slot), desc.nbytes)
        tma.async_copy_global_to_shared(desc, [i * ROWS, 0], ready.index(slot), tiles.index(slot))


@ll.jit
def scale_tiles(out_ptr, tiles, ready, empty, count, scale):
    """The default warpgroup: each tile times `scale`, its slot handed back after the read."""
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, TILE))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, TILE))
    for i in range(count):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), i // STAGES & 1)
        x = tiles.index(slot).load(TILE)
        ll.fence_async_shared()  # the read, before the next TMA load into the slot
        mbarrier.arrive(empty.index(slot))
        ll.store(out_ptr + (i * ROWS + rows[:, None]) * COLS + cols[None, :], x * scale)


@ll.jit
def one_warp_producer(desc, out_ptr, count, scale, REGS: ll.constexpr, WORKERS: ll.constexpr,
                      TWICE: ll.constexpr = False):
    tiles = ll.allocate_shared_memory(ll.float32, [STAGES, ROWS, COLS], SWIZZLED)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    if WORKERS == 2:  # a second one-warp worker with a budget of its own, in the producer's warpgroup
        ll.warp_specialize([(scale_tiles, (out_ptr, tiles, ready, empty, count, scale)),
                            (load_tiles, (desc, tiles, ready, empty, count)),
                            (load_tiles, (desc, tiles, ready, empty, 0))], [1, 1], [REGS, 2 * REGS])
    else:
        ll.warp_specialize([(scale_tiles, (out_ptr, tiles, ready, empty, count, scale)),
                            (load_tiles, (desc, tiles, ready, empty, count))], [1], [REGS])
    if TWICE:  # the first op's worker warps stay for the second, which has nothing left to do
        ll.warp_specialize([(scale_tiles, (out_ptr, tiles, ready, empty, 0, scale)),
                            (load_tiles, (desc, tiles, ready, empty, 0))], [1], [REGS])


@pytest.mark.parametrize("workers, twice", [(1, False), (2, False), (1, True)])
def test_a_one_warp_producer_with_24_registers_feeds_the_ring_on_the_emulator(workers, twice):
    x = RNG.standard_normal((5 * ROWS, COLS)).astype(np.float32)
    out = np.full_like(x, np.nan)
    desc = ll.TensorDescriptor.from_tensor(x, [ROWS, COLS], SWIZZLED)
    one_warp_producer[(1,)](desc, out, 5, 3.0, REGS=24, WORKERS=workers, TWICE=twice, num_warps=4)
    np.testing.assert_array_equal(out, x * np.float32(3.0))


SIGNATURE = {"desc": f"tensordesc<fp32[{ROWS},{COLS}]>", "out_ptr": "*fp32", "count": "i32", "scale": "fp32"}


def _op(workers: int) -> ir.WarpSpecialize:
    kernel = build_kernel(one_warp_producer, SIGNATURE, {"REGS": 24, "WORKERS": workers}, 4)
    op, = [op for op in kernel.walk() if isinstance(op, ir.WarpSpecialize)]
    return op


def test_idle_warps_fill_the_producers_warpgroup_and_take_its_budget():
    op = _op(1)
    assert op.worker_num_warps == (1, 2, 1) and op.worker_num_regs == (24, 24, 24)
    assert all(len(block.ops) == 1 for block in op.workers[1:])  # idle: nothing but the yield
    # 65536 registers less the producer warpgroup's 4 * 32 * 24, over the default's 128 threads
    # is more than 240: the default gets 240.
    assert op.default_num_regs == 240


def test_under_a_launch_maxnreg_the_default_gets_what_the_pool_leaves():
    """maxnreg=128 on 8 warps: 128 * 256 registers, less the producer warpgroup's 24 * 128,
    over the default's 128 threads is 232 (Triton's AllocateWarpGroups gets the same)."""
    kernel = build_kernel(one_warp_producer, SIGNATURE, {"REGS": 24, "WORKERS": 1}, 4, max_registers=128)
    op, = [op for op in kernel.walk() if isinstance(op, ir.WarpSpecialize)]
    assert op.default_num_regs == 232


def test_one_warp_workers_in_one_warpgroup_share_its_largest_budget():
    op = _op(2)
    assert op.worker_num_warps == (1, 1, 2) and op.worker_num_regs == (48, 48, 48)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_every_warp_of_the_producers_warpgroup_sets_the_budget_through_ptxas():
    compiled = one_warp_producer.compile(signature=SIGNATURE, constexprs={"REGS": 24, "WORKERS": 1}, num_warps=4)
    ptx = compiled.asm["ptx"]
    # The producer and the two idle partitions (2 + 1 warps) each lower their budget on
    # entry; the producer and the default take the launch cap (248 for 8 warps) back before
    # the join, the idle warps leave after it with the kernel's last warp_specialize.
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 24;") == 3
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 240;") == 1
    assert ptx.count("setmaxnreg.inc.sync.aligned.u32 248;") == 2
    assert ".maxntid 256" in ptx and compiled.metadata["total_warps"] == 8
    assert compiled.metadata["spill_stores"] == 0
    # Where worker warps stay for a later warp_specialize, the idle ones take the cap back
    # past the join's barrier (once per op but the last), when no partition still needs theirs.
    twice = one_warp_producer.compile(signature=SIGNATURE, constexprs={"REGS": 24, "WORKERS": 1, "TWICE": True},
                                      num_warps=4).asm["ptx"]
    assert twice.count("setmaxnreg.dec.sync.aligned.u32 24;") == 6
    assert twice.count("setmaxnreg.inc.sync.aligned.u32 248;") == 5
    capped = one_warp_producer.compile(signature=SIGNATURE, constexprs={"REGS": 24, "WORKERS": 1}, num_warps=4,
                                       maxnreg=128).asm["ptx"]
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in capped and ".maxnreg 128" in capped


@ll.jit
def budget_beside_none(desc, out_ptr, count, scale):
    tiles = ll.allocate_shared_memory(ll.float32, [STAGES, ROWS, COLS], SWIZZLED)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    ll.warp_specialize([(scale_tiles, (out_ptr, tiles, ready, empty, count, scale)),
                        (load_tiles, (desc, tiles, ready, empty, count)),
                        (load_tiles, (desc, tiles, ready, empty, 0))], [1, 1], [24, 0])


@ll.jit
def two_warp_default(desc, out_ptr, count, scale):
    tiles = ll.allocate_shared_memory(ll.float32, [STAGES, ROWS, COLS], SWIZZLED)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    ll.warp_specialize([(load_tiles, (desc, tiles, ready, empty, count)),
                        (load_tiles, (desc, tiles, ready, empty, count))], [1], [24])


@pytest.mark.parametrize("kernel, num_warps, message", [
    (budget_beside_none, 4, "keep the launch budget (0)"),
    (two_warp_default, 2, "the default partition needs a multiple of 4 warps"),
])
def test_budgets_a_warpgroup_cannot_hold_are_refused_at_the_users_line(kernel, num_warps, message):
    with pytest.raises(CompilationError) as info:
        build_kernel(kernel, SIGNATURE, {}, num_warps)
    assert message in str(info.value) and "ll.warp_specialize([" in str(info.value)


@pytest.mark.gpu
def test_a_one_warp_producer_with_24_registers_on_the_gpu():
    torch = pytest.importorskip("torch")
    x = torch.randn(7 * ROWS, COLS, device="cuda")
    out = torch.full_like(x, float("nan"))
    desc = ll.TensorDescriptor.from_tensor(x, [ROWS, COLS], SWIZZLED)
    one_warp_producer[(1,)](desc, out, 7, 3.0, REGS=24, WORKERS=1, num_warps=4)
    torch.testing.assert_close(out, x * 3.0, rtol=0, atol=0)
