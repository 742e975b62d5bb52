"""`smem._reinterpret(dtype, shape, layout)`: the same shared bytes seen with another element
type, shape and layout. Values written through one view read back through the other as
numpy's `.view()` of the same bytes; the emulator tracks races on the bytes either view
touches."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationError
from weft.lowlevel import mbarrier, tma
from weft.runtime.emulator import EmulationError

ROW_MAJOR = ll.SwizzledSharedLayout(1, 1, 1, [1, 0])
BLOCKED = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])


@ll.jit
def as_halves(x_ptr, out_ptr, R: ll.constexpr, C: ll.constexpr):
    """fp32 [R, C] written row-major, read back as fp16 [R, 2C]."""
    rows = ll.arange(0, R, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    wide = ll.arange(0, 2 * C, ll.SliceLayout(0, BLOCKED))
    buf = ll.allocate_shared_memory(ll.float32, [R, C], ROW_MAJOR)
    buf.store(ll.load(x_ptr + rows[:, None] * C + cols[None, :]))
    halves = buf._reinterpret(ll.float16, [R, 2 * C], ROW_MAJOR)
    ll.store(out_ptr + rows[:, None] * (2 * C) + wide[None, :], halves.load(BLOCKED))


@ll.jit
def swizzled_bytes(x_ptr, out_ptr):
    """fp16 [64, 64] in the 128-byte swizzle, read back as its u8 [64, 128] bytes in the
    same swizzle (the 16-byte chunks move alike), then written back through the bytes."""
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 64, ll.SliceLayout(0, BLOCKED))
    buf = ll.allocate_shared_memory(ll.float16, [64, 64], ll.NVMMASharedLayout(128, 16))
    buf.store(ll.load(x_ptr + rows[:, None] * 64 + cols[None, :]))
    raw = buf._reinterpret(ll.uint8, [64, 128], ll.NVMMASharedLayout(128, 8))
    raw.store(raw.load(BLOCKED) ^ 0x80)  # bit 7 of every byte: each half's sign and a mantissa bit
    ll.store(out_ptr + rows[:, None] * 64 + cols[None, :], buf.load(BLOCKED))


def test_a_row_major_buffer_reads_back_as_numpy_views_it():
    x = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    out = np.zeros((16, 64), np.float16)
    as_halves[(1,)](x, out, R=16, C=32)
    np.testing.assert_array_equal(out.view(np.uint16), x.view(np.uint16))


def test_a_swizzled_buffer_is_the_same_bytes_in_either_view():
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float16)
    out = np.zeros_like(x)
    swizzled_bytes[(1,)](x, out)
    expected = (x.view(np.uint8) ^ 0x80).view(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


@ll.jit
def read_before_the_copy_lands(desc, out_ptr):
    buf = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, desc.nbytes)
    tma.async_copy_global_to_shared(desc, [0, 0], bar, buf)
    raw = buf._reinterpret(ll.uint8, [64, 128], ll.NVMMASharedLayout(128, 8))
    values = raw.load(BLOCKED)  # the bug: no mbarrier.wait(bar, 0) before this read
    mbarrier.wait(bar, 0)
    rows = ll.arange(0, 64, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 128, ll.SliceLayout(0, BLOCKED))
    ll.store(out_ptr + rows[:, None] * 128 + cols[None, :], values)


def test_a_race_through_the_other_view_is_caught():
    x = np.zeros((64, 64), np.float16)
    out = np.zeros((64, 128), np.uint8)
    with pytest.raises(EmulationError, match="race"):
        read_before_the_copy_lands[(1,)](ll.TensorDescriptor.from_tensor(x, [64, 64]), out)


@ll.jit
def too_large(out_ptr):
    buf = ll.allocate_shared_memory(ll.float16, [64, 64], ROW_MAJOR)
    wide = buf._reinterpret(ll.float32, [64, 64], ROW_MAJOR)
    ll.store(out_ptr, ll.sum(ll.sum(wide.load(BLOCKED), 1), 0))


def test_a_view_larger_than_its_allocation_is_refused_at_the_line():
    with pytest.raises(CompilationError, match=r"needs 16384 bytes, but the allocation shared<64x64xfp16> "
                                               r"it views holds 8192") as info:
        too_large.compile(signature={"out_ptr": "*fp32"}, num_warps=4)
    assert "buf._reinterpret(ll.float32" in str(info.value)


@ll.jit
def borrow_two_stages(x_ptr, out_ptr, first):
    """An fp32 [32, 32] tile in two of four fp16 [32, 32] stages, from stage `first` on (as
    Gluon's tutorial 07 lends B stages to its epilogue)."""
    rows = ll.arange(0, 32, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, 32, ll.SliceLayout(0, BLOCKED))
    stages = ll.allocate_shared_memory(ll.float16, [4, 32, 32], ROW_MAJOR)
    tile = stages.index(first)._reinterpret(ll.float32, [32, 32], ROW_MAJOR)
    tile.store(ll.load(x_ptr + rows[:, None] * 32 + cols[None, :]))
    halves = stages.index(first + 1).load(BLOCKED)  # the second stage holds rows 16..31
    ll.store(out_ptr + rows[:, None] * 32 + cols[None, :], halves)


def test_a_view_of_one_stage_may_span_the_next_but_not_past_the_allocation():
    x = np.random.default_rng(2).standard_normal((32, 32)).astype(np.float32)
    out = np.zeros((32, 32), np.float16)
    borrow_two_stages[(1,)](x, out, 2)
    np.testing.assert_array_equal(out.view(np.uint16), x[16:].view(np.uint16).reshape(32, 32))
    with pytest.raises(EmulationError, match=r"needs 4096 bytes from byte \d+, but its allocation ends 2048 "
                                             r"bytes after that"):
        borrow_two_stages[(1,)](x, out, 3)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_reinterpreted_views_assemble():
    compiled = swizzled_bytes.compile(signature={"x_ptr": "*fp16", "out_ptr": "*fp16"}, num_warps=4)
    assert compiled.asm["cubin"] and compiled.metadata["spill_stores"] == 0
