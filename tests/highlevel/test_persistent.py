"""Persistent matmuls (each program walks tiles `start, start + NUM_SMS, ...`) in the two
forms Triton's tutorial 09 has used: a tile loop around a K loop, and one flattened loop
over tiles x K steps whose pointers are computed afresh each step from carried state
(`ki`, the tile's offsets) with the tile's epilogue under `if ki == k_tiles - 1:`. Both
have their dot loop pipelined by cp.async rings (compiler/passes/pipeline_dot_loops.py,
pipeline_carried_state.py), checked on the emulator with its race and deadlock detection
against numpy float64, and through ptxas without spills at the tutorial's configs."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import weft.highlevel as tl
from weft.compiler.backend import ptxas
from weft.compiler.ir import AsyncCopyGlobalToShared
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator import emulate

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(9)
needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
STRIDES = ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
             **{name: "i32" for name in STRIDES}}


@tl.jit
def tile_loop_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr):
    """fp16 c = a @ b; program p computes tiles p, p + NUM_SMS, ... (row-major tile order)."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    ks = tl.arange(0, BLOCK_K)
    for tile in range(tl.program_id(0), tiles, NUM_SMS):
        rows = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        safe_rows = tl.max_contiguous(tl.multiple_of(tl.where(rows < M, rows, 0), BLOCK_M), BLOCK_M)
        safe_cols = tl.max_contiguous(tl.multiple_of(tl.where(cols < N, cols, 0), BLOCK_N), BLOCK_N)
        a_ptrs = a_ptr + safe_rows[:, None] * stride_am + ks[None, :] * stride_ak
        b_ptrs = b_ptr + ks[:, None] * stride_bk + safe_cols[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs, mask=ks[None, :] < K - step * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < K - step * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(tl.float16),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


@tl.jit
def flat_loop_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_SMS: tl.constexpr):
    """The same product over one loop of (tiles of this program) x (K steps of a tile)."""
    me = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    my_tiles = tiles // NUM_SMS
    if me < tiles % NUM_SMS:
        my_tiles += 1
    tile = me - NUM_SMS
    step = -1
    ks = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    tile_m = 0
    tile_n = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k_steps * my_tiles):
        step = tl.where(step == k_steps - 1, 0, step + 1)
        if step == 0:
            tile += NUM_SMS
            tile_m = tile // tiles_n
            tile_n = tile % tiles_n
            rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
            rows = tl.max_contiguous(tl.multiple_of(tl.where(rows < M, rows, 0), BLOCK_M), BLOCK_M)
            cols = tl.max_contiguous(tl.multiple_of(tl.where(cols < N, cols, 0), BLOCK_N), BLOCK_N)
        k_offsets = step * BLOCK_K + tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows[:, None] * stride_am + k_offsets[None, :] * stride_ak
        b_ptrs = b_ptr + k_offsets[:, None] * stride_bk + cols[None, :] * stride_bn
        a = tl.load(a_ptrs, mask=ks[None, :] < K - step * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < K - step * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        if step == k_steps - 1:
            out_rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
            out_cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(c_ptr + out_rows[:, None] * stride_cm + out_cols[None, :] * stride_cn, acc.to(tl.float16),
                     mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


KERNELS = {"tile_loop": tile_loop_matmul, "flat_loop": flat_loop_matmul}


def constexprs(block, num_sms: int) -> dict:
    return dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], NUM_SMS=num_sms)


def emulated(form: str, block, num_warps: int, stages: int, num_sms: int):
    return compile_kernel(KERNELS[form], SIGNATURE, constexprs(block, num_sms), {},
                          {"num_warps": num_warps, "num_stages": stages, "target": "emulator"})


def copies(kernel) -> int:
    return sum(isinstance(op, AsyncCopyGlobalToShared) for op in kernel.walk())


def check_product(kernel, num_sms: int, m: int, n: int, k: int) -> None:
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    emulate(kernel, (num_sms,), [a, b, c, m, n, k, k, 1, n, 1, n, 1])
    want = a.astype(np.float64) @ b.astype(np.float64)
    # fp16 output: half an ulp of the result plus the fp32 accumulation's error.
    tolerance = np.abs(want) * 2.0 ** -10 + 1e-5 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert (np.abs(c.astype(np.float64) - want) <= tolerance + 1e-6).all(), np.nanmax(np.abs(c - want))


@pytest.mark.parametrize("form", ["tile_loop", "flat_loop"])
def test_both_persistent_forms_are_pipelined_and_right(form):
    """3 stages: each operand has 2 prologue copies and one in the loop; 3 programs over
    3 x 2 tiles with row, column and K tails."""
    kernel = emulated(form, (64, 64, 32), 4, 3, 3)
    assert copies(kernel) == 2 * 3
    check_product(kernel, 3, 150, 100, 70)


TILES = [(64, 64, 32), (64, 32, 16)]


@settings(max_examples=200 if DEEP else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(form=st.sampled_from(sorted(KERNELS)), block=st.sampled_from(TILES), stages=st.integers(2, 4),
       num_sms=st.integers(1, 4), tiles=st.tuples(st.integers(1, 2), st.integers(1, 3)), k_steps=st.integers(0, 3),
       tails=st.tuples(*(st.integers(0, 15) for _ in range(3))))
def test_persistent_matmul_property(form, block, stages, num_sms, tiles, k_steps, tails):
    """Any tile, stage count, number of programs (fewer or more than tiles) and tails: the
    emulator (races, deadlocks) agrees with numpy. (K = 0 runs no step of the flattened
    loop, so it stores nothing: the form needs K > 0, as in the tutorial.)"""
    kernel = emulated(form, block, 4, stages, num_sms)
    assert copies(kernel) == 2 * stages
    m, n = (max(1, t * b - r) for t, b, r in zip(tiles, block[:2], tails))
    k = max(0, k_steps * block[2] - tails[2])
    if form == "flat_loop":
        k = max(k, 1)
    check_product(kernel, num_sms, m, n, k)


def assembled(form: str, block, num_warps: int, stages: int):
    specialization = {name: "divisible_by_16" for name in SIGNATURE}
    specialization.update(stride_ak="equal_to_1", stride_bn="equal_to_1", stride_cn="equal_to_1")
    return KERNELS[form].compile(signature=SIGNATURE, constexprs=constexprs(block, 132), num_warps=num_warps,
                                 num_stages=stages, specialization=specialization)


@needs_ptxas
@pytest.mark.parametrize("form, block, num_warps, stages", [("flat_loop", (128, 128, 64), 4, 3),
                                                            ("tile_loop", (128, 128, 64), 4, 3),
                                                            ("tile_loop", (128, 256, 64), 8, 3)])
def test_persistent_matmul_assembles_pipelined_without_spills(form, block, num_warps, stages):
    compiled = assembled(form, block, num_warps, stages)
    ptx = compiled.asm["ptx"]
    for instruction in ("cp.async.cg.shared.global", "cp.async.commit_group", "wgmma.mma_async"):
        assert instruction in ptx, instruction
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
