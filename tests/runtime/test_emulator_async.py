"""The CPU emulator on the Hopper async machinery: TMA, cp.async, mbarriers, wgmma and
warp-specialized partitions, as @ll.jit kernels on numpy arrays (checked against float64
numpy), and the broken kernels it must catch: missing fences, wrong phases, missing
expects, in-flight reads, and deadlocks named by barrier, phase and partition."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.frontend import build_kernel
from weft.compiler.pipeline import run_layout_passes
from weft.lowlevel import async_copy, mbarrier, tma
from weft.runtime.emulator import EmulationError, emulate, from_bf16, to_bf16
from weft.runtime.emulator.dtypes import from_fp8, to_fp8

RNG = np.random.default_rng(4)
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
ACC = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 16])


def run(fn, signature, grid, args, num_warps=4, **constexprs):
    """Compile `fn` for the emulator with an explicit signature (bf16/fp8 arrays are
    uint16/uint8 bit patterns on the host) and run it."""
    kernel = run_layout_passes(build_kernel(fn, signature, constexprs, num_warps))
    emulate(kernel, grid, args)


def padded(rows, cols, dtype):
    """A [rows, cols] view whose rows start 16-byte aligned, as TMA needs."""
    width = -(-cols * np.dtype(dtype).itemsize // 16) * 16 // np.dtype(dtype).itemsize
    return np.zeros((rows, width), dtype)[:, :cols]


def descriptor_type(dtype: str, block):
    return f"tensordesc<{dtype}[{','.join(map(str, block))}]>"


# ------------------------------------------------------------------ TMA round trip
@ll.jit
def tma_round_trip(src, dst, landed, LANDED_COLS: ll.constexpr, LAYOUT: ll.constexpr):
    smem = ll.allocate_shared_memory(src.dtype, src.block_shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    row = ll.program_id(0) * src.block_shape[0]
    col = ll.program_id(1) * src.block_shape[1]
    mbarrier.expect(bar, src.nbytes)
    tma.async_copy_global_to_shared(src, [row, col], bar, smem)
    mbarrier.wait(bar, 0)
    # the box as it landed, out-of-range elements included, read through the swizzle
    rows = row + ll.arange(0, src.block_shape[0], ll.SliceLayout(1, LAYOUT))
    cols = col + ll.arange(0, src.block_shape[1], ll.SliceLayout(0, LAYOUT))
    ll.store(landed + rows[:, None] * LANDED_COLS + cols[None, :], smem.load(LAYOUT))
    tma.async_copy_shared_to_global(dst, [row, col], smem)
    tma.store_wait(0)
    mbarrier.invalidate(bar)


@pytest.mark.parametrize("dtype, block, layout", [
    (np.float16, (64, 64), BLOCKED),                                            # 128B swizzle
    (np.float16, (32, 32), ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])),   # 64B
    (np.float32, (16, 8), ll.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0])),    # 32B
])
def test_tma_round_trip_with_tails(dtype, block, layout):
    x = padded(100, 150, dtype)
    x[:] = RNG.standard_normal(x.shape)
    y = padded(100, 150, dtype)
    grid = (-(-100 // block[0]), -(-150 // block[1]))
    landed = np.full((grid[0] * block[0], grid[1] * block[1]), np.nan, dtype)
    src = ll.TensorDescriptor.from_tensor(x, list(block))
    dst = ll.TensorDescriptor.from_tensor(y, list(block))
    tma_round_trip[grid](src, dst, landed, landed.shape[1], layout)
    np.testing.assert_array_equal(y, x)  # stores skip the out-of-range part of each box
    expected = np.zeros_like(landed)
    expected[:100, :150] = x           # loads fill it with zeros
    np.testing.assert_array_equal(landed, expected)


@ll.jit
def tma_store_at(dst, row, col):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], dst.layout,
                                     ll.full([64, 64], 2.0, ll.float16, BLOCKED))
    ll.fence_async_shared()
    tma.async_copy_shared_to_global(dst, [row, col], smem)
    tma.store_wait(0)


def test_tma_store_at_a_negative_coordinate_is_refused():
    """The H200 traps on a TMA store box starting at a negative coordinate, even partly
    inside the tensor (loads there read zeros); a box past the end is clipped."""
    y = np.zeros((100, 64), np.float16)
    tma_store_at[(1,)](ll.TensorDescriptor.from_tensor(y, [64, 64]), 64, 0)
    assert (y[64:] == 2).all() and not y[:64].any()
    with pytest.raises(EmulationError, match="may not start at a negative coordinate") as info:
        tma_store_at[(1,)](ll.TensorDescriptor.from_tensor(y, [64, 64]), -32, 0)
    assert "tma.async_copy_shared_to_global(dst, [row, col], smem)" in str(info.value)
    assert "[-32, 0]" in str(info.value)


# ------------------------------------------------------------------ cp.async
@ll.jit
def cp_async_copy(src, out, n, READ: ll.constexpr, WAIT: ll.constexpr):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    offsets = rows[:, None] * 64 + cols[None, :]
    async_copy.async_copy_global_to_shared(smem, src + offsets, offsets < n)
    async_copy.commit_group()
    if WAIT:
        async_copy.wait_group(0)
    ll.barrier()  # other threads' copies: wait_group only covers the thread's own
    r = ll.arange(0, 64, ll.SliceLayout(1, READ))
    c = ll.arange(0, 64, ll.SliceLayout(0, READ))
    ll.store(out + r[:, None] * 64 + c[None, :], smem.load(READ))


def test_cp_async_copy_with_masks():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.full_like(x, np.nan)
    transposed_read = ll.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    cp_async_copy[(1,)](x, out, 1000, transposed_read, True)
    expected = np.where(np.arange(64 * 64).reshape(64, 64) < 1000, x, 0)
    np.testing.assert_array_equal(out, expected)


def test_reading_cp_async_bytes_before_wait_group_is_a_race():
    x = np.ones((64, 64), np.float16)
    with pytest.raises(EmulationError, match="cp.async is still writing") as info:
        cp_async_copy[(1,)](x, np.zeros_like(x), 4096, BLOCKED, False)
    text = str(info.value)
    assert "smem.load(READ)" in text and "async_copy_global_to_shared(smem" in text
    assert "wait_group" in text


# ------------------------------------------------------------------ wgmma
DTYPES = {  # name: (host dtype, encode, decode)
    "fp16": (np.float16, lambda v: v.astype(np.float16), lambda b: b.astype(np.float64)),
    "bf16": (np.uint16, to_bf16, from_bf16),
    "fp8e4m3": (np.uint8, lambda v: to_fp8(v, "fp8e4m3"), lambda b: from_fp8(b, "fp8e4m3")),
    "fp8e5m2": (np.uint8, lambda v: to_fp8(v, "fp8e5m2"), lambda b: from_fp8(b, "fp8e5m2")),
}
BITS = {"fp16": 16, "bf16": 16, "fp8e4m3": 8, "fp8e5m2": 8}


@ll.constexpr_function
def nvmma(shape, bits):
    return ll.NVMMASharedLayout.get_default_for(shape, bits)


@ll.jit
def tile_offsets(ROWS: ll.constexpr, COLS: ll.constexpr, LAYOUT: ll.constexpr):
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, LAYOUT))
    return rows[:, None] * COLS + cols[None, :]


@ll.jit
def wgmma_kernel(a_ptr, b_ptr, acc_ptr, c_ptr, K: ll.constexpr, A_IN_REGISTERS: ll.constexpr,
                 B_K_MAJOR: ll.constexpr, USE_ACC: ll.constexpr, FENCE: ll.constexpr):
    dtype: ll.constexpr = a_ptr.dtype.element_ty
    load_layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    a = ll.load(a_ptr + tile_offsets(64, K, load_layout))
    if A_IN_REGISTERS:
        a_operand = ll.convert_layout(a, ll.DotOperandLayout(0, ACC, 32 // dtype.bits))
    else:
        a_operand = ll.allocate_shared_memory(dtype, [64, K], nvmma([64, K], dtype.bits))
        a_operand.store(a)
    if B_K_MAJOR:  # b_ptr holds B^T, [N, K]
        b_smem = ll.allocate_shared_memory(dtype, [64, K], nvmma([64, K], dtype.bits))
        b_smem.store(ll.load(b_ptr + tile_offsets(64, K, load_layout)))
        b_operand = b_smem.permute((1, 0))
    else:
        b_operand = ll.allocate_shared_memory(dtype, [K, 64], nvmma([K, 64], dtype.bits))
        b_operand.store(ll.load(b_ptr + tile_offsets(K, 64, load_layout)))
    if FENCE:
        ll.fence_async_shared()
    acc = ll.load(acc_ptr + tile_offsets(64, 64, ACC))
    acc = ll.warpgroup_mma(a_operand, b_operand, acc, use_acc=USE_ACC, is_async=True)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)


def _run_wgmma(dtype, a_in_registers, b_k_major, use_acc=True, fence=True, k=64):
    host, encode, decode = DTYPES[dtype]
    a_bits = encode(RNG.standard_normal((64, k)))
    b_bits = encode(RNG.standard_normal((k, 64)))
    acc = RNG.standard_normal((64, 64)).astype(np.float32)
    out = np.full((64, 64), np.nan, np.float32)
    b_host = np.ascontiguousarray(b_bits.T) if b_k_major else b_bits
    signature = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "acc_ptr": "*fp32", "c_ptr": "*fp32"}
    run(wgmma_kernel, signature, (1,), [a_bits, b_host, acc, out], K=k,
        A_IN_REGISTERS=a_in_registers, B_K_MAJOR=b_k_major, USE_ACC=use_acc, FENCE=fence)
    reference = decode(a_bits).astype(np.float64) @ decode(b_bits).astype(np.float64)
    if use_acc:
        reference += acc
    return out, reference


@pytest.mark.parametrize("dtype, a_in_registers, b_k_major", [
    ("fp16", False, False), ("fp16", True, False), ("fp16", False, True),
    ("bf16", False, False), ("bf16", True, True),
    ("fp8e4m3", False, True), ("fp8e4m3", True, True),
    ("fp8e5m2", False, True),
])
def test_wgmma_matches_numpy(dtype, a_in_registers, b_k_major):
    out, reference = _run_wgmma(dtype, a_in_registers, b_k_major)
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)


def test_wgmma_without_use_acc_ignores_the_accumulator():
    out, reference = _run_wgmma("fp16", False, False, use_acc=False)
    np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-5)


def test_missing_fence_async_shared_is_a_race():
    with pytest.raises(EmulationError, match="without fence_async_shared") as info:
        _run_wgmma("fp16", False, False, fence=False)
    text = str(info.value)
    assert "generic-proxy write" in text
    assert "a_operand.store(a)" in text  # the write
    assert "ll.warpgroup_mma(a_operand, b_operand" in text  # the async-proxy read


@ll.jit
def wgmma_misuse(a_ptr, c_ptr, READ_EARLY: ll.constexpr, OVERWRITE: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    a = ll.load(a_ptr + tile_offsets(64, 64, layout))
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16), a)
    ll.fence_async_shared()
    acc = ll.zeros([64, 64], ll.float32, ACC)
    acc = ll.warpgroup_mma(smem, smem, acc, is_async=True)
    if OVERWRITE:
        smem.store(a)
    if READ_EARLY:
        ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)


@pytest.mark.parametrize("read_early, overwrite, message, lines", [
    (True, False, "before a warpgroup_mma_wait", ["ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)"]),
    (False, True, "wgmma (operand a) is still reading", ["smem.store(a)", "ll.warpgroup_mma(smem, smem"]),
])
def test_async_wgmma_protocol_errors(read_early, overwrite, message, lines):
    a = RNG.standard_normal((64, 64)).astype(np.float16)
    with pytest.raises(EmulationError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        wgmma_misuse[(1,)](a, np.zeros((64, 64), np.float32), read_early, overwrite)
    for line in lines:
        assert line in str(info.value)


def test_async_wgmma_retired_by_its_wait_is_readable():
    a = RNG.standard_normal((64, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    wgmma_misuse[(1,)](a, c, False, False)
    np.testing.assert_allclose(c, a.astype(np.float64) @ a.astype(np.float64), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------ TMA and mbarrier misuse
@ll.jit
def tma_then_read(src, out, EXPECT: ll.constexpr, WAIT: ll.constexpr, PARITY: ll.constexpr,
                  INIT: ll.constexpr):
    smem = ll.allocate_shared_memory(src.dtype, src.block_shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    if INIT:
        mbarrier.init(bar, count=1)
    if EXPECT:
        mbarrier.expect(bar, src.nbytes)
    tma.async_copy_global_to_shared(src, [0, 0], bar, smem)
    if WAIT:
        mbarrier.wait(bar, PARITY)
    ll.store(out + tile_offsets(64, 64, BLOCKED), smem.load(BLOCKED))


def _tma_then_read(expect=True, wait=True, parity=0, init=True):
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.zeros_like(x)
    tma_then_read[(1,)](ll.TensorDescriptor.from_tensor(x, [64, 64]), out, expect, wait, parity, init)
    return x, out


def test_tma_load_waited_for_is_readable():
    x, out = _tma_then_read()
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("wait, parity", [(False, 0), (True, 1)])  # no wait; a wait that passes at once
def test_reading_a_buffer_a_tma_load_is_still_writing_is_a_race(wait, parity):
    with pytest.raises(EmulationError, match="the TMA load is still writing") as info:
        _tma_then_read(wait=wait, parity=parity)
    text = str(info.value)
    assert "smem.load(BLOCKED)" in text and "tma.async_copy_global_to_shared(src" in text
    assert "wait on mbarrier `bar`" in text


def test_missing_expect_is_a_deadlock_naming_the_stray_bytes():
    with pytest.raises(EmulationError, match="deadlock") as info:
        _tma_then_read(expect=False)
    text = str(info.value)
    assert "phase 0 (parity 0) of mbarrier `bar`" in text
    assert "1 of 1 arrivals still pending" in text
    assert "8192 bytes of TMA loads landed that no mbarrier.expect announced" in text
    assert "mbarrier.wait(bar, PARITY)" in text and "mbarrier.init(bar, count=1)" in text


@ll.jit
def tma_with_run_time_expect(src, out, nbytes):
    smem = ll.allocate_shared_memory(src.dtype, src.block_shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, nbytes)  # an i32 known at run time
    tma.async_copy_global_to_shared(src, [0, 0], bar, smem)
    mbarrier.wait(bar, 0)
    ll.store(out + tile_offsets(64, 64, BLOCKED), smem.load(BLOCKED))


def test_a_run_time_expect_count_must_be_what_the_hardware_takes():
    """mbarrier.expect with bytes known only at run time: the box's bytes complete the
    phase; a count outside [0, 2^20 - 1] is refused at the line rather than wrapped."""
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    desc = ll.TensorDescriptor.from_tensor(x, [64, 64])
    out = np.zeros_like(x)
    tma_with_run_time_expect[(1,)](desc, out, 64 * 64 * 2)
    np.testing.assert_array_equal(out, x)
    for bad in (-1, 1 << 20):
        with pytest.raises(EmulationError, match=rf"mbarrier.expect nbytes \[{bad}\]: it must be one value "
                                                 rf"in \[0, 1048575\]") as info:
            tma_with_run_time_expect[(1,)](desc, np.zeros_like(x), bad)
        assert "mbarrier.expect(bar, nbytes)" in str(info.value)


def test_uninitialised_mbarrier_is_refused():
    with pytest.raises(EmulationError, match="before mbarrier_init") as info:
        _tma_then_read(init=False)
    assert "mbarrier.expect(bar, src.nbytes)" in str(info.value)


@ll.jit
def tma_store_then_overwrite(dst, WAIT: ll.constexpr, FENCE: ll.constexpr = True):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], dst.layout,
                                     ll.zeros([64, 64], ll.float16, BLOCKED))
    if FENCE:
        ll.fence_async_shared()
    tma.async_copy_shared_to_global(dst, [0, 0], smem)
    if WAIT:
        tma.store_wait(0)
    smem.store(ll.full([64, 64], 1.0, ll.float16, BLOCKED))


def test_overwriting_a_tma_store_source_before_store_wait_is_a_race():
    y = np.ones((64, 64), np.float16)
    tma_store_then_overwrite[(1,)](ll.TensorDescriptor.from_tensor(y, [64, 64]), True)
    assert (y == 0).all()
    with pytest.raises(EmulationError, match="TMA store is still reading") as info:
        tma_store_then_overwrite[(1,)](ll.TensorDescriptor.from_tensor(y, [64, 64]), False)
    assert "smem.store(ll.full(" in str(info.value) and "tma.store_wait" in str(info.value)


def test_tma_store_of_unfenced_generic_writes_is_a_race():
    y = np.ones((64, 64), np.float16)
    with pytest.raises(EmulationError, match="read by TMA store without fence_async_shared") as info:
        tma_store_then_overwrite[(1,)](ll.TensorDescriptor.from_tensor(y, [64, 64]), True, False)
    assert "smem = ll.allocate_shared_memory" in str(info.value)


# ------------------------------------------------------------------ warp specialization
@ll.jit
def ring_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, K,
                  STAGES: ll.constexpr, FREE_PHASE: ll.constexpr, EXPECT: ll.constexpr):
    BLOCK_K: ll.constexpr = a_desc.block_shape[1]
    for k in range(0, ll.cdiv(K, BLOCK_K)):
        slot = k % STAGES
        mbarrier.wait(empty.index(slot), ((k // STAGES) & 1) ^ FREE_PHASE)
        if EXPECT:
            mbarrier.expect(ready.index(slot), a_desc.nbytes + b_desc.nbytes)
        tma.async_copy_global_to_shared(a_desc, [0, k * BLOCK_K], ready.index(slot), a_ring.index(slot))
        tma.async_copy_global_to_shared(b_desc, [0, k * BLOCK_K], ready.index(slot), b_ring.index(slot))


@ll.jit
def ring_consumer(a_ring, b_ring, ready, empty, K, STAGES: ll.constexpr, BLOCK_K: ll.constexpr):
    acc = ll.zeros([64, 64], ll.float32, ACC)
    for k in range(0, ll.cdiv(K, BLOCK_K)):
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        acc = ll.warpgroup_mma(a_ring.index(slot), b_ring.index(slot).permute((1, 0)), acc,
                               is_async=True)
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(slot))
    return acc


@ll.jit
def ring_matmul(a_desc, b_desc, c_ptr, K, STAGES: ll.constexpr, FREE_PHASE: ll.constexpr,
                EXPECT: ll.constexpr):
    BLOCK_K: ll.constexpr = a_desc.block_shape[1]
    a_ring = ll.allocate_shared_memory(a_desc.dtype, [STAGES, 64, BLOCK_K], a_desc.layout)
    b_ring = ll.allocate_shared_memory(b_desc.dtype, [STAGES, 64, BLOCK_K], b_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    acc = ll.warp_specialize((a_ring, b_ring, ready, empty, K, STAGES, BLOCK_K), ring_consumer,
                             (a_desc, b_desc, a_ring, b_ring, ready, empty, K, STAGES, FREE_PHASE,
                              EXPECT), [ring_producer], worker_num_warps=[1], worker_num_regs=[0])
    ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


@ll.jit
def ring_peeker(a_ring, ready, empty, sums_ptr, K, STAGES: ll.constexpr, BLOCK_K: ll.constexpr,
                FENCE: ll.constexpr):
    """A second reader of the A ring, through the generic proxy, beside the wgmma."""
    layout: ll.constexpr = ll.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    total = ll.zeros([64, BLOCK_K], ll.float32, layout)
    for k in range(0, ll.cdiv(K, BLOCK_K)):
        slot = k % STAGES
        mbarrier.wait(ready.index(slot), (k // STAGES) & 1)
        total += a_ring.index(slot).load(layout).to(ll.float32)
        if FENCE:  # before the release: TMA overwrites the slot next
            ll.fence_async_shared()
        mbarrier.arrive(empty.index(slot))
    ll.store(sums_ptr + tile_offsets(64, BLOCK_K, layout), total)


@ll.jit
def peeked_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, sums_ptr, K, FENCE: ll.constexpr):
    ring_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, K, 2, 1, True)


@ll.jit
def peeker(a_desc, b_desc, a_ring, b_ring, ready, empty, sums_ptr, K, FENCE: ll.constexpr):
    ring_peeker(a_ring, ready, empty, sums_ptr, K, 2, a_desc.block_shape[1], FENCE)


@ll.jit
def peeked_ring_matmul(a_desc, b_desc, c_ptr, sums_ptr, K, FENCE: ll.constexpr):
    BLOCK_K: ll.constexpr = a_desc.block_shape[1]
    a_ring = ll.allocate_shared_memory(a_desc.dtype, [2, 64, BLOCK_K], a_desc.layout)
    b_ring = ll.allocate_shared_memory(b_desc.dtype, [2, 64, BLOCK_K], b_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=2)
    empty = mbarrier.allocate_mbarrier(batch=2)
    for s in ll.static_range(2):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # the wgmma's warpgroup and the peeker
    acc = ll.warp_specialize((a_ring, b_ring, ready, empty, K, 2, BLOCK_K), ring_consumer,
                             (a_desc, b_desc, a_ring, b_ring, ready, empty, sums_ptr, K, FENCE),
                             [peeked_producer, peeker], worker_num_warps=[1, 4], worker_num_regs=[0, 0])
    ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)


def _peeked_ring(fence: bool):
    k = 96
    a, b_t = padded(64, k, np.float16), padded(64, k, np.float16)
    a[:], b_t[:] = RNG.standard_normal(a.shape), RNG.standard_normal(b_t.shape)
    c = np.full((64, 64), np.nan, np.float32)
    sums = np.full((64, 32), np.nan, np.float32)
    peeked_ring_matmul[(1,)](ll.TensorDescriptor.from_tensor(a, [64, 32]),
                             ll.TensorDescriptor.from_tensor(b_t, [64, 32]), c, sums, k, fence)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b_t.astype(np.float64).T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(sums, a.astype(np.float64).reshape(64, 3, 32).sum(1), rtol=1e-5, atol=1e-5)


def test_a_slot_read_by_wgmma_and_by_fenced_generic_loads_is_refilled_without_a_race():
    """One warpgroup's wgmma needs no proxy fence before TMA refills its slot; another
    warp's generic reads of the same bytes need theirs (and have it): per warp, not per
    byte, or the wgmma's reads would look unfenced."""
    _peeked_ring(fence=True)


def test_a_slot_read_by_generic_loads_without_a_fence_is_a_race():
    with pytest.raises(EmulationError, match=r"race \(proxy\).*read through the generic proxy") as info:
        _peeked_ring(fence=False)
    assert "a_ring.index(slot).load(layout)" in str(info.value)


# Two readers share a slot by turns, each reading only its own uses of it (as packed query
# tiles each read every third ring position): the slot's barrier names phases by parity,
# so a reader whose last wait was on another barrier can pass on a phase two back, unless
# it waits for every phase and releases the ones it does not read (EVERY_PHASE), as the
# attention kernel's release_step does.
@ll.jit
def shared_slot_loader(desc, slot, other, ready, other_ready, free):
    mbarrier.expect(ready, desc.nbytes)
    tma.async_copy_global_to_shared(desc, [0, 0], ready, slot)  # phase 0 of `ready`: the first reader's
    mbarrier.expect(other_ready, desc.nbytes)
    tma.async_copy_global_to_shared(desc, [0, 0], other_ready, other)  # the second reader's previous item
    mbarrier.wait(free, 0)
    mbarrier.expect(ready, desc.nbytes)
    tma.async_copy_global_to_shared(desc, [64, 0], ready, slot)  # phase 1: the second reader's


@ll.jit
def first_slot_reader(slot, other, ready, other_ready, free, out, EVERY_PHASE: ll.constexpr):
    mbarrier.wait(ready, 0)
    ll.store(out + tile_offsets(64, 64, BLOCKED), slot.load(BLOCKED))
    ll.fence_async_shared()  # generic reads before the TMA load that refills the slot
    mbarrier.arrive(free)


@ll.jit
def second_slot_reader(slot, other, ready, other_ready, free, out, EVERY_PHASE: ll.constexpr):
    mbarrier.wait(other_ready, 0)
    if EVERY_PHASE:  # every phase of the slot, releasing the first reader's unread: the
        mbarrier.wait(ready, 0)  # loader then waits for it before phase 1, so the parity
        mbarrier.arrive(free)  # wait below can only mean phase 1
    mbarrier.wait(ready, 1)
    ll.store(out + 64 * 64 + tile_offsets(64, 64, BLOCKED), slot.load(BLOCKED))


@ll.jit
def shared_slot(desc, out, EVERY_PHASE: ll.constexpr):
    slot = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    other = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    bars = mbarrier.allocate_mbarrier(batch=3)
    ready, other_ready, free = bars.index(0), bars.index(1), bars.index(2)
    mbarrier.init(ready, count=1)
    mbarrier.init(other_ready, count=1)
    mbarrier.init(free, count=2 if EVERY_PHASE else 1)
    ll.warp_specialize((desc, slot, other, ready, other_ready, free), shared_slot_loader,
                       (slot, other, ready, other_ready, free, out, EVERY_PHASE),
                       [first_slot_reader, second_slot_reader], worker_num_warps=[4, 4],
                       worker_num_regs=[0, 0])


def _shared_slot(every_phase):
    x = RNG.standard_normal((128, 64)).astype(np.float16)
    out = np.zeros_like(x)
    shared_slot[(1,)](ll.TensorDescriptor.from_tensor(x, [64, 64]), out, every_phase)
    return x, out


def test_shuffled_landing_catches_a_wait_passing_on_a_phase_two_back(monkeypatch):
    """WEFT_EMULATE_SHUFFLE lands TMA loads in an order drawn from its seed, as the hardware
    may (loads of different tensors meet different cache states); unset, oldest first.
    The second reader waits for its previous item (on another barrier), then for parity 1
    of the shared slot: right only if the first reader's load, issued earlier, has landed.
    Oldest first it always has, and the run is right; shuffled, some seeds land it later,
    the wait passes on the slot's incomplete phase 0 and the read of bytes still in flight
    is caught. Waiting for (and releasing) every phase of the slot is right under every
    order."""
    x, out = _shared_slot(every_phase=False)
    np.testing.assert_array_equal(out[:64], x[:64])
    np.testing.assert_array_equal(out[64:], x[64:])
    caught = 0
    for seed in range(8):
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(seed))
        x, out = _shared_slot(every_phase=True)
        np.testing.assert_array_equal(out, x)
        try:
            x, out = _shared_slot(every_phase=False)
            np.testing.assert_array_equal(out, x)
        except EmulationError as error:
            assert "the TMA load is still writing" in str(error)
            assert "mbarrier.wait(ready, 1)" in str(error) or "slot.load(BLOCKED)" in str(error)
            caught += 1
    assert 0 < caught < 8  # each order comes up under some seed


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(i for i, line in enumerate(source, 1) if text in line)


def _ring(k=150, free_phase=1, expect=True):
    a = padded(64, k, np.float16)
    a[:] = RNG.standard_normal(a.shape)
    b_t = padded(64, k, np.float16)  # B given K-major, as B^T [N, K]
    b_t[:] = RNG.standard_normal(b_t.shape)
    c = np.full((64, 64), np.nan, np.float32)
    a_desc = ll.TensorDescriptor.from_tensor(a, [64, 32])
    b_desc = ll.TensorDescriptor.from_tensor(b_t, [64, 32])
    ring_matmul[(1,)](a_desc, b_desc, c, k, 2, free_phase, expect)
    return c, a.astype(np.float64) @ b_t.astype(np.float64).T


def test_producer_consumer_ring_over_mbarriers_with_a_worker_partition():
    c, reference = _ring()  # 5 K steps of 32 through 2 slots, the last one a zero-filled tail
    np.testing.assert_allclose(c, reference, rtol=1e-5, atol=1e-4)


def test_wrong_phase_is_a_deadlock_naming_barrier_phase_and_partitions():
    threads = threading.active_count()
    with pytest.raises(EmulationError, match="deadlock") as info:
        _ring(free_phase=0)  # the producer waits for the slots to be freed before any use
    text = str(info.value)
    assert "default partition (warps 0-3) waits at" in text
    assert "for phase 0 (parity 0) of mbarrier `ready[0]`" in text
    assert "worker 0 (warps 4-4) waits at" in text
    assert "for phase 0 (parity 0) of mbarrier `empty[0]`" in text
    assert f"test_emulator_async.py:{_line_of('mbarrier.wait(empty.index(slot)')}:" in text
    assert "mbarrier.wait(ready.index(slot)" in text  # the first wait's line, with its caret
    assert threading.active_count() == threads  # the partition threads are gone


def test_missing_expect_in_a_ring_deadlocks_both_partitions():
    with pytest.raises(EmulationError, match="deadlock") as info:
        _ring(expect=False)
    text = str(info.value)
    assert "`ready[0]`" in text and "bytes of TMA loads landed that no mbarrier.expect" in text
    assert "`empty[0]`" in text


@ll.jit
def unsynchronised_worker(smem, bar, src):
    layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    smem.store(ll.load(src + tile_offsets(64, 64, layout)))
    mbarrier.arrive(bar)


@ll.jit
def unsynchronised_default(smem, bar, WAIT: ll.constexpr):
    if WAIT:
        mbarrier.wait(bar, 0)
    return smem.load(BLOCKED)


@ll.jit
def handoff(src, out, WAIT: ll.constexpr):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    x = ll.warp_specialize((smem, bar, WAIT), unsynchronised_default, (smem, bar, src),
                           [unsynchronised_worker], worker_num_warps=[1], worker_num_regs=[0])
    ll.store(out + tile_offsets(64, 64, BLOCKED), x)


def test_partitions_hand_data_over_through_an_mbarrier():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.zeros_like(x)
    handoff[(1,)](x, out, True)
    np.testing.assert_array_equal(out, x)


def test_a_partition_reading_without_the_wait_races_with_the_writer():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    threads = threading.active_count()
    # the default partition runs first and reads poison; the worker's later store is
    # the unordered write after a read (WAR) that the vector clocks catch
    with pytest.raises(EmulationError, match=r"race \(WAR\)") as info:
        handoff[(1,)](x, np.zeros_like(x), False)
    text = str(info.value)
    assert "warp 4 (worker 0) writes" in text and "(default partition) read" in text
    assert "smem.store(ll.load(src" in text and "return smem.load(BLOCKED)" in text
    assert threading.active_count() == threads


@ll.jit
def counted_worker(smem, bar, src, count):
    layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    smem.store(ll.load(src + tile_offsets(64, 64, layout)))
    mbarrier.arrive(bar, count=count)  # a run-time count: all of the phase's arrivals at once


@ll.jit
def counted_handoff(src, out, count):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=3)
    x = ll.warp_specialize((smem, bar, True), unsynchronised_default, (smem, bar, src, count),
                           [counted_worker], worker_num_warps=[1], worker_num_regs=[0])
    ll.store(out + tile_offsets(64, 64, BLOCKED), x)


def test_an_arrival_count_known_at_run_time_completes_the_phase():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.zeros_like(x)
    counted_handoff[(1,)](x, out, 3)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(EmulationError, match="deadlock"):  # one arrival short: the wait never ends
        counted_handoff[(1,)](x, np.zeros_like(x), 2)
    with pytest.raises(EmulationError, match="more arrivals than init"):
        counted_handoff[(1,)](x, np.zeros_like(x), 4)
    with pytest.raises(EmulationError, match=r"mbarrier.arrive count \[0\]"):
        counted_handoff[(1,)](x, np.zeros_like(x), 0)


@ll.jit
def double_arrive_worker(bar):
    mbarrier.arrive(bar)
    mbarrier.arrive(bar)  # phase 1 completes before the waiter has seen phase 0


@ll.jit
def waiting_default(bar):
    mbarrier.wait(bar, 0)


@ll.jit
def overrun(x):
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    ll.warp_specialize((bar,), waiting_default, (bar,), [double_arrive_worker],
                       worker_num_warps=[1], worker_num_regs=[0])


def test_arrivals_overrunning_a_waiter_are_reported():
    with pytest.raises(EmulationError, match="can miss phase 0") as info:
        overrun[(1,)](np.zeros(1, np.float32))
    text = str(info.value)
    assert "completes phase 1 while default partition (warps 0-3)" in text
    assert "mbarrier.wait(bar, 0)" in text


@ll.jit
def named_barrier_worker(smem, bar, src):
    # a 2-warp worker: one layout stores, a transposed one reads back, ordered by its
    # own barrier (a named barrier over its 2 warps: the other partition never joins)
    store_layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [2, 1], [1, 0])
    read_layout: ll.constexpr = ll.BlockedLayout([8, 1], [8, 4], [1, 2], [0, 1])
    smem.store(ll.load(src + tile_offsets(64, 64, store_layout)))
    ll.barrier()
    x = smem.load(read_layout)
    ll.barrier()
    smem.store(x + x)
    mbarrier.arrive(bar)


@ll.jit
def named_barrier_kernel(src, out):
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    x = ll.warp_specialize((smem, bar, True), unsynchronised_default, (smem, bar, src),
                           [named_barrier_worker], worker_num_warps=[2], worker_num_regs=[0])
    ll.store(out + tile_offsets(64, 64, BLOCKED), x)


def test_barrier_inside_a_partition_orders_only_its_warps():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    out = np.zeros_like(x)
    named_barrier_kernel[(1,)](x, out)
    np.testing.assert_array_equal(out, x + x)


def test_wgmma_reads_through_its_descriptors_and_refuses_a_misaligned_swizzle():
    a = RNG.standard_normal((64, 64)).astype(np.float16)
    kernel = run_layout_passes(build_kernel(wgmma_misuse, {"a_ptr": "*fp16", "c_ptr": "*fp32"},
                                            {"READ_EARLY": False, "OVERWRITE": False}, 4))
    # move the 128B-swizzled buffer to a 512-byte boundary: the swizzle repeats every 1024
    moved = tuple(dataclasses.replace(op, offset=op.offset + 512) if isinstance(op, ir.AllocateSharedMemory)
                  else op for op in kernel.body.ops)
    kernel = kernel.with_body(ir.Block(kernel.body.args, moved), shared_bytes=kernel.shared_bytes + 512)
    with pytest.raises(EmulationError, match="multiple of 1024 bytes") as info:
        emulate(kernel, (1,), [a, np.zeros((64, 64), np.float32)])
    assert "wgmma operand a" in str(info.value)
