"""Highlevel tensor-descriptor matmuls on the GPU against torch's fp32 matmul of the same
inputs: host TensorDescriptor arguments (Triton's, no layout) and in-kernel
tl.make_tensor_descriptor, 1-4 stages of TMA rings, tails in every dim, B stored [N, K],
fp16 / bf16 / fp8, and a block_shape set after the descriptor was built (a tuner's hook)."""

import pytest

torch = pytest.importorskip("torch")

from weft.highlevel.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from .test_tensor_descriptor_in_kernel import made_matmul  # noqa: E402
from .test_tma_pipeline import made_ringed_matmul, ringed_matmul, ringed_matmul_bt  # noqa: E402

pytestmark = pytest.mark.gpu

TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8e4m3": torch.float8_e4m3fn}


def operands(m, n, k, dtype, seed, b_rows_n=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).to(TYPES[dtype])
    b = torch.randn(*((n, k) if b_rows_n else (k, n)), device="cuda", generator=gen).to(TYPES[dtype])
    return a, b


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("shape, block, num_warps, dtype", [
    ((1024, 1024, 1024), (128, 128, 64), 4, "fp16"),
    ((1000, 776, 304), (128, 256, 64), 8, "fp16"),   # tails in M and N, 16-byte rows
    ((512, 512, 512), (128, 128, 64), 8, "bf16"),
    ((320, 200, 48), (64, 64, 32), 4, "fp16"),       # two K iterations: fewer than the prologue at 4 stages
])
def test_host_descriptor_matmul_matches_torch(stages, shape, block, num_warps, dtype):
    m, n, k = shape
    a, b = operands(m, n, k, dtype, 40)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=TYPES[dtype])
    bm, bn, bk = block
    ringed_matmul[(-(-m // bm), -(-n // bn))](
        TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bk, bn]),
        TensorDescriptor.from_tensor(c, [bm, bn]), k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages,
        num_warps=num_warps)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=1e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", ["fp16", "fp8e4m3"])
def test_b_stored_n_by_k_matches_torch(dtype):
    m, n, k = 1000, 512, 1000
    a, b = operands(m, n, 1024, dtype, 41, b_rows_n=True)
    a, b = a[:, :k], b[:, :k]  # K tail, rows still 16-byte aligned
    c = torch.empty((m, n), device="cuda", dtype=torch.float16)
    ringed_matmul_bt[(-(-m // 128), n // 128)](
        TensorDescriptor.from_tensor(a, [128, 64]), TensorDescriptor.from_tensor(b, [128, 64]),
        TensorDescriptor.from_tensor(c, [128, 128]), k, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=3, num_warps=8)
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=1e-2, atol=1e-1)


@pytest.mark.parametrize("kernel, stages", [(made_matmul, None), (made_ringed_matmul, 3)])
def test_in_kernel_descriptor_matmul_matches_torch(kernel, stages):
    m, n, k = 1000, 776, 304
    a, b = operands(m, n, k, "fp16", 42)
    c = torch.empty((m, n), device="cuda", dtype=torch.float16)
    extra = {} if stages is None else {"STAGES": stages}
    kernel[(-(-m // 128), -(-n // 128))](a, b, c, m, n, k, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, **extra)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=1e-2, atol=5e-2)


def test_a_block_shape_set_after_building_is_what_the_launch_encodes():
    m, n, k = 512, 512, 256
    a, b = operands(m, n, k, "fp16", 43)
    c = torch.empty((m, n), device="cuda", dtype=torch.float16)
    descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1]) for t in (a, b, c)]
    for desc, box in zip(descs, ([128, 64], [64, 128], [128, 128])):
        desc.block_shape = box
    ringed_matmul[(4, 4)](*descs, k, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=3, num_warps=4)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=1e-2, atol=5e-2)
