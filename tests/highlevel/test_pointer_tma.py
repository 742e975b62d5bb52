"""stage_pointer_loads: the tutorial matmul's pointer loads become TMA boxes.

highlevel/examples.py's matmul_kernel (pointer tiles advanced by BLOCK_K * stride, masked by
rows < M and k < K - k * BLOCK_K) and a variant reading B as [K, N] tiles of an [N, K] array
(a transposed pointer tile), and one computing its pointer tiles from the induction
variable each iteration, fp16 and bf16, tails in M, N and K, on the emulator (races,
deadlocks and in-flight reads flagged; bf16 completes TMA copies shuffled) against numpy
float64: the IR holds TMA copies and no cp.async. A stride that is not a multiple of 16
bytes, rows that wrap (`% M`) and pointer_tma=False keep the cp.async rings and still match."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.ir import AsyncCopyGlobalToShared, TmaAsyncCopyGlobalToShared
from weft.highlevel import examples
from weft.highlevel.jit import compile_kernel

from ._compile import HAS_PTXAS

torch = pytest.importorskip("torch")  # bf16 host arrays

RNG = np.random.default_rng(40)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
NAMES = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")


@tl.jit
def matmul_nk(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WRAP: tl.constexpr):
    """c = a @ b, b read as [BLOCK_K, BLOCK_N] pointer tiles whatever its strides ([N, K]
    row-major: stride_bk 1); WRAP: rows wrap as Triton's tutorial 03 writes them."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if WRAP:
        offs_m = offs_m % M
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def operands(m, n, k, dtype, b_transposed=False):
    a = torch.tensor(RNG.standard_normal((m, k)), dtype=torch.float32).to(TORCH_TYPES[dtype])
    b = torch.tensor(RNG.standard_normal((n, k) if b_transposed else (k, n)), dtype=torch.float32)
    return a, b.to(TORCH_TYPES[dtype])


def copies(kernel_fn, values, dtype, constexprs, options=None):
    """(TMA copies, cp.async copies) in the kernel's layout IR, specialized as a launch is."""
    signature = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp32", **{n: "i32" for n in NAMES}}
    specialization = {name: "equal_to_1" if value == 1 else "divisible_by_16" if value % 16 == 0 else ""
                      for name, value in values.items()}
    specialization.update(a_ptr="divisible_by_16", b_ptr="divisible_by_16", c_ptr="divisible_by_16")
    kernel = compile_kernel(kernel_fn, signature, constexprs, specialization,
                            {"num_warps": 4, "target": "emulator", "num_stages": 3, **(options or {})})
    ops = list(kernel.walk())
    return (sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops),
            sum(isinstance(op, AsyncCopyGlobalToShared) for op in ops))


def example_values(m, n, k):
    return dict(M=m, N=n, K=k, stride_am=k, stride_ak=1, stride_bk=n, stride_bn=1, stride_cm=n, stride_cn=1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_examples_matmul_reads_tma_boxes_and_matches_numpy(dtype, monkeypatch):
    if dtype == "bf16":
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", "3")
    m, n, k = 72, 80, 96  # tails in M, N and K (BLOCK_K 64)
    constexprs = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True)
    tma, cp_async = copies(examples.matmul_kernel, example_values(m, n, k), dtype, constexprs)
    assert (tma, cp_async) == (6, 0)  # A and B: two iterations ahead of the loop, one in it
    a, b = operands(m, n, k, dtype)
    c = examples.matmul(a, b, block=(64, 64, 64), num_stages=3)
    np.testing.assert_allclose(np.asarray(c), a.double().numpy() @ b.double().numpy(), rtol=1e-4, atol=1e-4 * k)


def run_nk(m, n, k, dtype, b_transposed, wrap=False, **options):
    a, b_stored = operands(m, n, k, dtype, b_transposed)
    c = torch.zeros((m, n), dtype=torch.float32)
    stride_bk, stride_bn = b_stored.stride()[::-1] if b_transposed else b_stored.stride()
    matmul_nk[(-(-m // 64), -(-n // 64))](a, b_stored, c, m, n, k, *a.stride(), stride_bk, stride_bn, *c.stride(),
                                          BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, WRAP=wrap, num_warps=4, num_stages=3,
                                          **options)
    b = b_stored.T if b_transposed else b_stored
    np.testing.assert_allclose(c.numpy(), a.double().numpy() @ b.double().numpy(), rtol=1e-4, atol=1e-4 * k)


def nk_copies(m, n, k, dtype, b_transposed, wrap=False, **options):
    values = example_values(m, n, k)
    if b_transposed:
        values.update(stride_bk=1, stride_bn=k)
    return copies(matmul_nk, values, dtype, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, WRAP=wrap), options)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_b_as_n_by_k_is_a_box_read_through_a_transposed_tile(dtype, monkeypatch):
    if dtype == "bf16":
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", "3")
    m, n, k = 64, 80, 80  # A's rows unmasked (M a multiple of BLOCK_M): the map's rows take every coordinate a box can (TMA_MAX_COORDINATE)
    assert nk_copies(m, n, k, dtype, True) == (6, 0)
    run_nk(m, n, k, dtype, True)


@tl.jit
def matmul_recomputed(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """c = a @ b, the pointer tiles computed each iteration from the induction variable."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :],
                    mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def test_pointers_recomputed_from_the_induction_variable_are_boxes_and_match_numpy(monkeypatch):
    monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", "3")
    m, n, k = 72, 80, 96  # tails in M, N and K (BLOCK_K 64)
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32",
                 **{name: "i32" for name in ("M", "N", "K", "stride_am", "stride_bk", "stride_cm")}}
    specialization = {"a_ptr": "divisible_by_16", "b_ptr": "divisible_by_16", "c_ptr": "divisible_by_16",
                      "stride_am": "divisible_by_16", "stride_bk": "divisible_by_16", "stride_cm": "divisible_by_16"}
    kernel = compile_kernel(matmul_recomputed, signature, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64), specialization,
                            {"num_warps": 4, "target": "emulator", "num_stages": 3})
    ops = list(kernel.walk())
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops) == 6
    assert not any(isinstance(op, AsyncCopyGlobalToShared) for op in ops)
    a, b = operands(m, n, k, "fp16")
    c = torch.zeros((m, n), dtype=torch.float32)
    matmul_recomputed[(2, 2)](a, b, c, m, n, k, k, n, n, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4,
                              num_stages=3)
    np.testing.assert_allclose(c.numpy(), a.double().numpy() @ b.double().numpy(), rtol=1e-4, atol=1e-4 * k)


@pytest.mark.parametrize("case", ["misaligned", "wrapped", "option"])
def test_loads_not_proven_boxes_stay_on_cp_async_and_match_numpy(case):
    # misaligned: A's rows 72 bytes apart; wrapped: rows % M (M 72: a tail the wrap reads
    # again); option: pointer_tma=False. A's rows are unmasked: M a multiple of BLOCK_M.
    m, n, k = {"misaligned": (64, 64, 36), "wrapped": (72, 64, 64), "option": (64, 80, 80)}[case]
    options = {"pointer_tma": False} if case == "option" else {}
    tma, cp_async = nk_copies(m, n, k, "fp16", False, wrap=case == "wrapped", **options)
    assert tma == 0 and cp_async > 0
    run_nk(m, n, k, "fp16", False, wrap=case == "wrapped", **options)


EXAMPLE_SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", **{name: "i32" for name in NAMES}}
EXAMPLE_SPECIALIZATION = {"a_ptr": "divisible_by_16", "b_ptr": "divisible_by_16", "c_ptr": "divisible_by_16",
                          "stride_am": "divisible_by_16", "stride_ak": "equal_to_1", "stride_bk": "divisible_by_16",
                          "stride_bn": "equal_to_1", "stride_cm": "divisible_by_16", "stride_cn": "equal_to_1"}


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("block_n", [128, 256])
def test_the_examples_matmul_at_the_tutorial_configs_assembles_by_tma_without_spills(block_n):
    compiled = examples.matmul_kernel.compile(
        signature=EXAMPLE_SIGNATURE, constexprs=dict(BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=64, GROUP_M=8,
                                                     ACTIVATION="", ACC_IN_DOT=True),
        num_warps=8, num_stages=3, specialization=EXAMPLE_SPECIALIZATION)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    ptx = compiled.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "cp.async.cg" not in ptx
