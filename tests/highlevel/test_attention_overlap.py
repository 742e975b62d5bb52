"""issue_dot_ahead: a pipelined loop of two chained dots issues the next block's first dot
before this block's softmax (attention's S = Q K^T one iteration ahead), carrying it in
flight. Golden IR of the pass on a small two-dot loop; the emulator (races, in-flight
reads, cp.async copies read before their wait) runs it and the attention example against
numpy float64 over tiles, warps, stages, causal and tails, and flags the schedule with a
wait count one too high; the option applies where registers allow and ptxas assembles
the benchmark's tightest configs without spills."""

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import AsyncCopyWaitGroup, Block, For, WarpgroupMma, WarpgroupMmaWait
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
    accumulator read between the dots as attention's rescale reads it."""

    @tl.jit
    def chain(q_ptr, k_ptr, v_ptr, out_ptr, N, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              STAGES: tl.constexpr):
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + offs_m[:, None] * D + offs_d[None, :])
        kt_ptrs = k_ptr + offs_d[:, None] + offs_n[None, :] * D  # K^T blocks, [D, BLOCK_N]
        v_ptrs = v_ptr + offs_n[:, None] * D + offs_d[None, :]
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in tl.range(0, N, BLOCK_N, num_stages=STAGES):
            s = tl.dot(q, tl.load(kt_ptrs))
            acc = acc * 0.5
            acc = tl.dot(s.to(tl.float16), tl.load(v_ptrs), acc)
            kt_ptrs += BLOCK_N * D
            v_ptrs += BLOCK_N * D
        tl.store(out_ptr + offs_m[:, None] * D + offs_d[None, :], acc)

    return chain


CHAIN_SIGNATURE = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "out_ptr": "*fp32", "N": "i32"}


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
    acc = np.zeros((q.shape[0], v.shape[1]))
    for start in range(0, k.shape[0], block_n):
        s = (q @ k[start:start + block_n].T).astype(np.float16).astype(np.float64)
        acc = acc * 0.5 + s @ v[start:start + block_n]
    return acc


def run_chain(kernel, n, stages, dot_ahead=True):
    q, k, v = ((0.25 * RNG.standard_normal(shape)).astype(np.float16) for shape in ((64, 16), (n, 16), (n, 16)))
    out = np.zeros((64, 16), np.float32)
    kernel[(1,)](q, k, v, out, n, D=16, BLOCK_M=64, BLOCK_N=16, STAGES=stages, num_warps=4, dot_ahead=dot_ahead)
    return out, chain_reference(q, k, v, 16)


def test_the_pass_sits_right_after_pipeline_dot_loops():
    names = [name for name, _ in pipeline.TILE_PASSES]
    assert names.index("issue_dot_ahead") == names.index("pipeline_dot_loops") + 1


def test_golden():
    check_golden(print_kernel(until_ahead()), "EXPECTED_CHAIN")


@pytest.mark.parametrize("stages", [3, 4, 5])
def test_first_dot_issued_a_slot_ahead_and_waited_with_one_in_flight(stages):
    kernel = until_ahead(stages)
    top = kernel.body.ops
    (loop,) = [op for op in top if isinstance(op, For)]
    before, after = top[:top.index(loop)], top[top.index(loop) + 1:]
    (first,) = [op for op in before if isinstance(op, WarpgroupMma)]  # block 0's S, before the loop
    assert loop.inits[-1] is first.result
    copies_waits = [op.pending for op in before if isinstance(op, AsyncCopyWaitGroup)]
    assert copies_waits == [stages - 2]  # block 0's copies landed
    body = loop.body.ops
    s_next, pv = [op for op in body if isinstance(op, WarpgroupMma)]
    assert [op.pending for op in body if isinstance(op, AsyncCopyWaitGroup)] == [stages - 3]
    waits = [op for op in body if isinstance(op, WarpgroupMmaWait)]
    assert [op.pending for op in waits] == [1, 1]  # S of this block, and the last P V; s_next runs on
    assert waits[0].deps == (loop.body.args[-1],) and body.index(waits[0]) == body.index(s_next) + 1
    assert body[-1].values[-1] is s_next.result  # carried in flight
    assert body.index(waits[-1]) < body.index(pv)
    assert any(isinstance(op, WarpgroupMmaWait) and loop.results[-1] in op.deps and op.pending == 0 for op in after)


def test_two_stages_and_dot_ahead_false_leave_the_loop_alone():
    for kernel in (until_ahead(2), until_ahead(3, dot_ahead=False)):
        (loop,) = [op for op in kernel.body.ops if isinstance(op, For)]
        assert not any(isinstance(op, WarpgroupMma) for op in kernel.body.ops[:kernel.body.ops.index(loop)])


@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("blocks", [0, 1, 2, 7])
def test_chain_on_the_emulator(stages, blocks):
    """Empty, short and long loops: the S issued for no block is never read."""
    out, expected = run_chain(make_chain(), 16 * blocks, stages)
    np.testing.assert_allclose(out, expected, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("field,value,message", [("pending", 2, "async `warpgroup_mma`"),
                                                 ("copies", 1, "the cp.async is still writing")])
def test_the_emulator_flags_a_schedule_one_wait_short(monkeypatch, field, value, message):
    """wait(2) in place of wait(1) leaves last block's P V in flight while the rescale reads
    the accumulator; wait_group(S - 2) in place of S - 3 lets the next S read K before its
    copy landed. The emulator catches both."""
    rewrite = ahead_pass.rewrite

    def one_short(loop, plan):
        ops = rewrite(loop, plan)
        (new_loop,) = [op for op in ops if isinstance(op, For)]
        body = []
        for op in new_loop.body.ops:
            if field == "pending" and isinstance(op, WarpgroupMmaWait):
                op = dataclasses.replace(op, pending=value)
            if field == "copies" and isinstance(op, AsyncCopyWaitGroup):
                op = dataclasses.replace(op, pending=op.pending + value)
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


def ahead_loops(head_dim, block, num_warps, causal=False, **options):
    """How many of the example's loops issue_dot_ahead rewrote (each rewritten one has a
    third wgmma, its first S before it)."""
    kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(head_dim, block, causal),
                            SPECIALIZATION, {"num_warps": num_warps, "target": "emulator", "num_stages": 3, **options})
    loops = sum(isinstance(op, For) for op in kernel.body.ops)
    return sum(isinstance(op, WarpgroupMma) for op in kernel.walk()) - 2 * loops


def test_off_by_default_and_on_where_asked_and_the_tiles_fit_registers():
    assert ahead_loops(64, (128, 64), 8) == 0
    assert ahead_loops(64, (128, 64), 8, causal=True, dot_ahead=True) == 2  # 2 x 32 + 32 registers a thread
    assert ahead_loops(128, (128, 128), 8, dot_ahead=True) == 1  # 2 x 64 + 64
    assert ahead_loops(64, (128, 128), 4, dot_ahead=True) == 0  # 2 x 128 + 64: more than a thread's budget


def test_dot_ahead_must_be_a_bool():
    with pytest.raises(ValueError, match="dot_ahead must be True or False"):
        compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (64, 64), False),
                       SPECIALIZATION, {"num_warps": 4, "target": "emulator", "num_stages": 3, "dot_ahead": 1})


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("head_dim,block,num_warps,stages,causal", [(64, (128, 64), 4, 4, False),
                                                                      (64, (128, 64), 4, 4, True),
                                                                      (128, (128, 128), 8, 3, False)])
def test_tightest_benchmark_configs_assemble_without_spills(head_dim, block, num_warps, stages, causal):
    """benchmarks/highlevel_attention.py's configs with the most accumulator registers a
    thread, with dot_ahead=True: two S tiles in flight and no spills."""
    compiled = attention_example.attention_kernel.compile(signature=SIGNATURE,
                                                          constexprs=constexprs(head_dim, block, causal),
                                                          num_warps=num_warps, num_stages=stages,
                                                          specialization=SPECIALIZATION, dot_ahead=True)
    assert compiled.asm["layout"].count("= warpgroup_mma ") == 3 * (2 if causal else 1)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


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
kernel @chain(%q_ptr: *fp16, %k_ptr: *fp16, %v_ptr: *fp16, %out_ptr: *fp32, %N: i32) num_warps=4 {
  %offs_m = arange [start=0 end=64] : tensor<64xi32>
  %offs_n = arange [start=0 end=16] : tensor<16xi32>
  %offs_d = arange [start=0 end=16] : tensor<16xi32>
  %8 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %9 = constant [value=16] : tensor<64x1xi32>
  %10 = binary [kind=mul] %8, %9 : tensor<64x1xi32>
  %11 = splat %q_ptr : tensor<64x1x*fp16>
  %12 = add_ptr %11, %10 : tensor<64x1x*fp16>
  %13 = expand_dims [axis=0] %offs_d : tensor<1x16xi32>
  %14 = broadcast %12 : tensor<64x16x*fp16>
  %15 = broadcast %13 : tensor<64x16xi32>
  %16 = add_ptr %14, %15 : tensor<64x16x*fp16>
  %17 = convert_layout %16 : tensor<64x16x*fp16, #L0>
  %18 = load %17 : tensor<64x16xfp16, #L0>
  %q = convert_layout %18 : tensor<64x16xfp16>
  %20 = expand_dims [axis=1] %offs_d : tensor<16x1xi32>
  %21 = splat %k_ptr : tensor<16x1x*fp16>
  %22 = add_ptr %21, %20 : tensor<16x1x*fp16>
  %23 = expand_dims [axis=0] %offs_n : tensor<1x16xi32>
  %24 = constant [value=16] : tensor<1x16xi32>
  %25 = binary [kind=mul] %23, %24 : tensor<1x16xi32>
  %26 = broadcast %22 : tensor<16x16x*fp16>
  %27 = broadcast %25 : tensor<16x16xi32>
  %kt_ptrs = add_ptr %26, %27 : tensor<16x16x*fp16>
  %29 = expand_dims [axis=1] %offs_n : tensor<16x1xi32>
  %30 = constant [value=16] : tensor<16x1xi32>
  %31 = binary [kind=mul] %29, %30 : tensor<16x1xi32>
  %32 = splat %v_ptr : tensor<16x1x*fp16>
  %33 = add_ptr %32, %31 : tensor<16x1x*fp16>
  %34 = expand_dims [axis=0] %offs_d : tensor<1x16xi32>
  %35 = broadcast %33 : tensor<16x16x*fp16>
  %36 = broadcast %34 : tensor<16x16xi32>
  %v_ptrs = add_ptr %35, %36 : tensor<16x16x*fp16>
  %acc = constant [value=0.0] : tensor<64x16xfp32>
  %39 = constant [value=0] : i32
  %40 = constant [value=16] : i32
  %a_smem = allocate_shared_memory : shared<64x16xfp16, #L1>
  shared_store %a_smem, %q
  %b_smem = allocate_shared_memory : shared<3x16x16xfp16, #L2>
  %b_smem_43 = allocate_shared_memory : shared<3x16x16xfp16, #L3>
  %44 = constant [value=256] : tensor<16x16xi32>
  %45 = constant [value=256] : tensor<16x16xi32>
  %46 = constant [value=0] : i32
  %kt_ptrs_47 = add_ptr %kt_ptrs, %44 : tensor<16x16x*fp16>
  %v_ptrs_48 = add_ptr %v_ptrs, %45 : tensor<16x16x*fp16>
  %49 = compare [predicate=lt] %39, %N : i1
  if %49 {
    %b_smem_50 = shared_index %b_smem, %46 : shared<16x16xfp16, #L4>
    %51 = convert_layout %kt_ptrs : tensor<16x16x*fp16, #L5>
    async_copy_global_to_shared %b_smem_50, %51
    %b_smem_52 = shared_index %b_smem_43, %46 : shared<16x16xfp16, #L6>
    %53 = convert_layout %v_ptrs : tensor<16x16x*fp16, #L7>
    async_copy_global_to_shared %b_smem_52, %53
    yield
  } {
    yield
  }
  async_copy_commit_group
  %54 = constant [value=16] : i32
  %55 = binary [kind=add] %39, %54 : i32
  %56 = constant [value=1] : i32
  %kt_ptrs_57 = add_ptr %kt_ptrs_47, %44 : tensor<16x16x*fp16>
  %v_ptrs_58 = add_ptr %v_ptrs_48, %45 : tensor<16x16x*fp16>
  %59 = compare [predicate=lt] %55, %N : i1
  if %59 {
    %b_smem_60 = shared_index %b_smem, %56 : shared<16x16xfp16, #L4>
    %61 = convert_layout %kt_ptrs_47 : tensor<16x16x*fp16, #L5>
    async_copy_global_to_shared %b_smem_60, %61
    %b_smem_62 = shared_index %b_smem_43, %56 : shared<16x16xfp16, #L6>
    %63 = convert_layout %v_ptrs_48 : tensor<16x16x*fp16, #L7>
    async_copy_global_to_shared %b_smem_62, %63
    yield
  } {
    yield
  }
  async_copy_commit_group
  %64 = constant [value=0] : i32
  async_copy_wait_group [pending=1]
  %65 = constant [value=0] : i32
  %b_smem_66 = shared_index %b_smem, %65 : shared<16x16xfp16, #L4>
  fence_async_shared
  %67 = constant [value=0.0] : tensor<64x16xfp32>
  %68 = convert_layout %67 : tensor<64x16xfp32, #L8>
  %s = warpgroup_mma [is_async=True] %a_smem, %b_smem_66, %68 : tensor<64x16xfp32, #L8>
  %kt_ptrs_70, %v_ptrs_71, %acc_72, %slot, %ahead, %ahead_75, %s_76 = for [schedule={num_stages=3}] %39, %N, %40, %kt_ptrs, %v_ptrs, %acc, %64, %kt_ptrs_57, %v_ptrs_58, %s : tensor<16x16x*fp16>, tensor<16x16x*fp16>, tensor<64x16xfp32>, i32, tensor<16x16x*fp16>, tensor<16x16x*fp16>, tensor<64x16xfp32, #L8> {
    ^(%start: i32, %kt_ptrs_78: tensor<16x16x*fp16>, %v_ptrs_79: tensor<16x16x*fp16>, %acc_80: tensor<64x16xfp32>, %slot_81: i32, %ahead_82: tensor<16x16x*fp16>, %ahead_83: tensor<16x16x*fp16>, %s_84: tensor<64x16xfp32, #L8>)
    %85 = convert_layout %kt_ptrs_78 : tensor<16x16x*fp16, #L5>
    async_copy_wait_group
    %b_smem_86 = shared_index %b_smem, %slot_81 : shared<16x16xfp16, #L4>
    %b_smem_87 = shared_index %b_smem_43, %slot_81 : shared<16x16xfp16, #L6>
    fence_async_shared
    %88 = constant [value=0.0] : tensor<64x16xfp32>
    %89 = convert_layout %88 : tensor<64x16xfp32, #L8>
    %90 = constant [value=1] : i32
    %91 = constant [value=3] : i32
    %92 = binary [kind=add] %slot_81, %90 : i32
    %slot_93 = binary [kind=mod] %92, %91 : i32
    %b_smem_94 = shared_index %b_smem, %slot_93 : shared<16x16xfp16, #L4>
    %s_95 = warpgroup_mma [is_async=True] %a_smem, %b_smem_94, %89 : tensor<64x16xfp32, #L8>
    %s_96 = warpgroup_mma_wait [pending=1] %s_84 : tensor<64x16xfp32, #L8>
    %acc_97 = convert_layout %acc_80 : tensor<64x16xfp32, #L8>
    %acc_98 = warpgroup_mma_wait [pending=1] %acc_97 : tensor<64x16xfp32, #L8>
    %acc_99 = convert_layout %acc_98 : tensor<64x16xfp32>
    %s_100 = convert_layout %s_96 : tensor<64x16xfp32>
    %101 = constant [value=0.5] : tensor<64x16xfp32>
    %acc_102 = binary [kind=mul] %acc_99, %101 : tensor<64x16xfp32>
    %103 = cast %s_100 : tensor<64x16xfp16>
    %104 = convert_layout %v_ptrs_79 : tensor<16x16x*fp16, #L7>
    %105 = convert_layout %acc_102 : tensor<64x16xfp32, #L8>
    %acc_106 = warpgroup_mma [is_async=True] %103, %b_smem_87, %105 : tensor<64x16xfp32, #L8>
    %107 = constant [value=32] : i32
    %108 = binary [kind=add] %start, %107 : i32
    %109 = constant [value=2] : i32
    %110 = binary [kind=add] %slot_81, %109 : i32
    %111 = constant [value=3] : i32
    %112 = binary [kind=mod] %110, %111 : i32
    %113 = constant [value=256] : tensor<16x16xi32>
    %114 = constant [value=256] : tensor<16x16xi32>
    %ahead_115 = add_ptr %ahead_82, %113 : tensor<16x16x*fp16>
    %ahead_116 = add_ptr %ahead_83, %114 : tensor<16x16x*fp16>
    %117 = compare [predicate=lt] %108, %N : i1
    if %117 {
      %b_smem_118 = shared_index %b_smem, %112 : shared<16x16xfp16, #L4>
      %119 = convert_layout %ahead_82 : tensor<16x16x*fp16, #L5>
      async_copy_global_to_shared %b_smem_118, %119
      %b_smem_120 = shared_index %b_smem_43, %112 : shared<16x16xfp16, #L6>
      %121 = convert_layout %ahead_83 : tensor<16x16x*fp16, #L7>
      async_copy_global_to_shared %b_smem_120, %121
      yield
    } {
      yield
    }
    async_copy_commit_group
    %acc_122 = convert_layout %acc_106 : tensor<64x16xfp32>
    %123 = constant [value=256] : tensor<16x16xi32>
    %kt_ptrs_124 = add_ptr %kt_ptrs_78, %123 : tensor<16x16x*fp16>
    %125 = constant [value=256] : tensor<16x16xi32>
    %v_ptrs_126 = add_ptr %v_ptrs_79, %125 : tensor<16x16x*fp16>
    %127 = constant [value=1] : i32
    %128 = binary [kind=add] %slot_81, %127 : i32
    %129 = constant [value=3] : i32
    %slot_130 = binary [kind=mod] %128, %129 : i32
    yield %kt_ptrs_124, %v_ptrs_126, %acc_122, %slot_130, %ahead_115, %ahead_116, %s_95
  }
  %s_131 = warpgroup_mma_wait [pending=0] %s_76 : tensor<64x16xfp32, #L8>
  %acc_132 = convert_layout %acc_72 : tensor<64x16xfp32, #L8>
  %acc_133 = warpgroup_mma_wait [pending=0] %acc_132 : tensor<64x16xfp32, #L8>
  %acc_134 = convert_layout %acc_133 : tensor<64x16xfp32>
  %135 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %136 = constant [value=16] : tensor<64x1xi32>
  %137 = binary [kind=mul] %135, %136 : tensor<64x1xi32>
  %138 = splat %out_ptr : tensor<64x1x*fp32>
  %139 = add_ptr %138, %137 : tensor<64x1x*fp32>
  %140 = expand_dims [axis=0] %offs_d : tensor<1x16xi32>
  %141 = broadcast %139 : tensor<64x16x*fp32>
  %142 = broadcast %140 : tensor<64x16xi32>
  %143 = add_ptr %141, %142 : tensor<64x16x*fp32>
  %144 = convert_layout %143 : tensor<64x16x*fp32, #L9>
  %145 = convert_layout %acc_134 : tensor<64x16xfp32, #L9>
  store %144, %145
}
"""
