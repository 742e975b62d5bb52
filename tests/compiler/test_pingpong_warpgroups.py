"""pingpong_warpgroups on a warp-specialized two-dot loop of 8 consumer warps launched with
`pingpong=True`: warpgroup turns (open once, a take before the loop and before its second
wgmma, a pass right after its first wgmma's issue and after the loop's drain), nothing without
the option. The golden text is `print_kernel` output of the consumer partition after the
pass; WEFT_ACCEPT=1 rewrites it."""

import dataclasses

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import WarpgroupTurn, WarpSpecialize
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def two_dot_loop(q_desc, k_desc, v_desc, o_ptr, N):
    q = q_desc.load([0, 0])
    acc = tl.zeros([128, 16], tl.float32)
    for n in tl.range(0, N, 16, num_stages=3, warp_specialize=True):
        s = tl.dot(q, k_desc.load([n, 0]).T)
        acc = tl.dot(s.to(tl.float16), v_desc.load([n, 0]), acc * 0.5)
    tl.store(o_ptr + tl.arange(0, 128)[:, None] * 16 + tl.arange(0, 16)[None, :], acc)


def until_pingpong(pingpong: bool):
    signature = {"q_desc": "tensordesc<fp16[128,16]>", "k_desc": "tensordesc<fp16[16,16]>",
                 "v_desc": "tensordesc<fp16[16,16]>", "o_ptr": "*fp32", "N": "i32"}
    kernel = build_kernel(two_dot_loop, signature, {}, 8, {}, language="highlevel")
    kernel = dataclasses.replace(kernel, pingpong=pingpong)
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "pingpong_warpgroups":
            return kernel
    raise AssertionError("pingpong_warpgroups is not in TILE_PASSES")


def consumer_text(kernel) -> str:
    (split,) = [op for op in kernel.body.ops if isinstance(op, WarpSpecialize)]
    return print_kernel(kernel.with_body(split.default))


def test_pingpong_golden():
    check_golden(consumer_text(until_pingpong(True)), "PINGPONG")


def test_nothing_without_the_option():
    assert not any(isinstance(op, WarpgroupTurn) for op in until_pingpong(False).walk())
PINGPONG = """\
#L0 = {} -> [1]
#L1 = {offset=[(0,1), (0,2), (0,4), (0,8), (1,0), (2,0), (4,8), (8,0)]} -> [16x16]
#L2 = {offset=[(1,0), (2,0), (4,0), (8,0), (0,1), (0,2), (8,4), (0,8)]} -> [16x16]
#L3 = {register=[(0,1), (8,0), (0,8)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0), (64,0)]} -> [128x16]
#L4 = {register=[(16,0), (32,0), (64,0)] lane=[(0,1), (0,2), (0,4), (0,8), (1,0)] warp=[(2,0), (4,0), (8,0)]} -> [128x16]
kernel @two_dot_loop(%q_desc: tensordesc<128x16xfp16>, %k_desc: tensordesc<16x16xfp16>, %v_desc: tensordesc<16x16xfp16>, %o_ptr: *fp32, %N: i32) num_warps=8 {
  %acc = constant [value=0.0] : tensor<128x16xfp32>
  %6 = constant [value=0] : i32
  %7 = constant [value=0] : i32
  warpgroup_turn [action=open barrier=5]
  warpgroup_turn [action=take barrier=5]
  %acc_8, %slot, %phase = for [schedule={num_stages=3 warp_specialize=True}] %11, %N_12, %13, %acc, %6, %7 : tensor<128x16xfp32>, i32, i32 {
    ^(%n: i32, %acc_15: tensor<128x16xfp32>, %slot_16: i32, %phase_17: i32)
    %bar = shared_index %bars, %slot_16 : shared<1xi64, #L0>
    mbarrier_wait %bar, %phase_17
    %20 = shared_index %21, %slot_16 : shared<16x16xfp16, #L1>
    %22 = shared_index %23, %slot_16 : shared<16x16xfp16, #L1>
    %24 = constant [value=0] : i32
    %25 = constant [value=0] : i32
    %26 = shared_permute [order=(1, 0)] %20 : shared<16x16xfp16, #L2>
    %27 = constant [value=0.0] : tensor<128x16xfp32>
    %28 = convert_layout %27 : tensor<128x16xfp32, #L3>
    %s = warpgroup_mma [is_async=True] %30, %26, %28 : tensor<128x16xfp32, #L3>
    warpgroup_turn [action=pass barrier=5]
    %s_31 = warpgroup_mma_wait [pending=0] %s : tensor<128x16xfp32, #L3>
    %acc_32 = convert_layout %acc_15 : tensor<128x16xfp32, #L3>
    %acc_33 = warpgroup_mma_wait [pending=0] %acc_32 : tensor<128x16xfp32, #L3>
    %acc_34 = convert_layout %acc_33 : tensor<128x16xfp32>
    %s_35 = convert_layout %s_31 : tensor<128x16xfp32>
    %36 = cast %s_35 : tensor<128x16xfp16>
    %37 = constant [value=0] : i32
    %38 = constant [value=0] : i32
    %39 = constant [value=0.5] : tensor<128x16xfp32>
    %40 = binary [kind=mul] %acc_34, %39 : tensor<128x16xfp32>
    %41 = convert_layout %40 : tensor<128x16xfp32, #L3>
    warpgroup_turn [action=take barrier=5]
    %acc_42 = warpgroup_mma [is_async=True] %36, %22, %41 : tensor<128x16xfp32, #L3>
    %43 = constant [value=2] : i32
    %44 = binary [kind=add] %slot_16, %43 : i32
    %45 = constant [value=3] : i32
    %46 = binary [kind=mod] %44, %45 : i32
    %47 = compare [predicate=ne] %n, %11 : i1
    %empty = shared_index %empties, %46 : shared<1xi64, #L0>
    mbarrier_arrive [per_warp=True] %empty, %47
    %acc_50 = convert_layout %acc_42 : tensor<128x16xfp32>
    %51 = constant [value=1] : i32
    %52 = binary [kind=add] %slot_16, %51 : i32
    %53 = constant [value=3] : i32
    %slot_54 = binary [kind=mod] %52, %53 : i32
    %55 = constant [value=0] : i32
    %56 = compare [predicate=eq] %slot_54, %55 : i1
    %57 = cast %56 : i32
    %phase_58 = binary [kind=xor] %phase_17, %57 : i32
    yield %acc_50, %slot_54, %phase_58
  }
  %acc_59 = convert_layout %acc_8 : tensor<128x16xfp32, #L3>
  %acc_60 = warpgroup_mma_wait [pending=0] %acc_59 : tensor<128x16xfp32, #L3>
  warpgroup_turn [action=pass barrier=5]
  %acc_61 = convert_layout %acc_60 : tensor<128x16xfp32>
  %62 = arange [start=0 end=128] : tensor<128xi32>
  %63 = expand_dims [axis=1] %62 : tensor<128x1xi32>
  %64 = constant [value=16] : tensor<128x1xi32>
  %65 = binary [kind=mul] %63, %64 : tensor<128x1xi32>
  %66 = splat %o_ptr_67 : tensor<128x1x*fp32>
  %68 = add_ptr %66, %65 : tensor<128x1x*fp32>
  %69 = arange [start=0 end=16] : tensor<16xi32>
  %70 = expand_dims [axis=0] %69 : tensor<1x16xi32>
  %71 = broadcast %68 : tensor<128x16x*fp32>
  %72 = broadcast %70 : tensor<128x16xi32>
  %73 = add_ptr %71, %72 : tensor<128x16x*fp32>
  %74 = convert_layout %73 : tensor<128x16x*fp32, #L4>
  %75 = convert_layout %acc_61 : tensor<128x16xfp32, #L4>
  store %74, %75
  yield
}
"""
