"""stage_pointer_loads on the GPU: highlevel/examples.py's matmul (pointer loads made TMA
boxes) and test_pointer_tma.py's variants reading B as [K, N] tiles of an [N, K] array and
computing the pointer tiles from the induction variable,
fp16 and bf16 with tails in M, N and K, against float32 torch; the PTX copies by
cp.async.bulk.tensor."""

import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import examples  # noqa: E402

from .test_pointer_tma import EXAMPLE_SIGNATURE, EXAMPLE_SPECIALIZATION, matmul_nk, matmul_recomputed  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [(128, 128, 64), (128, 256, 64)])
def test_the_examples_matmul_matches_torch(dtype, block):
    m, n, k = 1000, 1008, 1008  # tails in every dim; the strides multiples of 16 elements
    gen = torch.Generator(device="cuda").manual_seed(40)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    b = torch.randn(k, n, device="cuda", generator=gen).to(dtype)
    c = examples.matmul(a, b, block=block, num_warps=8, num_stages=3)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3 * k ** 0.5)
    ptx = examples.matmul_kernel.compile(
        signature=EXAMPLE_SIGNATURE, constexprs=dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2],
                                                     GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True),
        num_warps=8, num_stages=3, specialization=EXAMPLE_SPECIALIZATION).asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "cp.async.cg" not in ptx


@pytest.mark.parametrize("dtype, k", [(torch.float16, 1008), (torch.bfloat16, 1008), (torch.float16, 32768)])
def test_b_as_n_by_k_matches_torch(dtype, k):
    """A's rows are unmasked in this kernel (M a multiple of BLOCK_M), so its map's rows take
    every coordinate a box can: 2**31 rows of 2 KB, and of 64 KB at K 32768."""
    m, n = 1024, 1008
    gen = torch.Generator(device="cuda").manual_seed(41)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    b_stored = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
    c = torch.zeros(m, n, device="cuda", dtype=torch.float32)
    matmul_nk[(m // 64, -(-n // 64))](a, b_stored, c, m, n, k, *a.stride(), 1, k, *c.stride(), BLOCK_M=64,
                                      BLOCK_N=64, BLOCK_K=32, WRAP=False, num_warps=4, num_stages=3)
    torch.testing.assert_close(c, a.float() @ b_stored.float().T, rtol=1e-3, atol=1e-3 * k ** 0.5)


def test_pointers_recomputed_from_the_induction_variable_match_torch():
    m, n, k = 1000, 1008, 1008
    gen = torch.Generator(device="cuda").manual_seed(42)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.float16)
    b = torch.randn(k, n, device="cuda", generator=gen).to(torch.float16)
    c = torch.zeros(m, n, device="cuda", dtype=torch.float32)
    matmul_recomputed[(-(-m // 128), -(-n // 128))](a, b, c, m, n, k, k, n, n, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                                                     num_warps=8, num_stages=3)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3 * k ** 0.5)


def test_an_empty_k_reads_zeros():
    """K = 0 with strides TMA takes: each load's K bound is empty, so its map becomes one
    element of zeros (made_tensor_descriptor.zeros_address) and C is all zeros."""
    a = torch.randn(1000, 64, device="cuda").half()[:, :0]  # strides (64, 1): a TMA box
    b = torch.randn(64, 1008, device="cuda").half()[:0]
    c = examples.matmul(a, b, block=(128, 128, 64), num_warps=8, num_stages=3)
    assert c.shape == (1000, 1008) and not c.any()
