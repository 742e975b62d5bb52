"""Kernels for the backend's Hopper async lowering: mbarriers, TMA, cp.async and
warp_specialize. Hand-built `layout`-stage IR (as backend_kernels.py) where a test needs
IR the language would refuse, `@ll.jit` kernels for the rest (the GPU tests launch them).
"""

from __future__ import annotations

from weft import lowlevel as ll
from weft.compiler.ir import (AllocateSharedMemory, Block, Constant, MBarrierArrive, MBarrierExpect, MBarrierInit,
                              MBarrierInvalidate, MBarrierWait, SharedSlice, Store, TmaAsyncCopyGlobalToShared,
                              TmaAsyncCopySharedToGlobal, TmaStoreWait, Value, WarpSpecialize, Yield)
from weft.compiler.types import PointerType, SharedType, TensorDescriptorType, fp16, i1, i32, i64
from weft.layouts import LinearLayout, nvmma_shared
from weft.lowlevel import async_copy, mbarrier, tma

from .backend_kernels import KernelBuilder, row_major_shared


def barrier_layout() -> LinearLayout:
    """The shared layout of one mbarrier (i64 [1])."""
    return LinearLayout({"offset": [], "block": []}, {"dim0": 1})


# ------------------------------------------------------------- hand-built IR
def tma_round_trip(box=(64, 64), swizzle=128, buffer_layout=None, window=None, pred=False, shared=None):
    """TMA-load the box at (y, x) of `src` into shared memory, wait on an mbarrier, TMA-store
    it at (y, x) of `dst`. `buffer_layout` overrides the buffer's layout (a mismatch);
    `window` = (rows, start) copies through a row window of a taller buffer; `shared`
    (shape -> layout) replaces the NVMMA layouts."""
    kb = KernelBuilder("tma_round_trip", num_warps=4)
    shared = shared or (lambda shape: nvmma_shared(shape, swizzle, 16))
    layout = shared(box)
    desc = TensorDescriptorType(fp16, box, layout)
    src, dst = kb.param(desc, "src"), kb.param(desc, "dst")
    y, x = kb.param(i32, "y"), kb.param(i32, "x")
    issue = kb.param(i1, "issue") if pred else None
    bar = kb.add(AllocateSharedMemory, SharedType((1,), i64, barrier_layout()), "bar")
    if window is None:
        smem = kb.add(AllocateSharedMemory, SharedType(box, fp16, buffer_layout or layout), "smem")
    else:
        rows, start = window
        tall = (rows, box[1])
        whole = kb.add(AllocateSharedMemory, SharedType(tall, fp16, shared(tall)), "whole")
        smem = kb.add(SharedSlice, SharedType(box, fp16, layout), "smem", buffer=whole, dim=0, start=start)
    kb.add(MBarrierInit, barrier=bar, count=1)
    kb.add(MBarrierExpect, barrier=bar, nbytes=desc.box_bytes, pred=issue)
    kb.add(TmaAsyncCopyGlobalToShared, descriptor=src, coords=(y, x), barrier=bar, buffer=smem, pred=issue)
    phase = kb.add(Constant, i32, value=0)
    kb.add(MBarrierWait, barrier=bar, phase=phase)
    kb.add(TmaAsyncCopySharedToGlobal, descriptor=dst, coords=(y, x), buffer=smem)
    kb.add(TmaStoreWait, pending=0)
    kb.add(MBarrierInvalidate, barrier=bar)
    params = (1,) * len(kb.params)
    return kb.build(param_divisibility=params)


def tma_3d():
    """A rank-3 TMA load of a [2, 8, 64] fp16 box (coordinates z, y, x)."""
    kb = KernelBuilder("tma_3d", num_warps=4)
    box = (2, 8, 64)
    bits = lambda n: n.bit_length() - 1  # noqa: E731
    offsets = [(0, 0, 1 << b) for b in range(bits(64))] + [(0, 1 << b, 0) for b in range(3)] + [(1, 0, 0)]
    layout = LinearLayout({"offset": offsets, "block": []}, {"dim0": 2, "dim1": 8, "dim2": 64})
    desc = kb.param(TensorDescriptorType(fp16, box, layout), "desc")
    z, y, x = kb.param(i32, "z"), kb.param(i32, "y"), kb.param(i32, "x")
    bar = kb.add(AllocateSharedMemory, SharedType((1,), i64, barrier_layout()), "bar")
    smem = kb.add(AllocateSharedMemory, SharedType(box, fp16, layout), "smem")
    kb.add(MBarrierInit, barrier=bar, count=1)
    kb.add(MBarrierExpect, barrier=bar, nbytes=2 * 8 * 64 * 2)
    kb.add(TmaAsyncCopyGlobalToShared, descriptor=desc, coords=(z, y, x), barrier=bar, buffer=smem)
    kb.add(MBarrierWait, barrier=bar, phase=z)
    return kb.build(param_divisibility=(1, 1, 1, 1))


def warp_specialized(worker_num_warps=(4,), worker_num_regs=(0,), default_num_regs=0, num_warps=4,
                     results=False, twice=False, nested=False):
    """Partitions that each arrive once on one mbarrier, for the lowering's structure and
    its checks. `results`: the default partition returns the `flag` argument, stored
    after the op; `twice`: a second warp_specialize follows; `nested`: worker 0 holds
    another warp_specialize."""
    kb = KernelBuilder("warp_specialized", num_warps=num_warps)
    out, flag = kb.param(PointerType(i32), "out"), kb.param(i32, "flag")
    bar = kb.add(AllocateSharedMemory, SharedType((1,), i64, barrier_layout()), "bar")
    kb.add(MBarrierInit, barrier=bar, count=1 + len(worker_num_warps))

    def partition(index: int, yields: bool) -> Block:
        bar_arg, flag_arg = Value(bar.type, "bar"), Value(i32, "flag")
        ops = [MBarrierArrive(barrier=bar_arg)]
        if nested and index == 1:
            inner = Block((), (Yield(),))
            ops.append(WarpSpecialize(results=(), captures=(), default=inner, workers=(inner,),
                                      worker_num_warps=(1,), worker_num_regs=(0,)))
        ops.append(Yield(values=(flag_arg,) if yields else ()))
        return Block((bar_arg, flag_arg), tuple(ops))

    def specialize(with_results: bool) -> None:
        outs = (Value(i32, "result"),) if with_results else ()
        kb.regions[-1].append(WarpSpecialize(
            results=outs, captures=(bar, flag), default=partition(0, with_results),
            workers=tuple(partition(i + 1, False) for i in range(len(worker_num_warps))),
            worker_num_warps=tuple(worker_num_warps), worker_num_regs=tuple(worker_num_regs),
            default_num_regs=default_num_regs))
        if with_results:
            kb.add(Store, pointer=out, value=outs[0])

    specialize(results)
    if twice:
        specialize(False)
    return kb.build(param_divisibility=(16, 1))


# ------------------------------------------------------------- @ll.jit kernels
@ll.jit
def cp_async_copy(x_ptr, out_ptr, n, ROWS: ll.constexpr, COLS: ll.constexpr, L: ll.constexpr,
                  S: ll.constexpr, OUT: ll.constexpr):
    """out[:n] = x[:n] of a ROWS x COLS tile, through cp.async into shared memory (masked
    copies zero-fill) and back out in another layout."""
    smem = ll.allocate_shared_memory(x_ptr.dtype.element_ty, [ROWS, COLS], S)
    rows = ll.arange(0, ROWS, layout=ll.SliceLayout(1, L))
    cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, L))
    offs = rows[:, None] * COLS + cols[None, :]
    async_copy.async_copy_global_to_shared(smem, x_ptr + offs, mask=offs < n)
    async_copy.commit_group()
    async_copy.wait_group(0)
    ll.barrier()  # other threads' copies: wait_group only covers this thread's
    values = smem.load(OUT)
    rows_out = ll.arange(0, ROWS, layout=ll.SliceLayout(1, OUT))
    cols_out = ll.arange(0, COLS, layout=ll.SliceLayout(0, OUT))
    offs_out = rows_out[:, None] * COLS + cols_out[None, :]
    ll.store(out_ptr + offs_out, values)


@ll.jit
def _pp_producer(x_ptr, smem, full, empty, ITERS: ll.constexpr, BLOCK: ll.constexpr, WARPS: ll.constexpr):
    offs = ll.arange(0, BLOCK, layout=ll.BlockedLayout([BLOCK // (32 * WARPS)], [32], [WARPS], [0]))
    for i in range(ITERS):
        mbarrier.wait(empty, (i & 1) ^ 1)  # a fresh barrier: phase 1 counts as complete
        smem.store(ll.load(x_ptr + i * BLOCK + offs))
        mbarrier.arrive(full, count=1)


@ll.jit
def _pp_consumer(out_ptr, smem, full, empty, ITERS: ll.constexpr, BLOCK: ll.constexpr, WARPS: ll.constexpr):
    layout = ll.BlockedLayout([BLOCK // (32 * WARPS)], [32], [WARPS], [0])
    offs = ll.arange(0, BLOCK, layout=layout)
    for i in range(ITERS):
        mbarrier.wait(full, i & 1)
        values = smem.load(layout)
        mbarrier.arrive(empty, count=1)
        ll.store(out_ptr + i * BLOCK + offs, values * 2.0)


@ll.jit
def ping_pong(x_ptr, out_ptr, ITERS: ll.constexpr, BLOCK: ll.constexpr, WORKER_WARPS: ll.constexpr,
              WORKER_REGS: ll.constexpr, WARPS: ll.constexpr = 4):
    """out = 2 * x, ITERS blocks of BLOCK fp32: a worker partition loads each block into one
    shared slot, the default partition (WARPS = num_warps warps) doubles and stores it;
    `full`/`empty` mbarriers hand the slot back and forth."""
    smem = ll.allocate_shared_memory(ll.float32, [BLOCK], ll.SwizzledSharedLayout(1, 1, 1, [0]))
    full = mbarrier.allocate_mbarrier()
    empty = mbarrier.allocate_mbarrier()
    mbarrier.init(full, count=1)
    mbarrier.init(empty, count=1)
    ll.warp_specialize((out_ptr, smem, full, empty, ITERS, BLOCK, WARPS), _pp_consumer,
                       (x_ptr, smem, full, empty, ITERS, BLOCK, WORKER_WARPS), [_pp_producer],
                       worker_num_warps=[WORKER_WARPS], worker_num_regs=[WORKER_REGS])
    mbarrier.invalidate(full)
    mbarrier.invalidate(empty)


SUM_LAYOUT = ll.BlockedLayout([1, 4], [4, 8], [1, 4], [1, 0])  # warps split the columns


@ll.jit
def _sum_rows(x_ptr, layout: ll.constexpr):
    rows = ll.arange(0, 16, layout=ll.SliceLayout(1, layout))
    cols = ll.arange(0, 128, layout=ll.SliceLayout(0, layout))
    return ll.sum(ll.load(x_ptr + rows[:, None] * 128 + cols[None, :]), axis=1)


@ll.jit
def _idle(x_ptr):
    pass


@ll.jit
def specialized_sum(x_ptr, out_ptr, WORKERS: ll.constexpr, LAYOUT: ll.constexpr = SUM_LAYOUT):
    """out[r] = sum(x[r, :]) of a 16 x 128 tile, computed in the default partition (a
    reduction across warps: shared scratch and the partition's named barrier) and
    returned from warp_specialize; the code after it runs on the default warps only."""
    total = ll.warp_specialize((x_ptr, LAYOUT), _sum_rows, (x_ptr,), [_idle] * WORKERS,
                               worker_num_warps=[1] * WORKERS, worker_num_regs=[0] * WORKERS)
    ll.barrier()
    ll.store(out_ptr + ll.arange(0, 16, layout=ll.SliceLayout(1, LAYOUT)), total)


@ll.jit
def _capture_default(values):
    pass


@ll.jit
def _capture_worker(values, out_ptr):
    ll.store(out_ptr + ll.arange(0, 128, layout=ll.BlockedLayout([1], [32], [4], [0])), values)


@ll.jit
def tensor_capture(x_ptr, out_ptr):
    """out = x (128 fp32): loaded before warp_specialize in a 4-warp layout, stored by a
    4-warp worker that captured it (its warps 4..7 hold it as warps 0..3 did)."""
    values = ll.load(x_ptr + ll.arange(0, 128, layout=ll.BlockedLayout([1], [32], [4], [0])))
    ll.warp_specialize((values,), _capture_default, (values, out_ptr), [_capture_worker],
                       worker_num_warps=[4], worker_num_regs=[0])


@ll.jit
def _capture_idle(values, out_ptr):
    pass


@ll.jit
def tensor_capture_misplaced(x_ptr, out_ptr):
    """The same capture for a 4-warp worker starting at warp 5: its warps hold the
    tensor as warps 1, 2, 3, 0 did."""
    values = ll.load(x_ptr + ll.arange(0, 128, layout=ll.BlockedLayout([1], [32], [4], [0])))
    ll.warp_specialize((values,), _capture_default, (values, out_ptr), [_capture_idle, _capture_worker],
                       worker_num_warps=[1, 4], worker_num_regs=[0, 0])


@ll.jit
def tma_copy(src, dst):
    """dst's box at program (y, x) = src's, by TMA load (mbarrier) and TMA store."""
    smem = ll.allocate_shared_memory(src.dtype, src.block_shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    y = ll.program_id(0) * src.block_shape[0]
    x = ll.program_id(1) * src.block_shape[1]
    mbarrier.expect(bar, src.nbytes)
    tma.async_copy_global_to_shared(src, [y, x], bar, smem)
    mbarrier.wait(bar, 0)
    tma.async_copy_shared_to_global(dst, [y, x], smem)
    tma.store_wait(0)
    mbarrier.invalidate(bar)


def row_major_box(rows, cols):
    return row_major_shared(rows, cols)
