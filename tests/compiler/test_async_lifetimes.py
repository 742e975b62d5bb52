"""allocate_shared_memory keeps the bytes an asynchronous op still reads or writes out of other
buffers and scratch areas until the op that completes the access (async_completion.py). Each
kernel issues an async access, then, before its completion, allocates a buffer or converts a
layout through shared scratch: bytes the allocator could place over the in-flight ones. Run on
the emulator, whose race detection reports such an overlap, against numpy float64.

Raced before the fix: a TMA store's or reduce-add's source reused before store_wait (also
after a loop of stores), a cp.async or TMA load whose buffer is not read again, an async
wgmma retired after a while loop, a store_wait(1) taken to complete the newer of two stores.
Safe before and pinned here: a cp.async or TMA load whose buffer is read after its wait, a
register-A wgmma."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.lowlevel import async_copy, fence_async_shared, mbarrier, tma

RNG = np.random.default_rng(51)
ROWS = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
COLS = ll.BlockedLayout([4, 1], [8, 4], [1, 4], [0, 1])  # a 64x64 fp32 conversion: 16 KB of scratch
ACC = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 16])
FP32_BOX = ll.NVMMASharedLayout.get_default_for([64, 64], ll.float32)


@ll.jit
def tile(LAYOUT: ll.constexpr):
    rows = ll.arange(0, 64, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, 64, ll.SliceLayout(0, LAYOUT))
    return rows[:, None] * 64 + cols[None, :]


def normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------ TMA store and reduce-add
@ll.jit
def store_then_reuse(desc, x_ptr, y_ptr, REDUCE: ll.constexpr, CONVERT: ll.constexpr):
    """desc's box = (or +=) x by TMA from `source`; before store_wait, y = 2 x through a second
    buffer, or y = x through a layout conversion."""
    x = ll.load(x_ptr + tile(ROWS))
    source = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout, x)
    fence_async_shared()
    if REDUCE:
        tma.async_reduce_add(desc, [0, 0], source)
    else:
        tma.async_copy_shared_to_global(desc, [0, 0], source)
    if CONVERT:
        ll.store(y_ptr + tile(COLS), ll.convert_layout(x, COLS))
    else:
        other = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout, x * 2.0)
        ll.store(y_ptr + tile(ROWS), other.load(ROWS))
    tma.store_wait(0)


@pytest.mark.parametrize("reduce, convert", [(False, False), (True, False), (False, True)])
def test_a_tma_store_source_is_not_reused_before_store_wait(reduce, convert):
    x, start = normal(64, 64), normal(64, 64)
    out, y = start.copy(), np.full((64, 64), np.nan, np.float32)
    store_then_reuse[(1,)](ll.TensorDescriptor.from_tensor(out, [64, 64], FP32_BOX), x, y, reduce, convert)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, start + x64 if reduce else x64, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, x64 if convert else 2 * x64, rtol=1e-6)


@ll.jit
def two_stores_wait_one(desc, x_ptr, y_ptr):
    """Boxes [64, 0] = 2 x, then [0, 0] = x; store_wait(1) completes only the older store, so
    a buffer made then may take `second`'s bytes, never `first`'s (which first fit offers)."""
    x = ll.load(x_ptr + tile(ROWS))
    first = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout, x)
    second = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout, x * 2.0)
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, [64, 0], second)
    tma.async_copy_shared_to_global(desc, [0, 0], first)
    tma.store_wait(1)
    other = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout, x * 3.0)
    ll.store(y_ptr + tile(ROWS), other.load(ROWS))
    tma.store_wait(0)


def test_store_wait_one_completes_only_the_older_store():
    x = normal(64, 64)
    out, y = np.zeros((128, 64), np.float32), np.zeros((64, 64), np.float32)
    two_stores_wait_one[(1,)](ll.TensorDescriptor.from_tensor(out, [64, 64], FP32_BOX), x, y)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, np.concatenate([x64, 2 * x64]), rtol=1e-6)
    np.testing.assert_allclose(y, 3 * x64, rtol=1e-6)


@ll.jit
def stores_in_a_loop(desc, x_ptr, y_ptr, N: ll.constexpr):
    """Box i = (i + 1) x, from a ring of two sources whose slot store_wait(1) frees; the
    last stores run past the loop, where y = x through a layout conversion before store_wait(0)."""
    x = ll.load(x_ptr + tile(ROWS))
    ring = ll.allocate_shared_memory(desc.dtype, [2, 64, 64], desc.layout)
    for i in range(N):
        tma.store_wait(1)  # the store two iterations ago read this slot
        slot = ring.index(i % 2)
        slot.store(x * (i + 1.0))
        fence_async_shared()
        tma.async_copy_shared_to_global(desc, [i * 64, 0], slot)
    ll.store(y_ptr + tile(COLS), ll.convert_layout(x, COLS))
    tma.store_wait(0)


def test_stores_still_running_after_their_loop_keep_their_ring():
    x = normal(64, 64)
    out, y = np.zeros((4 * 64, 64), np.float32), np.zeros((64, 64), np.float32)
    stores_in_a_loop[(1,)](ll.TensorDescriptor.from_tensor(out, [64, 64], FP32_BOX), x, y, 4)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, np.concatenate([(i + 1) * x64 for i in range(4)]), rtol=1e-6)
    np.testing.assert_allclose(y, x64, rtol=1e-6)


# ------------------------------------------------------------------ cp.async and TMA loads
@ll.jit
def cp_async_then_convert(x_ptr, y_ptr, z_ptr, READ: ll.constexpr):
    """cp.async x into a buffer; before its wait_group, z = y through a layout conversion;
    after it, y = the buffer (READ) or the buffer is never read."""
    buffer = ll.allocate_shared_memory(ll.float32, [64, 64], ll.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    async_copy.async_copy_global_to_shared(buffer, x_ptr + tile(ROWS))
    async_copy.commit_group()
    ll.store(z_ptr + tile(COLS), ll.convert_layout(ll.load(y_ptr + tile(ROWS)), COLS))
    async_copy.wait_group(0)
    ll.barrier()
    if READ:
        ll.store(y_ptr + tile(ROWS), buffer.load(ROWS))


@ll.jit
def tma_load_then_convert(desc, y_ptr, z_ptr, READ: ll.constexpr):
    """As cp_async_then_convert, the box loaded by TMA and completed by an mbarrier wait."""
    buffer = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, desc.nbytes)
    tma.async_copy_global_to_shared(desc, [0, 0], bar, buffer)
    ll.store(z_ptr + tile(COLS), ll.convert_layout(ll.load(y_ptr + tile(ROWS)), COLS))
    mbarrier.wait(bar, 0)
    if READ:
        ll.store(y_ptr + tile(ROWS), buffer.load(ROWS))
    mbarrier.invalidate(bar)


@pytest.mark.parametrize("by_tma", [False, True])
@pytest.mark.parametrize("read", [True, False])  # read after the wait: safe before the fix too
def test_an_async_copy_destination_is_not_reused_before_its_wait(by_tma, read):
    x, y = normal(64, 64), normal(64, 64)
    y_before, z = y.copy(), np.full((64, 64), np.nan, np.float32)
    if by_tma:
        tma_load_then_convert[(1,)](ll.TensorDescriptor.from_tensor(x, [64, 64], FP32_BOX), y, z, read)
    else:
        cp_async_then_convert[(1,)](x, y, z, read)
    np.testing.assert_allclose(z, y_before.astype(np.float64), rtol=1e-6)
    np.testing.assert_allclose(y, (x if read else y_before).astype(np.float64), rtol=1e-6)


# ------------------------------------------------------------------ wgmma
@ll.jit
def wgmma_then_convert(a_ptr, b_ptr, c_ptr, y_ptr, z_ptr, n, LOOP: ll.constexpr):
    """c = a @ b (n times over, in a while loop, with LOOP) by async wgmma, A in registers
    and B in shared memory; before the wait, z = y through a layout conversion."""
    a = ll.convert_layout(ll.load(a_ptr + tile(ROWS)), ll.DotOperandLayout(0, ACC, 2))
    b = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16), ll.load(b_ptr + tile(ROWS)))
    fence_async_shared()
    acc = ll.zeros([64, 64], ll.float32, ACC)
    if LOOP:
        i = 0
        while i < n:
            acc = ll.warpgroup_mma(a, b, acc, is_async=True)
            i += 1
    else:
        acc = ll.warpgroup_mma(a, b, acc, is_async=True)
    ll.store(z_ptr + tile(COLS), ll.convert_layout(ll.load(y_ptr + tile(ROWS)), COLS))
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    ll.store(c_ptr + tile(ACC), acc)


@pytest.mark.parametrize("loop", [False, True])  # the while loop raced before the fix
def test_a_wgmma_operand_is_not_reused_before_its_wait(loop):
    a, b = normal(64, 64, dtype=np.float16), normal(64, 64, dtype=np.float16)
    y = normal(64, 64)
    c, z = np.full((64, 64), np.nan, np.float32), np.full((64, 64), np.nan, np.float32)
    wgmma_then_convert[(1,)](a, b, c, y, z, 3, loop)
    product = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, 3 * product if loop else product, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z, y.astype(np.float64), rtol=1e-6)
