"""Dot loops with `tl.range(num_stages=)` pipelined by cp.async into rings of buffers
(compiler/passes/pipeline_dot_loops.py), run on the CPU emulator, whose race checks see
every cp.async byte in flight until its wait_group and every wgmma operand read until its
warpgroup_mma_wait, against numpy float64: num_stages 2-4, K loops shorter than the
prologue (0, 1, 2 iterations), tails in M, N and K, a hypothesis property over tiles,
stages, warps and tails; one wgmma in flight across iterations, and the race the emulator
reports when a refill goes into the slot that wgmma reads; loops the pass leaves alone
still run right; and the 128x128x64 tile through ptxas without spills."""

import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.hardware import SHARED_LIMIT
from weft.compiler.ir import (AsyncCopyGlobalToShared, AsyncCopyWaitGroup, For, Load, MmaV2, WarpgroupMma,
                              WarpgroupMmaWait)
from weft.compiler.passes import pipeline_dot_loops
from weft.runtime.emulator import emulate
from weft.runtime.emulator.errors import EmulationError

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(41)
STRIDES = ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")


@tl.jit
def staged_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                  B_OTHER: tl.constexpr):
    """c = a @ b, one [BLOCK_M, BLOCK_N] tile per program, the K loop over STAGES stages;
    b's masked-off elements read as B_OTHER (the K tail of a is zero, so any value is right)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=B_OTHER)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def prepared(block, stages: int, num_warps: int = 4, dtype: str = "fp16", b_other: float = 0.0):
    """staged_matmul at the `layout` stage the emulator runs."""
    signature = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 **{name: "i32" for name in STRIDES}}
    constexprs = dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages, B_OTHER=b_other)
    tile = build_kernel(staged_matmul, signature, constexprs, num_warps, {}, language="highlevel")
    return pipeline.prepare_for_emulator(tile)


def run_matmul(kernel, block, m: int, n: int, k: int, dtype: str = "fp16", flat_grid: bool = False):
    """The emulated product of random [m, k] @ [k, n] inputs, checked against float64
    (`flat_grid`: one program id over all tiles, as examples.matmul_kernel takes)."""
    host = {"fp16": np.float16, "fp32": np.float32}[dtype]
    a = (RNG.standard_normal((m, k)) * 2).astype(host)
    b = (RNG.standard_normal((k, n)) * 2).astype(host)
    c = np.full((m, n), np.nan, np.float32)
    grid = (-(-m // block[0]), -(-n // block[1]))
    grid = (grid[0] * grid[1],) if flat_grid else grid
    emulate(kernel, grid, [a, b, c, m, n, k, k, 1, n, 1, n, 1])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tolerance = 1e-5 if dtype == "fp16" else 2e-3  # fp32 runs as tf32
    error = np.abs(c - a64 @ b64)
    assert (error <= tolerance * (np.abs(a64) @ np.abs(b64)) + 1e-6).all(), f"largest error {error.max()}"


def copies(kernel) -> int:
    return sum(isinstance(op, AsyncCopyGlobalToShared) for op in kernel.walk())


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("k", [0, 32, 64, 50, 200])  # 0, 1, 2 iterations (shorter than the prologue), tails
def test_pipelined_matmul_matches_numpy(stages, k):
    block = (64, 64, 32)
    kernel = prepared(block, stages)
    # Each operand: S - 1 prologue copies and one in the loop; nothing loaded into registers.
    assert copies(kernel) == 2 * stages
    assert not any(isinstance(op, Load) for op in kernel.walk())
    assert [op.pending for op in kernel.walk() if isinstance(op, AsyncCopyWaitGroup)] == [stages - 2]
    # One wgmma left in flight across iterations from 3 stages on (2 keep wait(0): see the pass).
    assert wgmma_waits(kernel) == (([1], [0]) if stages >= 3 else ([0], []))
    run_matmul(kernel, block, 70, 100, k)


def wgmma_waits(kernel) -> tuple[list[int], list[int]]:
    """The pending counts of the warpgroup_mma_waits in the K loop, and of those after it."""
    top = kernel.body.ops
    loop = next(op for op in top if isinstance(op, For))
    after = top[top.index(loop) + 1:]
    return ([op.pending for op in loop.body.walk() if isinstance(op, WarpgroupMmaWait)],
            [op.pending for op in after if isinstance(op, WarpgroupMmaWait)])


@pytest.mark.parametrize("stages", [3, 4])
def test_a_refill_of_the_slot_the_wgmma_in_flight_reads_is_a_race(stages, monkeypatch):
    """The emulator checks the slot arithmetic: copies into this iteration's own slot,
    which its wgmma (left in flight by the wait(1)) still reads, are reported."""
    monkeypatch.setattr(pipeline_dot_loops.LoopPipeliner, "refill_slot", lambda self, out, slot: slot)
    block = (64, 64, 32)
    kernel = prepared(block, stages)
    assert wgmma_waits(kernel) == ([1], [0])
    with pytest.raises(EmulationError, match=r"race \(WAR\).*wgmma"):
        run_matmul(kernel, block, 64, 64, 32 * stages)


def test_tiles_on_mma_sync_are_pipelined_too():
    block = (32, 128, 64)  # too few rows for wgmma: mma.sync reads the ring's slot
    kernel = prepared(block, 3)
    assert copies(kernel) == 6 and any(isinstance(op, MmaV2) for op in kernel.walk())
    run_matmul(kernel, block, 50, 130, 100)


def test_one_stage_and_no_schedule_leave_the_loop_alone():
    kernel = prepared((64, 64, 32), 1)
    assert copies(kernel) == 0
    run_matmul(kernel, (64, 64, 32), 64, 64, 64)


def test_a_nonzero_other_leaves_the_loop_unpipelined_and_right():
    block = (64, 64, 32)
    kernel = prepared(block, 3, b_other=1.0)
    assert copies(kernel) == 0 and any(isinstance(op, WarpgroupMma) for op in kernel.walk())
    run_matmul(kernel, block, 70, 90, 50)


@tl.jit
def recomputed_pointers(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
    """A K loop whose pointers are computed from k, not carried: each copy computes its
    iteration's addresses again."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK, num_stages=3):
        a = tl.load(a_ptr + offs[:, None] * K + k + offs[None, :])
        b = tl.load(b_ptr + (k + offs[:, None]) * BLOCK + offs[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


def test_pointers_computed_from_the_induction_variable_are_pipelined():
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    kernel = pipeline.prepare_for_emulator(build_kernel(recomputed_pointers, signature, {"BLOCK": 64}, 4, {},
                                                        language="highlevel"))
    assert copies(kernel) == 2 * 3
    a, b = RNG.standard_normal((64, 128)).astype(np.float16), RNG.standard_normal((128, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    emulate(kernel, (1,), [a, b, c, 128])
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


@tl.jit
def decayed_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
    """acc = 0.5 * acc + a_k @ b_k over the K blocks: the loop reads its accumulator."""
    offs = tl.arange(0, BLOCK)
    a_ptrs = a_ptr + offs[:, None] * K + offs[None, :]
    b_ptrs = b_ptr + offs[:, None] * BLOCK + offs[None, :]
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK, num_stages=3):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc * 0.5)
        a_ptrs += BLOCK
        b_ptrs += BLOCK * BLOCK
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


def test_an_accumulator_read_in_the_loop_keeps_each_wgmma_waited_for():
    """The scaling reads the accumulator's registers, which a wgmma in flight still owns:
    the loop keeps wait(0) in each iteration, and is still pipelined and right."""
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    kernel = pipeline.prepare_for_emulator(build_kernel(decayed_matmul, signature, {"BLOCK": 64}, 4, {},
                                                        language="highlevel"))
    assert copies(kernel) == 6 and wgmma_waits(kernel) == ([0], [])
    a, b = RNG.standard_normal((64, 192)).astype(np.float16), RNG.standard_normal((192, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    emulate(kernel, (1,), [a, b, c, 192])
    expected = np.zeros((64, 64))
    for k in range(0, 192, 64):
        expected = 0.5 * expected + a[:, k:k + 64].astype(np.float64) @ b[k:k + 64].astype(np.float64)
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-3)


TILES = [(64, 64, 32), (64, 32, 16), (128, 64, 32), (64, 128, 64), (128, 128, 16)]


@settings(max_examples=200 if DEEP else 8, deadline=None, suppress_health_check=list(HealthCheck))
@given(block=st.sampled_from(TILES), stages=st.integers(2, 4), num_warps=st.sampled_from([4, 8]),
       dtype=st.sampled_from(["fp16", "fp32"]), k_blocks=st.integers(0, 5),
       remainders=st.tuples(*(st.integers(0, 15) for _ in range(3))))
def test_pipelined_matmul_property(block, stages, num_warps, dtype, k_blocks, remainders):
    """Any tile, stage count, warp count and tails: the emulator (races, deadlocks) agrees
    with numpy."""
    if block[0] == 64 and num_warps == 8:
        block = (128,) + block[1:]  # 8 warps stack two warpgroups along M
    ring_bytes = stages * (block[0] + block[1]) * block[2] * {"fp16": 2, "fp32": 4}[dtype]
    if ring_bytes > SHARED_LIMIT:  # 128x128x64 fp32 in 4 stages: refused, as Triton would
        with pytest.raises(CompilationError, match="bytes of shared memory"):
            prepared(block, stages, num_warps, dtype)
        return
    kernel = prepared(block, stages, num_warps, dtype)
    assert copies(kernel) == 2 * stages
    m, n = (max(1, b - r) for b, r in zip(block[:2], remainders))
    k = max(0, k_blocks * block[2] - remainders[2])
    run_matmul(kernel, block, m, n, k, dtype)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_the_hopper_tile_assembles_without_spills():
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 **{name: "i32" for name in STRIDES}}
    specialization = {name: "divisible_by_16" for name in signature}
    specialization.update(stride_ak="equal_to_1", stride_bn="equal_to_1", stride_cn="equal_to_1")
    # pointer_tma=False: these loads are TMA boxes by default (stage_pointer_loads); this is the cp.async form.
    compiled = staged_matmul.compile(signature=signature, num_warps=8, specialization=specialization,
                                     constexprs=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=3, B_OTHER=0.0),
                                     pointer_tma=False)
    ptx = compiled.asm["ptx"]
    for instruction in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 1",
                        "wgmma.mma_async"):
        assert instruction in ptx, instruction
    # One wgmma group left in flight in the loop (after its mma_async), none after it.
    mma, waits = ptx.index("wgmma.mma_async"), re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)
    assert waits == ["1", "0"], waits
    assert ptx.index("wgmma.wait_group.sync.aligned 1") > mma
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    # The accumulator in flight across the back edge does not make ptxas serialize the wgmmas.
    assert not compiled.metadata["performance_warnings"], compiled.metadata["performance_warnings"]


def test_the_launch_option_pipelines_loops_without_tl_range():
    """examples.matmul_kernel's plain `range` K loop, launched with num_stages=3."""
    from weft.highlevel import examples
    from weft.highlevel.jit import compile_kernel

    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                 **{name: "i32" for name in STRIDES}}
    constexprs = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, ACTIVATION="", ACC_IN_DOT=True)
    options = {"num_warps": 4, "target": "emulator"}
    assert copies(compile_kernel(examples.matmul_kernel, signature, constexprs, {}, options)) == 0
    kernel = compile_kernel(examples.matmul_kernel, signature, constexprs, {}, {**options, "num_stages": 3})
    assert copies(kernel) == 6
    run_matmul(kernel, (64, 64, 32), 100, 70, 90, flat_grid=True)
