"""stage_block_pointers on the GPU: the block-pointer matmul of test_block_pointer_tma.py
and the attention example (its Q, K and V TMA boxes, split into a producer and consumers
at head_dim 128) against float64, with tails; the PTX copies by cp.async.bulk.tensor."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import attention_example  # noqa: E402

from .test_attention_example import reference  # noqa: E402
from .test_block_pointer_tma import block_matmul  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_block_pointer_matmul_matches_float64(dtype, transposed):
    m, n, k = 1000, 1008, 1008  # tails in every dim; the strides multiples of 16 elements
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    b_stored = torch.randn((n, k) if transposed else (k, n), device="cuda", generator=gen).to(dtype)
    c = torch.zeros(m, n, device="cuda", dtype=torch.float32)
    grid = (-(-m // 128), -(-n // 128))
    block_matmul[grid](a, b_stored, c, m, n, k, *a.stride(), *b_stored.stride(), *c.stride(), BM=128, BN=128, BK=64,
                       B_TRANSPOSED=transposed, num_warps=8, num_stages=3)
    b = b_stored.T if transposed else b_stored
    expected = a.double() @ b.double()
    torch.testing.assert_close(c.double(), expected, rtol=1e-4, atol=1e-4 * k ** 0.5)
    ptx = block_matmul.compile(signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", **{
        name: "i32" for name in ("M", "N", "K", "stride_am", "stride_ak", "stride_b0", "stride_b1", "stride_cm",
                                 "stride_cn")}}, constexprs=dict(BM=128, BN=128, BK=64, B_TRANSPOSED=transposed),
        num_warps=8, num_stages=3, specialization={"a_ptr": "divisible_by_16", "b_ptr": "divisible_by_16",
                                                   "stride_am": "divisible_by_16", "stride_b0": "divisible_by_16",
                                                   "stride_b1": "equal_to_1", "stride_ak": "equal_to_1"}).asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx


@pytest.mark.parametrize("head_dim,block", [(64, (128, 64)), (128, (128, 64)), (128, (128, 128))])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_example_matches_float64(head_dim, block, causal):
    n_ctx = 1000
    gen = torch.Generator(device="cuda").manual_seed(13)
    q, k, v = ((0.5 * torch.randn(2, 3, n_ctx, head_dim, device="cuda", generator=gen)).half() for _ in range(3))
    out, lse = attention_example.attention(q, k, v, causal, block=block, num_warps=8, num_stages=3)
    expected, expected_lse = reference(*(x.cpu().numpy() for x in (q, k, v)), causal, head_dim ** -0.5)
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse.cpu().numpy(), expected_lse, atol=1e-4, rtol=1e-5)
