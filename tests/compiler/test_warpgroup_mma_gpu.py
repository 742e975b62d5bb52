"""One-CTA wgmma kernels written in weft.lowlevel: compiled on the CPU (ptxas), run on the
GPU against float64 references (marked `gpu`).

out = A @ B (+ C when use_acc), with A and B loaded from global memory by ordinary loads
into NVMMA shared buffers, `fence_async_shared`, a barrier, one `warpgroup_mma` (A from
shared memory or from registers), and the accumulator stored back. B is given either as
[K, N] (N-major for wgmma) or as B^T [N, K] read through `smem.permute((1, 0))` (K-major).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas

from .backend_kernels import prepare
from .global_tiles import load_tile, store_tile
from .warpgroup_mma_kernels import DotConfig, warpgroup_mma_dot


@ll.jit
def wgmma_matmul(a_ptr, b_ptr, c_ptr, out_ptr, use_acc,
                 M: ll.constexpr, N: ll.constexpr, K: ll.constexpr, WARPS: ll.constexpr,
                 ACC: ll.constexpr, A_SMEM: ll.constexpr, B_SMEM: ll.constexpr,
                 A_IN_REGISTERS: ll.constexpr, B_K_MAJOR: ll.constexpr, IS_ASYNC: ll.constexpr):
    io: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    a = load_tile(a_ptr, M, K, io)
    if B_K_MAJOR:
        b_t = ll.allocate_shared_memory(a.dtype, [N, K], B_SMEM, load_tile(b_ptr, N, K, io))
        b = b_t.permute((1, 0))
    else:
        b = ll.allocate_shared_memory(a.dtype, [K, N], B_SMEM, load_tile(b_ptr, K, N, io))
    if A_IN_REGISTERS:
        a_operand = ll.convert_layout(a, ll.DotOperandLayout(0, ACC, 32 // A_SMEM.element_bitwidth))
    else:
        a_operand = ll.allocate_shared_memory(a.dtype, [M, K], A_SMEM, a)
    ll.fence_async_shared()
    ll.barrier()
    c = ll.convert_layout(load_tile(c_ptr, M, N, io), ACC)
    acc = ll.warpgroup_mma(a_operand, b, c, use_acc=use_acc != 0, is_async=IS_ASYNC)
    if IS_ASYNC:
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
    store_tile(out_ptr, acc, M, N, io)


@dataclass(frozen=True)
class Variant:
    dtype: str = "bf16"
    m: int = 64
    n: int = 64
    k: int = 64
    warpgroups: int = 1
    a_in_registers: bool = False
    b_k_major: bool = True
    swizzle: int = -1  # -1: NVMMASharedLayout.get_default_for
    a_m_major: bool = False  # A stored with M contiguous
    is_async: bool = False

    @property
    def bits(self) -> int:
        return 8 if self.dtype.startswith("fp8") else 16

    def constexprs(self) -> dict:
        warps = 4 * self.warpgroups
        instr_n = min(self.n, 256)
        acc = ll.NVMMADistributedLayout([3, 0], [warps, 1], [16, instr_n, 256 // self.bits])

        def shared(shape, transposed=False):
            if self.swizzle < 0:
                return ll.NVMMASharedLayout.get_default_for(shape, self.bits, transposed)
            return ll.NVMMASharedLayout(self.swizzle, self.bits, transposed=transposed)

        b_shape = [self.n, self.k] if self.b_k_major else [self.k, self.n]
        return dict(M=self.m, N=self.n, K=self.k, WARPS=warps, ACC=acc, A_SMEM=shared([self.m, self.k], self.a_m_major),
                    B_SMEM=shared(b_shape), A_IN_REGISTERS=self.a_in_registers, B_K_MAJOR=self.b_k_major,
                    IS_ASYNC=self.is_async)

    def __str__(self) -> str:
        return (f"{self.dtype}-{'rs' if self.a_in_registers else 'ss'}-m{self.m}n{self.n}k{self.k}-"
                f"wg{self.warpgroups}-{'bk' if self.b_k_major else 'bn'}-sw{self.swizzle}"
                f"{'-async' if self.is_async else ''}{'-am' if self.a_m_major else ''}")


VARIANTS = [
    Variant("bf16"),
    Variant("fp16", b_k_major=False),
    Variant("fp8e4m3", k=128),
    Variant("fp8e5m2", n=128),
    Variant("bf16", a_in_registers=True),
    Variant("fp16", a_in_registers=True, b_k_major=False, n=128),
    Variant("fp8e4m3", a_in_registers=True, k=128),
    Variant("bf16", n=256, k=32),
    Variant("fp16", n=128, b_k_major=False),
    Variant("bf16", m=128, n=128, warpgroups=2),
    Variant("bf16", m=128, n=256, warpgroups=2, b_k_major=False, is_async=True),
    Variant("fp16", m=128, n=64, warpgroups=2, a_in_registers=True),
    Variant("bf16", swizzle=0),
    Variant("fp16", swizzle=32, b_k_major=False),
    Variant("bf16", swizzle=64, is_async=True),
    Variant("bf16", a_m_major=True),
    Variant("fp16", m=128, n=128, warpgroups=2, a_m_major=True, b_k_major=False, swizzle=64),
]


def signature(variant: Variant) -> dict:
    element = variant.dtype
    return {"a_ptr": f"*{element}", "b_ptr": f"*{element}", "c_ptr": "*fp32", "out_ptr": "*fp32", "use_acc": "i32"}


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_lowlevel_warpgroup_mma_kernels_assemble(variant):
    compiled = wgmma_matmul.compile(signature=signature(variant), constexprs=variant.constexprs(),
                                    num_warps=4 * variant.warpgroups)
    assert "wgmma.mma_async" in compiled.asm["ptx"]
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0


# ------------------------------------------------------------------------- on the GPU
TORCH_TYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}
TOLERANCE = {"bf16": 1e-5, "fp16": 1e-5, "fp8e4m3": 1e-3, "fp8e5m2": 1e-3}


@pytest.mark.gpu
@pytest.mark.parametrize("use_acc", [True, False])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_lowlevel_wgmma_matches_float64(variant, use_acc):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, TORCH_TYPES[variant.dtype])
    generator = torch.Generator(device="cuda").manual_seed(7)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=generator).to(dtype)

    a = randn(variant.m, variant.k)
    b = randn(variant.k, variant.n)
    b_given = b.t().contiguous() if variant.b_k_major else b
    c = torch.randn(variant.m, variant.n, device="cuda", generator=generator)
    out = torch.full((variant.m, variant.n), float("nan"), device="cuda")
    wgmma_matmul[(1,)](a, b_given, c, out, int(use_acc), **variant.constexprs(), num_warps=4 * variant.warpgroups)
    torch.cuda.synchronize()
    reference = a.double() @ b.double() + (c.double() if use_acc else 0)
    error = float((out.double() - reference).norm() / reference.norm())
    assert error < TOLERANCE[variant.dtype], error


# The same one-CTA product from hand-built IR, for what the lowlevel builtins do not take
# (tf32 inputs, fp16 accumulators): numpy arrays in, numpy out.
IR_CONFIGS = [
    DotConfig(element="fp32", k=32),
    DotConfig(element="fp32", m=128, n=128, k=64, warpgroups=2),
    DotConfig(element="fp16", acc="fp16", n=128),
    DotConfig(element="fp16", acc="fp16", a_in_registers=True, b_kmajor=False, use_acc=False),
    # warps [4, 2]: each warpgroup's n32 B tile starts 64 bytes into a 128-byte swizzle row
    DotConfig(element="fp16", m=64, n=64, warpgroups=2, warps_n=2, b_kmajor=False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", IR_CONFIGS, ids=lambda c: c.name + "_" + c.acc)
def test_ir_wgmma_matches_numpy(config):
    from .test_backend_gpu import launch

    rng = np.random.default_rng(3)
    element = np.float32 if config.element == "fp32" else np.float16
    acc_type = np.float32 if config.acc == "fp32" else np.float16
    a = rng.standard_normal((config.m, config.k)).astype(element)
    b = rng.standard_normal((config.k, config.n)).astype(element)
    c = rng.standard_normal((config.m, config.n)).astype(acc_type)
    b_given = np.ascontiguousarray(b.T) if config.b_kmajor else b
    out = np.full((config.m, config.n), np.nan, np.float32)
    kernel = warpgroup_mma_dot(config)
    _, _, _, result = launch(kernel, [a, b_given, c, out, int(config.use_acc)])  # the 4 buffers
    reference = a.astype(np.float64) @ b.astype(np.float64) + (c.astype(np.float64) if config.use_acc else 0)
    # tf32 keeps 10 mantissa bits of each input; fp16 accumulation rounds every partial sum.
    tolerance = 2e-3 if config.element == "fp32" or config.acc == "fp16" else 1e-5
    assert np.linalg.norm(result - reference) / np.linalg.norm(reference) < tolerance


def test_ir_kernels_are_prepared_on_the_cpu():
    for config in IR_CONFIGS:
        prepare(warpgroup_mma_dot(config))
