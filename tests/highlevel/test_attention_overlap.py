"""issue_dot_ahead: a pipelined loop of two chained dots issues Q K^T of block j with P V
of block j - 1, so block j's softmax runs while that P V is in flight (with the launch
option dot_ahead=True, where the tiles fit the registers; off by default).
Golden IR of the pass on a small two-dot loop; the emulator (races, in-flight reads,
cp.async copies read before their wait) runs it and the attention example against numpy
float64 over tiles, warps, stages, head_dim, causal and tails, and flags the schedule
with any of its waits one short; ptxas assembles the benchmark's configs with the most
registers without spills and without serializing the wgmmas."""

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import AsyncCopyWaitGroup, Block, For, If, WarpgroupMma, WarpgroupMmaWait
from weft.compiler.passes import issue_dot_ahead as ahead_pass
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.highlevel import attention_example
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator.errors import EmulationError

from ..compiler.golden import golden_checker
from ._compile import HAS_PTXAS
from .test_attention_example import SIGNATURE, SPECIALIZATION, constexprs, reference

check_golden = golden_checker(__file__, globals())
RNG = np.random.default_rng(40)
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def make_chain():
    """A fresh two-dot loop (its own compile caches): acc = acc / 2 + fp16(Q K_j^T) V_j, the
    accumulator read between the dots as attention's rescale reads it, and the rows'
    maxima of S summed over the blocks (S read outside the second dot's operands, as the
    softmax reads it)."""

    @tl.jit
    def chain(q_ptr, k_ptr, v_ptr, out_ptr, max_ptr, N, D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + offs_m[:, None] * D + offs_d[None, :])
        kt_ptrs = k_ptr + offs_d[:, None] + offs_n[None, :] * D  # K^T blocks, [D, BLOCK_N]
        v_ptrs = v_ptr + offs_n[:, None] * D + offs_d[None, :]
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        maxima = tl.zeros([BLOCK_M], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            s = tl.dot(q, tl.load(kt_ptrs))
            maxima += tl.max(s, 1)
            acc = acc * 0.5
            acc = tl.dot(s.to(tl.float16), tl.load(v_ptrs), acc)
            kt_ptrs += BLOCK_N * D
            v_ptrs += BLOCK_N * D
        tl.store(out_ptr + offs_m[:, None] * D + offs_d[None, :], acc)
        tl.store(max_ptr + offs_m, maxima)

    return chain


CHAIN_SIGNATURE = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "out_ptr": "*fp32", "max_ptr": "*fp32",
                   "N": "i32"}


def until_ahead(stages=3, dot_ahead=True):
    """The chain kernel after the tile passes up to issue_dot_ahead, verified after each."""
    kernel = build_kernel(make_chain(), CHAIN_SIGNATURE, dict(D=16, BLOCK_M=64, BLOCK_N=16, STAGES=stages), 4,
                          {name: "divisible_by_16" for name in CHAIN_SIGNATURE}, language="highlevel")
    kernel = dataclasses.replace(kernel, dot_ahead=dot_ahead)
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "issue_dot_ahead":
            return kernel
    raise AssertionError("issue_dot_ahead is not in TILE_PASSES")


def chain_reference(q, k, v, block_n):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    acc, maxima = np.zeros((q.shape[0], v.shape[1])), np.zeros(q.shape[0])
    for start in range(0, k.shape[0], block_n):
        s = q @ k[start:start + block_n].T
        maxima += s.max(axis=1)
        acc = acc * 0.5 + s.astype(np.float16).astype(np.float64) @ v[start:start + block_n]
    return acc, maxima


def run_chain(kernel, n, stages, dot_ahead=True):
    q, k, v = ((0.25 * RNG.standard_normal(shape)).astype(np.float16) for shape in ((64, 16), (n, 16), (n, 16)))
    out, maxima = np.zeros((64, 16), np.float32), np.zeros(64, np.float32)
    kernel[(1,)](q, k, v, out, maxima, n, D=16, BLOCK_M=64, BLOCK_N=16, STAGES=stages, num_warps=4, dot_ahead=dot_ahead)
    return (out, maxima), chain_reference(q, k, v, 16)


def test_the_pass_sits_right_after_pipeline_dot_loops():
    names = [name for name, _ in pipeline.TILE_PASSES]
    assert names.index("issue_dot_ahead") == names.index("pipeline_dot_loops") + 1


def test_golden():
    check_golden(print_kernel(until_ahead()), "EXPECTED_CHAIN")


def wgmmas(ops):
    return [op for op in ops if isinstance(op, WarpgroupMma)]


@pytest.mark.parametrize("stages", [3, 4, 5])
def test_qk_of_block_j_and_pv_of_block_j_minus_1_issued_together(stages):
    kernel = until_ahead(stages)
    top = kernel.body.ops
    (loop,) = [op for op in top if isinstance(op, For)]
    peel, epilogue = top[top.index(loop) - 2], top[top.index(loop) + 1]  # the If before (then the lower bound)
    assert isinstance(peel, If) and isinstance(epilogue, If)
    assert len(wgmmas(peel.then_body.walk())) == 1  # block 0's Q K^T, waited at once
    assert len(wgmmas(epilogue.then_body.walk())) == 1  # the last block's P V
    body = loop.body.ops
    qk, pv = wgmmas(body)
    assert body.index(pv) < body.index(qk) + 8  # issued together: only the V slot's index between them
    assert [op.pending for op in body if isinstance(op, AsyncCopyWaitGroup)] == [stages - 2]
    waits = [op for op in body if isinstance(op, WarpgroupMmaWait)]
    assert [op.pending for op in waits] == [1, 0, 0]  # S of block j; then P V of j - 1, and P through it
    assert waits[0].deps == (qk.result,) and body.index(pv) < body.index(waits[0])
    p_arg, acc_arg = loop.body.args[-2:]
    assert pv.a is p_arg and pv.acc is acc_arg  # carried from the iteration before
    assert waits[1].deps == (pv.result,) and waits[2].deps == (p_arg,)
    # The next P and rescaled accumulator are computed after the wait, nothing in flight yielded.
    yielded = body[-1].values[-2:]
    producers = {value: index for index, op in enumerate(body) for value in op.defines()}
    assert all(producers[value] > body.index(waits[2]) for value in yielded)


def test_two_stages_and_dot_ahead_false_leave_the_loop_alone():
    for kernel in (until_ahead(2), until_ahead(3, dot_ahead=False)):
        assert len(wgmmas(kernel.walk())) == 2
        assert [op.pending for op in kernel.walk() if isinstance(op, WarpgroupMmaWait)][:2] == [0, 0]


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("blocks", [0, 1, 2, 7])
def test_chain_on_the_emulator(stages, blocks):
    """Empty, one-block, short and long loops (the peeled block 0 and last P V)."""
    (out, maxima), (expected, expected_maxima) = run_chain(make_chain(), 16 * blocks, stages)
    np.testing.assert_allclose(out, expected, atol=2e-2, rtol=1e-2)
    np.testing.assert_allclose(maxima, expected_maxima, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("change,message", [("s_wait", "async `warpgroup_mma`"), ("pv_wait", "async `warpgroup_mma`"),
                                            ("copies", "the cp.async is still writing")])
def test_the_emulator_flags_a_schedule_one_wait_short(monkeypatch, change, message):
    """The loop's wait(1) of S as wait(2) (the softmax reads S in flight), P V's wait(0) as
    wait(1) (the rescale reads the accumulator in flight), wait_group(S - 2) as S - 1 (Q K^T
    reads K while its cp.async writes): the emulator catches each."""
    rewrite = ahead_pass.rewrite

    def one_short(loop, split):
        ops = rewrite(loop, split)
        (new_loop,) = [op for op in ops if isinstance(op, For)]
        body, waits = [], 0
        for op in new_loop.body.ops:
            if isinstance(op, WarpgroupMmaWait):
                waits += 1
                if (change, waits) in (("s_wait", 1), ("pv_wait", 2), ("pv_wait", 3)):
                    op = dataclasses.replace(op, pending=op.pending + 1)
            if change == "copies" and isinstance(op, AsyncCopyWaitGroup):
                op = dataclasses.replace(op, pending=op.pending + 1)
            body.append(op)
        replaced = dataclasses.replace(new_loop, body=Block(new_loop.body.args, tuple(body)))
        return [replaced if op is new_loop else op for op in ops]

    monkeypatch.setattr(ahead_pass, "rewrite", one_short)
    with pytest.raises(EmulationError, match=message):
        run_chain(make_chain(), 16 * 6, 3)


@settings(max_examples=200 if DEEP else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=st.sampled_from([(64, (64, 64), 4), (64, (64, 32), 4), (64, (128, 64), 8), (128, (64, 64), 4),
                               (64, (128, 64), 4), (32, (64, 32), 4)]),
       stages=st.integers(3, 5), causal=st.booleans(), blocks=st.integers(1, 3), tail=st.integers(0, 40))
def test_attention_ahead_on_the_emulator_property(config, stages, causal, blocks, tail):
    """The attention example with dot_ahead on, any tile, warps, stages, head_dim, causal
    (STAGE 1 and 2, or 3) or not, tails (EVEN=False): the emulator agrees with numpy."""
    head_dim, block, num_warps = config
    n_ctx = max(1, blocks * block[0] - tail)
    q, k, v = ((0.5 * RNG.standard_normal((1, 1, n_ctx, head_dim))).astype(np.float16) for _ in range(3))
    out, lse = attention_example.attention(q, k, v, causal, block=block, num_warps=num_warps, num_stages=stages,
                                           dot_ahead=True)
    expected, expected_lse = reference(q, k, v, causal, head_dim ** -0.5)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


def ahead_loops(causal, num_warps=8, **options):
    """How many of the example's loops issue_dot_ahead rewrote (each rewritten one has two
    more wgmmas: block 0's Q K^T and the last block's P V)."""
    kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (128, 64), causal),
                            SPECIALIZATION, {"num_warps": num_warps, "target": "emulator", "num_stages": 3, **options})
    loops = sum(isinstance(op, For) for op in kernel.body.ops)
    return (len(wgmmas(kernel.walk())) - 2 * loops) // 2


def test_on_when_asked_where_the_tiles_fit_registers_and_off_by_default():
    assert ahead_loops(True, dot_ahead=True) == 2  # 32 + 32 + 16 registers a thread
    with pytest.warns(CompilationWarning, match="dot_ahead is not applied to this loop: .* 160 registers"):
        assert ahead_loops(True, num_warps=4, dot_ahead=True) == 0  # 64 + 64 + 32: past the budget
    assert ahead_loops(True) == 0
    assert ahead_loops(False, dot_ahead=False) == 0


def test_dot_ahead_must_be_a_bool():
    with pytest.raises(ValueError, match="dot_ahead must be True or False"):
        compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (64, 64), False),
                       SPECIALIZATION, {"num_warps": 4, "target": "emulator", "num_stages": 3, "dot_ahead": 1})


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("head_dim,block,num_warps,stages,causal", [(64, (128, 64), 8, 3, False),
                                                                      (64, (128, 128), 8, 3, True),
                                                                      (128, (128, 64), 8, 3, True)])
def test_benchmark_configs_assemble_without_spills_or_serialized_wgmmas(head_dim, block, num_warps, stages, causal):
    """benchmarks/highlevel_attention.py's configs within the register budget with
    dot_ahead=True (the budget's edge: 128 x 128 at head_dim 64; causal at head_dim 128):
    no spills, and no ptxas advisory that it serialized the wgmmas (registers a wgmma
    reads written while it runs)."""
    compiled = attention_example.attention_kernel.compile(signature=SIGNATURE,
                                                          constexprs=constexprs(head_dim, block, causal),
                                                          num_warps=num_warps, num_stages=stages,
                                                          specialization=SPECIALIZATION, dot_ahead=True)
    assert compiled.asm["layout"].count("= warpgroup_mma ") == 4 * (2 if causal else 1)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert not compiled.metadata["performance_warnings"], compiled.metadata["performance_warnings"]


EXPECTED_CHAIN = """\
#L0 = {register=[(0,1), (0,2), (0,4)] lane=[(0,8), (1,0), (2,0), (4,0), (8,0)] warp=[(16,0), (32,0)]} -> [64x16]
#L1 = {offset=[(0,1), (0,2), (0,4), (0,8), (1,0), (2,0), (4,8), (8,0), (16,0), (32,0)]} -> [64x16]
#L2 = {offset=[(0,1,0), (0,2,0), (0,4,0), (0,8,0), (0,0,1), (0,0,2), (0,8,4), (0,0,8), (1,0,0), (2,0,0)]} -> [4x16x16]
#L3 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,1,0), (0,2,0), (0,4,8), (0,8,0), (1,0,0), (2,0,0)]} -> [4x16x16]
#L4 = {offset=[(1,0), (2,0), (4,0), (8,0), (0,1), (0,2), (8,4), (0,8)]} -> [16x16]
#L5 = {register=[(1,0)] lane=[(2,0), (4,0), (8,0), (0,1), (0,2)] warp=[(0,4), (0,8)]} -> [16x16]
#L6 = {offset=[(0,1), (0,2), (0,4), (0,8), (1,0), (2,0), (4,8), (8,0)]} -> [16x16]
#L7 = {register=[(0,1)] lane=[(0,2), (0,4), (0,8), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [16x16]
#L8 = {register=[(0,1), (8,0), (0,8)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x16]
#L9 = {register=[(0,1), (0,2), (32,0)] lane=[(0,4), (0,8), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [64x16]
#L10 = {lane=[(1), (2), (4), (8), (16)] warp=[(32), (0)]} -> [64]
kernel @chain(%q_ptr: *fp16, %k_ptr: *fp16, %v_ptr: *fp16, %out_ptr: *fp32, %max_ptr: *fp32, %N: i32) num_warps=4 {
  %offs_m = arange [start=0 end=64] : tensor<64xi32>
  %offs_n = arange [start=0 end=16] : tensor<16xi32>
  %offs_d = arange [start=0 end=16] : tensor<16xi32>
  %9 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %10 = constant [value=16] : tensor<64x1xi32>
  %11 = binary [kind=mul] %9, %10 : tensor<64x1xi32>
  %12 = splat %q_ptr : tensor<64x1x*fp16>
  %13 = add_ptr %12, %11 : tensor<64x1x*fp16>
  %14 = expand_dims [axis=0] %offs_d : tensor<1x16xi32>
  %15 = broadcast %13 : tensor<64x16x*fp16>
  %16 = broadcast %14 : tensor<64x16xi32>
  %17 = add_ptr %15, %16 : tensor<64x16x*fp16>
  %18 = convert_layout %17 : tensor<64x16x*fp16, #L0>
  %19 = load %18 : tensor<64x16xfp16, #L0>
  %q = convert_layout %19 : tensor<64x16xfp16>
  %21 = expand_dims [axis=1] %offs_d : tensor<16x1xi32>
  %22 = splat %k_ptr : tensor<16x1x*fp16>
  %23 = add_ptr %22, %21 : tensor<16x1x*fp16>
  %24 = expand_dims [axis=0] %offs_n : tensor<1x16xi32>
  %25 = constant [value=16] : tensor<1x16xi32>
  %26 = binary [kind=mul] %24, %25 : tensor<1x16xi32>
  %27 = broadcast %23 : tensor<16x16x*fp16>
  %28 = broadcast %26 : tensor<16x16xi32>
  %kt_ptrs = add_ptr %27, %28 : tensor<16x16x*fp16>
  %30 = expand_dims [axis=1] %offs_n : tensor<16x1xi32>
  %31 = constant [value=16] : tensor<16x1xi32>
  %32 = binary [kind=mul] %30, %31 : tensor<16x1xi32>
  %33 = splat %v_ptr : tensor<16x1x*fp16>
  %34 = add_ptr %33, %32 : tensor<16x1x*fp16>
  %35 = expand_dims [axis=0] %offs_d : tensor<1x16xi32>
  %36 = broadcast %34 : tensor<16x16x*fp16>
  %37 = broadcast %35 : tensor<16x16xi32>
  %v_ptrs = add_ptr %36, %37 : tensor<16x16x*fp16>
  %acc = constant [value=0.0] : tensor<64x16xfp32>
  %maxima = constant [value=0.0] : tensor<64xfp32>
  %41 = constant [value=0] : i32
  %42 = constant [value=16] : i32
  %a_smem = allocate_shared_memory : shared<64x16xfp16, #L1>
  shared_store %a_smem, %q
  %b_smem = allocate_shared_memory : shared<3x16x16xfp16, #L2>
  %b_smem_45 = allocate_shared_memory : shared<3x16x16xfp16, #L3>
  %46 = constant [value=256] : tensor<16x16xi32>
  %47 = constant [value=256] : tensor<16x16xi32>
  %48 = constant [value=0] : i32
  %kt_ptrs_49 = add_ptr %kt_ptrs, %46 : tensor<16x16x*fp16>
  %v_ptrs_50 = add_ptr %v_ptrs, %47 : tensor<16x16x*fp16>
  %51 = compare [predicate=lt] %41, %N : i1
  if %51 {
    %b_smem_52 = shared_index %b_smem, %48 : shared<16x16xfp16, #L4>
    %53 = convert_layout %kt_ptrs : tensor<16x16x*fp16, #L5>
    async_copy_global_to_shared %b_smem_52, %53
    %b_smem_54 = shared_index %b_smem_45, %48 : shared<16x16xfp16, #L6>
    %55 = convert_layout %v_ptrs : tensor<16x16x*fp16, #L7>
    async_copy_global_to_shared %b_smem_54, %55
    yield
  } {
    yield
  }
  async_copy_commit_group
  %56 = constant [value=16] : i32
  %57 = binary [kind=add] %41, %56 : i32
  %58 = constant [value=1] : i32
  %kt_ptrs_59 = add_ptr %kt_ptrs_49, %46 : tensor<16x16x*fp16>
  %v_ptrs_60 = add_ptr %v_ptrs_50, %47 : tensor<16x16x*fp16>
  %61 = compare [predicate=lt] %57, %N : i1
  if %61 {
    %b_smem_62 = shared_index %b_smem, %58 : shared<16x16xfp16, #L4>
    %63 = convert_layout %kt_ptrs_49 : tensor<16x16x*fp16, #L5>
    async_copy_global_to_shared %b_smem_62, %63
    %b_smem_64 = shared_index %b_smem_45, %58 : shared<16x16xfp16, #L6>
    %65 = convert_layout %v_ptrs_50 : tensor<16x16x*fp16, #L7>
    async_copy_global_to_shared %b_smem_64, %65
    yield
  } {
    yield
  }
  async_copy_commit_group
  %66 = constant [value=0] : i32
  %67 = compare [predicate=lt] %41, %N : i1
  %kt_ptrs_68, %v_ptrs_69, %acc_70, %maxima_71, %slot, %ahead, %ahead_74, %75, %76 = if %67 : tensor<16x16x*fp16>, tensor<16x16x*fp16>, tensor<64x16xfp32>, tensor<64xfp32>, i32, tensor<16x16x*fp16>, tensor<16x16x*fp16>, tensor<64x16xfp16>, tensor<64x16xfp32, #L8> {
    %77 = convert_layout %kt_ptrs : tensor<16x16x*fp16, #L5>
    async_copy_wait_group [pending=1]
    %b_smem_78 = shared_index %b_smem, %66 : shared<16x16xfp16, #L4>
    %b_smem_79 = shared_index %b_smem_45, %66 : shared<16x16xfp16, #L6>
    fence_async_shared
    %80 = constant [value=0.0] : tensor<64x16xfp32>
    %81 = convert_layout %80 : tensor<64x16xfp32, #L8>
    %s = warpgroup_mma [is_async=True] %a_smem, %b_smem_78, %81 : tensor<64x16xfp32, #L8>
    %s_83 = warpgroup_mma_wait [pending=0] %s : tensor<64x16xfp32, #L8>
    %s_84 = convert_layout %s_83 : tensor<64x16xfp32>
    %85 = reduce [axis=1 kind=max] %s_84 : tensor<64xfp32>
    %maxima_86 = binary [kind=add] %maxima, %85 : tensor<64xfp32>
    %87 = convert_layout %v_ptrs : tensor<16x16x*fp16, #L7>
    %88 = constant [value=32] : i32
    %89 = binary [kind=add] %41, %88 : i32
    %90 = constant [value=2] : i32
    %91 = binary [kind=add] %66, %90 : i32
    %92 = constant [value=3] : i32
    %93 = binary [kind=mod] %91, %92 : i32
    %94 = constant [value=256] : tensor<16x16xi32>
    %95 = constant [value=256] : tensor<16x16xi32>
    %ahead_96 = add_ptr %kt_ptrs_59, %94 : tensor<16x16x*fp16>
    %ahead_97 = add_ptr %v_ptrs_60, %95 : tensor<16x16x*fp16>
    %98 = compare [predicate=lt] %89, %N : i1
    if %98 {
      %b_smem_99 = shared_index %b_smem, %93 : shared<16x16xfp16, #L4>
      %100 = convert_layout %kt_ptrs_59 : tensor<16x16x*fp16, #L5>
      async_copy_global_to_shared %b_smem_99, %100
      %b_smem_101 = shared_index %b_smem_45, %93 : shared<16x16xfp16, #L6>
      %102 = convert_layout %v_ptrs_60 : tensor<16x16x*fp16, #L7>
      async_copy_global_to_shared %b_smem_101, %102
      yield
    } {
      yield
    }
    async_copy_commit_group
    %103 = constant [value=256] : tensor<16x16xi32>
    %kt_ptrs_104 = add_ptr %kt_ptrs, %103 : tensor<16x16x*fp16>
    %105 = constant [value=256] : tensor<16x16xi32>
    %v_ptrs_106 = add_ptr %v_ptrs, %105 : tensor<16x16x*fp16>
    %107 = constant [value=1] : i32
    %108 = binary [kind=add] %66, %107 : i32
    %109 = constant [value=3] : i32
    %slot_110 = binary [kind=mod] %108, %109 : i32
    %111 = constant [value=0.5] : tensor<64x16xfp32>
    %acc_112 = binary [kind=mul] %acc, %111 : tensor<64x16xfp32>
    %113 = cast %s_84 : tensor<64x16xfp16>
    %114 = convert_layout %acc_112 : tensor<64x16xfp32, #L8>
    yield %kt_ptrs_104, %v_ptrs_106, %acc, %maxima_86, %slot_110, %ahead_96, %ahead_97, %113, %114
  } {
    %115 = constant [value=0.0] : tensor<64x16xfp16>
    %116 = constant [value=0.0] : tensor<64x16xfp32, #L8>
    yield %kt_ptrs, %v_ptrs, %acc, %maxima, %66, %kt_ptrs_59, %v_ptrs_60, %115, %116
  }
  %117 = binary [kind=add] %41, %42 : i32
  %kt_ptrs_118, %v_ptrs_119, %acc_120, %maxima_121, %slot_122, %ahead_123, %ahead_124, %125, %126 = for [schedule={num_stages=3}] %117, %N, %42, %kt_ptrs_68, %v_ptrs_69, %acc_70, %maxima_71, %slot, %ahead, %ahead_74, %75, %76 : tensor<16x16x*fp16>, tensor<16x16x*fp16>, tensor<64x16xfp32>, tensor<64xfp32>, i32, tensor<16x16x*fp16>, tensor<16x16x*fp16>, tensor<64x16xfp16>, tensor<64x16xfp32, #L8> {
    ^(%start: i32, %kt_ptrs_128: tensor<16x16x*fp16>, %v_ptrs_129: tensor<16x16x*fp16>, %acc_130: tensor<64x16xfp32>, %maxima_131: tensor<64xfp32>, %slot_132: i32, %ahead_133: tensor<16x16x*fp16>, %ahead_134: tensor<16x16x*fp16>, %135: tensor<64x16xfp16>, %136: tensor<64x16xfp32, #L8>)
    %137 = convert_layout %kt_ptrs_128 : tensor<16x16x*fp16, #L5>
    async_copy_wait_group [pending=1]
    %b_smem_138 = shared_index %b_smem, %slot_132 : shared<16x16xfp16, #L4>
    %b_smem_139 = shared_index %b_smem_45, %slot_132 : shared<16x16xfp16, #L6>
    fence_async_shared
    %140 = constant [value=0.0] : tensor<64x16xfp32>
    %141 = convert_layout %140 : tensor<64x16xfp32, #L8>
    %s_142 = warpgroup_mma [is_async=True] %a_smem, %b_smem_138, %141 : tensor<64x16xfp32, #L8>
    %143 = constant [value=2] : i32
    %144 = constant [value=3] : i32
    %145 = binary [kind=add] %slot_132, %143 : i32
    %slot_146 = binary [kind=mod] %145, %144 : i32
    %b_smem_147 = shared_index %b_smem_45, %slot_146 : shared<16x16xfp16, #L6>
    %acc_148 = warpgroup_mma [is_async=True] %135, %b_smem_147, %136 : tensor<64x16xfp32, #L8>
    %s_149 = warpgroup_mma_wait [pending=1] %s_142 : tensor<64x16xfp32, #L8>
    %s_150 = convert_layout %s_149 : tensor<64x16xfp32>
    %151 = reduce [axis=1 kind=max] %s_150 : tensor<64xfp32>
    %maxima_152 = binary [kind=add] %maxima_131, %151 : tensor<64xfp32>
    %153 = convert_layout %v_ptrs_129 : tensor<16x16x*fp16, #L7>
    %acc_154 = warpgroup_mma_wait [pending=0 anchor=volatile] %acc_148 : tensor<64x16xfp32, #L8>
    %155 = warpgroup_mma_wait [pending=0] %135 : tensor<64x16xfp16>
    %acc_156 = convert_layout %acc_154 : tensor<64x16xfp32>
    %157 = constant [value=0.5] : tensor<64x16xfp32>
    %acc_158 = binary [kind=mul] %acc_156, %157 : tensor<64x16xfp32>
    %159 = cast %s_150 : tensor<64x16xfp16>
    %160 = convert_layout %acc_158 : tensor<64x16xfp32, #L8>
    %161 = constant [value=32] : i32
    %162 = binary [kind=add] %start, %161 : i32
    %163 = constant [value=2] : i32
    %164 = binary [kind=add] %slot_132, %163 : i32
    %165 = constant [value=3] : i32
    %166 = binary [kind=mod] %164, %165 : i32
    %167 = constant [value=256] : tensor<16x16xi32>
    %168 = constant [value=256] : tensor<16x16xi32>
    %ahead_169 = add_ptr %ahead_133, %167 : tensor<16x16x*fp16>
    %ahead_170 = add_ptr %ahead_134, %168 : tensor<16x16x*fp16>
    %171 = compare [predicate=lt] %162, %N : i1
    if %171 {
      %b_smem_172 = shared_index %b_smem, %166 : shared<16x16xfp16, #L4>
      %173 = convert_layout %ahead_133 : tensor<16x16x*fp16, #L5>
      async_copy_global_to_shared %b_smem_172, %173
      %b_smem_174 = shared_index %b_smem_45, %166 : shared<16x16xfp16, #L6>
      %175 = convert_layout %ahead_134 : tensor<16x16x*fp16, #L7>
      async_copy_global_to_shared %b_smem_174, %175
      yield
    } {
      yield
    }
    async_copy_commit_group
    %176 = constant [value=256] : tensor<16x16xi32>
    %kt_ptrs_177 = add_ptr %kt_ptrs_128, %176 : tensor<16x16x*fp16>
    %178 = constant [value=256] : tensor<16x16xi32>
    %v_ptrs_179 = add_ptr %v_ptrs_129, %178 : tensor<16x16x*fp16>
    %180 = constant [value=1] : i32
    %181 = binary [kind=add] %slot_132, %180 : i32
    %182 = constant [value=3] : i32
    %slot_183 = binary [kind=mod] %181, %182 : i32
    yield %kt_ptrs_177, %v_ptrs_179, %acc_130, %maxima_152, %slot_183, %ahead_169, %ahead_170, %159, %160
  }
  %acc_184 = if %67 : tensor<64x16xfp32> {
    %185 = constant [value=2] : i32
    %186 = constant [value=3] : i32
    %187 = binary [kind=add] %slot_122, %185 : i32
    %slot_188 = binary [kind=mod] %187, %186 : i32
    %b_smem_189 = shared_index %b_smem_45, %slot_188 : shared<16x16xfp16, #L6>
    %acc_190 = warpgroup_mma [is_async=True] %125, %b_smem_189, %126 : tensor<64x16xfp32, #L8>
    %acc_191 = warpgroup_mma_wait [pending=0] %acc_190 : tensor<64x16xfp32, #L8>
    %192 = warpgroup_mma_wait [pending=0] %125 : tensor<64x16xfp16>
    %acc_193 = convert_layout %acc_191 : tensor<64x16xfp32>
    yield %acc_193
  } {
    yield %acc
  }
  %acc_194 = convert_layout %acc_184 : tensor<64x16xfp32, #L8>
  %acc_195 = warpgroup_mma_wait [pending=0] %acc_194 : tensor<64x16xfp32, #L8>
  %acc_196 = convert_layout %acc_195 : tensor<64x16xfp32>
  %197 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %198 = constant [value=16] : tensor<64x1xi32>
  %199 = binary [kind=mul] %197, %198 : tensor<64x1xi32>
  %200 = splat %out_ptr : tensor<64x1x*fp32>
  %201 = add_ptr %200, %199 : tensor<64x1x*fp32>
  %202 = expand_dims [axis=0] %offs_d : tensor<1x16xi32>
  %203 = broadcast %201 : tensor<64x16x*fp32>
  %204 = broadcast %202 : tensor<64x16xi32>
  %205 = add_ptr %203, %204 : tensor<64x16x*fp32>
  %206 = convert_layout %205 : tensor<64x16x*fp32, #L9>
  %207 = convert_layout %acc_196 : tensor<64x16xfp32, #L9>
  store %206, %207
  %208 = splat %max_ptr : tensor<64x*fp32>
  %209 = add_ptr %208, %offs_m : tensor<64x*fp32>
  %210 = convert_layout %209 : tensor<64x*fp32, #L10>
  %211 = convert_layout %maxima_121 : tensor<64xfp32, #L10>
  store %210, %211
}
"""
