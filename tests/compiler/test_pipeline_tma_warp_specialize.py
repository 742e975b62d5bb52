"""pipeline_dot_loops then warp_specialize_epilogues on a TMA dot loop written
`tl.range(..., warp_specialize=True)` (pipeline_tma_warp_specialize.py): a warp_specialize
whose one-warp worker fills the ring (waiting on each slot's empty barrier) and whose
default partition waits on the full barriers, multiplies, releases and runs the epilogue.

The golden text is `print_kernel` output after the passes; WEFT_ACCEPT=1 rewrites it.
"""

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def specialized_dot_loop(a_desc, b_desc, c_ptr, K, STAGES: tl.constexpr):
    acc = tl.zeros([64, 64], tl.float32)
    for k in tl.range(0, K, 32, num_stages=STAGES, warp_specialize=True):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    tl.store(c_ptr + tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :], acc)


def until_split(stages: int):
    signature = {"a_desc": "tensordesc<fp16[64,32]>", "b_desc": "tensordesc<fp16[32,64]>", "c_ptr": "*fp32",
                 "K": "i32"}
    kernel = build_kernel(specialized_dot_loop, signature, {"STAGES": stages}, 4, {}, language="highlevel")
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "warp_specialize_epilogues":
            return kernel
    raise AssertionError("warp_specialize_epilogues is not in TILE_PASSES")


def test_two_stages_golden():
    check_golden(print_kernel(until_split(2)), "TWO_STAGES")


TWO_STAGES = """\
#L0 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,1,0), (0,2,8), (0,4,16), (0,8,0), (0,16,0), (0,32,0), (1,0,0)]} -> [2x64x32]
#L1 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,0,32), (0,1,8), (0,2,16), (0,4,32), (0,8,0), (0,16,0), (1,0,0)]} -> [2x32x64]
#L2 = {offset=[(1,0)]} -> [2x1]
#L3 = {} -> [1]
#L4 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L5 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L6 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L7 = {register=[(2,0), (4,0), (8,0), (16,0), (32,0)] lane=[(0,1), (0,2), (0,4), (0,8), (0,16)] warp=[(0,32), (1,0)]} -> [64x64]
kernel @specialized_dot_loop(%a_desc: tensordesc<64x32xfp16>, %b_desc: tensordesc<32x64xfp16>, %c_ptr: *fp32, %K: i32) num_warps=4 {
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %5 = constant [value=0] : i32
  %6 = constant [value=32] : i32
  %7 = allocate_shared_memory : shared<2x64x32xfp16, #L0>
  %8 = allocate_shared_memory : shared<2x32x64xfp16, #L1>
  %bars = allocate_shared_memory : shared<2x1xi64, #L2>
  %empties = allocate_shared_memory : shared<2x1xi64, #L2>
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
  warp_specialize [worker_num_warps=(1, 2, 1) worker_num_regs=(40, 40, 40) default_num_regs=240] %5, %K, %6, %bars, %7, %8, %empties, %a_desc, %b_desc, %c_ptr {
    ^(%19: i32, %K_20: i32, %21: i32, %bars_22: shared<2x1xi64, #L2>, %23: shared<2x64x32xfp16, #L0>, %24: shared<2x32x64xfp16, #L1>, %empties_25: shared<2x1xi64, #L2>, %a_desc_26: tensordesc<64x32xfp16>, %b_desc_27: tensordesc<32x64xfp16>, %c_ptr_28: *fp32)
    %acc_29 = constant [value=0.0] : tensor<64x64xfp32>
    %30 = constant [value=0] : i32
    %31 = constant [value=0] : i32
    %acc_32, %slot, %phase = for [schedule={num_stages=2 warp_specialize=True}] %19, %K_20, %21, %acc_29, %30, %31 : tensor<64x64xfp32>, i32, i32 {
      ^(%k: i32, %acc_36: tensor<64x64xfp32>, %slot_37: i32, %phase_38: i32)
      %bar_39 = shared_index %bars_22, %slot_37 : shared<1xi64, #L3>
      mbarrier_wait %bar_39, %phase_38
      %40 = shared_index %23, %slot_37 : shared<64x32xfp16, #L4>
      %41 = shared_index %24, %slot_37 : shared<32x64xfp16, #L5>
      %42 = constant [value=0] : i32
      %43 = constant [value=0] : i32
      %44 = constant [value=0] : i32
      %45 = constant [value=0] : i32
      %46 = convert_layout %acc_36 : tensor<64x64xfp32, #L6>
      %acc_47 = warpgroup_mma [is_async=True] %40, %41, %46 : tensor<64x64xfp32, #L6>
      %48 = constant [value=1] : i32
      %49 = binary [kind=add] %slot_37, %48 : i32
      %50 = constant [value=2] : i32
      %51 = binary [kind=mod] %49, %50 : i32
      %52 = compare [predicate=ne] %k, %19 : i1
      %empty_53 = shared_index %empties_25, %51 : shared<1xi64, #L3>
      mbarrier_arrive [per_warp=True] %empty_53, %52
      %acc_54 = warpgroup_mma_wait [pending=0] %acc_47 : tensor<64x64xfp32, #L6>
      %acc_55 = convert_layout %acc_54 : tensor<64x64xfp32>
      %56 = constant [value=1] : i32
      %57 = binary [kind=add] %slot_37, %56 : i32
      %58 = constant [value=2] : i32
      %slot_59 = binary [kind=mod] %57, %58 : i32
      %60 = constant [value=0] : i32
      %61 = compare [predicate=eq] %slot_59, %60 : i1
      %62 = cast %61 : i32
      %phase_63 = binary [kind=xor] %phase_38, %62 : i32
      yield %acc_55, %slot_59, %phase_63
    }
    %64 = arange [start=0 end=64] : tensor<64xi32>
    %65 = expand_dims [axis=1] %64 : tensor<64x1xi32>
    %66 = constant [value=64] : tensor<64x1xi32>
    %67 = binary [kind=mul] %65, %66 : tensor<64x1xi32>
    %68 = splat %c_ptr_28 : tensor<64x1x*fp32>
    %69 = add_ptr %68, %67 : tensor<64x1x*fp32>
    %70 = arange [start=0 end=64] : tensor<64xi32>
    %71 = expand_dims [axis=0] %70 : tensor<1x64xi32>
    %72 = broadcast %69 : tensor<64x64x*fp32>
    %73 = broadcast %71 : tensor<64x64xi32>
    %74 = add_ptr %72, %73 : tensor<64x64x*fp32>
    %75 = convert_layout %74 : tensor<64x64x*fp32, #L7>
    %76 = convert_layout %acc_32 : tensor<64x64xfp32, #L7>
    store %75, %76
    yield
  } {
    ^(%77: i32, %K_78: i32, %79: i32, %bars_80: shared<2x1xi64, #L2>, %81: shared<2x64x32xfp16, #L0>, %82: shared<2x32x64xfp16, #L1>, %empties_83: shared<2x1xi64, #L2>, %a_desc_84: tensordesc<64x32xfp16>, %b_desc_85: tensordesc<32x64xfp16>, %c_ptr_86: *fp32)
    %87 = constant [value=0] : i32
    %slot_88, %phase_89 = for %77, %K_78, %79, %87, %87 : i32, i32 {
      ^(%k_90: i32, %slot_91: i32, %phase_92: i32)
      %93 = constant [value=1] : i32
      %released = binary [kind=xor] %phase_92, %93 : i32
      %empty_95 = shared_index %empties_83, %slot_91 : shared<1xi64, #L3>
      mbarrier_wait %empty_95, %released
      %96 = compare [predicate=lt] %k_90, %K_78 : i1
      %bar_97 = shared_index %bars_80, %slot_91 : shared<1xi64, #L3>
      mbarrier_expect [nbytes=8192] %bar_97, %96
      %98 = constant [value=0] : i32
      %99 = shared_index %81, %slot_91 : shared<64x32xfp16, #L4>
      tma_async_copy_global_to_shared %a_desc_84, %98, %k_90, %bar_97, %99, %96
      %100 = constant [value=0] : i32
      %101 = shared_index %82, %slot_91 : shared<32x64xfp16, #L5>
      tma_async_copy_global_to_shared %b_desc_85, %k_90, %100, %bar_97, %101, %96
      %102 = constant [value=1] : i32
      %103 = binary [kind=add] %slot_91, %102 : i32
      %104 = constant [value=2] : i32
      %slot_105 = binary [kind=mod] %103, %104 : i32
      %106 = constant [value=0] : i32
      %107 = compare [predicate=eq] %slot_105, %106 : i1
      %108 = cast %107 : i32
      %phase_109 = binary [kind=xor] %phase_92, %108 : i32
      yield %slot_105, %phase_109
    }
    yield
  } {
    ^(%110: i32, %K_111: i32, %112: i32, %bars_113: shared<2x1xi64, #L2>, %114: shared<2x64x32xfp16, #L0>, %115: shared<2x32x64xfp16, #L1>, %empties_116: shared<2x1xi64, #L2>, %a_desc_117: tensordesc<64x32xfp16>, %b_desc_118: tensordesc<32x64xfp16>, %c_ptr_119: *fp32)
    yield
  } {
    ^(%120: i32, %K_121: i32, %122: i32, %bars_123: shared<2x1xi64, #L2>, %124: shared<2x64x32xfp16, #L0>, %125: shared<2x32x64xfp16, #L1>, %empties_126: shared<2x1xi64, #L2>, %a_desc_127: tensordesc<64x32xfp16>, %b_desc_128: tensordesc<32x64xfp16>, %c_ptr_129: *fp32)
    yield
  }
  %130 = constant [value=0] : i32
  %bar_131 = shared_index %bars, %130 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_131
  %132 = constant [value=0] : i32
  %empty_133 = shared_index %empties, %132 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_133
  %134 = constant [value=1] : i32
  %bar_135 = shared_index %bars, %134 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_135
  %136 = constant [value=1] : i32
  %empty_137 = shared_index %empties, %136 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_137
}
"""
