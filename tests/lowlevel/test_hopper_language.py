"""weft.lowlevel's Hopper ops (mbarrier, tma, async_copy, warpgroup_mma, warp_specialize,
shared permute views): the IR they build and the errors bad input gets (no GPU)."""

import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.pipeline import run_layout_passes
from weft.lowlevel import async_copy, mbarrier, tma

ACC = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 16])
SWIZZLED = ll.NVMMASharedLayout(128, 16)
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
DESC = {"desc": "tensordesc<fp16[64,64]>"}


def build(fn, signature=None, constexprs=None, num_warps=4):
    return build_kernel(fn, signature or {}, constexprs or {}, num_warps)


def ops(kernel, op_class):
    return [op for op in kernel.walk() if isinstance(op, op_class)]


def error_of(fn, signature=None, num_warps=4) -> str:
    with pytest.raises(CompilationError) as info:
        build(fn, signature, num_warps=num_warps)
    return str(info.value)


# ------------------------------------------------------------------ mbarrier and TMA
@ll.jit
def tma_round_trip(desc):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, desc.nbytes)
    tma.async_copy_global_to_shared(desc, [64, 0], bar, smem)
    mbarrier.wait(bar, 0)
    tma.async_copy_shared_to_global(desc, [0, 64], smem)
    tma.store_wait(0)
    mbarrier.invalidate(bar)


def test_tma_and_mbarrier_ops_build_their_ir():
    kernel = build(tma_round_trip, DESC)
    init, = ops(kernel, ir.MBarrierInit)
    expect, = ops(kernel, ir.MBarrierExpect)
    load, = ops(kernel, ir.TmaAsyncCopyGlobalToShared)
    assert init.count == 1 and expect.nbytes == 64 * 64 * 2
    assert len(load.coords) == 2 and load.barrier is init.barrier
    (store,) = ops(kernel, ir.TmaAsyncCopySharedToGlobal)
    assert store.buffer is load.buffer


def test_barriers_go_where_the_async_ops_need_them():
    kernel = run_layout_passes(build(tma_round_trip, DESC))
    names = [op.NAME for op in kernel.body.ops if not isinstance(op, ir.Constant)]
    # The elected thread inits, expects, loads and stores: no barriers among those. The
    # other threads may touch the mbarrier only once its init is published (a barrier
    # before the wait), and it is invalidated only once nobody waits on it any more.
    assert names == ["allocate_shared_memory", "allocate_shared_memory", "mbarrier_init", "mbarrier_expect",
                     "tma_async_copy_global_to_shared", "barrier", "mbarrier_wait",
                     "tma_async_copy_shared_to_global", "tma_store_wait", "barrier", "mbarrier_invalidate"]


@ll.jit
def wrong_box(desc):
    smem = ll.allocate_shared_memory(ll.float16, [32, 64], desc.layout)
    bar = mbarrier.allocate_mbarrier()
    tma.async_copy_global_to_shared(desc, [0, 0], bar, smem)


@ll.jit
def wrong_swizzle(desc):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(64, 16))
    bar = mbarrier.allocate_mbarrier()
    tma.async_copy_global_to_shared(desc, [0, 0], bar, smem)


@ll.jit
def wrong_coords(desc):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], desc.layout)
    bar = mbarrier.allocate_mbarrier()
    tma.async_copy_global_to_shared(desc, [0], bar, smem)


@ll.jit
def not_a_barrier(desc):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], desc.layout)
    tma.async_copy_global_to_shared(desc, [0, 0], smem, smem)


@ll.jit
def batch_without_index():
    bars = mbarrier.allocate_mbarrier(batch=2)
    mbarrier.init(bars, count=1)


@pytest.mark.parametrize("fn, message", [
    (wrong_box, "descriptor's box is [64, 64]"),
    (wrong_swizzle, "layout=desc.layout"),
    (wrong_coords, "needs 2 coordinates"),
    (not_a_barrier, "needs one mbarrier"),
    (batch_without_index, "bars.index(i)"),
])
def test_tma_misuse_is_reported_at_the_line(fn, message):
    text = error_of(fn, DESC if fn is not batch_without_index else None)
    assert message in text
    assert "tma." in text or "mbarrier." in text  # the caret line is the user's call


# ------------------------------------------------------------------ cp.async
@ll.jit
def cp_async(ptr, n):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    offsets = rows[:, None] * 64 + cols[None, :]
    async_copy.async_copy_global_to_shared(smem, ptr + offsets, offsets < n)
    async_copy.commit_group()
    async_copy.wait_group(0)
    x = smem.load(BLOCKED)


def test_cp_async_builds_copy_commit_wait():
    kernel = build(cp_async, {"ptr": "*fp16", "n": "i32"})
    copy, = ops(kernel, ir.AsyncCopyGlobalToShared)
    assert copy.mask is not None and copy.pointer.type.shape == (64, 64)
    assert len(ops(kernel, ir.AsyncCopyCommitGroup)) == 1 and ops(kernel, ir.AsyncCopyWaitGroup)[0].pending == 0


@ll.jit
def cp_async_wrong_type(ptr):
    smem = ll.allocate_shared_memory(ll.float32, [64, 64], SWIZZLED)
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    async_copy.async_copy_global_to_shared(smem, ptr + rows[:, None] * 64 + cols[None, :])


def test_cp_async_rejects_pointers_of_another_type():
    assert "do not match the buffer" in error_of(cp_async_wrong_type, {"ptr": "*fp16"})


# ------------------------------------------------------------------ wgmma
@ll.jit
def wgmma(ACC_LAYOUT: ll.constexpr, TRANSPOSED: ll.constexpr):
    a = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    b = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    acc = ll.zeros([64, 64], ll.float32, ACC_LAYOUT)
    b_view = b.permute((1, 0)) if TRANSPOSED else b
    acc = ll.warpgroup_mma(a, b_view, acc, is_async=True)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])


def test_warpgroup_mma_and_its_wait():
    kernel = build(wgmma, constexprs={"ACC_LAYOUT": ACC, "TRANSPOSED": True})
    dot, = ops(kernel, ir.WarpgroupMma)
    wait, = ops(kernel, ir.WarpgroupMmaWait)
    permute, = ops(kernel, ir.SharedPermute)
    assert dot.is_async and dot.b is permute.result and wait.deps == (dot.result,)
    assert permute.result.type.encoding == ll.NVMMASharedLayout(128, 16, transposed=True)


def test_warpgroup_mma_wants_a_wgmma_accumulator():
    with pytest.raises(CompilationError, match="NVMMADistributedLayout"):
        build(wgmma, constexprs={"ACC_LAYOUT": BLOCKED, "TRANSPOSED": False})


@ll.jit
def wgmma_bad_k():
    a = ll.allocate_shared_memory(ll.float16, [64, 32], ll.NVMMASharedLayout(64, 16))
    b = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    acc = ll.zeros([64, 64], ll.float32, ACC)
    ll.warpgroup_mma(a, b, acc)


@ll.jit
def wgmma_fp8_transposed():
    a = ll.allocate_shared_memory(ll.float8e4nv, [64, 64], ll.NVMMASharedLayout(64, 8))
    b = ll.allocate_shared_memory(ll.float8e4nv, [64, 64], ll.NVMMASharedLayout(64, 8))
    acc = ll.zeros([64, 64], ll.float32, ACC)
    ll.warpgroup_mma(a, b, acc)  # b [K, N] with N contiguous: MN-major


@pytest.mark.parametrize("fn, message", [
    (wgmma_bad_k, "shapes do not chain"),
    (wgmma_fp8_transposed, "must be K-major"),
])
def test_wgmma_misuse(fn, message):
    assert message in error_of(fn)


# ------------------------------------------------------------------ warp specialization
@ll.jit
def consumer(smem, bar, LAYOUT: ll.constexpr):
    mbarrier.wait(bar, 0)
    return smem.load(LAYOUT)


@ll.jit
def producer(smem, bar, ptr, LAYOUT: ll.constexpr):
    rows = ll.arange(0, 64, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, 64, ll.SliceLayout(0, LAYOUT))
    smem.store(ll.load(ptr + rows[:, None] * 64 + cols[None, :]))
    mbarrier.arrive(bar)


@ll.jit
def specialized(ptr, out):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    worker_layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    x = ll.warp_specialize((smem, bar, BLOCKED), consumer, (smem, bar, ptr, worker_layout),
                           [producer], worker_num_warps=[1], worker_num_regs=[0])
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    ll.store(out + rows[:, None] * 64 + cols[None, :], x)


def test_warp_specialize_captures_values_and_returns_the_default_results():
    kernel = build(specialized, {"ptr": "*fp16", "out": "*fp16"})
    op, = ops(kernel, ir.WarpSpecialize)
    assert op.worker_num_warps == (1,) and len(op.workers) == 1
    assert [v.type for v in op.captures] == [a.type for a in op.default.args]
    assert [v.type for v in op.captures] == [a.type for a in op.workers[0].args]
    assert isinstance(op.default.ops[-1], ir.Yield) and len(op.results) == 1
    # the worker's layouts span its single warp
    loads = [o for o in op.workers[0].walk() if isinstance(o, ir.Load)]
    assert loads[0].result.type.layout.in_dims["warp"] == 1
    # captured values are only used through the block args inside the partitions
    inner = {v for block in op.nested_blocks() for o in block.walk() for v in o.uses()}
    assert not inner & set(op.captures)


@ll.jit
def bad_budget(ptr, out):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    bar = mbarrier.allocate_mbarrier()
    worker_layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    ll.warp_specialize((smem, bar, BLOCKED), consumer, (smem, bar, ptr, worker_layout),
                       [producer, producer], worker_num_warps=[1, 1], worker_num_regs=[40, 0])


def test_workers_sharing_a_warpgroup_cannot_mix_a_budget_with_none():
    text = error_of(bad_budget, {"ptr": "*fp16", "out": "*fp16"})
    assert "apply per warpgroup" in text and "warp_specialize" in text


@ll.jit
def scratch_user(LAYOUT: ll.constexpr):
    buffer = ll.allocate_shared_memory(ll.float32, [64, 64], ll.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    buffer.store(ll.zeros([64, 64], ll.float32, LAYOUT))


@ll.jit
def two_partitions_allocating():
    worker_layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    ll.warp_specialize((BLOCKED,), scratch_user, (worker_layout,), [scratch_user],
                       worker_num_warps=[4], worker_num_regs=[0])


def test_partitions_running_together_never_share_shared_bytes():
    kernel = run_layout_passes(build(two_partitions_allocating))
    allocs = ops(kernel, ir.AllocateSharedMemory)
    assert len(allocs) == 2
    (a, b) = sorted(op.offset for op in allocs)
    assert b >= a + 64 * 64 * 4 and kernel.shared_bytes >= 2 * 64 * 64 * 4


@ll.jit
def nothing(x):
    pass


@ll.jit
def uses_it(x):
    y = x + 1


@ll.jit
def captures_a_tensor_into_a_smaller_worker(WORKER: ll.constexpr):
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    ll.warp_specialize((rows,), nothing, (rows,), [WORKER], worker_num_warps=[1], worker_num_regs=[0])


def test_a_worker_cannot_use_a_tensor_laid_out_over_other_warps():
    build(captures_a_tensor_into_a_smaller_worker, constexprs={"WORKER": nothing})  # unused: fine
    with pytest.raises(CompilationError) as info:
        build(captures_a_tensor_into_a_smaller_worker, constexprs={"WORKER": uses_it})
    text = str(info.value)
    assert "runs on 1 warps but uses a captured tensor laid out over 4 warps" in text
    assert "y = x + 1" in text and "through shared memory" in text


@ll.jit
def too_much_shared():
    ring = ll.allocate_shared_memory(ll.float16, [4, 128, 256], SWIZZLED)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    ring.index(0).store(ll.zeros([128, 256], ll.float16, BLOCKED))


def test_the_shared_memory_budget_is_reported_at_the_largest_buffer():
    with pytest.raises(CompilationError) as info:
        run_layout_passes(build(too_much_shared))
    text = str(info.value)
    assert "over the 232448 bytes" in text and "ring = ll.allocate_shared_memory" in text
    assert "262144 bytes: shared<4x128x256xfp16>" in text
