"""The emulator's rule for wgmma reads of bytes a cp.async wrote (runtime/emulator/ordering.py):
once the copy's wait_group retired them and a barrier published them, the async proxy reads
them with no proxy fence (as NVIDIA's cp.async wgmma mainloops and Triton's loops do, and
compiler/passes/hoist_copy_fences relies on); a generic store over them needs the fence
again. Values against numpy float64."""

from __future__ import annotations

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.lowlevel import async_copy
from weft.runtime.emulator import EmulationError

from .test_emulator_async import ACC, BLOCKED, nvmma, tile_offsets

RNG = np.random.default_rng(49)


@ll.jit
def copied_operands(a_ptr, b_ptr, c_ptr, OVERWRITE: ll.constexpr, FENCE: ll.constexpr):
    """C = A B with A and B copied by cp.async (A doubled by a generic store over the
    copy when OVERWRITE), fenced for the async proxy only when FENCE."""
    a_smem = ll.allocate_shared_memory(ll.float16, [64, 64], nvmma([64, 64], 16))
    b_smem = ll.allocate_shared_memory(ll.float16, [64, 64], nvmma([64, 64], 16))
    async_copy.async_copy_global_to_shared(a_smem, a_ptr + tile_offsets(64, 64, BLOCKED))
    async_copy.async_copy_global_to_shared(b_smem, b_ptr + tile_offsets(64, 64, BLOCKED))
    async_copy.commit_group()
    async_copy.wait_group(0)
    if OVERWRITE:
        a_smem.store(ll.load(a_ptr + tile_offsets(64, 64, BLOCKED)) * 2)
    if FENCE:
        ll.fence_async_shared()
    acc = ll.zeros([64, 64], ll.float32, ACC)
    acc = ll.warpgroup_mma(a_smem, b_smem, acc, is_async=True)
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    ll.store(c_ptr + tile_offsets(64, 64, ACC), acc)


def _inputs():
    a, b = (RNG.standard_normal((64, 64)).astype(np.float16) for _ in range(2))
    return a, b, np.full((64, 64), np.nan, np.float32)


@pytest.mark.parametrize("fence", [False, True])
def test_wgmma_reads_landed_copies_without_a_fence(fence):
    a, b, c = _inputs()
    copied_operands[(1,)](a, b, c, False, fence)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_a_generic_store_over_copied_bytes_needs_the_fence_again():
    a, b, c = _inputs()
    with pytest.raises(EmulationError, match="without fence_async_shared"):
        copied_operands[(1,)](a, b, c, True, False)
    copied_operands[(1,)](a, b, c, True, True)
    np.testing.assert_allclose(c, (2 * a).astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
