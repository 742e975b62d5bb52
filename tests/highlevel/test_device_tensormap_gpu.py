"""Tensor maps a highlevel kernel writes itself (tl.make_tensor_descriptor over bases found
on the device), on the GPU against torch's fp32 matmul of the same inputs: the grouped
GEMM over packed operands and offsets, and Triton tutorial 08's form, pointers read from
tables of data_ptr() values; groups with tails in every dim, more tiles than programs (a
program rewrites its maps for each group), and a second launch on a larger grid (the
launcher's workspace grows)."""

import pytest

torch = pytest.importorskip("torch")

from .test_device_tensormap import BLOCKS, GROUPS, grouped_matmul, table_grouped_matmul  # noqa: E402

pytestmark = pytest.mark.gpu


def operands(groups, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = [torch.randn(m, k, device="cuda", generator=gen).half() for m, n, k in groups]
    b = [torch.randn(k, n, device="cuda", generator=gen).half() for m, n, k in groups]
    c = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16) for m, n, k in groups]
    sizes = torch.tensor([v for g in groups for v in g], device="cuda", dtype=torch.int32)
    return a, b, c, sizes


def check(a, b, c):
    for x, y, z in zip(a, b, c):
        torch.testing.assert_close(z.float(), x.float() @ y.float(), rtol=1e-2, atol=5e-2)


LARGE = GROUPS + [(1000, 776, 304), (256, 512, 1024)]


@pytest.mark.parametrize("programs", [3, 132])
@pytest.mark.parametrize("blocks, num_warps", [(BLOCKS, 4), (dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64), 8)])
def test_packed_grouped_matmul_matches_torch(programs, blocks, num_warps):
    a, b, c, sizes = operands(LARGE, programs)
    flat = [torch.cat([x.reshape(-1) for x in xs]) for xs in (a, b, c)]
    offsets = torch.tensor([sum(x.numel() for x in xs[:g]) for g in range(len(LARGE)) for xs in (a, b, c)],
                           device="cuda", dtype=torch.int64)
    grouped_matmul[(programs,)](*flat, offsets, sizes, len(LARGE), NUM_PROGRAMS=programs, num_warps=num_warps,
                                **blocks)
    torch.cuda.synchronize()
    start = 0
    for g, (m, n, _) in enumerate(LARGE):
        c[g] = flat[2][start:start + m * n].reshape(m, n)
        start += m * n
    check(a, b, c)


def test_tutorial_pointer_tables_match_torch():
    a, b, c, sizes = operands(LARGE, 7)
    tables = [torch.tensor([x.data_ptr() for x in xs], device="cuda", dtype=torch.int64) for xs in (a, b, c)]
    for programs in (4, 132):  # the second launch needs a larger workspace
        for x in c:
            x.fill_(float("nan"))
        table_grouped_matmul[(programs,)](*tables, sizes, len(LARGE), NUM_PROGRAMS=programs, num_warps=4,
                                          BLOCK_M=128, BLOCK_N=128, BLOCK_K=64)
        torch.cuda.synchronize()
        check(a, b, c)
