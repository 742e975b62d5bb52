"""pipeline_dot_loops, for a pointer (cp.async) dot loop written
`tl.range(num_stages=2, warp_specialize=True)` (pipeline_copy_warp_specialize): full and
empty barriers per slot, the full ones counting the producer warpgroup's 128 threads, the
empty ones the 4 consumer warps; a warp_specialize whose default partition (the kernel's
warps) waits on the slot's full barrier, runs the wgmma from the slot and releases the
previous iteration's slot per warp, carrying no pointers; and whose one worker (4 warps)
waits for each slot's release, copies into it with the loads' masks (the layouts of the
pointers and masks made again over its 4 warps) and arrives by
async_copy_mbarrier_arrive. The golden text is `print_kernel` output after the pass,
verified; WEFT_ACCEPT=1 rewrites it."""

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def split_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] * BLOCK_N + offs_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=2, warp_specialize=True):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
        acc = tl.dot(a, tl.load(b_ptrs), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * BLOCK_N
    tl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


def until_split():
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    kernel = build_kernel(split_matmul, signature, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32), 4,
                          {name: "divisible_by_16" for name in signature}, language="highlevel")
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "pipeline_dot_loops":
            return kernel
    raise AssertionError("pipeline_dot_loops is not in TILE_PASSES")


def test_the_split_of_a_pointer_loop():
    check_golden(print_kernel(until_split()), "SPLIT")
SPLIT = """\
#L0 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,1,0), (0,2,8), (0,4,16), (0,8,0), (0,16,0), (0,32,0), (1,0,0)]} -> [2x64x32]
#L1 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,0,32), (0,1,8), (0,2,16), (0,4,32), (0,8,0), (0,16,0), (1,0,0)]} -> [2x32x64]
#L2 = {offset=[(1,0)]} -> [2x1]
#L3 = {} -> [1]
#L4 = {register=[(0,1), (0,2), (0,4), (32,0)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [64x32]
#L5 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L6 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L7 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L8 = {register=[(0,1), (0,2), (0,4), (16,0)] lane=[(0,8), (0,16), (0,32), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [32x64]
#L9 = {register=[(0,1), (0,2), (8,0), (16,0), (32,0)] lane=[(0,4), (0,8), (0,16), (0,32), (1,0)] warp=[(2,0), (4,0)]} -> [64x64]
kernel @split_matmul(%a_ptr: *fp16, %b_ptr: *fp16, %c_ptr: *fp32, %K: i32) num_warps=4 {
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
  %a_smem = allocate_shared_memory : shared<2x64x32xfp16, #L0>
  %b_smem = allocate_shared_memory : shared<2x32x64xfp16, #L1>
  %bars = allocate_shared_memory : shared<2x1xi64, #L2>
  %empties = allocate_shared_memory : shared<2x1xi64, #L2>
  %32 = constant [value=0] : i32
  %bar = shared_index %bars, %32 : shared<1xi64, #L3>
  mbarrier_init [count=128] %bar
  %34 = constant [value=0] : i32
  %empty = shared_index %empties, %34 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty
  %36 = constant [value=1] : i32
  %bar_37 = shared_index %bars, %36 : shared<1xi64, #L3>
  mbarrier_init [count=128] %bar_37
  %38 = constant [value=1] : i32
  %empty_39 = shared_index %empties, %38 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty_39
  %acc_40 = warp_specialize [worker_num_warps=(4,) worker_num_regs=(88,) default_num_regs=240] %26, %K, %27, %bars, %a_smem, %b_smem, %empties, %a_ptr, %b_ptr : tensor<64x64xfp32> {
    ^(%41: i32, %K_42: i32, %43: i32, %bars_44: shared<2x1xi64, #L2>, %a_smem_45: shared<2x64x32xfp16, #L0>, %b_smem_46: shared<2x32x64xfp16, #L1>, %empties_47: shared<2x1xi64, #L2>, %a_ptr_48: *fp16, %b_ptr_49: *fp16)
    %offs_k_50 = arange [start=0 end=32] : tensor<32xi32>
    %acc_51 = constant [value=0.0] : tensor<64x64xfp32>
    %52 = constant [value=0] : i32
    %53 = constant [value=0] : i32
    %acc_54, %slot, %phase = for [schedule={num_stages=2 warp_specialize=True}] %41, %K_42, %43, %acc_51, %52, %53 : tensor<64x64xfp32>, i32, i32 {
      ^(%k: i32, %acc_58: tensor<64x64xfp32>, %slot_59: i32, %phase_60: i32)
      %61 = expand_dims [axis=0] %offs_k_50 : tensor<1x32xi32>
      %62 = binary [kind=sub] %K_42, %k : i32
      %63 = splat %62 : tensor<1x32xi32>
      %64 = compare [predicate=lt] %61, %63 : tensor<1x32xi1>
      %65 = broadcast %64 : tensor<64x32xi1>
      %66 = constant [value=0.0] : tensor<64x32xfp16>
      %67 = convert_layout %65 : tensor<64x32xi1, #L4>
      %68 = convert_layout %66 : tensor<64x32xfp16, #L4>
      %bar_69 = shared_index %bars_44, %slot_59 : shared<1xi64, #L3>
      mbarrier_wait %bar_69, %phase_60
      %a_smem_70 = shared_index %a_smem_45, %slot_59 : shared<64x32xfp16, #L5>
      %b_smem_71 = shared_index %b_smem_46, %slot_59 : shared<32x64xfp16, #L6>
      fence_async_shared
      %72 = convert_layout %acc_58 : tensor<64x64xfp32, #L7>
      %acc_73 = warpgroup_mma [is_async=True] %a_smem_70, %b_smem_71, %72 : tensor<64x64xfp32, #L7>
      %74 = compare [predicate=ne] %k, %41 : i1
      %75 = constant [value=1] : i32
      %76 = binary [kind=add] %slot_59, %75 : i32
      %77 = constant [value=2] : i32
      %78 = binary [kind=mod] %76, %77 : i32
      %empty_79 = shared_index %empties_47, %78 : shared<1xi64, #L3>
      mbarrier_arrive [per_warp=True] %empty_79, %74
      %acc_80 = warpgroup_mma_wait [pending=0] %acc_73 : tensor<64x64xfp32, #L7>
      %acc_81 = convert_layout %acc_80 : tensor<64x64xfp32>
      %82 = constant [value=32] : tensor<64x32xi32>
      %83 = constant [value=2048] : tensor<32x64xi32>
      %84 = constant [value=1] : i32
      %85 = binary [kind=add] %slot_59, %84 : i32
      %86 = constant [value=2] : i32
      %slot_87 = binary [kind=mod] %85, %86 : i32
      %88 = constant [value=0] : i32
      %89 = compare [predicate=eq] %slot_87, %88 : i1
      %90 = cast %89 : i32
      %phase_91 = binary [kind=xor] %phase_60, %90 : i32
      yield %acc_81, %slot_87, %phase_91
    }
    yield %acc_54
  } {
    ^(%92: i32, %K_93: i32, %94: i32, %bars_95: shared<2x1xi64, #L2>, %a_smem_96: shared<2x64x32xfp16, #L0>, %b_smem_97: shared<2x32x64xfp16, #L1>, %empties_98: shared<2x1xi64, #L2>, %a_ptr_99: *fp16, %b_ptr_100: *fp16)
    %offs_m_101 = arange [start=0 end=64] : tensor<64xi32>
    %offs_n_102 = arange [start=0 end=64] : tensor<64xi32>
    %offs_k_103 = arange [start=0 end=32] : tensor<32xi32>
    %104 = expand_dims [axis=1] %offs_m_101 : tensor<64x1xi32>
    %105 = splat %K_93 : tensor<64x1xi32>
    %106 = binary [kind=mul] %104, %105 : tensor<64x1xi32>
    %107 = splat %a_ptr_99 : tensor<64x1x*fp16>
    %108 = add_ptr %107, %106 : tensor<64x1x*fp16>
    %109 = expand_dims [axis=0] %offs_k_103 : tensor<1x32xi32>
    %110 = broadcast %108 : tensor<64x32x*fp16>
    %111 = broadcast %109 : tensor<64x32xi32>
    %a_ptrs_112 = add_ptr %110, %111 : tensor<64x32x*fp16>
    %113 = expand_dims [axis=1] %offs_k_103 : tensor<32x1xi32>
    %114 = constant [value=64] : tensor<32x1xi32>
    %115 = binary [kind=mul] %113, %114 : tensor<32x1xi32>
    %116 = splat %b_ptr_100 : tensor<32x1x*fp16>
    %117 = add_ptr %116, %115 : tensor<32x1x*fp16>
    %118 = expand_dims [axis=0] %offs_n_102 : tensor<1x64xi32>
    %119 = broadcast %117 : tensor<32x64x*fp16>
    %120 = broadcast %118 : tensor<32x64xi32>
    %b_ptrs_121 = add_ptr %119, %120 : tensor<32x64x*fp16>
    %122 = constant [value=0] : i32
    %123 = constant [value=32] : tensor<64x32xi32>
    %124 = constant [value=2048] : tensor<32x64xi32>
    %a_ptrs_125, %b_ptrs_126, %slot_127, %phase_128 = for %92, %K_93, %94, %a_ptrs_112, %b_ptrs_121, %122, %122 : tensor<64x32x*fp16>, tensor<32x64x*fp16>, i32, i32 {
      ^(%k_129: i32, %a_ptrs_130: tensor<64x32x*fp16>, %b_ptrs_131: tensor<32x64x*fp16>, %slot_132: i32, %phase_133: i32)
      %134 = constant [value=1] : i32
      %released = binary [kind=xor] %phase_133, %134 : i32
      %empty_136 = shared_index %empties_98, %slot_132 : shared<1xi64, #L3>
      mbarrier_wait %empty_136, %released
      %a_smem_137 = shared_index %a_smem_96, %slot_132 : shared<64x32xfp16, #L5>
      %138 = expand_dims [axis=0] %offs_k_103 : tensor<1x32xi32>
      %139 = binary [kind=sub] %K_93, %k_129 : i32
      %140 = splat %139 : tensor<1x32xi32>
      %141 = compare [predicate=lt] %138, %140 : tensor<1x32xi1>
      %142 = broadcast %141 : tensor<64x32xi1>
      %143 = convert_layout %142 : tensor<64x32xi1, #L4>
      %144 = convert_layout %a_ptrs_130 : tensor<64x32x*fp16, #L4>
      async_copy_global_to_shared %a_smem_137, %144, %143
      %b_smem_145 = shared_index %b_smem_97, %slot_132 : shared<32x64xfp16, #L6>
      %146 = convert_layout %b_ptrs_131 : tensor<32x64x*fp16, #L8>
      async_copy_global_to_shared %b_smem_145, %146
      %bar_147 = shared_index %bars_95, %slot_132 : shared<1xi64, #L3>
      async_copy_mbarrier_arrive %bar_147
      %a_ptrs_148 = add_ptr %a_ptrs_130, %123 : tensor<64x32x*fp16>
      %b_ptrs_149 = add_ptr %b_ptrs_131, %124 : tensor<32x64x*fp16>
      %150 = constant [value=1] : i32
      %151 = binary [kind=add] %slot_132, %150 : i32
      %152 = constant [value=2] : i32
      %slot_153 = binary [kind=mod] %151, %152 : i32
      %154 = constant [value=0] : i32
      %155 = compare [predicate=eq] %slot_153, %154 : i1
      %156 = cast %155 : i32
      %phase_157 = binary [kind=xor] %phase_133, %156 : i32
      yield %a_ptrs_148, %b_ptrs_149, %slot_153, %phase_157
    }
    yield
  }
  %158 = constant [value=0] : i32
  %bar_159 = shared_index %bars, %158 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_159
  %160 = constant [value=0] : i32
  %empty_161 = shared_index %empties, %160 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_161
  %162 = constant [value=1] : i32
  %bar_163 = shared_index %bars, %162 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_163
  %164 = constant [value=1] : i32
  %empty_165 = shared_index %empties, %164 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_165
  %166 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %167 = constant [value=64] : tensor<64x1xi32>
  %168 = binary [kind=mul] %166, %167 : tensor<64x1xi32>
  %169 = splat %c_ptr : tensor<64x1x*fp32>
  %170 = add_ptr %169, %168 : tensor<64x1x*fp32>
  %171 = expand_dims [axis=0] %offs_n : tensor<1x64xi32>
  %172 = broadcast %170 : tensor<64x64x*fp32>
  %173 = broadcast %171 : tensor<64x64xi32>
  %174 = add_ptr %172, %173 : tensor<64x64x*fp32>
  %175 = convert_layout %174 : tensor<64x64x*fp32, #L9>
  %176 = convert_layout %acc_40 : tensor<64x64xfp32, #L9>
  store %175, %176
}
"""
