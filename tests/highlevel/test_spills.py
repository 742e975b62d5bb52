"""Dot kernels written as Triton's tutorials write them, through ptxas at the tutorials' own
Hopper configs without register spills, and right on the emulator against numpy float64.

The tutorial matmul wraps its row and column offsets, `(pid_m * BLOCK_M + arange) % M`, so
that the loads need no M/N masks. Axis analysis knew nothing about `%`: the wrapped
offsets lost their contiguity, every operand element was copied alone (a 2-byte cp.async
with its own address and predicate), and the per-element addresses kept live across the
K loop spilled at every wgmma config."""

import numpy as np
import pytest

import weft.highlevel as tl
from weft.compiler.backend import ptxas
from weft.compiler.frontend import build_kernel
from weft.compiler.passes.axis_analysis import analyze_axes
from weft.compiler.ir import Binary, Dot, WarpgroupMma
from weft.compiler.passes.accelerate_dots import accelerate_dots
from weft.compiler.passes.coalesce import coalesce
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator import emulate

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
RNG = np.random.default_rng(40)
STRIDES = ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
             **{name: "i32" for name in STRIDES}}


@tl.jit
def _leaky(x):
    return tl.where(x >= 0, x, 0.01 * x)


@tl.jit
def wrapped_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   LEAKY: tl.constexpr, PLUS: tl.constexpr):
    """fp16 c = leaky(a @ b): grouped tile order, rows and columns wrapped by `%` instead of
    masked, K masked by what is left, the accumulator passed to tl.dot (PLUS: `acc +=
    tl.dot(a, b)`, as the grouped GEMM tutorial writes it), pointers carried."""
    pid = tl.program_id(axis=0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows_in_group
    tile_n = (pid % per_group) // rows_in_group
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rows[:, None] * stride_am + ks[None, :] * stride_ak)
    b_ptrs = b_ptr + (ks[:, None] * stride_bk + cols[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=ks[None, :] < K - step * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < K - step * BLOCK_K, other=0.0)
        if PLUS:
            acc += tl.dot(a, b)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if LEAKY:
        acc = _leaky(acc)
    out = acc.to(tl.float16)
    out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :], out,
             mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def launch_specialization(aligned: bool = True) -> dict:
    """As a launch on row-major tensors with unit column strides specializes the kernel
    (`aligned`: sizes, strides and addresses divisible by 16)."""
    spec = {name: "divisible_by_16" for name in SIGNATURE} if aligned else {}
    spec.update(stride_ak="equal_to_1", stride_bn="equal_to_1", stride_cn="equal_to_1")
    return spec


def wrapped_constexprs(block, leaky: bool = True, plus: bool = False) -> dict:
    return dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], GROUP_M=8, LEAKY=leaky, PLUS=plus)


# The tutorial's Hopper configs (BLOCK_M, BLOCK_N, BLOCK_K), num_warps, num_stages.
TUTORIAL_CONFIGS = [((128, 256, 64), 8, 3), ((64, 256, 32), 4, 4), ((128, 128, 32), 4, 4)]


@needs_ptxas
@pytest.mark.parametrize("plus", [False, True])
@pytest.mark.parametrize("block, num_warps, num_stages", TUTORIAL_CONFIGS)
def test_the_wrapped_offsets_matmul_assembles_without_spills(block, num_warps, num_stages, plus):
    compiled = wrapped_matmul.compile(signature=SIGNATURE, constexprs=wrapped_constexprs(block, plus=plus),
                                      num_warps=num_warps, num_stages=num_stages,
                                      specialization=launch_specialization())
    ptx = compiled.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    copies = [line for line in ptx.splitlines() if "cp.async.cg.shared.global" in line or "cp.async.ca" in line]
    assert copies and all(", 16" in line for line in copies), copies[:3]  # 16 bytes each: 8 fp16
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


def test_wrapped_offsets_keep_their_contiguity():
    """`(start + arange) % M` with M divisible by 16 runs +1 in aligned groups of 16."""
    kernel = build_kernel(wrapped_matmul, SIGNATURE, wrapped_constexprs((64, 64, 32)), 4, launch_specialization(),
                          language="highlevel")
    facts = analyze_axes(kernel)
    wraps = [op.result for op in kernel.walk() if isinstance(op, Binary) and op.kind == "mod"
             and getattr(op.result.type, "shape", ())]
    assert len(wraps) == 2
    assert [(facts[v].contiguity, facts[v].divisibility) for v in wraps] == [((16,), (16,)), ((16,), (16,))]
    unknown = build_kernel(wrapped_matmul, SIGNATURE, wrapped_constexprs((64, 64, 32)), 4,
                           launch_specialization(aligned=False), language="highlevel")
    facts = analyze_axes(unknown)
    wraps = [op.result for op in unknown.walk() if isinstance(op, Binary) and op.kind == "mod"
             and getattr(op.result.type, "shape", ())]
    assert [facts[v].contiguity for v in wraps] == [(1,), (1,)]  # M may be odd: any row may wrap


@pytest.mark.parametrize("m, n, k, aligned, plus", [(96, 80, 112, True, False), (70, 50, 45, False, False),
                                                    (32, 48, 0, True, False), (70, 50, 45, False, True)])
def test_the_wrapped_offsets_matmul_matches_numpy(m, n, k, aligned, plus):
    """Pipelined (3 stages) on the emulator, with its race checks: the wrapped rows read
    real rows, the masked K tail reads zeros, the stores are masked."""
    block = (64, 64, 32)
    kernel = compile_kernel(wrapped_matmul, SIGNATURE, wrapped_constexprs(block, plus=plus),
                            launch_specialization(aligned),
                            {"num_warps": 4, "num_stages": 3, "target": "emulator"})
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    grid = (-(-m // block[0]) * -(-n // block[1]),)
    emulate(kernel, grid, [a, b, c, m, n, k, k, 1, n, 1, n, 1])
    want = a.astype(np.float64) @ b.astype(np.float64)
    want = np.where(want >= 0, want, 0.01 * want)
    np.testing.assert_allclose(c.astype(np.float64), want, atol=2e-2, rtol=2e-3)


def test_acc_plus_dot_accumulates_in_the_dot():
    """`acc += tl.dot(a, b)` is one dot accumulating into acc: no second accumulator tile
    and no add of the two (compiler/passes/fold_dot_add.py)."""
    from weft.compiler.passes.fold_dot_add import fold_dot_add

    kernel = build_kernel(wrapped_matmul, SIGNATURE, wrapped_constexprs((64, 64, 32), plus=True), 4,
                          launch_specialization(), language="highlevel")
    dots = [op for op in kernel.walk() if isinstance(op, Dot)]
    assert len(dots) == 1 and dots[0].acc is None
    folded = fold_dot_add(kernel)
    dots = [op for op in folded.walk() if isinstance(op, Dot)]
    assert len(dots) == 1 and dots[0].acc is not None
    assert not [op for op in folded.walk() if isinstance(op, Binary) and op.kind == "add"
                and op.result.type == dots[0].result.type]
    accelerated = accelerate_dots(coalesce(kernel))
    wgmmas = [op for op in accelerated.walk() if isinstance(op, WarpgroupMma)]
    assert len(wgmmas) == 1 and not [op for op in accelerated.walk() if isinstance(op, Binary) and op.kind == "add"
                                    and getattr(op.result.type, "shape", ()) == (64, 64)]
