"""A wgmma accumulator spread over two warpgroups side by side along N
(`NVMMADistributedLayout([3, 0], [4, 2], [16, N, 16])` at M = 64, eight warps): each
warpgroup computes its own half of the columns, its B descriptors starting at that half.
Checked on the emulator against numpy, in the descriptor plan, through ptxas and on the GPU."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationError
from weft.compiler.warpgroup_mma_descriptors import OperandView, decode, plan_accumulator, plan_operand
from weft.layouts import nvmma_shared

RNG = np.random.default_rng(39)
BM, BN, BK = 64, 128, 64
SWIZZLED = ll.NVMMASharedLayout(128, 16)


@ll.jit
def two_warpgroup_matmul(a_ptr, b_ptr, c_ptr, K, WARPS_N: ll.constexpr, INSTR_N: ll.constexpr,
                         A_IN_REGISTERS: ll.constexpr, IS_ASYNC: ll.constexpr):
    """c[BM, BN] = a[BM, K] @ b[BN, K]^T over 8 warps, K in steps of BK."""
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [8 // WARPS_N, WARPS_N], [16, INSTR_N, 16])
    rows_layout: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    a_smem = ll.allocate_shared_memory(ll.float16, [BM, BK], SWIZZLED)
    b_smem = ll.allocate_shared_memory(ll.float16, [BN, BK], SWIZZLED)
    a_rows = ll.arange(0, BM, ll.SliceLayout(1, rows_layout))
    b_rows = ll.arange(0, BN, ll.SliceLayout(1, rows_layout))
    ks = ll.arange(0, BK, ll.SliceLayout(0, rows_layout))
    acc = ll.zeros([BM, BN], ll.float32, acc_layout)
    for k in range(0, K, BK):
        a_smem.store(ll.load(a_ptr + a_rows[:, None] * K + k + ks[None, :]))
        b_smem.store(ll.load(b_ptr + b_rows[:, None] * K + k + ks[None, :]))
        ll.fence_async_shared()
        if A_IN_REGISTERS:
            a = a_smem.load(ll.DotOperandLayout(0, acc_layout, 2))
        else:
            a = a_smem
        acc = ll.warpgroup_mma(a, b_smem.permute((1, 0)), acc, is_async=IS_ASYNC)
        if IS_ASYNC:
            acc = ll.warpgroup_mma_wait(0, deps=[acc])
    rows = ll.arange(0, BM, ll.SliceLayout(1, acc_layout))
    cols = ll.arange(0, BN, ll.SliceLayout(0, acc_layout))
    ll.store(c_ptr + rows[:, None] * BN + cols[None, :], acc)


def _inputs(k: int):
    a = RNG.standard_normal((BM, k)).astype(np.float16)
    b = RNG.standard_normal((BN, k)).astype(np.float16)
    return a, b, a.astype(np.float64) @ b.astype(np.float64).T


@pytest.mark.parametrize("a_in_registers, is_async", [(False, False), (False, True), (True, True)])
def test_two_warpgroups_split_n_on_the_emulator(a_in_registers, is_async):
    a, b, expected = _inputs(3 * BK)
    c = np.full((BM, BN), np.nan, np.float32)
    two_warpgroup_matmul[(1,)](a, b, c, 3 * BK, WARPS_N=2, INSTR_N=64, A_IN_REGISTERS=a_in_registers,
                               IS_ASYNC=is_async, num_warps=8)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)


def test_eight_warps_stacked_on_64_rows_repeat_the_first_warpgroup():
    """[8, 1] at M = 64 (Gluon's small_mma at num_warps=8): the second warpgroup's warps
    are broadcast in the layout and compute the same tile again."""
    a, b, expected = _inputs(BK)
    c = np.full((BM, BN), np.nan, np.float32)
    two_warpgroup_matmul[(1,)](a, b, c, BK, WARPS_N=1, INSTR_N=64, A_IN_REGISTERS=False, IS_ASYNC=True,
                               num_warps=8)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)


def test_the_second_warpgroups_b_descriptors_read_its_half_of_n():
    """The plan the backend and emulator share: warp bit 2 moves the accumulator to column
    64, and the B descriptor started at that column's unswizzled offset reads rows 64..127
    of the [N, K] buffer, K step by K step, exactly where its own addressing puts them."""
    acc = plan_accumulator(ll.NVMMADistributedLayout([3, 0], [4, 2], [16, 64, 16]).to_linear([BM, BN]), (BM, BN))
    assert acc.n == 64 and acc.warpgroup_origins == ((0, 64),) and acc.tiles == ((0, 0),)
    view = OperandView.from_addressing(nvmma_shared([BN, BK], swizzle_bytes=128, element_bits=16).invert(),
                                       0, 16, mn_dim=0)
    origins = [(acc.warpgroup_origin(g)[1], k) for g in range(2) for k in range(0, BK, 16)]
    plan = plan_operand(view, acc.n, 16, origins)
    for g in range(2):
        n0 = acc.warpgroup_origin(g)[1]
        for k in range(0, BK, 16):
            # The backend adds the warpgroup's part at run time (from the warp index) to the
            # tile's static start: together they are the start of the warpgroup's tile.
            assert plan.linear_offset(n0, 0) ^ plan.start_offset(0, k) == plan.start_offset(n0, k)
            read = decode(plan.descriptor(plan.start_offset(n0, k)).value, plan.major, 16, acc.n, 16)
            np.testing.assert_array_equal(read, view.byte_offsets((n0, k), acc.n, 16))
            assert read.min() // (2 * BK) == n0  # 128-byte rows: the half's first row


@ll.jit
def too_few_rows(c_ptr):
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [4, 2], [16, 32, 16])
    a_smem = ll.allocate_shared_memory(ll.float16, [32, 64], SWIZZLED)
    b_smem = ll.allocate_shared_memory(ll.float16, [64, 64], SWIZZLED)
    acc = ll.warpgroup_mma(a_smem, b_smem.permute((1, 0)), ll.zeros([32, 64], ll.float32, acc_layout))
    ll.store(c_ptr + ll.arange(0, 32, ll.SliceLayout(1, acc_layout))[:, None] * 64
             + ll.arange(0, 64, ll.SliceLayout(0, acc_layout))[None, :], acc)


def test_fewer_than_64_rows_are_still_refused_at_the_users_line():
    with pytest.raises(CompilationError) as info:
        too_few_rows.compile(signature={"c_ptr": "*fp32"}, constexprs={}, num_warps=8)
    assert "must be a multiple of 64" in str(info.value) and "ll.warpgroup_mma(a_smem" in str(info.value)


SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_each_warpgroup_issues_m64n64_through_ptxas():
    compiled = two_warpgroup_matmul.compile(
        signature=SIGNATURE, num_warps=8,
        constexprs={"WARPS_N": 2, "INSTR_N": 64, "A_IN_REGISTERS": False, "IS_ASYNC": True})
    ptx = compiled.asm["ptx"]
    # One m64n64 tile per warpgroup and K step (BK / 16 of them a loop iteration).
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16") == BK // 16
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["total_warps"] == 8


@pytest.mark.gpu
@pytest.mark.parametrize("a_in_registers", [False, True])
def test_two_warpgroups_split_n_on_the_gpu(a_in_registers):
    torch = pytest.importorskip("torch")
    a, b, expected = _inputs(4 * BK)
    c = torch.zeros((BM, BN), dtype=torch.float32, device="cuda")
    two_warpgroup_matmul[(1,)](torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c, 4 * BK, WARPS_N=2,
                               INSTR_N=64, A_IN_REGISTERS=a_in_registers, IS_ASYNC=True, num_warps=8)
    np.testing.assert_allclose(c.cpu().numpy(), expected, rtol=1e-3, atol=1e-2)
