"""Transposed dot operands (accelerate_dots): `tl.trans(b)`, `b.T` and `tl.permute(b, (1, 0))`
of a loaded tile, a transposed A, and a B loaded K-major are stored to shared memory in the
layout they were loaded in and read by wgmma through a transposed view of the buffer: the
layout IR has no register permute and no conversion between the load and its store. On
the CPU emulator (race checks on) against numpy float64 on random inputs, with and
without the K loop pipelined; fp8 and tf32 (which wgmma reads K-major only) included."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.ir import (AsyncCopyGlobalToShared, ConvertLayout, Load, Permute, SharedPermute, SharedStore,
                              WarpgroupMma)
from weft.highlevel.jit import compile_kernel

torch = pytest.importorskip("torch")  # bf16 and fp8 host arrays

RNG = np.random.default_rng(41)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp8e4m3": torch.float8_e4m3fn}
# Error per unit of sum(|a| |b|): fp32 sums of exact products, or tf32 inputs (10-bit mantissa).
TOLERANCE = {"fp16": 1e-5, "bf16": 1e-5, "fp8e4m3": 1e-5, "fp32": 2e-3}
FORMS = ("trans", "dot_T", "permute", "trans_a", "k_major_b")


@tl.jit
def transposed_dot(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FORM: tl.constexpr):
    """c = a @ b, with A or B loaded as its transpose (FORM) where FORM says so."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        if FORM == "trans_a":  # the [K, M] tile, M contiguous
            a = tl.trans(tl.load(a_ptr + ks[:, None] * stride_ak + offs_m[None, :] * stride_am,
                                 mask=(ks[:, None] < K) & (offs_m[None, :] < M), other=0.0))
        else:
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
                        mask=(offs_m[:, None] < M) & (ks[None, :] < K), other=0.0)
        if FORM == "k_major_b":  # the [K, N] tile itself, K contiguous
            b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=(ks[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        else:  # the [N, K] tile, K contiguous, transposed (for trans_a too)
            b_t = tl.load(b_ptr + offs_n[:, None] * stride_bn + ks[None, :] * stride_bk,
                          mask=(offs_n[:, None] < N) & (ks[None, :] < K), other=0.0)
            if FORM == "dot_T":
                b = b_t.T
            elif FORM == "permute":
                b = tl.permute(b_t, (1, 0))
            else:
                b = tl.trans(b_t)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def operands(m, n, k, dtype, form):
    """(a, b) and the arrays the kernel reads them from (strides in elements): A as [K, M]
    for trans_a, B as [N, K] (K contiguous) for every form."""
    a, b = (torch.tensor(RNG.standard_normal(shape) * 2, dtype=torch.float32).to(TORCH_TYPES[dtype])
            for shape in ((m, k), (k, n)))
    a_arg = a.t().contiguous() if form == "trans_a" else a
    a_strides = (1, m) if form == "trans_a" else (k, 1)
    return a, b, a_arg, a_strides, b.t().contiguous()


@pytest.mark.parametrize("form,dtype,stages", [(form, "fp16", None) for form in FORMS] + [
    ("trans", "bf16", 3), ("trans_a", "bf16", 3), ("k_major_b", "bf16", 4), ("trans", "fp8e4m3", None),
    ("trans_a", "fp8e4m3", 3), ("k_major_b", "fp8e4m3", None), ("dot_T", "fp32", 3), ("trans_a", "fp32", None)])
def test_transposed_operands_match_numpy(form, dtype, stages):
    block_k = 64 if dtype == "fp8e4m3" else 32
    m, n, k = 100, 72, 2 * block_k + 8  # tails in every dim
    a, b, a_arg, (sam, sak), b_arg = operands(m, n, k, dtype, form)
    c = torch.zeros((m, n), dtype=torch.float32)
    options = {} if stages is None else {"num_stages": stages}
    transposed_dot[(2, 2)](a_arg, b_arg, c, m, n, k, sam, sak, 1, k, BLOCK_M=64, BLOCK_N=64, BLOCK_K=block_k,
                           FORM=form, num_warps=4, **options)
    a64, b64 = a.double().numpy(), b.double().numpy()
    error = np.abs(c.double().numpy() - a64 @ b64)
    assert (error <= TOLERANCE[dtype] * (np.abs(a64) @ np.abs(b64)) + 1e-6).all(), f"largest error {error.max()}"


def layout_ir(form, dtype="fp16", stages=None):
    element = {"fp8e4m3": "fp8e4m3"}.get(dtype, dtype)
    signature = {"a_ptr": f"*{element}", "b_ptr": f"*{element}", "c_ptr": "*fp32", "M": "i32", "N": "i32",
                 "K": "i32", "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32"}
    specialization = {name: "divisible_by_16" for name in signature}
    specialization.update(stride_bk="equal_to_1", **{"stride_am" if form == "trans_a" else "stride_ak": "equal_to_1"})
    """The kernel's `layout` IR after every pass (conversion plans recorded)."""
    # pointer_tma=False: these aligned tiles would otherwise be TMA boxes (stage_pointer_loads);
    # this file checks how loaded tiles are stored and read transposed.
    return compile_kernel(transposed_dot, signature, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, FORM=form), specialization,
                          {"num_warps": 4, "target": "emulator", "num_stages": stages, "pointer_tma": False})


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", ["fp16", "fp8e4m3"])
def test_loaded_tiles_are_stored_as_loaded_and_read_transposed(form, dtype):
    kernel = layout_ir(form, dtype)
    ops = list(kernel.walk())
    assert not any(isinstance(op, Permute) for op in ops)  # no register transpose
    stores = [op for op in ops if isinstance(op, SharedStore)]
    loads = {op.result for op in ops if isinstance(op, Load)}
    assert len(stores) == 2 and all(store.value in loads for store in stores)  # no conversion before a store
    views = [op for op in ops if isinstance(op, SharedPermute)]
    (wgmma,) = [op for op in ops if isinstance(op, WarpgroupMma)]
    if form == "k_major_b":
        assert not views and wgmma.b.type.layout.bases["offset"][0] == (1, 0)  # K contiguous
        return
    (view,) = [op for op in views if op.result is (wgmma.a if form == "trans_a" else wgmma.b)]
    # The buffer holds the tile as loaded (its dim 1 contiguous: K of B's [N, K], M of A's
    # [K, M]), except 8-bit A, which wgmma reads K-major only: its [K, M] tile is stored K-major.
    k_major_a = form == "trans_a" and dtype == "fp8e4m3"
    assert view.buffer.type.layout.bases["offset"][0] == ((1, 0) if k_major_a else (0, 1))


def test_a_transposed_b_is_staged_by_cp_async_as_loaded():
    kernel = layout_ir("trans", "fp16", stages=3)
    ops = list(kernel.walk())
    copies = [op for op in ops if isinstance(op, AsyncCopyGlobalToShared)]
    assert len(copies) == 6 and not any(isinstance(op, (Permute, SharedStore)) for op in ops)
    # The copies read the pointers in the layout the addresses were computed in: no fp16 tile moves.
    assert not any(isinstance(op, ConvertLayout) and op.result.type.element.name == "fp16" for op in ops)
