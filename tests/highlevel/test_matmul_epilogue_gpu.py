"""The 16-bit epilogue of the tutorial-style matmul (test_matmul_epilogue.py: the cast before
the conversion, its loads by ldmatrix.x4) on the GPU, against torch's fp32 matmul rounded
once to the output type, with and without tails, pipelined as the benchmark runs it."""

import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import examples  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype, out_dtype", [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")])
@pytest.mark.parametrize("shape, block, num_warps", [
    ((1024, 1024, 1024), (128, 256, 64), 8),
    ((1000, 777, 300), (128, 256, 64), 8),    # tails in every dim
    ((1000, 777, 300), (128, 128, 64), 8),
    ((512, 384, 256), (64, 128, 64), 4),
])
def test_16_bit_output_matches_torch(dtype, out_dtype, shape, block, num_warps):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(45)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    out = examples.matmul(a, b, block=block, num_warps=num_warps, num_stages=3, out_dtype=out_dtype)
    assert out.dtype == dtype
    reference = a.float() @ b.float()
    # fp32 sums in another order, then one rounding to 16 bits
    torch.testing.assert_close(out.float(), reference, rtol=2e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-2)
