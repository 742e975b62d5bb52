"""The highlevel matmul (tl.dot, highlevel/examples.py) on the GPU against torch's fp32
matmul of the same inputs, at shapes with and without tails."""

import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import examples  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape, block, num_warps", [
    ((1024, 1024, 1024), (128, 128, 64), 8),
    ((1000, 777, 300), (128, 256, 64), 8),    # tails in every dim
    ((4096, 512, 128), (64, 64, 32), 4),
    ((96, 80, 48), (16, 16, 16), 4),          # tiles too small for wgmma: multiply-and-sum
])
def test_matmul_matches_torch(dtype, shape, block, num_warps):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(40)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    out = examples.matmul(a, b, "leaky_relu", block=block, num_warps=num_warps)
    reference = torch.nn.functional.leaky_relu(a.float() @ b.float(), 0.01)
    torch.testing.assert_close(out, reference, rtol=1e-3, atol=1e-2)


def test_tf32_and_fp8():
    gen = torch.Generator(device="cuda").manual_seed(41)
    a = torch.randn(500, 300, device="cuda", generator=gen)
    b = torch.randn(300, 260, device="cuda", generator=gen)
    out = examples.matmul(a, b, block=(128, 128, 32), num_warps=8)
    exact = a.double() @ b.double()
    assert ((out.double() - exact).abs() <= 2e-3 * (a.abs().double() @ b.abs().double()) + 1e-6).all()
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    out8 = examples.matmul(a8, b8, block=(128, 128, 64), num_warps=8)
    # Hopper's fp8 wgmma adds its products into the fp32 accumulator keeping fewer mantissa
    # bits than fp32 (about 14, DeepSeek-V3's report measured): the error grows like a
    # rounding of each step's partial sum, so the bound scales with sum |a||b|. A wrong
    # element is off by far more; the emulator, which adds exactly, is held to fp32 in
    # test_dot.py.
    exact8 = a8.double() @ b8.double()
    bound8 = 2.0 ** -10 * (a8.double().abs() @ b8.double().abs()) + 1e-6
    assert ((out8.double() - exact8).abs() <= bound8).all()
