"""Gluon's spellings of descriptor and buffer types in lowlevel kernels: `desc.type.block_type`
(compared with ==, `.shape` a list), `smem.type.layout` (the layout object the kernel
allocated with) and `NVMMASharedLayout.get_default_for` for rank-1 boxes, checked on the
emulator against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.lowlevel import mbarrier, tma

RNG = np.random.default_rng(39)
BLOCKED = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
ROW = ll.BlockedLayout([4], [32], [4], [0])


@ll.jit
def copy_when_boxes_match(src, dst, out):
    """Copies a box from src to dst through shared memory; `out` records what the kernel
    saw of the types at compile time."""
    block_type = src.type.block_type
    same = block_type == dst.type.block_type and block_type.shape == list(src.block_shape)
    smem = ll.allocate_shared_memory(src.dtype, block_type.shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, block_type.nbytes)
    tma.async_copy_global_to_shared(src, [0, 0], bar, smem)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    if same and smem.type.layout == src.layout:
        tma.async_copy_shared_to_global(dst, [0, 0], smem)
        tma.store_wait(0)
    ll.store(out + ll.arange(0, 2, ll.BlockedLayout([1], [32], [4], [0])),
             ll.full([2], len(block_type.shape), ll.int32, ll.BlockedLayout([1], [32], [4], [0])))


def test_block_type_compares_and_has_a_list_shape():
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    y = np.zeros_like(x)
    out = np.zeros(2, np.int32)
    layout = ll.NVMMASharedLayout.get_default_for([64, 64], ll.float16)
    copy_when_boxes_match[(1,)](ll.TensorDescriptor.from_tensor(x, [64, 64], layout),
                                ll.TensorDescriptor.from_tensor(y, [64, 64], layout), out)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(out, [2, 2])


def test_block_types_differ_in_shape_or_element():
    from weft.compiler.types import BlockType
    assert BlockType((64, 64), ll.float16) == BlockType((64, 64), ll.float16)
    assert BlockType((64, 64), ll.float16) != BlockType((64, 32), ll.float16)
    assert BlockType((64, 64), ll.float16) != BlockType((64, 64), ll.bfloat16)
    assert BlockType((64, 64), ll.float16).shape == [64, 64]


@ll.jit
def keep_where_layout_is(src, dst, LAYOUT: ll.constexpr):
    """Writes src to dst only when the buffer's type names the very layout it was made with."""
    smem = ll.allocate_shared_memory(ll.float16, [64, 64], LAYOUT)
    if smem.type.layout is LAYOUT:
        smem.store(ll.load(src + ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))[:, None] * 64
                           + ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))[None, :]))
        ll.store(dst + ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))[:, None] * 64
                 + ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))[None, :], smem.load(BLOCKED))


@pytest.mark.parametrize("layout", [ll.NVMMASharedLayout(128, 16),
                                    ll.SwizzledSharedLayout(8, 1, 8, [1, 0])])
def test_smem_type_layout_is_the_users_layout(layout):
    x = RNG.standard_normal((64, 64)).astype(np.float16)
    y = np.zeros_like(x)
    keep_where_layout_is[(1,)](x, y, layout)
    np.testing.assert_array_equal(y, x)


@ll.jit
def scale_rows_through_tma(src, dst, scale):
    """A rank-1 TMA box per program, in a buffer of the descriptor's (rank-1 NVMMA) layout."""
    smem = ll.allocate_shared_memory(src.dtype, src.block_type.shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    start = ll.program_id(0) * src.block_shape[0]
    mbarrier.expect(bar, src.block_type.nbytes)
    tma.async_copy_global_to_shared(src, [start], bar, smem)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    smem.store(smem.load(ROW) * scale)
    ll.fence_async_shared()
    tma.async_copy_shared_to_global(dst, [start], smem)
    tma.store_wait(0)


def test_rank1_default_layout_carries_a_tma_box():
    layout = ll.NVMMASharedLayout.get_default_for([256], ll.float32)
    assert (layout.rank, layout.swizzle_byte_width) == (1, 0)
    x = RNG.standard_normal(2048).astype(np.float32)
    y = np.zeros_like(x)
    scale_rows_through_tma[(8,)](ll.TensorDescriptor.from_tensor(x, [256], layout),
                                 ll.TensorDescriptor.from_tensor(y, [256], layout), 3.0)
    np.testing.assert_allclose(y, x * np.float32(3.0))
