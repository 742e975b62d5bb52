"""stage_pointer_loads on the tutorial's pointer dot loop: A's pointer tile (rows masked by
M, k by K - k * BK) and B's (k masked, advanced by BK * stride_b) are proven boxes; each
load becomes `desc.load` of a tensor map the host encodes from the arguments (hidden
parameters: A [M, K] with stride stride_a, B [K, 2**31] whose unmasked columns take every
coordinate a box can) at the coordinates (pid * 64 + 0, 0 + (k - 0) * 32) and ((k - 0) * 32, 0);
the pointer tiles, the masks and the carried pointers are gone. The same kernel with B's
stride not known a multiple of 16 bytes keeps both pointer loads and adds no parameter.

The golden text is `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites it.
"""

from weft import highlevel as tl
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import For, Load, TmaAsyncCopyGlobalToShared
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.highlevel.pointer_tma import stage_pointer_loads_by_tma
from weft.runtime import made_tensor_descriptor as made

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def pointer_dot_loop(a_ptr, b_ptr, c_ptr, M, K, stride_a, stride_b):
    rows = tl.program_id(0) * 64 + tl.arange(0, 64)
    ks = tl.arange(0, 32)
    cols = tl.arange(0, 64)
    a_ptrs = a_ptr + rows[:, None] * stride_a + ks[None, :]
    b_ptrs = b_ptr + ks[:, None] * stride_b + cols[None, :]
    acc = tl.zeros([64, 64], tl.float32)
    for k in range(0, tl.cdiv(K, 32)):
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < K - k * 32), other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < K - k * 32, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += 32
        b_ptrs += 32 * stride_b
    tl.store(c_ptr + rows[:, None] * 64 + cols[None, :], acc, mask=rows[:, None] < M)


SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "K": "i32", "stride_a": "i32",
             "stride_b": "i32"}


def staged(b_stride_aligned: bool):
    specialization = {"a_ptr": "divisible_by_16", "b_ptr": "divisible_by_16", "stride_a": "divisible_by_16",
                      "stride_b": "divisible_by_16" if b_stride_aligned else ""}
    kernel = build_kernel(pointer_dot_loop, SIGNATURE, {}, 4, specialization, language="highlevel")
    return verify(stage_pointer_loads_by_tma(kernel))


def test_boxes_golden():
    kernel = staged(True)
    ops = list(kernel.walk())
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops) == 2
    assert not any(isinstance(op, Load) for op in ops)
    loop = next(op for op in ops if isinstance(op, For))
    assert len(loop.inits) == 1  # only the accumulator is carried
    assert [key[0] for key in kernel.hidden_params] == ["a_ptr", "b_ptr"]
    assert [eval(key[2])[:2] for key in kernel.hidden_params] == [  # (shape, strides), outermost first
        ((("param", "M"), ("param", "K")), (("param", "stride_a"), ("const", 1))),
        ((("param", "K"), ("const", 2**31)), (("param", "stride_b"), ("const", 1)))]
    # Only read: a launch where a bound is empty (K = 0) encodes a map of zeros, not an error.
    assert all(made.is_load_only(key[2]) for key in kernel.hidden_params)
    check_golden(print_kernel(kernel), "BOXES")


def test_an_unaligned_stride_keeps_both_pointer_loads():
    kernel = staged(False)
    ops = list(kernel.walk())
    assert sum(isinstance(op, Load) for op in ops) == 2
    assert not any(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops) and not kernel.hidden_params
BOXES = """\
#L0 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L1 = {} -> [1]
#L2 = {register=[(0,1), (0,2), (0,4), (32,0)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [64x32]
#L3 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L4 = {register=[(0,1), (0,2), (0,4), (16,0)] lane=[(0,8), (0,16), (0,32), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [32x64]
kernel @pointer_dot_loop(%a_ptr: *fp16, %b_ptr: *fp16, %c_ptr: *fp32, %M: i32, %K: i32, %stride_a: i32, %stride_b: i32, %a_ptr_desc0: tensordesc<64x32xfp16>, %b_ptr_desc1: tensordesc<32x64xfp16>) num_warps=4 {
  %9 = program_id [axis=0] : i32
  %10 = constant [value=64] : i32
  %11 = binary [kind=mul] %9, %10 : i32
  %12 = arange [start=0 end=64] : tensor<64xi32>
  %13 = splat %11 : tensor<64xi32>
  %rows = binary [kind=add] %13, %12 : tensor<64xi32>
  %cols = arange [start=0 end=64] : tensor<64xi32>
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %17 = constant [value=32] : i32
  %18 = binary [kind=add] %K, %17 : i32
  %19 = constant [value=1] : i32
  %20 = binary [kind=sub] %18, %19 : i32
  %21 = constant [value=32] : i32
  %22 = binary [kind=floordiv] %20, %21 : i32
  %23 = constant [value=0] : i32
  %24 = constant [value=1] : i32
  %acc_25 = for %23, %22, %24, %acc : tensor<64x64xfp32> {
    ^(%k: i32, %acc_27: tensor<64x64xfp32>)
    %28 = constant [value=0] : i32
    %29 = binary [kind=sub] %k, %23 : i32
    %30 = constant [value=32] : i32
    %31 = binary [kind=mul] %29, %30 : i32
    %32 = binary [kind=add] %28, %31 : i32
    %33 = allocate_shared_memory : shared<64x32xfp16, #L0>
    %34 = allocate_shared_memory : shared<1xi64, #L1>
    mbarrier_init [count=1] %34
    mbarrier_expect [nbytes=4096] %34
    tma_async_copy_global_to_shared %a_ptr_desc0, %11, %32, %34, %33
    %35 = constant [value=0] : i32
    mbarrier_wait %34, %35
    %36 = shared_load %33 : tensor<64x32xfp16, #L2>
    %37 = convert_layout %36 : tensor<64x32xfp16>
    fence_async_shared
    mbarrier_invalidate %34
    %38 = constant [value=0] : i32
    %39 = binary [kind=sub] %k, %23 : i32
    %40 = constant [value=32] : i32
    %41 = binary [kind=mul] %39, %40 : i32
    %42 = binary [kind=add] %38, %41 : i32
    %43 = constant [value=0] : i32
    %44 = allocate_shared_memory : shared<32x64xfp16, #L3>
    %45 = allocate_shared_memory : shared<1xi64, #L1>
    mbarrier_init [count=1] %45
    mbarrier_expect [nbytes=4096] %45
    tma_async_copy_global_to_shared %b_ptr_desc1, %42, %43, %45, %44
    %46 = constant [value=0] : i32
    mbarrier_wait %45, %46
    %47 = shared_load %44 : tensor<32x64xfp16, #L4>
    %48 = convert_layout %47 : tensor<32x64xfp16>
    fence_async_shared
    mbarrier_invalidate %45
    %acc_49 = dot %37, %48, %acc_27 : tensor<64x64xfp32>
    yield %acc_49
  }
  %50 = expand_dims [axis=1] %rows : tensor<64x1xi32>
  %51 = constant [value=64] : tensor<64x1xi32>
  %52 = binary [kind=mul] %50, %51 : tensor<64x1xi32>
  %53 = splat %c_ptr : tensor<64x1x*fp32>
  %54 = add_ptr %53, %52 : tensor<64x1x*fp32>
  %55 = expand_dims [axis=0] %cols : tensor<1x64xi32>
  %56 = broadcast %54 : tensor<64x64x*fp32>
  %57 = broadcast %55 : tensor<64x64xi32>
  %58 = add_ptr %56, %57 : tensor<64x64x*fp32>
  %59 = expand_dims [axis=1] %rows : tensor<64x1xi32>
  %60 = splat %M : tensor<64x1xi32>
  %61 = compare [predicate=lt] %59, %60 : tensor<64x1xi1>
  %62 = broadcast %61 : tensor<64x64xi1>
  store %58, %acc_25, %62
}
"""
