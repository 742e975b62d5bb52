"""pipeline_dot_loops: a dot loop with tl.range(num_stages=3) gets rings of 3 buffers, a
prologue of 2 commit groups (each copy only where its iteration exists), a wait_group(1)
before the dot, a warpgroup_mma_wait(1) after it (the last iteration's wgmma retired, this
one's in flight), then the copies of iteration i + 2 into slot (slot + 2) % 3, the slot the
retired wgmma read; a warpgroup_mma_wait(0) after the loop gives the accumulator the store
reads. The golden text is `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites it.
"""

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (AllocateSharedMemory, AsyncCopyCommitGroup, AsyncCopyWaitGroup, ConvertLayout,
                              For, Store, WarpgroupMmaWait)
from weft.compiler.passes.pipeline_dot_loops import pipeline_dot_loops
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def staged_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  STAGES: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] * BLOCK_N + offs_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
        acc = tl.dot(a, tl.load(b_ptrs), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * BLOCK_N
    tl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


def until_pipelined(stages: int):
    """staged_matmul after the passes up to pipeline_dot_loops, verified after each."""
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    kernel = build_kernel(staged_matmul, signature, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, STAGES=stages), 4,
                          {name: "divisible_by_16" for name in signature}, language="highlevel")
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "pipeline_dot_loops":
            return kernel
    raise AssertionError("pipeline_dot_loops is not in TILE_PASSES")


def test_the_pass_sits_right_after_accelerate_dots():
    names = [name for name, _ in pipeline.TILE_PASSES]
    assert names.index("pipeline_dot_loops") == names.index("accelerate_dots") + 1
    assert dict(pipeline.TILE_PASSES)["pipeline_dot_loops"] is pipeline_dot_loops


def test_rings_prologue_and_wait_counts():
    for stages in (2, 3, 4):
        kernel = until_pipelined(stages)
        top = kernel.body.ops
        rings = [op.result.type.shape for op in top if isinstance(op, AllocateSharedMemory)]
        assert rings == [(stages, 64, 32), (stages, 32, 64)]
        loop = next(op for op in top if isinstance(op, For))
        prologue = top[:top.index(loop)]
        assert sum(isinstance(op, AsyncCopyCommitGroup) for op in prologue) == stages - 1
        waits = [op.pending for op in loop.body.walk() if isinstance(op, AsyncCopyWaitGroup)]
        assert waits == [stages - 2]
        in_loop = [op.pending for op in loop.body.walk() if isinstance(op, WarpgroupMmaWait)]
        if stages == 2:  # keeps its wait(0) in the loop (see the pass)
            assert in_loop == [0]
            continue
        assert in_loop == [1]
        # After the loop: wait(0) on its accumulator, and the store reads what that wait returns.
        after = top[top.index(loop) + 1:]
        (final,) = [op for op in after if isinstance(op, WarpgroupMmaWait)]
        (reader,) = [op for op in after if loop.results[2] in op.uses()]
        assert isinstance(reader, ConvertLayout) and final.deps == (reader.result,) and final.pending == 0
        (store,) = [op for op in after if isinstance(op, Store)]
        converts = {op.result: op.operand for op in after if isinstance(op, ConvertLayout)}
        value = store.value
        while value in converts:
            value = converts[value]
        assert (value,) == final.results


def test_without_num_stages_the_loop_is_unchanged():
    kernel = until_pipelined(1)
    assert pipeline_dot_loops(kernel) is kernel


def test_golden():
    check_golden(print_kernel(until_pipelined(3)), "STAGED_MATMUL_3_STAGES")


STAGED_MATMUL_3_STAGES = """\
#L0 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,1,0), (0,2,8), (0,4,16), (0,8,0), (0,16,0), (0,32,0), (1,0,0), (2,0,0)]} -> [4x64x32]
#L1 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,0,32), (0,1,8), (0,2,16), (0,4,32), (0,8,0), (0,16,0), (1,0,0), (2,0,0)]} -> [4x32x64]
#L2 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L3 = {register=[(0,1), (0,2), (0,4), (32,0)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [64x32]
#L4 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L5 = {register=[(0,1), (0,2), (0,4), (16,0)] lane=[(0,8), (0,16), (0,32), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [32x64]
#L6 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L7 = {register=[(0,1), (0,2), (8,0), (16,0), (32,0)] lane=[(0,4), (0,8), (0,16), (0,32), (1,0)] warp=[(2,0), (4,0)]} -> [64x64]
kernel @staged_matmul(%a_ptr: *fp16, %b_ptr: *fp16, %c_ptr: *fp32, %K: i32) num_warps=4 {
  %offs_m = arange [start=0 end=64] : tensor<64xi32>
  %offs_n = arange [start=0 end=64] : tensor<64xi32>
  %offs_k = arange [start=0 end=32] : tensor<32xi32>
  %7 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %8 = splat %K : tensor<64x1xi32>
  %9 = binary [kind=mul] %7, %8 : tensor<64x1xi32>
  %10 = splat %a_ptr : tensor<64x1x*fp16>
  %11 = add_ptr %10, %9 : tensor<64x1x*fp16>
  %12 = expand_dims [axis=0] %offs_k : tensor<1x32xi32>
  %13 = broadcast %11 : tensor<64x32x*fp16>
  %14 = broadcast %12 : tensor<64x32xi32>
  %a_ptrs = add_ptr %13, %14 : tensor<64x32x*fp16>
  %16 = expand_dims [axis=1] %offs_k : tensor<32x1xi32>
  %17 = constant [value=64] : tensor<32x1xi32>
  %18 = binary [kind=mul] %16, %17 : tensor<32x1xi32>
  %19 = splat %b_ptr : tensor<32x1x*fp16>
  %20 = add_ptr %19, %18 : tensor<32x1x*fp16>
  %21 = expand_dims [axis=0] %offs_n : tensor<1x64xi32>
  %22 = broadcast %20 : tensor<32x64x*fp16>
  %23 = broadcast %21 : tensor<32x64xi32>
  %b_ptrs = add_ptr %22, %23 : tensor<32x64x*fp16>
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %26 = constant [value=0] : i32
  %27 = constant [value=32] : i32
  %a_smem = allocate_shared_memory : shared<3x64x32xfp16, #L0>
  %b_smem = allocate_shared_memory : shared<3x32x64xfp16, #L1>
  %30 = constant [value=32] : tensor<64x32xi32>
  %31 = constant [value=2048] : tensor<32x64xi32>
  %32 = constant [value=0] : i32
  %a_ptrs_33 = add_ptr %a_ptrs, %30 : tensor<64x32x*fp16>
  %b_ptrs_34 = add_ptr %b_ptrs, %31 : tensor<32x64x*fp16>
  %35 = compare [predicate=lt] %26, %K : i1
  if %35 {
    %a_smem_36 = shared_index %a_smem, %32 : shared<64x32xfp16, #L2>
    %37 = expand_dims [axis=0] %offs_k : tensor<1x32xi32>
    %38 = binary [kind=sub] %K, %26 : i32
    %39 = splat %38 : tensor<1x32xi32>
    %40 = compare [predicate=lt] %37, %39 : tensor<1x32xi1>
    %41 = broadcast %40 : tensor<64x32xi1>
    %42 = convert_layout %41 : tensor<64x32xi1, #L3>
    %43 = convert_layout %a_ptrs : tensor<64x32x*fp16, #L3>
    async_copy_global_to_shared %a_smem_36, %43, %42
    %b_smem_44 = shared_index %b_smem, %32 : shared<32x64xfp16, #L4>
    %45 = convert_layout %b_ptrs : tensor<32x64x*fp16, #L5>
    async_copy_global_to_shared %b_smem_44, %45
    yield
  } {
    yield
  }
  async_copy_commit_group
  %46 = constant [value=32] : i32
  %47 = binary [kind=add] %26, %46 : i32
  %48 = constant [value=1] : i32
  %a_ptrs_49 = add_ptr %a_ptrs_33, %30 : tensor<64x32x*fp16>
  %b_ptrs_50 = add_ptr %b_ptrs_34, %31 : tensor<32x64x*fp16>
  %51 = compare [predicate=lt] %47, %K : i1
  if %51 {
    %a_smem_52 = shared_index %a_smem, %48 : shared<64x32xfp16, #L2>
    %53 = expand_dims [axis=0] %offs_k : tensor<1x32xi32>
    %54 = binary [kind=sub] %K, %47 : i32
    %55 = splat %54 : tensor<1x32xi32>
    %56 = compare [predicate=lt] %53, %55 : tensor<1x32xi1>
    %57 = broadcast %56 : tensor<64x32xi1>
    %58 = convert_layout %57 : tensor<64x32xi1, #L3>
    %59 = convert_layout %a_ptrs_33 : tensor<64x32x*fp16, #L3>
    async_copy_global_to_shared %a_smem_52, %59, %58
    %b_smem_60 = shared_index %b_smem, %48 : shared<32x64xfp16, #L4>
    %61 = convert_layout %b_ptrs_34 : tensor<32x64x*fp16, #L5>
    async_copy_global_to_shared %b_smem_60, %61
    yield
  } {
    yield
  }
  async_copy_commit_group
  %62 = constant [value=0] : i32
  %a_ptrs_63, %b_ptrs_64, %acc_65, %slot, %ahead, %ahead_68 = for [schedule={num_stages=3}] %26, %K, %27, %a_ptrs, %b_ptrs, %acc, %62, %a_ptrs_49, %b_ptrs_50 : tensor<64x32x*fp16>, tensor<32x64x*fp16>, tensor<64x64xfp32>, i32, tensor<64x32x*fp16>, tensor<32x64x*fp16> {
    ^(%k: i32, %a_ptrs_70: tensor<64x32x*fp16>, %b_ptrs_71: tensor<32x64x*fp16>, %acc_72: tensor<64x64xfp32>, %slot_73: i32, %ahead_74: tensor<64x32x*fp16>, %ahead_75: tensor<32x64x*fp16>)
    %76 = expand_dims [axis=0] %offs_k : tensor<1x32xi32>
    %77 = binary [kind=sub] %K, %k : i32
    %78 = splat %77 : tensor<1x32xi32>
    %79 = compare [predicate=lt] %76, %78 : tensor<1x32xi1>
    %80 = broadcast %79 : tensor<64x32xi1>
    %81 = constant [value=0.0] : tensor<64x32xfp16>
    %82 = convert_layout %a_ptrs_70 : tensor<64x32x*fp16, #L3>
    %83 = convert_layout %80 : tensor<64x32xi1, #L3>
    %84 = convert_layout %81 : tensor<64x32xfp16, #L3>
    %85 = convert_layout %b_ptrs_71 : tensor<32x64x*fp16, #L5>
    async_copy_wait_group [pending=1]
    %a_smem_86 = shared_index %a_smem, %slot_73 : shared<64x32xfp16, #L2>
    %b_smem_87 = shared_index %b_smem, %slot_73 : shared<32x64xfp16, #L4>
    fence_async_shared
    %88 = convert_layout %acc_72 : tensor<64x64xfp32, #L6>
    %acc_89 = warpgroup_mma [is_async=True] %a_smem_86, %b_smem_87, %88 : tensor<64x64xfp32, #L6>
    %acc_90 = warpgroup_mma_wait [pending=1] %acc_89 : tensor<64x64xfp32, #L6>
    %91 = constant [value=64] : i32
    %92 = binary [kind=add] %k, %91 : i32
    %93 = constant [value=2] : i32
    %94 = binary [kind=add] %slot_73, %93 : i32
    %95 = constant [value=3] : i32
    %96 = binary [kind=mod] %94, %95 : i32
    %97 = constant [value=32] : tensor<64x32xi32>
    %98 = constant [value=2048] : tensor<32x64xi32>
    %ahead_99 = add_ptr %ahead_74, %97 : tensor<64x32x*fp16>
    %ahead_100 = add_ptr %ahead_75, %98 : tensor<32x64x*fp16>
    %101 = compare [predicate=lt] %92, %K : i1
    if %101 {
      %a_smem_102 = shared_index %a_smem, %96 : shared<64x32xfp16, #L2>
      %103 = expand_dims [axis=0] %offs_k : tensor<1x32xi32>
      %104 = binary [kind=sub] %K, %92 : i32
      %105 = splat %104 : tensor<1x32xi32>
      %106 = compare [predicate=lt] %103, %105 : tensor<1x32xi1>
      %107 = broadcast %106 : tensor<64x32xi1>
      %108 = convert_layout %107 : tensor<64x32xi1, #L3>
      %109 = convert_layout %ahead_74 : tensor<64x32x*fp16, #L3>
      async_copy_global_to_shared %a_smem_102, %109, %108
      %b_smem_110 = shared_index %b_smem, %96 : shared<32x64xfp16, #L4>
      %111 = convert_layout %ahead_75 : tensor<32x64x*fp16, #L5>
      async_copy_global_to_shared %b_smem_110, %111
      yield
    } {
      yield
    }
    async_copy_commit_group
    %acc_112 = convert_layout %acc_90 : tensor<64x64xfp32>
    %113 = constant [value=32] : tensor<64x32xi32>
    %a_ptrs_114 = add_ptr %a_ptrs_70, %113 : tensor<64x32x*fp16>
    %115 = constant [value=2048] : tensor<32x64xi32>
    %b_ptrs_116 = add_ptr %b_ptrs_71, %115 : tensor<32x64x*fp16>
    %117 = constant [value=1] : i32
    %118 = binary [kind=add] %slot_73, %117 : i32
    %119 = constant [value=3] : i32
    %slot_120 = binary [kind=mod] %118, %119 : i32
    yield %a_ptrs_114, %b_ptrs_116, %acc_112, %slot_120, %ahead_99, %ahead_100
  }
  %acc_121 = convert_layout %acc_65 : tensor<64x64xfp32, #L6>
  %acc_122 = warpgroup_mma_wait [pending=0] %acc_121 : tensor<64x64xfp32, #L6>
  %acc_123 = convert_layout %acc_122 : tensor<64x64xfp32>
  %124 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %125 = constant [value=64] : tensor<64x1xi32>
  %126 = binary [kind=mul] %124, %125 : tensor<64x1xi32>
  %127 = splat %c_ptr : tensor<64x1x*fp32>
  %128 = add_ptr %127, %126 : tensor<64x1x*fp32>
  %129 = expand_dims [axis=0] %offs_n : tensor<1x64xi32>
  %130 = broadcast %128 : tensor<64x64x*fp32>
  %131 = broadcast %129 : tensor<64x64xi32>
  %132 = add_ptr %130, %131 : tensor<64x64x*fp32>
  %133 = convert_layout %132 : tensor<64x64x*fp32, #L7>
  %134 = convert_layout %acc_123 : tensor<64x64xfp32, #L7>
  store %133, %134
}
"""
