"""The Triton language features of tests/highlevel/test_{hints,shape_ops,random,scan,pointers}.py
on the GPU: the same kernels, on torch CUDA tensors, against the same numpy references
(random streams bit for bit)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from .test_hints import copy_from  # noqa: E402
from .test_pointers import block_copy  # noqa: E402
from .test_random import philox_reference, random_streams, uniform_reference  # noqa: E402
from .test_scan import recurrence, sequential_recurrence  # noqa: E402
from .test_shape_ops import joins_and_splits  # noqa: E402

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(45)


def cuda(array: np.ndarray):
    return torch.from_numpy(array).cuda()


def test_random_streams_are_bit_exact_on_the_gpu():
    offsets = RNG.integers(-2**31, 2**31, 1024).astype(np.int32)
    out = torch.zeros(7 * 1024, dtype=torch.int32, device="cuda")
    random_streams[(1,)](cuda(offsets), out, -7, N=1024)
    got = out.cpu().numpy().reshape(7, 1024).view(np.uint32)
    words = philox_reference(-7, offsets)
    np.testing.assert_array_equal(got[0], words[0])
    for k in range(4):
        np.testing.assert_array_equal(got[1 + k], words[k])
    np.testing.assert_array_equal(got[5].view(np.float32), uniform_reference(words[0]))
    np.testing.assert_array_equal(got[6].view(np.float32), uniform_reference(words[3]))


@pytest.mark.parametrize("axis, reverse", [(0, False), (1, True)])
def test_associative_scan_on_the_gpu(axis, reverse):
    a = RNG.uniform(0.5, 1.0, (64, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 64)).astype(np.float32)
    out = torch.zeros(64, 64, device="cuda")
    recurrence[(1,)](cuda(a), cuda(b), out, R=64, C=64, AXIS=axis, REVERSE=reverse)
    expected = sequential_recurrence(a.astype(np.float64), b.astype(np.float64), axis, reverse)
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=1e-4, atol=1e-4)


def test_shape_ops_hints_and_block_pointers_on_the_gpu():
    n = 256
    x, y = (RNG.standard_normal(n).astype(np.float32) for _ in range(2))
    idx = RNG.integers(-1000, 1000, n).astype(np.int32)
    out = torch.zeros(8 * n, device="cuda")
    idx_gpu = cuda(idx)
    joins_and_splits[(1,)](cuda(x), cuda(y), out, idx_gpu, N=n)
    got = out.cpu().numpy()
    np.testing.assert_array_equal(got[:2 * n], np.stack([x, y], -1).ravel())
    np.testing.assert_array_equal(got[2 * n:4 * n], np.stack([y, x], -1).ravel())
    np.testing.assert_array_equal(idx_gpu.cpu().numpy(), idx.astype(np.int64) * 11 + 1)

    data = RNG.standard_normal(1024).astype(np.float32)
    copied = torch.zeros(1024, device="cuda")
    copy_from[(1,)](cuda(data), copied, cuda(np.array([256], np.int32)), HINT=True, BLOCK=512)
    np.testing.assert_array_equal(copied.cpu().numpy()[256:768], data[256:768])

    tile = RNG.standard_normal((300, 170)).astype(np.float32)
    doubled = torch.zeros(300, 170, device="cuda")
    block_copy[(5,)](cuda(tile), doubled, 300, 170, 170, 1, BM=64, BN=64, PADDING="zero")
    np.testing.assert_array_equal(doubled.cpu().numpy(), tile * 2)
