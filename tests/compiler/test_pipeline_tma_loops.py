"""pipeline_dot_loops on a loop whose dot operands are `desc.load`s (pipeline_tma_loops.py):
the boxes become rings that TMA fills S - 1 iterations ahead, one mbarrier per slot.

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
    for k in tl.range(0, K, 32, num_stages=STAGES):
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
  %10 = constant [value=0] : i32
  %bar = shared_index %bars, %10 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar
  %12 = constant [value=1] : i32
  %bar_13 = shared_index %bars, %12 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar_13
  %14 = constant [value=2] : i32
  %bar_15 = shared_index %bars, %14 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar_15
  %16 = constant [value=0] : i32
  %17 = compare [predicate=lt] %5, %K : i1
  %bar_18 = shared_index %bars, %16 : shared<1xi64, #L3>
  mbarrier_expect [nbytes=8192] %bar_18, %17
  %19 = constant [value=0] : i32
  %20 = shared_index %7, %16 : shared<64x32xfp16, #L4>
  tma_async_copy_global_to_shared %a_desc, %19, %5, %bar_18, %20, %17
  %21 = constant [value=0] : i32
  %22 = shared_index %8, %16 : shared<32x64xfp16, #L5>
  tma_async_copy_global_to_shared %b_desc, %5, %21, %bar_18, %22, %17
  %23 = constant [value=32] : i32
  %24 = binary [kind=add] %5, %23 : i32
  %25 = constant [value=1] : i32
  %26 = compare [predicate=lt] %24, %K : i1
  %bar_27 = shared_index %bars, %25 : shared<1xi64, #L3>
  mbarrier_expect [nbytes=8192] %bar_27, %26
  %28 = constant [value=0] : i32
  %29 = shared_index %7, %25 : shared<64x32xfp16, #L4>
  tma_async_copy_global_to_shared %a_desc, %28, %24, %bar_27, %29, %26
  %30 = constant [value=0] : i32
  %31 = shared_index %8, %25 : shared<32x64xfp16, #L5>
  tma_async_copy_global_to_shared %b_desc, %24, %30, %bar_27, %31, %26
  %32 = constant [value=0] : i32
  %33 = constant [value=0] : i32
  %acc_34, %slot, %phase = for [schedule={num_stages=3}] %5, %K, %6, %acc, %32, %33 : tensor<64x64xfp32>, i32, i32 {
    ^(%k: i32, %acc_38: tensor<64x64xfp32>, %slot_39: i32, %phase_40: i32)
    %bar_41 = shared_index %bars, %slot_39 : shared<1xi64, #L3>
    mbarrier_wait %bar_41, %phase_40
    %42 = shared_index %7, %slot_39 : shared<64x32xfp16, #L4>
    %43 = shared_index %8, %slot_39 : shared<32x64xfp16, #L5>
    %44 = constant [value=0] : i32
    %45 = constant [value=0] : i32
    %46 = constant [value=0] : i32
    %47 = constant [value=0] : i32
    %48 = convert_layout %acc_38 : tensor<64x64xfp32, #L6>
    %acc_49 = warpgroup_mma [is_async=True] %42, %43, %48 : tensor<64x64xfp32, #L6>
    %acc_50 = warpgroup_mma_wait [pending=1] %acc_49 : tensor<64x64xfp32, #L6>
    %51 = constant [value=64] : i32
    %52 = binary [kind=add] %k, %51 : i32
    %53 = constant [value=2] : i32
    %54 = binary [kind=add] %slot_39, %53 : i32
    %55 = constant [value=3] : i32
    %56 = binary [kind=mod] %54, %55 : i32
    %57 = compare [predicate=lt] %52, %K : i1
    %bar_58 = shared_index %bars, %56 : shared<1xi64, #L3>
    mbarrier_expect [nbytes=8192] %bar_58, %57
    %59 = constant [value=0] : i32
    %60 = shared_index %7, %56 : shared<64x32xfp16, #L4>
    tma_async_copy_global_to_shared %a_desc, %59, %52, %bar_58, %60, %57
    %61 = constant [value=0] : i32
    %62 = shared_index %8, %56 : shared<32x64xfp16, #L5>
    tma_async_copy_global_to_shared %b_desc, %52, %61, %bar_58, %62, %57
    %acc_63 = convert_layout %acc_50 : tensor<64x64xfp32>
    %64 = constant [value=1] : i32
    %65 = binary [kind=add] %slot_39, %64 : i32
    %66 = constant [value=3] : i32
    %slot_67 = binary [kind=mod] %65, %66 : i32
    %68 = constant [value=0] : i32
    %69 = compare [predicate=eq] %slot_67, %68 : i1
    %70 = cast %69 : i32
    %phase_71 = binary [kind=xor] %phase_40, %70 : i32
    yield %acc_63, %slot_67, %phase_71
  }
  %acc_72 = convert_layout %acc_34 : tensor<64x64xfp32, #L6>
  %acc_73 = warpgroup_mma_wait [pending=0] %acc_72 : tensor<64x64xfp32, #L6>
  %acc_74 = convert_layout %acc_73 : tensor<64x64xfp32>
  %75 = constant [value=0] : i32
  %bar_76 = shared_index %bars, %75 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_76
  %77 = constant [value=1] : i32
  %bar_78 = shared_index %bars, %77 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_78
  %79 = constant [value=2] : i32
  %bar_80 = shared_index %bars, %79 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_80
  %81 = arange [start=0 end=64] : tensor<64xi32>
  %82 = expand_dims [axis=1] %81 : tensor<64x1xi32>
  %83 = constant [value=64] : tensor<64x1xi32>
  %84 = binary [kind=mul] %82, %83 : tensor<64x1xi32>
  %85 = splat %c_ptr : tensor<64x1x*fp32>
  %86 = add_ptr %85, %84 : tensor<64x1x*fp32>
  %87 = arange [start=0 end=64] : tensor<64xi32>
  %88 = expand_dims [axis=0] %87 : tensor<1x64xi32>
  %89 = broadcast %86 : tensor<64x64x*fp32>
  %90 = broadcast %88 : tensor<64x64xi32>
  %91 = add_ptr %89, %90 : tensor<64x64x*fp32>
  %92 = convert_layout %91 : tensor<64x64x*fp32, #L7>
  %93 = convert_layout %acc_74 : tensor<64x64xfp32, #L7>
  store %92, %93
}
"""
