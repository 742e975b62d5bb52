"""A dot whose A is computed in registers (P = f(a @ b) in attention) runs wgmma with A
from registers (accelerate_dots; propagate_layouts places A in the wgmma A fragment):
values on the CPU emulator (race checks on) against numpy float64, in one step and in a
pipelined loop; the layout IR and the PTX use the register-A wgmma and no shared buffer
for A; and, from the layout algebra, P's conversion from a wgmma accumulator into the A
fragment of the next wgmma moves no data for 16-bit types when one warpgroup column holds
the accumulator's rows."""

import re

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.ir import AllocateSharedMemory, Cast, ConvertLayout, WarpgroupMma, is_tensor
from weft.compiler.passes.accelerate_dots import choose_wgmma
from weft.compiler.types import fp16
from weft.highlevel.jit import compile_kernel
from weft.layouts import DotOperandLayout
from weft.layouts.conversion import plan_conversion
from weft.layouts.plans import NoOp, RegisterPermutation

from ._compile import ptx_through_ptxas

torch = pytest.importorskip("torch")  # bf16 host arrays

RNG = np.random.default_rng(42)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# P is rounded to the input type before the second dot: a relative error of 2^-8 (bf16) per
# element of P, on top of fp32 sums of exact products.
TOLERANCE = {"fp16": 2e-3, "bf16": 8e-3}


@tl.jit
def chained_dots(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K, L, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr):
    """out = sum over N blocks j of (0.25 * (a @ b_j)).to(a's type) @ c_j: the product of
    the first dot feeds the second as A, as P does in attention."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_l = tl.arange(0, BLOCK_L)
    a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :], mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
                other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_L], tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        b = tl.load(b_ptr + offs_k[:, None] * N + offs_n[None, :], mask=(offs_k[:, None] < K) & (offs_n[None, :] < N),
                    other=0.0)
        c = tl.load(c_ptr + offs_n[:, None] * L + offs_l[None, :], mask=(offs_n[:, None] < N) & (offs_l[None, :] < L),
                    other=0.0)
        p = (tl.dot(a, b) * 0.25).to(a.dtype)
        acc = tl.dot(p, c, acc)
    tl.store(out_ptr + offs_m[:, None] * L + offs_l[None, :], acc, mask=(offs_m[:, None] < M) & (offs_l[None, :] < L))


def reference(a, b, c):
    """The kernel's sum with P rounded to the input type, and the scale of its error."""
    p = (0.25 * (a.double().numpy() @ b.double().numpy()))
    p_rounded = torch.tensor(p).to(a.dtype).double().numpy()
    c64 = c.double().numpy()
    return p_rounded @ c64, np.abs(p) @ np.abs(c64)


# (BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_L, num_warps); [4, 2] warps at BLOCK_M = 64 with 8 warps.
TILES = [(64, 64, 32, 64, 4), (128, 64, 64, 128, 8), (64, 32, 16, 64, 8), (128, 128, 64, 64, 8)]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("dtype,stages", [("fp16", None), ("bf16", 3)])
def test_register_a_matches_numpy(tile, dtype, stages):
    block_m, block_n, block_k, block_l, num_warps = tile
    m, n, k, l = block_m + 9, 2 * block_n + 5, block_k - 3, block_l - 7  # tails everywhere
    a, b, c = (torch.tensor(RNG.standard_normal(shape), dtype=torch.float32).to(TORCH_TYPES[dtype])
               for shape in ((m, k), (k, n), (n, l)))
    out = torch.zeros((m, l), dtype=torch.float32)
    chained_dots[(-(-m // block_m),)](a, b, c, out, m, n, k, l, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                                      BLOCK_L=block_l, num_warps=num_warps,
                                      **({} if stages is None else {"num_stages": stages}))
    expected, scale = reference(a, b, c)
    error = np.abs(out.double().numpy() - expected)
    assert (error <= TOLERANCE[dtype] * scale + 1e-5).all(), f"largest error {error.max()}"


SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "out_ptr": "*fp32", "M": "i32", "N": "i32",
             "K": "i32", "L": "i32"}
SPECIALIZATION = {name: "divisible_by_16" for name in SIGNATURE}


def test_the_second_dot_reads_p_from_registers_with_no_shared_buffer():
    constexprs = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, BLOCK_L=64)
    kernel = compile_kernel(chained_dots, SIGNATURE, constexprs, SPECIALIZATION,  # one dot of each (no peeling)
                            {"num_warps": 8, "target": "emulator", "num_stages": 3, "dot_ahead": False})
    ops = list(kernel.walk())
    first, second = [op for op in ops if isinstance(op, WarpgroupMma)]
    assert not is_tensor(first.a) and is_tensor(second.a)
    assert second.plan.a is None and second.plan.a_registers  # planned as the wgmma A fragment
    # P comes straight from the cast of the first product: no conversion, no buffer for it.
    (cast,) = [op for op in ops if isinstance(op, Cast) and op.result is second.a]
    assert not any(isinstance(op, ConvertLayout) and op.result is second.a for op in ops)
    buffers = [op.result for op in ops if isinstance(op, AllocateSharedMemory)]
    assert len(buffers) == 3  # a (stored once), and the rings of b and c
    assert cast.operand.type.layout == first.result.type.layout  # P computed in the accumulator's layout


REGISTER_A_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.f16\.f16 \{[^}]*\}, "
                              r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+")


def test_the_ptx_uses_the_register_a_form_of_wgmma():
    constexprs = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, BLOCK_L=64)
    ptx = ptx_through_ptxas(chained_dots, SIGNATURE, constexprs, num_warps=8, num_stages=3,
                            specialization=SPECIALIZATION, dot_ahead=False)  # one P V dot in the code
    register_a = REGISTER_A_WGMMA.findall(ptx)
    assert len(register_a) == 64 // 16  # the second dot's 4 K steps, one m64 tile per warpgroup
    assert "cp.async" in ptx


@pytest.mark.parametrize("m,n1,n2,num_warps", [(64, 64, 64, 4), (128, 64, 128, 8), (128, 128, 64, 8),
                                               (256, 64, 64, 8), (128, 32, 256, 4)])
def test_p_reaches_the_a_fragment_without_moving_between_threads(m, n1, n2, num_warps):
    """From the first dot's accumulator [M, N1] to A of a dot [M, N1] @ [N1, N2]: a NoOp or
    a permutation of each thread's registers (the layout algebra's plan)."""
    first, _ = choose_wgmma(m, n1, 64, fp16, num_warps)
    second, _ = choose_wgmma(m, n2, n1, fp16, num_warps)
    assert first.warps_per_cta[1] == 1  # one warpgroup column: each holds whole rows of P
    source = first.acc_encoding.to_linear((m, n1))
    fragment = DotOperandLayout(0, second.acc_encoding, 2).to_linear((m, n1))
    assert isinstance(plan_conversion(source, fragment, 16), (NoOp, RegisterPermutation))
