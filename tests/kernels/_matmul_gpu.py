"""The GPU check the matmul tests of CTA pairs (test_matmul_cluster.py) and of tiles staged
in halves (test_matmul_stages.py) share: bf16 operands on the H200, a config's kernel
called twice, each result against torch's float32 product."""

import pytest

from weft.kernels.matmul import matmul


def check_bf16_matmul_on_gpu(m, n, k, layout, config, seed):
    """matmul(a, b, config=config) on random bf16 operands against `a.float() @ b.float()`,
    to 2e-2 of the product's largest magnitude. B is [K, N] row-major for layout "kn" and
    the transposed view of an [N, K] tensor (K-major) for "nk". The second call refills A
    and keeps B: it reuses what the first prepared (the launch, a split's workspace) on a
    new C. Skips without torch or a CUDA GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = b.t() if layout == "nk" else b.t().contiguous()
    for call in range(2):
        a.normal_(generator=gen)
        out = matmul(a, b, config=config)
        torch.cuda.synchronize()
        expected = a.float() @ b.float()
        assert (out.float() - expected).abs().max().item() <= 2e-2 * expected.abs().max().item(), call
