"""pipeline_dot_loops on a loop whose dot operands are `desc.load`s (pipeline_tma_loops.py):
the boxes become rings that TMA fills S - 1 iterations ahead, one mbarrier per slot
(warp_specialize=False: the one-partition ring; the split is test_pipeline_tma_warp_specialize.py).

The golden text is `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites it.
"""

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def descriptor_dot_loop(a_desc, b_desc, c_ptr, K, STAGES: tl.constexpr):
    acc = tl.zeros([64, 64], tl.float32)
    for k in tl.range(0, K, 32, num_stages=STAGES, warp_specialize=False):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    tl.store(c_ptr + tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :], acc)


def until_pipelined(stages: int):
    signature = {"a_desc": "tensordesc<fp16[64,32]>", "b_desc": "tensordesc<fp16[32,64]>", "c_ptr": "*fp32",
                 "K": "i32"}
    kernel = build_kernel(descriptor_dot_loop, signature, {"STAGES": stages}, 4, {}, language="highlevel")
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "pipeline_dot_loops":
            return kernel
    raise AssertionError("pipeline_dot_loops is not in TILE_PASSES")


def test_three_stages_golden():
    check_golden(print_kernel(until_pipelined(3)), "THREE_STAGES")


THREE_STAGES = """\
#L0 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,1,0), (0,2,8), (0,4,16), (0,8,0), (0,16,0), (0,32,0), (1,0,0), (2,0,0)]} -> [4x64x32]
#L1 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,0,32), (0,1,8), (0,2,16), (0,4,32), (0,8,0), (0,16,0), (1,0,0), (2,0,0)]} -> [4x32x64]
#L2 = {offset=[(1,0), (2,0)]} -> [4x1]
#L3 = {} -> [1]
#L4 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L5 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L6 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L7 = {register=[(2,0), (4,0), (8,0), (16,0), (32,0)] lane=[(0,1), (0,2), (0,4), (0,8), (0,16)] warp=[(0,32), (1,0)]} -> [64x64]
kernel @descriptor_dot_loop(%a_desc: tensordesc<64x32xfp16>, %b_desc: tensordesc<32x64xfp16>, %c_ptr: *fp32, %K: i32) num_warps=4 {
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %5 = constant [value=0] : i32
  %6 = constant [value=32] : i32
  %7 = allocate_shared_memory : shared<3x64x32xfp16, #L0>
  %8 = allocate_shared_memory : shared<3x32x64xfp16, #L1>
  %bars = allocate_shared_memory : shared<3x1xi64, #L2>
  %empties = allocate_shared_memory : shared<3x1xi64, #L2>
  %11 = constant [value=0] : i32
  %bar = shared_index %bars, %11 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar
  %13 = constant [value=0] : i32
  %empty = shared_index %empties, %13 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty
  %15 = constant [value=1] : i32
  %bar_16 = shared_index %bars, %15 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar_16
  %17 = constant [value=1] : i32
  %empty_18 = shared_index %empties, %17 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty_18
  %19 = constant [value=2] : i32
  %bar_20 = shared_index %bars, %19 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar_20
  %21 = constant [value=2] : i32
  %empty_22 = shared_index %empties, %21 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty_22
  %23 = constant [value=0] : i32
  %24 = compare [predicate=lt] %5, %K : i1
  %bar_25 = shared_index %bars, %23 : shared<1xi64, #L3>
  mbarrier_expect [nbytes=8192] %bar_25, %24
  %26 = constant [value=0] : i32
  %27 = shared_index %7, %23 : shared<64x32xfp16, #L4>
  tma_async_copy_global_to_shared %a_desc, %26, %5, %bar_25, %27, %24
  %28 = constant [value=0] : i32
  %29 = shared_index %8, %23 : shared<32x64xfp16, #L5>
  tma_async_copy_global_to_shared %b_desc, %5, %28, %bar_25, %29, %24
  %30 = constant [value=32] : i32
  %31 = binary [kind=add] %5, %30 : i32
  %32 = constant [value=1] : i32
  %33 = compare [predicate=lt] %31, %K : i1
  %bar_34 = shared_index %bars, %32 : shared<1xi64, #L3>
  mbarrier_expect [nbytes=8192] %bar_34, %33
  %35 = constant [value=0] : i32
  %36 = shared_index %7, %32 : shared<64x32xfp16, #L4>
  tma_async_copy_global_to_shared %a_desc, %35, %31, %bar_34, %36, %33
  %37 = constant [value=0] : i32
  %38 = shared_index %8, %32 : shared<32x64xfp16, #L5>
  tma_async_copy_global_to_shared %b_desc, %31, %37, %bar_34, %38, %33
  %39 = constant [value=0] : i32
  %40 = constant [value=0] : i32
  %acc_41, %slot, %phase = for [schedule={num_stages=3}] %5, %K, %6, %acc, %39, %40 : tensor<64x64xfp32>, i32, i32 {
    ^(%k: i32, %acc_45: tensor<64x64xfp32>, %slot_46: i32, %phase_47: i32)
    %bar_48 = shared_index %bars, %slot_46 : shared<1xi64, #L3>
    mbarrier_wait %bar_48, %phase_47
    %49 = shared_index %7, %slot_46 : shared<64x32xfp16, #L4>
    %50 = shared_index %8, %slot_46 : shared<32x64xfp16, #L5>
    %51 = constant [value=0] : i32
    %52 = constant [value=0] : i32
    %53 = constant [value=0] : i32
    %54 = constant [value=0] : i32
    %55 = convert_layout %acc_45 : tensor<64x64xfp32, #L6>
    %acc_56 = warpgroup_mma [is_async=True] %49, %50, %55 : tensor<64x64xfp32, #L6>
    %acc_57 = warpgroup_mma_wait [pending=1] %acc_56 : tensor<64x64xfp32, #L6>
    %58 = constant [value=64] : i32
    %59 = binary [kind=add] %k, %58 : i32
    %60 = constant [value=2] : i32
    %61 = binary [kind=add] %slot_46, %60 : i32
    %62 = constant [value=3] : i32
    %63 = binary [kind=mod] %61, %62 : i32
    %64 = compare [predicate=ne] %k, %5 : i1
    %empty_65 = shared_index %empties, %63 : shared<1xi64, #L3>
    mbarrier_arrive [per_warp=True] %empty_65, %64
    %66 = constant [value=0] : i32
    %67 = compare [predicate=eq] %slot_46, %66 : i1
    %68 = cast %67 : i32
    %released = binary [kind=xor] %phase_47, %68 : i32
    %empty_70 = shared_index %empties, %63 : shared<1xi64, #L3>
    mbarrier_wait [elected=True] %empty_70, %released
    %71 = compare [predicate=lt] %59, %K : i1
    %bar_72 = shared_index %bars, %63 : shared<1xi64, #L3>
    mbarrier_expect [nbytes=8192] %bar_72, %71
    %73 = constant [value=0] : i32
    %74 = shared_index %7, %63 : shared<64x32xfp16, #L4>
    tma_async_copy_global_to_shared %a_desc, %73, %59, %bar_72, %74, %71
    %75 = constant [value=0] : i32
    %76 = shared_index %8, %63 : shared<32x64xfp16, #L5>
    tma_async_copy_global_to_shared %b_desc, %59, %75, %bar_72, %76, %71
    %acc_77 = convert_layout %acc_57 : tensor<64x64xfp32>
    %78 = constant [value=1] : i32
    %79 = binary [kind=add] %slot_46, %78 : i32
    %80 = constant [value=3] : i32
    %slot_81 = binary [kind=mod] %79, %80 : i32
    %82 = constant [value=0] : i32
    %83 = compare [predicate=eq] %slot_81, %82 : i1
    %84 = cast %83 : i32
    %phase_85 = binary [kind=xor] %phase_47, %84 : i32
    yield %acc_77, %slot_81, %phase_85
  }
  %acc_86 = convert_layout %acc_41 : tensor<64x64xfp32, #L6>
  %acc_87 = warpgroup_mma_wait [pending=0] %acc_86 : tensor<64x64xfp32, #L6>
  %acc_88 = convert_layout %acc_87 : tensor<64x64xfp32>
  %89 = constant [value=0] : i32
  %bar_90 = shared_index %bars, %89 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_90
  %91 = constant [value=0] : i32
  %empty_92 = shared_index %empties, %91 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_92
  %93 = constant [value=1] : i32
  %bar_94 = shared_index %bars, %93 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_94
  %95 = constant [value=1] : i32
  %empty_96 = shared_index %empties, %95 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_96
  %97 = constant [value=2] : i32
  %bar_98 = shared_index %bars, %97 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_98
  %99 = constant [value=2] : i32
  %empty_100 = shared_index %empties, %99 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_100
  %101 = arange [start=0 end=64] : tensor<64xi32>
  %102 = expand_dims [axis=1] %101 : tensor<64x1xi32>
  %103 = constant [value=64] : tensor<64x1xi32>
  %104 = binary [kind=mul] %102, %103 : tensor<64x1xi32>
  %105 = splat %c_ptr : tensor<64x1x*fp32>
  %106 = add_ptr %105, %104 : tensor<64x1x*fp32>
  %107 = arange [start=0 end=64] : tensor<64xi32>
  %108 = expand_dims [axis=0] %107 : tensor<1x64xi32>
  %109 = broadcast %106 : tensor<64x64x*fp32>
  %110 = broadcast %108 : tensor<64x64xi32>
  %111 = add_ptr %109, %110 : tensor<64x64x*fp32>
  %112 = convert_layout %111 : tensor<64x64x*fp32, #L7>
  %113 = convert_layout %acc_88 : tensor<64x64xfp32, #L7>
  store %112, %113
}
"""
