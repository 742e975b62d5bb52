"""stage_block_pointers on a block-pointer dot loop: the frontend builds each operand load
both ways (pointers, and a TMA box through a tensor map written where the block pointer is
made); the pass keeps the boxes (they feed the dot, the strides are specialized to multiples
of 16 elements), writes their coordinates as the induction variable's (offset = init +
(iv - lower): the block advances by the step), deletes the pointer loads, and publishes
each map (its fence) only where it is first read, after both are written. The same
kernel whose B stride is not known to be a multiple of 16 bytes keeps both pointer loads
and writes no tensor map.

The golden text is `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites it.
"""

from weft import highlevel as tl
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import For, Load, TensormapFence, TensormapReplace, TmaAsyncCopyGlobalToShared
from weft.compiler.passes.stage_block_pointers import stage_block_pointers
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def block_dot_loop(a_ptr, b_ptr, c_ptr, K, stride_a, stride_b):
    a_block = tl.make_block_ptr(a_ptr, (64, K), (stride_a, 1), (0, 0), (64, 32), (1, 0))
    b_block = tl.make_block_ptr(b_ptr, (K, 64), (1, stride_b), (0, 0), (32, 64), (0, 1))  # B^T stored
    acc = tl.zeros([64, 64], tl.float32)
    for _ in range(0, K, 32):
        acc = tl.dot(tl.load(a_block), tl.load(b_block, boundary_check=(0,)), acc)
        a_block = tl.advance(a_block, (0, 32))
        b_block = tl.advance(b_block, (32, 0))
    tl.store(c_ptr + tl.arange(0, 64)[:, None] * 64 + tl.arange(0, 64)[None, :], acc)


SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32", "stride_a": "i32", "stride_b": "i32"}


def staged(b_stride_aligned: bool):
    specialization = {"a_ptr": "divisible_by_16", "b_ptr": "divisible_by_16", "stride_a": "divisible_by_16",
                      "stride_b": "divisible_by_16" if b_stride_aligned else ""}
    kernel = build_kernel(block_dot_loop, SIGNATURE, {}, 4, specialization, language="highlevel")
    assert len(kernel.block_pointer_loads) == 2
    return verify(stage_block_pointers(kernel))


def test_boxes_kept_golden():
    kernel = staged(True)
    assert not kernel.block_pointer_loads
    ops = list(kernel.walk())
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops) == 2
    assert not any(isinstance(op, Load) for op in ops)
    # Both maps are written before either is published (the first release waits for both).
    top = [type(op).__name__ for op in kernel.body.ops if isinstance(op, (TensormapReplace, TensormapFence, For))]
    assert top == ["TensormapReplace", "TensormapReplace", "TensormapFence", "TensormapFence", "For"]
    check_golden(print_kernel(kernel), "BOXES_KEPT")


def test_an_unaligned_stride_keeps_both_pointer_loads():
    ops = list(staged(False).walk())
    assert sum(isinstance(op, Load) for op in ops) == 2
    assert not any(isinstance(op, (TmaAsyncCopyGlobalToShared, TensormapReplace)) for op in ops)
BOXES_KEPT = """\
#L0 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L1 = {} -> [1]
#L2 = {register=[(0,1), (0,2), (0,4), (32,0)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [64x32]
kernel @block_dot_loop(%a_ptr: *fp16, %b_ptr: *fp16, %c_ptr: *fp32, %K: i32, %stride_a: i32, %stride_b: i32, %tensor_map_template0: tensordesc<64x32xfp16>, %tensor_map_template1: tensordesc<64x32xfp16>, %tensor_map_workspace: *u8) num_warps=4 {
  %9 = constant [value=64] : i32
  %10 = constant [value=1] : i64
  %11 = constant [value=0] : i32
  %12 = constant [value=0] : i32
  %13 = program_id [axis=0] : i32
  %14 = cast %13 : i64
  %15 = num_programs [axis=0] : i32
  %16 = cast %15 : i64
  %17 = program_id [axis=1] : i32
  %18 = cast %17 : i64
  %19 = num_programs [axis=1] : i32
  %20 = cast %19 : i64
  %21 = binary [kind=mul] %18, %16 : i64
  %22 = binary [kind=add] %14, %21 : i64
  %23 = binary [kind=mul] %16, %20 : i64
  %24 = program_id [axis=2] : i32
  %25 = cast %24 : i64
  %26 = num_programs [axis=2] : i32
  %27 = cast %26 : i64
  %28 = binary [kind=mul] %25, %23 : i64
  %29 = binary [kind=add] %22, %28 : i64
  %30 = binary [kind=mul] %23, %27 : i64
  %31 = constant [value=0] : i64
  %32 = binary [kind=mul] %30, %31 : i64
  %33 = binary [kind=add] %32, %29 : i64
  %34 = constant [value=128] : i64
  %35 = binary [kind=mul] %33, %34 : i64
  %36 = add_ptr %tensor_map_workspace, %35 : *u8
  %37 = cast %stride_a : i64
  %38 = tensormap_replace %36, %tensor_map_template0, %a_ptr, %9, %K, %37, %10 : tensordesc<64x32xfp16>
  %39 = constant [value=64] : i32
  %40 = constant [value=1] : i64
  %41 = constant [value=0] : i32
  %42 = constant [value=0] : i32
  %43 = program_id [axis=0] : i32
  %44 = cast %43 : i64
  %45 = num_programs [axis=0] : i32
  %46 = cast %45 : i64
  %47 = program_id [axis=1] : i32
  %48 = cast %47 : i64
  %49 = num_programs [axis=1] : i32
  %50 = cast %49 : i64
  %51 = binary [kind=mul] %48, %46 : i64
  %52 = binary [kind=add] %44, %51 : i64
  %53 = binary [kind=mul] %46, %50 : i64
  %54 = program_id [axis=2] : i32
  %55 = cast %54 : i64
  %56 = num_programs [axis=2] : i32
  %57 = cast %56 : i64
  %58 = binary [kind=mul] %55, %53 : i64
  %59 = binary [kind=add] %52, %58 : i64
  %60 = binary [kind=mul] %53, %57 : i64
  %61 = constant [value=1] : i64
  %62 = binary [kind=mul] %60, %61 : i64
  %63 = binary [kind=add] %62, %59 : i64
  %64 = constant [value=128] : i64
  %65 = binary [kind=mul] %63, %64 : i64
  %66 = add_ptr %tensor_map_workspace, %65 : *u8
  %67 = cast %stride_b : i64
  %68 = tensormap_replace %66, %tensor_map_template1, %b_ptr, %39, %K, %67, %40 : tensordesc<64x32xfp16>
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %70 = constant [value=0] : i32
  %71 = constant [value=32] : i32
  tensormap_fence %38
  tensormap_fence %68
  %a_block.offsets[0], %a_block.offsets[1], %b_block.offsets[0], %b_block.offsets[1], %acc_76 = for %70, %K, %71, %11, %12, %41, %42, %acc : i32, i32, i32, i32, tensor<64x64xfp32> {
    ^(%_: i32, %a_block.offsets[0]_78: i32, %a_block.offsets[1]_79: i32, %b_block.offsets[0]_80: i32, %b_block.offsets[1]_81: i32, %acc_82: tensor<64x64xfp32>)
    %83 = allocate_shared_memory : shared<64x32xfp16, #L0>
    %84 = allocate_shared_memory : shared<1xi64, #L1>
    mbarrier_init [count=1] %84
    mbarrier_expect [nbytes=4096] %84
    %85 = binary [kind=sub] %_, %70 : i32
    %86 = binary [kind=add] %12, %85 : i32
    tma_async_copy_global_to_shared %38, %11, %86, %84, %83
    %87 = constant [value=0] : i32
    mbarrier_wait %84, %87
    %88 = shared_load %83 : tensor<64x32xfp16, #L2>
    %89 = convert_layout %88 : tensor<64x32xfp16>
    fence_async_shared
    mbarrier_invalidate %84
    %90 = allocate_shared_memory : shared<64x32xfp16, #L0>
    %91 = allocate_shared_memory : shared<1xi64, #L1>
    mbarrier_init [count=1] %91
    mbarrier_expect [nbytes=4096] %91
    %92 = binary [kind=sub] %_, %70 : i32
    %93 = binary [kind=add] %41, %92 : i32
    tma_async_copy_global_to_shared %68, %42, %93, %91, %90
    %94 = constant [value=0] : i32
    mbarrier_wait %91, %94
    %95 = shared_load %90 : tensor<64x32xfp16, #L2>
    %96 = convert_layout %95 : tensor<64x32xfp16>
    fence_async_shared
    mbarrier_invalidate %91
    %97 = permute [order=(1, 0)] %96 : tensor<32x64xfp16>
    %acc_98 = dot %89, %97, %acc_82 : tensor<64x64xfp32>
    %99 = constant [value=0] : i32
    %100 = binary [kind=add] %a_block.offsets[0]_78, %99 : i32
    %101 = constant [value=32] : i32
    %102 = binary [kind=add] %a_block.offsets[1]_79, %101 : i32
    %103 = constant [value=32] : i32
    %104 = binary [kind=add] %b_block.offsets[0]_80, %103 : i32
    %105 = constant [value=0] : i32
    %106 = binary [kind=add] %b_block.offsets[1]_81, %105 : i32
    yield %100, %102, %104, %106, %acc_98
  }
  %107 = arange [start=0 end=64] : tensor<64xi32>
  %108 = expand_dims [axis=1] %107 : tensor<64x1xi32>
  %109 = constant [value=64] : tensor<64x1xi32>
  %110 = binary [kind=mul] %108, %109 : tensor<64x1xi32>
  %111 = splat %c_ptr : tensor<64x1x*fp32>
  %112 = add_ptr %111, %110 : tensor<64x1x*fp32>
  %113 = arange [start=0 end=64] : tensor<64xi32>
  %114 = expand_dims [axis=0] %113 : tensor<1x64xi32>
  %115 = broadcast %112 : tensor<64x64x*fp32>
  %116 = broadcast %114 : tensor<64x64xi32>
  %117 = add_ptr %115, %116 : tensor<64x64x*fp32>
  store %117, %acc_76
}
"""
