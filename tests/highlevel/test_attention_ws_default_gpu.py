"""The descriptor attention forward as launched by default (warp_specialize not given:
split into a producer and two consumer warpgroups at head_dim 128 with 8 warps,
pipeline_tma_warp_specialize.pays_by_default) on the GPU against float32 torch, causal
and not, and with a tail of rows and key columns past the last full block."""

import pytest

from weft.highlevel import attention_descriptor_example as example

from .test_attention_ws_default import default_compiled, splits

torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.parametrize("n_ctx", [1024, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_default_split_on_the_gpu_against_float32_torch(causal, n_ctx):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    assert splits(default_compiled(128, (128, 64), causal, n_ctx=n_ctx))  # the kernel below is the split one
    q, k, v = (torch.randn(2, 3, n_ctx, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    out, lse = example.attention(q, k, v, causal, block=(128, 64), num_warps=8, num_stages=3)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)
    scores = q.float() @ k.float().transpose(-1, -2) * 128 ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones(n_ctx, n_ctx, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    expected_lse = torch.logsumexp(scores, -1) / torch.log(torch.tensor(2.0))
    torch.testing.assert_close(lse, expected_lse, atol=1e-2, rtol=1e-3)
