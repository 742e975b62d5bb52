"""insert_barriers: the CTA barriers it places around shared-memory traffic, checked on the
CPU emulator (its race detector is the oracle) and in the layout-stage IR.

The regression kernels are the ones the pass got wrong: a K loop whose TMA loads overwrite
what the previous iteration's wgmma read, the same through a two-slot ring whose wgmma is
retired only by the next iteration's wait, and async accesses (a TMA store, cp.async) with
a user barrier between the op and its wait. The property at the end draws small kernels of
shared-memory traffic and runs them through the pipeline onto the emulator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import numpy as np
import pytest
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.frontend import build_kernel
from weft.compiler.passes.allocate_shared_memory import allocate_shared_memory
from weft.compiler.passes.insert_barriers import insert_barriers
from weft.compiler.pipeline import run_layout_passes
from weft.compiler.types import i32
from weft.lowlevel import async_copy, mbarrier, tma

from . import pipeline_traffic, shared_traffic
from .backend_kernels import shared_kernel

RNG = np.random.default_rng(38)
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])


@ll.jit
def tma_wgmma_k_loop(a_desc, b_desc, c_ptr, N, K, NUM_WARPS: ll.constexpr):
    """c = a @ b: each K step TMA-loads an A and a B tile into one buffer each, waits on
    one mbarrier and multiplies with an async wgmma retired at once. The next step's loads
    overwrite what every warpgroup's wgmma read: a CTA barrier must come between."""
    BLOCK_M: ll.constexpr = a_desc.block_shape[0]
    BLOCK_K: ll.constexpr = a_desc.block_shape[1]
    BLOCK_N: ll.constexpr = b_desc.block_shape[1]
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, BLOCK_N, 16])
    a_smem = ll.allocate_shared_memory(a_desc.dtype, a_desc.block_shape, a_desc.layout)
    b_smem = ll.allocate_shared_memory(b_desc.dtype, b_desc.block_shape, b_desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    off_m = ll.program_id(0) * BLOCK_M
    off_n = ll.program_id(1) * BLOCK_N
    acc = ll.zeros([BLOCK_M, BLOCK_N], ll.float32, acc_layout)
    phase = 0
    for k in range(0, K, BLOCK_K):
        mbarrier.expect(bar, a_desc.nbytes + b_desc.nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_smem)
        tma.async_copy_global_to_shared(b_desc, [k, off_n], bar, b_smem)
        mbarrier.wait(bar, phase)
        phase ^= 1
        acc = ll.warpgroup_mma(a_smem, b_smem, acc, is_async=True)
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
    mbarrier.invalidate(bar)
    rows = off_m + ll.arange(0, BLOCK_M, ll.SliceLayout(1, acc_layout))
    cols = off_n + ll.arange(0, BLOCK_N, ll.SliceLayout(0, acc_layout))
    ll.store(c_ptr + rows[:, None] * N + cols[None, :], acc)


def _k_loop_layout_ir(num_warps: int) -> ir.Kernel:
    signature = {"a_desc": f"tensordesc<fp16[{16 * num_warps},64]>", "b_desc": "tensordesc<fp16[64,64]>",
                 "c_ptr": "*fp32", "N": "i32", "K": "i32"}
    return run_layout_passes(build_kernel(tma_wgmma_k_loop, signature, {"NUM_WARPS": num_warps}, num_warps))


@pytest.mark.parametrize("num_warps", [4, 8])
def test_k_loop_gets_a_barrier_before_the_tma_overwrites_what_wgmma_read(num_warps):
    kernel = _k_loop_layout_ir(num_warps)
    loop = next(op for op in kernel.body.ops if isinstance(op, ir.For))
    names = [op.NAME for op in loop.body.ops]
    first_load = names.index("tma_async_copy_global_to_shared")
    assert "barrier" in names[:first_load], names


@pytest.mark.parametrize("num_warps", [4, 8])
def test_k_loop_runs_without_a_race_on_the_emulator(num_warps):
    m, n, k = 16 * num_warps * 2, 128, 256
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float32)
    grid = (m // (16 * num_warps), n // 64)
    tma_wgmma_k_loop[grid](ll.TensorDescriptor.from_tensor(a, [16 * num_warps, 64]),
                           ll.TensorDescriptor.from_tensor(b, [64, 64]), c, n, k, num_warps, num_warps=num_warps)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_k_loop_on_the_gpu_is_right_every_run():
    """The kernel of issue 38 as it failed on an H100 (wrong in 4 of 40 runs): 8 warps,
    128x64x64 tiles, fp16 2048x2048x4096."""
    import torch

    m, n, k = 2048, 2048, 4096
    torch.manual_seed(38)
    a = torch.randn((m, k), device="cuda", dtype=torch.float16)
    b = torch.randn((k, n), device="cuda", dtype=torch.float16)
    reference = (a.double() @ b.double()).float()
    a_desc = ll.TensorDescriptor.from_tensor(a, [128, 64])
    b_desc = ll.TensorDescriptor.from_tensor(b, [64, 64])
    errors = []
    for _ in range(40):
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
        tma_wgmma_k_loop[(m // 128, n // 64)](a_desc, b_desc, c, n, k, 8, num_warps=8)
        torch.cuda.synchronize()
        errors.append(((c - reference).abs().max() / reference.abs().max()).item())
    assert max(errors) < 1e-4, errors


@ll.jit
def _refill_slot(count, a_desc, b_desc, off_m, off_n, k, ready, a_ring, b_ring, SLOTS: ll.constexpr):
    """TMA-load the next K step's tiles into ring slot count % SLOTS."""
    slot = count % SLOTS
    mbarrier.expect(ready.index(slot), a_desc.nbytes + b_desc.nbytes)
    tma.async_copy_global_to_shared(a_desc, [off_m, k], ready.index(slot), a_ring.index(slot))
    tma.async_copy_global_to_shared(b_desc, [k, off_n], ready.index(slot), b_ring.index(slot))
    return count + 1


@ll.jit
def _multiply_slot(count, acc, ready, a_ring, b_ring, SLOTS: ll.constexpr):
    """Wait for slot count % SLOTS, retire the wgmma still reading the other slot, then
    start one on this slot that the next call retires."""
    slot = count % SLOTS
    mbarrier.wait(ready.index(slot), count // SLOTS & 1)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    acc = ll.warpgroup_mma(a_ring.index(slot), b_ring.index(slot), acc, is_async=True)
    return count + 1, acc


@ll.jit
def ring_k_loop(a_desc, b_desc, c_ptr, N, K, NUM_WARPS: ll.constexpr, SLOTS: ll.constexpr):
    """c = a @ b through a ring of SLOTS tile pairs indexed by a loop-carried count, with
    helpers doing the work (the shape of Gluon tutorial 07's pipelined matmul). Each wgmma
    stays in flight into the next iteration, whose wait retires it; the iteration after
    that refills its slot, which every warp's wait must precede: a CTA barrier."""
    BLOCK_M: ll.constexpr = a_desc.block_shape[0]
    BLOCK_K: ll.constexpr = a_desc.block_shape[1]
    BLOCK_N: ll.constexpr = b_desc.block_shape[1]
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [NUM_WARPS, 1], [16, BLOCK_N, 16])
    a_ring = ll.allocate_shared_memory(a_desc.dtype, [SLOTS, BLOCK_M, BLOCK_K], a_desc.layout)
    b_ring = ll.allocate_shared_memory(b_desc.dtype, [SLOTS, BLOCK_K, BLOCK_N], b_desc.layout)
    ready = ll.allocate_shared_memory(ll.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in ll.static_range(SLOTS):
        mbarrier.init(ready.index(i), count=1)
    off_m = ll.program_id(0) * BLOCK_M
    off_n = ll.program_id(1) * BLOCK_N
    acc = ll.zeros([BLOCK_M, BLOCK_N], ll.float32, acc_layout)
    filled = 0
    used = 0
    for k in range(0, K, BLOCK_K):
        filled = _refill_slot(filled, a_desc, b_desc, off_m, off_n, k, ready, a_ring, b_ring, SLOTS)
        used, acc = _multiply_slot(used, acc, ready, a_ring, b_ring, SLOTS)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    rows = off_m + ll.arange(0, BLOCK_M, ll.SliceLayout(1, acc_layout))
    cols = off_n + ll.arange(0, BLOCK_N, ll.SliceLayout(0, acc_layout))
    ll.store(c_ptr + rows[:, None] * N + cols[None, :], acc)


@pytest.mark.parametrize("num_warps", [4, 8])
def test_ring_k_loop_gets_a_barrier_before_refilling_a_slot(num_warps):
    signature = {"a_desc": f"tensordesc<fp16[{16 * num_warps},64]>", "b_desc": "tensordesc<fp16[64,64]>",
                 "c_ptr": "*fp32", "N": "i32", "K": "i32"}
    kernel = run_layout_passes(build_kernel(ring_k_loop, signature, {"NUM_WARPS": num_warps, "SLOTS": 2}, num_warps))
    loop = next(op for op in kernel.body.ops if isinstance(op, ir.For))
    names = [op.NAME for op in loop.body.ops]
    assert "barrier" in names[:names.index("tma_async_copy_global_to_shared")], names


@pytest.mark.parametrize("num_warps", [4, 8])
def test_ring_k_loop_runs_without_a_race_on_the_emulator(num_warps):
    m, n, k = 16 * num_warps * 2, 128, 320  # five K steps: each slot refilled twice
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float32)
    grid = (m // (16 * num_warps), n // 64)
    ring_k_loop[grid](ll.TensorDescriptor.from_tensor(a, [16 * num_warps, 64]),
                      ll.TensorDescriptor.from_tensor(b, [64, 64]), c, n, k, num_warps, 2, num_warps=num_warps)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


@ll.jit
def tma_store_twice(dst, BARRIER_BEFORE_WAIT: ll.constexpr):
    """Store zeros, then ones, from one buffer. A user barrier between the first store and
    its store_wait does not cover the store's reads: only the wait ends them, so a barrier
    must still come after the wait, before the buffer is written again."""
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], dst.layout, ll.zeros([64, 64], ll.float16, BLOCKED))
    ll.fence_async_shared()
    tma.async_copy_shared_to_global(dst, [0, 0], smem)
    if BARRIER_BEFORE_WAIT:
        ll.barrier()
    tma.store_wait(0)
    smem.store(ll.full([64, 64], 1.0, ll.float16, BLOCKED))
    ll.fence_async_shared()
    tma.async_copy_shared_to_global(dst, [64, 0], smem)
    tma.store_wait(0)


@pytest.mark.parametrize("barrier_before_wait", [False, True])
def test_a_barrier_before_store_wait_keeps_the_one_after_it(barrier_before_wait):
    y = np.full((128, 64), 5, np.float16)
    tma_store_twice[(1,)](ll.TensorDescriptor.from_tensor(y, [64, 64]), barrier_before_wait)
    np.testing.assert_array_equal(y[:64], 0)
    np.testing.assert_array_equal(y[64:], 1)
    kernel = run_layout_passes(build_kernel(tma_store_twice, {"dst": "tensordesc<fp16[64,64]>"},
                                            {"BARRIER_BEFORE_WAIT": barrier_before_wait}, 4))
    names = [op.NAME for op in kernel.body.ops]
    wait = names.index("tma_store_wait")
    assert "barrier" in names[wait:names.index("shared_store", wait)], names


@ll.jit
def cp_async_then_transposed_read(src, out, BARRIER_BEFORE_WAIT: ll.constexpr):
    """cp.async a tile, read it back transposed (other threads' copies). A barrier between
    the copy and wait_group comes too early: each thread's wait covers its own copies."""
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    async_copy.async_copy_global_to_shared(smem, src + rows[:, None] * 64 + cols[None, :])
    async_copy.commit_group()
    if BARRIER_BEFORE_WAIT:
        ll.barrier()
    async_copy.wait_group(0)
    read: ll.constexpr = ll.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    r = ll.arange(0, 64, ll.SliceLayout(1, read))
    c = ll.arange(0, 64, ll.SliceLayout(0, read))
    ll.store(out + r[:, None] * 64 + c[None, :], smem.load(read))


@pytest.mark.parametrize("barrier_before_wait", [False, True])
def test_a_barrier_before_wait_group_keeps_the_one_after_it(barrier_before_wait):
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.full_like(x, np.nan)
    cp_async_then_transposed_read[(1,)](x, out, barrier_before_wait)
    np.testing.assert_array_equal(out, x)


@ll.jit
def cp_async_then_empty_group(src, out):
    """cp.async a tile, commit it, commit an empty group (a pipeline's slot with no tile
    left), wait until one group is left: the empty one. The tile is done, and the other
    warps' transposed read of it needs a barrier after the wait."""
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    async_copy.async_copy_global_to_shared(smem, src + rows[:, None] * 64 + cols[None, :])
    async_copy.commit_group()
    async_copy.commit_group()
    async_copy.wait_group(1)
    read: ll.constexpr = ll.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    r = ll.arange(0, 64, ll.SliceLayout(1, read))
    c = ll.arange(0, 64, ll.SliceLayout(0, read))
    ll.store(out + r[:, None] * 64 + c[None, :], smem.load(read))


def test_an_empty_cp_async_group_counts_for_wait_group():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.full_like(x, np.nan)
    cp_async_then_empty_group[(1,)](x, out)
    np.testing.assert_array_equal(out, x)


# ------------------------------------------------------------------ the property
KINDS = ("store", "load", "cp_async", "tma_load", "tma_store", "wgmma", "barrier")


@st.composite
def programs(draw):
    """Ops over two buffers in a prologue, a loop body and an epilogue; run by the whole
    CTA (4 or 8 warps) or by a worker partition (1 or 4 warps; one warp has no wgmma)."""
    worker = draw(st.booleans())
    num_warps = draw(st.sampled_from([1, 4] if worker else [4, 8]))
    kinds = [k for k in KINDS if k != "wgmma" or num_warps >= 4]
    op = st.builds(shared_traffic.Op, st.sampled_from(kinds), st.integers(0, shared_traffic.BUFFERS - 1),
                   st.integers(0, shared_traffic.SOURCES - 1))
    op = op.map(lambda o: dataclasses.replace(o, arg=o.arg % shared_traffic.BUFFERS) if o.kind == "wgmma" else o)
    part = st.lists(op, max_size=3).map(tuple)  # few ops: each new list compiles a kernel while shrinking
    return shared_traffic.Program(draw(part), draw(part), draw(part), num_warps, worker)


def _run_program(program: shared_traffic.Program, iterations: int, seed: int) -> None:
    kernel, _ = shared_traffic.load_kernel(program)
    rows = program.rows
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((shared_traffic.SOURCES * rows, 64)).astype(np.float16)
    loads, mmas, out = shared_traffic.expected(program, x, iterations)
    got_loads = np.full(loads.shape, np.nan, np.float32)
    got_mmas = np.full(mmas.shape, np.nan, np.float32)
    got_out = np.full(out.shape, np.nan, np.float16)
    kernel[(1,)](x, ll.TensorDescriptor.from_tensor(x, [rows, 64]), ll.TensorDescriptor.from_tensor(got_out, [rows, 64]),
                 got_loads, got_mmas, iterations, num_warps=4 if program.worker else program.num_warps)
    np.testing.assert_array_equal(got_loads, loads)
    np.testing.assert_array_equal(got_out, out)
    np.testing.assert_allclose(got_mmas, mmas, rtol=1e-5, atol=1e-4)


# A few examples by default (each compiles and emulates a kernel); the deep profile runs
# as many as it asks for.
_EXAMPLES = settings().max_examples if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 10


@settings(max_examples=_EXAMPLES, deadline=None)
@given(programs(), st.integers(1, 3), st.integers(0, 2**16), st.one_of(st.none(), st.integers(0, 7)))
def test_shared_traffic_runs_without_a_race(program, iterations, seed, shuffle):
    """Whatever the traffic, the barriers insert_barriers places leave the emulator's race
    detector nothing to report, and every load, wgmma and TMA store sees the values a
    numpy model of the ops gives; also with TMA loads landing in a shuffled order."""
    note(shared_traffic.source_of(program))
    with _shuffled(shuffle):
        _run_program(program, iterations, seed)


@contextlib.contextmanager
def _shuffled(seed):
    """TMA loads land oldest first (seed None) or in the order WEFT_EMULATE_SHUFFLE=seed draws."""
    previous = os.environ.get("WEFT_EMULATE_SHUFFLE")
    try:
        if seed is None:
            os.environ.pop("WEFT_EMULATE_SHUFFLE", None)
        else:
            os.environ["WEFT_EMULATE_SHUFFLE"] = str(seed)
        yield
    finally:
        if previous is None:
            os.environ.pop("WEFT_EMULATE_SHUFFLE", None)
        else:
            os.environ["WEFT_EMULATE_SHUFFLE"] = previous


# ------------------------------------------------------------------ pipelines
@st.composite
def pipelines(draw):
    """A ring of 1-3 slots filled by TMA, cp.async or register stores and read by
    register loads or wgmma, inline or across partitions, with tiles held past their use."""
    producer = draw(st.sampled_from(["tma_load", "cp_async", "store"]))
    consumer = draw(st.sampled_from(["load", "wgmma"]))
    stages = draw(st.integers(1, 3))
    specialized = draw(st.booleans())
    lag = draw(st.integers(0, min(stages - 1, 1)))
    producer_lag = draw(st.integers(0, stages - 1 - lag)) if specialized and producer == "cp_async" else 0
    return pipeline_traffic.Pipeline(
        producer, consumer, stages, lag, echo=draw(st.booleans()), specialized=specialized,
        producer_warps=draw(st.sampled_from([1, 4])) if specialized else 4, producer_lag=min(producer_lag, 1),
        per_warp=specialized and draw(st.booleans()))


@settings(max_examples=_EXAMPLES, deadline=None)
@given(pipelines(), st.integers(0, 5), st.integers(0, 2**16), st.one_of(st.none(), st.integers(0, 7)))
# The two the property shrank to: one slot whose refill overtakes the other warps' reads
# (1f70ba8), and a cp.async ring whose empty groups the pass did not count.
@example(pipeline_traffic.Pipeline("tma_load", "load", stages=1), 2, 0, None)
@example(pipeline_traffic.Pipeline("cp_async", "wgmma", stages=3), 1, 0, None)
def test_pipelines_run_without_a_race(pipeline, iterations, seed, shuffle):
    """Rings with async work in flight across the loop's back edge, and producer and
    consumer partitions handing slots over through full/empty mbarriers: the barriers
    insert_barriers places leave no race and no deadlock, and the loads, the wgmma
    accumulator and the echoed tiles hold the input's values; also with TMA loads landing
    in a shuffled order."""
    note(pipeline_traffic.source_of(pipeline))
    kernel = pipeline_traffic.load_kernel(pipeline)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(((iterations + 1) * pipeline_traffic.R, 64)).astype(np.float16)
    loads, mma, out = pipeline_traffic.expected(pipeline, x, iterations)
    got_loads = np.full(loads.shape, np.nan, np.float32)
    got_mma = np.full(mma.shape, np.nan, np.float32)
    got_out = np.full(out.shape, np.nan, np.float16)
    with _shuffled(shuffle):
        kernel[(1,)](x, ll.TensorDescriptor.from_tensor(x, [pipeline_traffic.R, 64]),
                     ll.TensorDescriptor.from_tensor(got_out, [pipeline_traffic.R, 64]), got_loads, got_mma,
                     iterations, num_warps=4)
    np.testing.assert_array_equal(got_loads, loads)
    np.testing.assert_array_equal(got_out, out)
    np.testing.assert_allclose(got_mma, mma, rtol=1e-4, atol=1e-3)


def test_loop_back_edge_gets_a_barrier():
    base = shared_kernel()
    x = base.params[0]
    ops = base.body.ops
    a = ops[0].result
    y = ir.Value(x.type, "y")
    iv = ir.Value(i32, "i")
    lo = ir.Value(i32, "lo")
    body = ir.Block((iv,), (ir.SharedStore(buffer=a, value=x), ir.SharedLoad(result=y, buffer=a), ir.Yield(values=())))
    loop = ir.For(results=(), lower=lo, upper=lo, step=lo, inits=(), body=body)
    kernel = ir.Kernel("l", (x, lo), ir.Block((), (ops[0], loop)), 4)
    kernel = insert_barriers(allocate_shared_memory(kernel))
    loop = kernel.body.ops[-1]
    # The store of iteration i+1 must wait for every warp's load of iteration i.
    assert [op.NAME for op in loop.body.ops] == ["barrier", "shared_store", "barrier", "shared_load", "yield"]
