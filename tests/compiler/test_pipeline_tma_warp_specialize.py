"""pipeline_dot_loops then warp_specialize_epilogues on a TMA dot loop written
`tl.range(..., warp_specialize=True)` (pipeline_tma_warp_specialize.py): a warp_specialize
whose one-warp worker fills the ring (waiting on each slot's empty barrier) and whose
default partition waits on the full barriers, multiplies, releases and runs the epilogue;
and two such loops in a row: one split whose producer walks both loops through one ring
(SplitGroup), the second loop starting at the first's slot and phase, the first's last
slot released between them; run on the emulator against numpy float64.

The golden text is `print_kernel` output after the passes; WEFT_ACCEPT=1 rewrites it.
"""

import numpy as np
import pytest

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


@tl.jit
def two_loops(a_desc, b_desc, c_ptr, K1, K, STAGES: tl.constexpr):
    """C = A @ B over K in two loops, [0, K1) and [K1, K): one split, one ring."""
    acc = tl.zeros([64, 64], tl.float32)
    for k in tl.range(0, K1, 32, num_stages=STAGES, warp_specialize=True):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    for k in tl.range(K1, K, 32, num_stages=STAGES, warp_specialize=True):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    tl.store(c_ptr + tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :], acc)


TWO_LOOPS_SIGNATURE = {"a_desc": "tensordesc<fp16[64,32]>", "b_desc": "tensordesc<fp16[32,64]>", "c_ptr": "*fp32",
                       "K1": "i32", "K": "i32"}


def two_loops_until_split(stages: int):
    kernel = build_kernel(two_loops, TWO_LOOPS_SIGNATURE, {"STAGES": stages}, 4, {}, language="highlevel")
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "warp_specialize_epilogues":
            return kernel
    raise AssertionError("warp_specialize_epilogues is not in TILE_PASSES")


def test_two_loops_in_a_row_golden():
    check_golden(print_kernel(two_loops_until_split(2)), "TWO_LOOPS")


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("k1, k", [(0, 96), (64, 64), (96, 288), (32, 64)])
def test_two_loops_in_a_row_match_numpy(stages, k1, k):
    """Any split of K between the loops (either empty): every slot is released once, so
    the producer's laps of the shared ring never wait forever nor overtake a reader."""
    from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
    from weft.runtime.emulator import emulate

    kernel = pipeline.prepare_for_emulator(
        build_kernel(two_loops, TWO_LOOPS_SIGNATURE, {"STAGES": stages}, 4, {}, language="highlevel"))
    rng = np.random.default_rng(k1 + k)
    a = rng.standard_normal((64, k)).astype(np.float16)
    b = rng.standard_normal((k, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    emulate(kernel, (1, 1), (TensorDescriptor.from_tensor(a, [64, 32]), TensorDescriptor.from_tensor(b, [32, 64]),
                             c, k1, k))
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, expected, atol=1e-3 * np.abs(expected).max() + 1e-4, rtol=1e-4)
TWO_LOOPS = """\
#L0 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,1,0), (0,2,8), (0,4,16), (0,8,0), (0,16,0), (0,32,0), (1,0,0)]} -> [2x64x32]
#L1 = {offset=[(0,0,1), (0,0,2), (0,0,4), (0,0,8), (0,0,16), (0,0,32), (0,1,8), (0,2,16), (0,4,32), (0,8,0), (0,16,0), (1,0,0)]} -> [2x32x64]
#L2 = {offset=[(1,0)]} -> [2x1]
#L3 = {} -> [1]
#L4 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L5 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L6 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L7 = {register=[(2,0), (4,0), (8,0), (16,0), (32,0)] lane=[(0,1), (0,2), (0,4), (0,8), (0,16)] warp=[(0,32), (1,0)]} -> [64x64]
kernel @two_loops(%a_desc: tensordesc<64x32xfp16>, %b_desc: tensordesc<32x64xfp16>, %c_ptr: *fp32, %K1: i32, %K: i32) num_warps=4 {
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %6 = constant [value=0] : i32
  %7 = constant [value=32] : i32
  %8 = constant [value=32] : i32
  %9 = allocate_shared_memory : shared<2x64x32xfp16, #L0>
  %10 = allocate_shared_memory : shared<2x32x64xfp16, #L1>
  %bars = allocate_shared_memory : shared<2x1xi64, #L2>
  %empties = allocate_shared_memory : shared<2x1xi64, #L2>
  %13 = constant [value=0] : i32
  %bar = shared_index %bars, %13 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar
  %15 = constant [value=0] : i32
  %empty = shared_index %empties, %15 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty
  %17 = constant [value=1] : i32
  %bar_18 = shared_index %bars, %17 : shared<1xi64, #L3>
  mbarrier_init [count=1] %bar_18
  %19 = constant [value=1] : i32
  %empty_20 = shared_index %empties, %19 : shared<1xi64, #L3>
  mbarrier_init [count=4] %empty_20
  warp_specialize [worker_num_warps=(1, 2, 1) worker_num_regs=(40, 40, 40) default_num_regs=240] %6, %K1, %7, %bars, %9, %10, %empties, %K, %8, %a_desc, %b_desc, %c_ptr {
    ^(%21: i32, %K1_22: i32, %23: i32, %bars_24: shared<2x1xi64, #L2>, %25: shared<2x64x32xfp16, #L0>, %26: shared<2x32x64xfp16, #L1>, %empties_27: shared<2x1xi64, #L2>, %K_28: i32, %29: i32, %a_desc_30: tensordesc<64x32xfp16>, %b_desc_31: tensordesc<32x64xfp16>, %c_ptr_32: *fp32)
    %acc_33 = constant [value=0.0] : tensor<64x64xfp32>
    %34 = constant [value=0] : i32
    %35 = constant [value=0] : i32
    %acc_36, %slot, %phase = for [schedule={num_stages=2 warp_specialize=True}] %21, %K1_22, %23, %acc_33, %34, %35 : tensor<64x64xfp32>, i32, i32 {
      ^(%k: i32, %acc_40: tensor<64x64xfp32>, %slot_41: i32, %phase_42: i32)
      %bar_43 = shared_index %bars_24, %slot_41 : shared<1xi64, #L3>
      mbarrier_wait %bar_43, %phase_42
      %44 = shared_index %25, %slot_41 : shared<64x32xfp16, #L4>
      %45 = shared_index %26, %slot_41 : shared<32x64xfp16, #L5>
      %46 = constant [value=0] : i32
      %47 = constant [value=0] : i32
      %48 = constant [value=0] : i32
      %49 = constant [value=0] : i32
      %50 = convert_layout %acc_40 : tensor<64x64xfp32, #L6>
      %acc_51 = warpgroup_mma [is_async=True] %44, %45, %50 : tensor<64x64xfp32, #L6>
      %52 = constant [value=1] : i32
      %53 = binary [kind=add] %slot_41, %52 : i32
      %54 = constant [value=2] : i32
      %55 = binary [kind=mod] %53, %54 : i32
      %56 = compare [predicate=ne] %k, %21 : i1
      %empty_57 = shared_index %empties_27, %55 : shared<1xi64, #L3>
      mbarrier_arrive [per_warp=True] %empty_57, %56
      %acc_58 = warpgroup_mma_wait [pending=0] %acc_51 : tensor<64x64xfp32, #L6>
      %acc_59 = convert_layout %acc_58 : tensor<64x64xfp32>
      %60 = constant [value=1] : i32
      %61 = binary [kind=add] %slot_41, %60 : i32
      %62 = constant [value=2] : i32
      %slot_63 = binary [kind=mod] %61, %62 : i32
      %64 = constant [value=0] : i32
      %65 = compare [predicate=eq] %slot_63, %64 : i1
      %66 = cast %65 : i32
      %phase_67 = binary [kind=xor] %phase_42, %66 : i32
      yield %acc_59, %slot_63, %phase_67
    }
    %68 = compare [predicate=lt] %21, %K1_22 : i1
    %69 = constant [value=1] : i32
    %70 = binary [kind=add] %slot, %69 : i32
    %71 = constant [value=2] : i32
    %72 = binary [kind=mod] %70, %71 : i32
    %empty_73 = shared_index %empties_27, %72 : shared<1xi64, #L3>
    mbarrier_arrive [per_warp=True] %empty_73, %68
    %acc_74, %slot_75, %phase_76 = for [schedule={num_stages=2 warp_specialize=True}] %K1_22, %K_28, %29, %acc_36, %slot, %phase : tensor<64x64xfp32>, i32, i32 {
      ^(%k_77: i32, %acc_78: tensor<64x64xfp32>, %slot_79: i32, %phase_80: i32)
      %bar_81 = shared_index %bars_24, %slot_79 : shared<1xi64, #L3>
      mbarrier_wait %bar_81, %phase_80
      %82 = shared_index %25, %slot_79 : shared<64x32xfp16, #L4>
      %83 = shared_index %26, %slot_79 : shared<32x64xfp16, #L5>
      %84 = constant [value=0] : i32
      %85 = constant [value=0] : i32
      %86 = constant [value=0] : i32
      %87 = constant [value=0] : i32
      %88 = convert_layout %acc_78 : tensor<64x64xfp32, #L6>
      %acc_89 = warpgroup_mma [is_async=True] %82, %83, %88 : tensor<64x64xfp32, #L6>
      %90 = constant [value=1] : i32
      %91 = binary [kind=add] %slot_79, %90 : i32
      %92 = constant [value=2] : i32
      %93 = binary [kind=mod] %91, %92 : i32
      %94 = compare [predicate=ne] %k_77, %K1_22 : i1
      %empty_95 = shared_index %empties_27, %93 : shared<1xi64, #L3>
      mbarrier_arrive [per_warp=True] %empty_95, %94
      %acc_96 = warpgroup_mma_wait [pending=0] %acc_89 : tensor<64x64xfp32, #L6>
      %acc_97 = convert_layout %acc_96 : tensor<64x64xfp32>
      %98 = constant [value=1] : i32
      %99 = binary [kind=add] %slot_79, %98 : i32
      %100 = constant [value=2] : i32
      %slot_101 = binary [kind=mod] %99, %100 : i32
      %102 = constant [value=0] : i32
      %103 = compare [predicate=eq] %slot_101, %102 : i1
      %104 = cast %103 : i32
      %phase_105 = binary [kind=xor] %phase_80, %104 : i32
      yield %acc_97, %slot_101, %phase_105
    }
    %106 = arange [start=0 end=64] : tensor<64xi32>
    %107 = expand_dims [axis=1] %106 : tensor<64x1xi32>
    %108 = constant [value=64] : tensor<64x1xi32>
    %109 = binary [kind=mul] %107, %108 : tensor<64x1xi32>
    %110 = splat %c_ptr_32 : tensor<64x1x*fp32>
    %111 = add_ptr %110, %109 : tensor<64x1x*fp32>
    %112 = arange [start=0 end=64] : tensor<64xi32>
    %113 = expand_dims [axis=0] %112 : tensor<1x64xi32>
    %114 = broadcast %111 : tensor<64x64x*fp32>
    %115 = broadcast %113 : tensor<64x64xi32>
    %116 = add_ptr %114, %115 : tensor<64x64x*fp32>
    %117 = convert_layout %116 : tensor<64x64x*fp32, #L7>
    %118 = convert_layout %acc_74 : tensor<64x64xfp32, #L7>
    store %117, %118
    yield
  } {
    ^(%119: i32, %K1_120: i32, %121: i32, %bars_122: shared<2x1xi64, #L2>, %123: shared<2x64x32xfp16, #L0>, %124: shared<2x32x64xfp16, #L1>, %empties_125: shared<2x1xi64, #L2>, %K_126: i32, %127: i32, %a_desc_128: tensordesc<64x32xfp16>, %b_desc_129: tensordesc<32x64xfp16>, %c_ptr_130: *fp32)
    %131 = constant [value=0] : i32
    %slot_132, %phase_133 = for %119, %K1_120, %121, %131, %131 : i32, i32 {
      ^(%k_134: i32, %slot_135: i32, %phase_136: i32)
      %137 = constant [value=1] : i32
      %released = binary [kind=xor] %phase_136, %137 : i32
      %empty_139 = shared_index %empties_125, %slot_135 : shared<1xi64, #L3>
      mbarrier_wait %empty_139, %released
      %140 = compare [predicate=lt] %k_134, %K1_120 : i1
      %bar_141 = shared_index %bars_122, %slot_135 : shared<1xi64, #L3>
      mbarrier_expect [nbytes=8192] %bar_141, %140
      %142 = constant [value=0] : i32
      %143 = shared_index %123, %slot_135 : shared<64x32xfp16, #L4>
      tma_async_copy_global_to_shared %a_desc_128, %142, %k_134, %bar_141, %143, %140
      %144 = constant [value=0] : i32
      %145 = shared_index %124, %slot_135 : shared<32x64xfp16, #L5>
      tma_async_copy_global_to_shared %b_desc_129, %k_134, %144, %bar_141, %145, %140
      %146 = constant [value=1] : i32
      %147 = binary [kind=add] %slot_135, %146 : i32
      %148 = constant [value=2] : i32
      %slot_149 = binary [kind=mod] %147, %148 : i32
      %150 = constant [value=0] : i32
      %151 = compare [predicate=eq] %slot_149, %150 : i1
      %152 = cast %151 : i32
      %phase_153 = binary [kind=xor] %phase_136, %152 : i32
      yield %slot_149, %phase_153
    }
    %slot_154, %phase_155 = for %K1_120, %K_126, %127, %slot_132, %phase_133 : i32, i32 {
      ^(%k_156: i32, %slot_157: i32, %phase_158: i32)
      %159 = constant [value=1] : i32
      %released_160 = binary [kind=xor] %phase_158, %159 : i32
      %empty_161 = shared_index %empties_125, %slot_157 : shared<1xi64, #L3>
      mbarrier_wait %empty_161, %released_160
      %162 = compare [predicate=lt] %k_156, %K_126 : i1
      %bar_163 = shared_index %bars_122, %slot_157 : shared<1xi64, #L3>
      mbarrier_expect [nbytes=8192] %bar_163, %162
      %164 = constant [value=0] : i32
      %165 = shared_index %123, %slot_157 : shared<64x32xfp16, #L4>
      tma_async_copy_global_to_shared %a_desc_128, %164, %k_156, %bar_163, %165, %162
      %166 = constant [value=0] : i32
      %167 = shared_index %124, %slot_157 : shared<32x64xfp16, #L5>
      tma_async_copy_global_to_shared %b_desc_129, %k_156, %166, %bar_163, %167, %162
      %168 = constant [value=1] : i32
      %169 = binary [kind=add] %slot_157, %168 : i32
      %170 = constant [value=2] : i32
      %slot_171 = binary [kind=mod] %169, %170 : i32
      %172 = constant [value=0] : i32
      %173 = compare [predicate=eq] %slot_171, %172 : i1
      %174 = cast %173 : i32
      %phase_175 = binary [kind=xor] %phase_158, %174 : i32
      yield %slot_171, %phase_175
    }
    yield
  } {
    ^(%176: i32, %K1_177: i32, %178: i32, %bars_179: shared<2x1xi64, #L2>, %180: shared<2x64x32xfp16, #L0>, %181: shared<2x32x64xfp16, #L1>, %empties_182: shared<2x1xi64, #L2>, %K_183: i32, %184: i32, %a_desc_185: tensordesc<64x32xfp16>, %b_desc_186: tensordesc<32x64xfp16>, %c_ptr_187: *fp32)
    yield
  } {
    ^(%188: i32, %K1_189: i32, %190: i32, %bars_191: shared<2x1xi64, #L2>, %192: shared<2x64x32xfp16, #L0>, %193: shared<2x32x64xfp16, #L1>, %empties_194: shared<2x1xi64, #L2>, %K_195: i32, %196: i32, %a_desc_197: tensordesc<64x32xfp16>, %b_desc_198: tensordesc<32x64xfp16>, %c_ptr_199: *fp32)
    yield
  }
  %200 = constant [value=0] : i32
  %bar_201 = shared_index %bars, %200 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_201
  %202 = constant [value=0] : i32
  %empty_203 = shared_index %empties, %202 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_203
  %204 = constant [value=1] : i32
  %bar_205 = shared_index %bars, %204 : shared<1xi64, #L3>
  mbarrier_invalidate %bar_205
  %206 = constant [value=1] : i32
  %empty_207 = shared_index %empties, %206 : shared<1xi64, #L3>
  mbarrier_invalidate %empty_207
}
"""
