"""Row kernels streaming rows through a shared-memory ring (kernels/row_ring.py), on the
CPU emulator against numpy, and the bulk copy's rules."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.kernels import layer_norm, softmax
from weft.lowlevel import mbarrier, tma
from weft.runtime.emulator.errors import EmulationError

RNG = np.random.default_rng(77)


def ring_config(kernel, n_cols, element_bits, warps, stages, **extra):
    base = softmax.Config.for_row(n_cols, element_bits)
    make = layer_norm.Config if kernel is layer_norm else softmax.Config
    return make(base.block, warps, base.vector, 0, stages, **extra)


@pytest.mark.parametrize("shape, warps, stages", [((7, 512), 4, 2), ((5, 200), 2, 4), ((9, 64), 1, 1), ((2, 96), 1, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax_through_a_ring_matches_numpy(shape, warps, stages, dtype):
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    config = ring_config(softmax, shape[1], 8 * x.itemsize, warps, stages)
    got = softmax.softmax(x, config).astype(np.float64)
    tolerance = 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got, softmax.reference(x), rtol=tolerance, atol=tolerance * 1e-2)


@pytest.mark.parametrize("hold", [False, True])
@pytest.mark.parametrize("shape, warps, stages", [((7, 512), 4, 2), ((5, 200), 2, 4), ((4, 1024), 4, 1)])
def test_layer_norm_through_a_ring_matches_numpy(shape, warps, stages, hold):
    x = (RNG.standard_normal(shape) * 2 + 5).astype(np.float32)
    w = RNG.standard_normal(shape[1]).astype(np.float32)
    b = RNG.standard_normal(shape[1]).astype(np.float32)
    config = ring_config(layer_norm, shape[1], 32, warps, stages, hold_weights=hold)
    y, mean, rstd = layer_norm.layer_norm(x, w, b, 1e-5, return_stats=True, config=config)
    ref_y, ref_mean, ref_rstd = layer_norm.reference(x, w, b, 1e-5)
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)


def test_rows_the_bulk_copy_cannot_take_fall_back_to_registers():
    # 300 fp16 columns are 600 bytes, not a multiple of 16; a view's rows 301 apart do not
    # start on 16 bytes: both run the one-row-per-CTA kernel, with the same results.
    config = ring_config(softmax, 300, 16, 2, 2)
    x = (RNG.standard_normal((5, 300)) * 3).astype(np.float16)
    np.testing.assert_allclose(softmax.softmax(x, config), softmax.reference(x), rtol=2e-3, atol=1e-5)
    view = RNG.standard_normal((5, 301)).astype(np.float32)[:, :296]
    config = ring_config(softmax, 296, 32, 2, 2)
    np.testing.assert_allclose(softmax.softmax(view, config), softmax.reference(view), rtol=1e-6)


@ll.jit
def copy_rows(out_ptr, in_ptr, n_rows, n_cols, BLOCK: ll.constexpr, STAGES: ll.constexpr,
              BARRIER: ll.constexpr, FENCE: ll.constexpr, LAYOUT: ll.constexpr):
    """Stream rows through a ring and write them back; BARRIER False refills a slot
    that other warps may still be reading, FENCE False one whose generic reads are not
    fenced from the copy's async-proxy writes."""
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
    ring = ll.allocate_shared_memory(ll.float32, [STAGES, BLOCK], LAYOUT)
    landed = mbarrier.allocate_mbarrier(batch=STAGES)
    for s in ll.static_range(STAGES):
        mbarrier.init(landed.index(s), count=1)
    for s in ll.static_range(STAGES):
        mbarrier.expect(landed.index(s), n_cols * 4)
        tma.async_bulk_copy_global_to_shared(in_ptr + s * n_cols, landed.index(s), ring.index(s), n_cols * 4)
    cols = ll.arange(0, BLOCK, layout)
    done = 0
    for row in range(0, n_rows):
        slot = done % STAGES
        mbarrier.wait(landed.index(slot), (done // STAGES) & 1)
        x = ring.index(slot).load(layout)
        if FENCE:
            ll.fence_async_shared()
        if BARRIER:
            ll.barrier()
        ahead = row + STAGES
        mbarrier.expect(landed.index(slot), n_cols * 4, pred=ahead < n_rows)
        tma.async_bulk_copy_global_to_shared(in_ptr + ahead * n_cols, landed.index(slot), ring.index(slot),
                                             n_cols * 4, pred=ahead < n_rows)
        ll.store(out_ptr + row * n_cols + cols, x, mask=cols < n_cols)
        done += 1


PLAIN = ll.SwizzledSharedLayout(1, 1, 1, [1, 0])


def test_bulk_copies_stream_rows_in_order():
    x = RNG.standard_normal((6, 128)).astype(np.float32)
    out = np.full_like(x, np.nan)
    copy_rows[(1,)](out, x, 6, 128, BLOCK=128, STAGES=2, BARRIER=True, FENCE=True, LAYOUT=PLAIN, num_warps=4)
    np.testing.assert_array_equal(out, x)


def test_refilling_a_slot_other_warps_still_read_gets_the_pass_s_barrier():
    # Without the kernel's own barrier, the bulk copy that refills a slot would overwrite
    # rows other warps still read (a WAR race); insert_barriers counts the copy as a write
    # to shared memory and places the CTA barrier before it (issue 38).
    x = RNG.standard_normal((6, 128)).astype(np.float32)
    out = np.full_like(x, np.nan)
    copy_rows[(1,)](out, x, 6, 128, BLOCK=128, STAGES=2, BARRIER=False, FENCE=True, LAYOUT=PLAIN, num_warps=4)
    np.testing.assert_array_equal(out, x)
    compiled = copy_rows.compile({"out_ptr": "*fp32", "in_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32"},
                                 constexprs=dict(BLOCK=128, STAGES=2, BARRIER=False, FENCE=True, LAYOUT=PLAIN))
    loop = compiled.asm["layout"].split(" = for ", 1)[1]
    assert loop.index("barrier\n") < loop.index("async_bulk_copy_global_to_shared"), loop


def test_refilling_a_slot_without_a_proxy_fence_is_a_race():
    # What the H200 showed: behind a CTA barrier alone, a bulk copy's writes landed under
    # generic loads of the slot that were still pending.
    x = RNG.standard_normal((6, 128)).astype(np.float32)
    with pytest.raises(EmulationError, match=r"race \(proxy\).*fence_async_shared"):
        copy_rows[(1,)](np.empty_like(x), x, 6, 128, BLOCK=128, STAGES=2, BARRIER=True, FENCE=False,
                        LAYOUT=PLAIN, num_warps=4)


@ll.jit
def copy_bytes(out_ptr, in_ptr, NBYTES: ll.constexpr, OFFSET: ll.constexpr, LAYOUT: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([1, 1], [2, 16], [1, 1], [1, 0])
    buffer = ll.allocate_shared_memory(ll.float32, [4, 16], LAYOUT)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, NBYTES)
    tma.async_bulk_copy_global_to_shared(in_ptr + OFFSET, bar, buffer, NBYTES)
    mbarrier.wait(bar, 0)
    flat = ll.arange(0, 4, ll.SliceLayout(1, layout))[:, None] * 16 + ll.arange(0, 16, ll.SliceLayout(0, layout))[None, :]
    ll.store(out_ptr + flat, buffer.load(layout), mask=flat < NBYTES // 4)


def test_bulk_copy_byte_counts_and_alignment_are_checked():
    x = RNG.standard_normal(80).astype(np.float32)
    out = np.zeros(64, np.float32)
    copy_bytes[(1,)](out, x, NBYTES=64, OFFSET=4, LAYOUT=PLAIN, num_warps=1)
    np.testing.assert_array_equal(out[:16], x[4:20])
    with pytest.raises(CompilationError, match="multiple of 16"):
        copy_bytes[(1,)](out, x, NBYTES=40, OFFSET=0, LAYOUT=PLAIN, num_warps=1)
    with pytest.raises(CompilationError, match="multiple of 16"):
        copy_bytes[(1,)](out, x, NBYTES=512, OFFSET=0, LAYOUT=PLAIN, num_warps=1)
    with pytest.raises(EmulationError, match="16-byte aligned"):
        copy_bytes[(1,)](out, x, NBYTES=64, OFFSET=1, LAYOUT=PLAIN, num_warps=1)


def test_bulk_copy_into_a_swizzled_buffer_is_refused_at_the_users_line():
    swizzled = ll.SwizzledSharedLayout(4, 1, 4, [1, 0])
    x = RNG.standard_normal(80).astype(np.float32)
    with pytest.raises(CompilationError, match="row-major") as error:
        copy_bytes[(1,)](np.zeros(64, np.float32), x, NBYTES=64, OFFSET=0, LAYOUT=swizzled, num_warps=1)
    assert "tma.async_bulk_copy_global_to_shared(in_ptr + OFFSET" in str(error.value)
