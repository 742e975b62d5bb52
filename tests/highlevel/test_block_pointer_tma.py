"""stage_block_pointers: block-pointer loads that feed a dot become TMA boxes.

A block-pointer matmul (A [M, K] row-major; B [K, N] row-major, or read as the transpose of
a row-major [N, K] array through order=(0, 1), or as its blocks transposed with .T) with
tails in every dim, fp16 and bf16, on
the emulator (races, deadlocks and in-flight reads flagged) against numpy float64: its
operands are TMA copies into rings, with no cp.async and no pointer load. A stride that is
not a multiple of 16 bytes, a load that feeds no dot, and a `padding_option="nan"` load
keep their pointer loads (and no tensor map is written) and still match numpy; a loop
that asked for warp_specialize=True is told at the load why its block stays pointers. The
attention example at head_dim 128 and 8 warps is split into a TMA producer and consumers
by default, and matches numpy; some cases complete the TMA copies in a shuffled order
(WEFT_EMULATE_SHUFFLE)."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.errors import CompilationWarning
from weft.compiler.ir import (AsyncCopyGlobalToShared, For, Load, TensormapReplace, TmaAsyncCopyGlobalToShared,
                              WarpSpecialize)
from weft.highlevel import attention_example
from weft.highlevel.jit import compile_kernel

from ._compile import HAS_PTXAS
from .test_attention_example import SIGNATURE, SPECIALIZATION, constexprs, reference

torch = pytest.importorskip("torch")  # bf16 host arrays

RNG = np.random.default_rng(61)
TORCH_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@tl.jit
def block_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_b0, stride_b1, stride_cm, stride_cn,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, B_TRANSPOSED: tl.constexpr):
    """c = a @ b over block pointers; B_TRANSPOSED: b_ptr holds B^T ([N, K] row-major), read
    as [BK, BN] blocks of B whose dim 0 is contiguous."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_block = tl.make_block_ptr(a_ptr, (M, K), (stride_am, stride_ak), (pid_m * BM, 0), (BM, BK), (1, 0))
    if B_TRANSPOSED:
        b_block = tl.make_block_ptr(b_ptr, (K, N), (stride_b1, stride_b0), (0, pid_n * BN), (BK, BN), (0, 1))
    else:
        b_block = tl.make_block_ptr(b_ptr, (K, N), (stride_b0, stride_b1), (0, pid_n * BN), (BK, BN), (1, 0))
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        a = tl.load(a_block, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_block, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(a, b, acc)
        a_block = tl.advance(a_block, (0, BK))
        b_block = tl.advance(b_block, (BK, 0))
    c_block = tl.make_block_ptr(c_ptr, (M, N), (stride_cm, stride_cn), (pid_m * BM, pid_n * BN), (BM, BN), (1, 0))
    tl.store(c_block, acc, boundary_check=(0, 1))


def run_matmul(m, n, k, dtype, transposed, block=(64, 64, 32)):
    a = torch.tensor(RNG.standard_normal((m, k)), dtype=torch.float32).to(TORCH_TYPES[dtype])
    b_stored = torch.tensor(RNG.standard_normal((n, k) if transposed else (k, n)), dtype=torch.float32)
    b_stored = b_stored.to(TORCH_TYPES[dtype])
    c = torch.zeros((m, n), dtype=torch.float32)
    bm, bn, bk = block
    grid = (-(-m // bm), -(-n // bn))
    block_matmul[grid](a, b_stored, c, m, n, k, *a.stride(), *b_stored.stride(), *c.stride(), BM=bm, BN=bn, BK=bk,
                       B_TRANSPOSED=transposed, num_warps=4, num_stages=3)
    b = b_stored.T if transposed else b_stored
    expected = a.double().numpy() @ b.double().numpy()
    # fp32 sums of k products of exact 16-bit inputs.
    np.testing.assert_allclose(c.numpy(), expected, rtol=1e-4, atol=1e-4 * k)


def matmul_ops(m, n, k, dtype, transposed, block=(64, 64, 32)):
    """The layout IR of block_matmul for these sizes (specialized as a launch would be)."""
    pointer = f"*{dtype}"
    signature = {"a_ptr": pointer, "b_ptr": pointer, "c_ptr": "*fp32", **{name: "i32" for name in (
        "M", "N", "K", "stride_am", "stride_ak", "stride_b0", "stride_b1", "stride_cm", "stride_cn")}}
    b_strides = (k, 1) if transposed else (n, 1)
    values = dict(M=m, N=n, K=k, stride_am=k, stride_ak=1, stride_b0=b_strides[0], stride_b1=b_strides[1],
                  stride_cm=n, stride_cn=1)
    specialization = {name: "equal_to_1" if value == 1 else "divisible_by_16" if value % 16 == 0 else ""
                      for name, value in values.items()}
    specialization.update(a_ptr="divisible_by_16", b_ptr="divisible_by_16", c_ptr="divisible_by_16")
    kernel = compile_kernel(block_matmul, signature, dict(BM=block[0], BN=block[1], BK=block[2],
                                                          B_TRANSPOSED=transposed),
                            specialization, {"num_warps": 4, "target": "emulator", "num_stages": 3})
    return list(kernel.walk())


def count(ops, kind) -> int:
    return sum(isinstance(op, kind) for op in ops)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("transposed", [False, True])
def test_block_pointer_matmul_reads_tma_rings_and_matches_numpy(dtype, transposed, monkeypatch):
    if dtype == "bf16":  # the emulator completes TMA copies in a shuffled order
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", "3")
    m, n, k = 80, 80, 80  # tails in M, N and K (BK = 32)
    ops = matmul_ops(m, n, k, dtype, transposed)
    # A and B: iterations 0 and 1 before the loop, i + 2 in it; two maps written, one each.
    assert count(ops, TmaAsyncCopyGlobalToShared) == 6
    assert count(ops, TensormapReplace) == 2
    assert count(ops, AsyncCopyGlobalToShared) == 0
    loop = next(op for op in ops if isinstance(op, For))
    assert not any(isinstance(op, Load) for op in loop.body.walk())
    run_matmul(m, n, k, dtype, transposed)


def test_a_stride_not_a_multiple_of_16_bytes_keeps_the_pointer_loads():
    m, n, k = 64, 64, 36  # A's rows 72 bytes apart: not a TMA tensor map's stride
    ops = matmul_ops(m, n, k, "fp16", False, block=(64, 64, 16))
    # A stays a pointer load, and so does B (the loop's dots take rings of one kind): cp.async.
    assert count(ops, AsyncCopyGlobalToShared) > 0
    assert count(ops, TmaAsyncCopyGlobalToShared) == 0 and count(ops, TensormapReplace) == 0
    run_matmul(m, n, k, "fp16", False, block=(64, 64, 16))


@tl.jit
def scaled_copy(x_ptr, out_ptr, M, N, stride_m, BM: tl.constexpr, BN: tl.constexpr, PADDING: tl.constexpr):
    src = tl.make_block_ptr(x_ptr, (M, N), (stride_m, 1), (tl.program_id(0) * BM, 0), (BM, BN), (1, 0))
    dst = tl.make_block_ptr(out_ptr, (M, N), (stride_m, 1), (tl.program_id(0) * BM, 0), (BM, BN), (1, 0))
    tl.store(dst, tl.load(src, boundary_check=(0, 1), padding_option=PADDING) * 2, boundary_check=(0, 1))


@pytest.mark.parametrize("padding", ["zero", "nan"])
def test_a_load_feeding_no_dot_stays_pointer_arithmetic(padding):
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32", "stride_m": "i32"}
    kernel = compile_kernel(scaled_copy, signature, dict(BM=16, BN=32, PADDING=padding),
                            {"x_ptr": "divisible_by_16", "out_ptr": "divisible_by_16", "stride_m": "divisible_by_16"},
                            {"num_warps": 4, "target": "emulator"})
    ops = list(kernel.walk())
    assert count(ops, TmaAsyncCopyGlobalToShared) == 0 and count(ops, TensormapReplace) == 0
    x = RNG.standard_normal((40, 32)).astype(np.float32)
    out = np.zeros_like(x)
    scaled_copy[(3,)](x, out, 40, 32, 32, BM=16, BN=32, PADDING=padding)
    np.testing.assert_array_equal(out, x * 2)


@pytest.mark.parametrize("n_ctx,causal,shuffle", [(128, False, None), (200, True, "7")])
def test_attention_example_at_head_dim_128_splits_its_tma_loop_and_matches_numpy(n_ctx, causal, shuffle,
                                                                                 monkeypatch):
    if shuffle is not None:  # TMA copies completed in a shuffled order
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", shuffle)
    kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(128, (128, 64), causal),
                            SPECIALIZATION, {"num_warps": 8, "target": "emulator", "num_stages": 3})
    assert count(list(kernel.walk()), WarpSpecialize) == 1
    q, k, v = ((0.5 * RNG.standard_normal((1, 2, n_ctx, 128))).astype(np.float16) for _ in range(3))
    out, lse = attention_example.attention(q, k, v, causal, block=(128, 64), num_warps=8, num_stages=3)
    expected, expected_lse = reference(q, k, v, causal, 128 ** -0.5)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


SPLIT_SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32", "stride_a": "i32",
                   "stride_b": "i32"}


@tl.jit
def split_matmul(a_ptr, b_ptr, c_ptr, K, stride_a, stride_b):
    a_block = tl.make_block_ptr(a_ptr, (64, K), (stride_a, 1), (0, 0), (64, 32), (1, 0))
    b_block = tl.make_block_ptr(b_ptr, (K, 64), (stride_b, 1), (0, 0), (32, 64), (1, 0))
    acc = tl.zeros((64, 64), dtype=tl.float32)
    for _ in tl.range(0, K, 32, num_stages=3, warp_specialize=True):
        acc = tl.dot(tl.load(a_block, boundary_check=(1,)), tl.load(b_block, boundary_check=(0,)), acc)
        a_block = tl.advance(a_block, (0, 32))
        b_block = tl.advance(b_block, (32, 0))
    tl.store(c_ptr + tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :], acc)


def test_a_split_asked_of_a_loop_whose_block_stays_pointers_warns_at_the_load_with_why():
    signature = SPLIT_SIGNATURE
    specialization = {"a_ptr": "divisible_by_16", "b_ptr": "divisible_by_16", "stride_a": "",
                      "stride_b": "divisible_by_16"}  # A's rows not known to be 16-byte aligned
    with pytest.warns(CompilationWarning, match="not provably a multiple of 16 bytes") as caught:
        compile_kernel(split_matmul, signature, {}, specialization, {"num_warps": 4, "target": "emulator"})
    (warning,) = [w for w in caught if "block-pointer load" in str(w.message)]
    # co_firstlineno is the decorator's line; the tl.dot holding the loads is 6 below it.
    assert warning.lineno == split_matmul.fn.__code__.co_firstlineno + 6


@tl.jit
def tiles_matmul(a_ptr, b_ptr, c_ptr, K, stride_a, stride_b, TILES: tl.constexpr):
    """TILES column tiles of c = a @ b, the block pointers made afresh in an outer loop from
    the same values each tile."""
    for tile in range(TILES):
        a_block = tl.make_block_ptr(a_ptr, (64, K), (stride_a, 1), (0, 0), (64, 32), (1, 0))
        b_block = tl.make_block_ptr(b_ptr, (K, 64 * TILES), (stride_b, 1), (0, tile * 64), (32, 64), (1, 0))
        acc = tl.zeros((64, 64), dtype=tl.float32)
        for _ in range(0, K, 32):
            acc = tl.dot(tl.load(a_block), tl.load(b_block), acc)
            a_block = tl.advance(a_block, (0, 32))
            b_block = tl.advance(b_block, (32, 0))
        tl.store(c_ptr + tl.arange(0, 64)[:, None] * (64 * TILES) + tile * 64 + tl.arange(0, 64)[None, :], acc)


def test_block_pointers_made_in_an_outer_loop_are_boxes_and_match_numpy():
    signature = SPLIT_SIGNATURE
    specialization = {name: "divisible_by_16" for name in signature if name != "c_ptr"}
    kernel = compile_kernel(tiles_matmul, signature, {"TILES": 2}, specialization,
                            {"num_warps": 4, "target": "emulator", "num_stages": 3})
    ops = list(kernel.walk())
    assert count(ops, TensormapReplace) == 2 and count(ops, AsyncCopyGlobalToShared) == 0
    a = RNG.standard_normal((64, 96)).astype(np.float16)
    b = RNG.standard_normal((96, 128)).astype(np.float16)
    c = np.zeros((64, 128), np.float32)
    tiles_matmul[(1,)](a, b, c, 96, 96, 128, TILES=2, num_warps=4, num_stages=3)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-2)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
def test_head_dim_128_at_128x128_in_2_stages_splits_and_assembles_without_spills():
    """benchmarks/highlevel_attention.py's weft pick at head_dim 128: the block-pointer
    source split into a TMA producer (setmaxnreg) and consumers, causal (two loops)."""
    compiled = attention_example.attention_kernel.compile(
        signature=SIGNATURE, constexprs=constexprs(128, (128, 128), True), num_warps=8, num_stages=2,
        specialization=SPECIALIZATION)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    ptx = compiled.asm["ptx"]
    assert "setmaxnreg" in ptx and "cp.async.bulk.tensor" in ptx and "cp.async.cg" not in ptx


@tl.jit
def transposed_b_matmul(a_ptr, b_ptr, c_ptr, K, stride_a, stride_b):
    """c = a @ b.T, b's [64, 32] blocks (row-major, as stored) transposed with .T."""
    a_block = tl.make_block_ptr(a_ptr, (64, K), (stride_a, 1), (0, 0), (64, 32), (1, 0))
    bt_block = tl.make_block_ptr(b_ptr, (64, K), (stride_b, 1), (0, 0), (64, 32), (1, 0))
    acc = tl.zeros((64, 64), dtype=tl.float32)
    for _ in range(0, K, 32):
        acc = tl.dot(tl.load(a_block), tl.load(bt_block).T, acc)
        a_block = tl.advance(a_block, (0, 32))
        bt_block = tl.advance(bt_block, (0, 32))
    tl.store(c_ptr + tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :], acc)


def test_a_block_transposed_with_dot_T_is_a_box_read_through_a_view():
    specialization = {name: "divisible_by_16" for name in SPLIT_SIGNATURE if name != "c_ptr"}
    kernel = compile_kernel(transposed_b_matmul, SPLIT_SIGNATURE, {}, specialization,
                            {"num_warps": 4, "target": "emulator", "num_stages": 3})
    ops = list(kernel.walk())
    assert count(ops, TmaAsyncCopyGlobalToShared) == 6 and count(ops, AsyncCopyGlobalToShared) == 0
    a = RNG.standard_normal((64, 96)).astype(np.float16)
    bt = RNG.standard_normal((64, 96)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    transposed_b_matmul[(1,)](a, bt, c, 96, 96, 96, num_warps=4, num_stages=3)
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt.astype(np.float64).T, rtol=1e-4, atol=1e-2)
