"""The Hopper async lowering on the GPU (marked `gpu`): cp.async copies, TMA round trips,
mbarrier hand-offs between warp_specialize partitions (with setmaxnreg budgets), results
and captured tensors across partitions; checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from weft import lowlevel as ll

from . import async_kernels as K
from .test_backend_async import CP_LAYOUT, CP_OUT

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def cuda(array: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


@pytest.mark.parametrize("dtype, aligned", [(np.float32, True), (np.float16, True), (np.int8, True),
                                            (np.float16, False)])
@pytest.mark.parametrize("n", [2048, 1000])
def test_cp_async_copy(dtype, aligned, n):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(2048) * 50).astype(dtype)
    # An odd n is not divisible by 16: no vector proof for the mask, narrower copies.
    n_arg = n if aligned else n + 1
    out = cuda(np.full(2048, 7, dtype))
    K.cp_async_copy[(1,)](cuda(x), out, n_arg, ROWS=32, COLS=64, L=CP_LAYOUT,
                          S=ll.SwizzledSharedLayout(4, 1, 8, [1, 0]), OUT=CP_OUT)
    expected = np.where(np.arange(2048) < n_arg, x, 0).astype(dtype)
    np.testing.assert_array_equal(out.cpu().numpy(), expected)


@pytest.mark.parametrize("worker_warps, worker_regs, num_warps", [(1, 0, 4), (2, 0, 4), (4, 24, 8), (4, 40, 4)])
def test_ping_pong_between_partitions(worker_warps, worker_regs, num_warps):
    iters, block = 16, 1024
    x = np.random.default_rng(1).standard_normal(iters * block).astype(np.float32)
    out = cuda(np.zeros_like(x))
    K.ping_pong[(1,)](cuda(x), out, ITERS=iters, BLOCK=block, WORKER_WARPS=worker_warps,
                      WORKER_REGS=worker_regs, WARPS=num_warps, num_warps=num_warps)
    np.testing.assert_array_equal(out.cpu().numpy(), 2 * x)


def test_ping_pong_many_ctas():
    iters, block = 64, 256
    x = np.random.default_rng(2).standard_normal(iters * block).astype(np.float32)
    for _ in range(3):  # a hang or a lost hand-off shows up as a wrong or missing block
        out = cuda(np.zeros_like(x))
        K.ping_pong[(132,)](cuda(x), out, ITERS=iters, BLOCK=block, WORKER_WARPS=1, WORKER_REGS=0)
        np.testing.assert_array_equal(out.cpu().numpy(), 2 * x)


@pytest.mark.parametrize("workers", [1, 3])
def test_results_of_the_default_partition(workers):
    x = np.random.default_rng(3).standard_normal((16, 128)).astype(np.float32)
    out = cuda(np.zeros(16, np.float32))
    K.specialized_sum[(1,)](cuda(x), out, WORKERS=workers)
    np.testing.assert_allclose(out.cpu().numpy(), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_a_captured_tensor_reaches_the_worker():
    x = np.random.default_rng(4).standard_normal(128).astype(np.float32)
    out = cuda(np.zeros_like(x))
    K.tensor_capture[(1,)](cuda(x), out)
    np.testing.assert_array_equal(out.cpu().numpy(), x)


@pytest.mark.parametrize("shape", [(128, 192), (100, 72)])
def test_tma_round_trip(shape):
    from weft.runtime.tensor_descriptor import TensorDescriptor

    x = np.random.default_rng(5).standard_normal(shape).astype(np.float16)
    src, dst = cuda(x), cuda(np.zeros_like(x))
    layout = ll.NVMMASharedLayout(128, 16)
    a = TensorDescriptor.from_tensor(src, [64, 64], layout)
    b = TensorDescriptor.from_tensor(dst, [64, 64], layout)
    grid = (-(-shape[0] // 64), -(-shape[1] // 64))
    K.tma_copy[grid](a, b)
    np.testing.assert_array_equal(dst.cpu().numpy(), x)  # edges: zeros in, nothing out
