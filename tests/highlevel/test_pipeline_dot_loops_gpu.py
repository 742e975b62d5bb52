"""Pipelined highlevel matmuls (cp.async rings, compiler/passes/pipeline_dot_loops.py) on
the GPU against torch's fp32 matmul of the same inputs: 2-4 stages, K loops shorter than
the prologue, tails in every dim, and the launch option num_stages on a plain `range` loop."""

import pytest

torch = pytest.importorskip("torch")

from weft.highlevel import examples  # noqa: E402

from .test_pipeline_dot_loops import staged_matmul  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("shape, block, num_warps", [
    ((1024, 1024, 1024), (128, 128, 64), 8),
    ((1000, 777, 300), (128, 256, 64), 8),    # tails in every dim
    ((300, 200, 40), (64, 64, 32), 4),        # two K iterations: fewer than the prologue at 4 stages
    ((300, 200, 0), (64, 64, 32), 4),         # no K iteration: zeros
])
def test_pipelined_matmul_matches_torch(stages, shape, block, num_warps):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(42)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=gen)
    c = torch.full((m, n), float("nan"), device="cuda")
    grid = (-(-m // block[0]), -(-n // block[1]))
    staged_matmul[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=block[0],
                        BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages, B_OTHER=0.0, num_warps=num_warps)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-2)


def test_the_launch_option_pipelines_the_example_matmul():
    gen = torch.Generator(device="cuda").manual_seed(43)
    a = torch.randn(1000, 300, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(300, 700, device="cuda", dtype=torch.float16, generator=gen)
    out = torch.empty(1000, 700, device="cuda")
    (am, ak), (bk, bn), (cm, cn) = a.stride(), b.stride(), out.stride()
    grid = (-(-1000 // 128) * -(-700 // 128),)
    examples.matmul_kernel[grid](a, b, out, 1000, 700, 300, am, ak, bk, bn, cm, cn, BLOCK_M=128, BLOCK_N=128,
                                 BLOCK_K=64, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True, num_warps=8, num_stages=3)
    torch.testing.assert_close(out, a.float() @ b.float(), rtol=1e-3, atol=1e-2)
