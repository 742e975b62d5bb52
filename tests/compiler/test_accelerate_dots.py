"""accelerate_dots: a `dot` becomes shared stores, a fence, wgmma and its wait (buffers
allocated before the loop), or multiply-and-sum tile ops for tiles wgmma cannot take.

The golden text is `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites it.
"""

import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (AllocateSharedMemory, Dot, FenceAsyncShared, For, MmaV2, Reduce, SharedStore,
                              WarpgroupMma, WarpgroupMmaWait)
from weft.compiler.passes.accelerate_dots import accelerate_dots, choose_wgmma, mma_v2_warps, wgmma_warps
from weft.compiler.printer import print_kernel
from weft.compiler.types import ScalarType, SharedType
from weft.compiler.verifier import VerificationError, verify
from weft.layouts import default_nvmma_swizzle

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())


@tl.jit
def tile_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                PRECISION: tl.constexpr, ACC: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] * BLOCK_N + offs_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * BLOCK_N
    tl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


def until_accelerated(element="fp16", m=64, n=64, k=32, num_warps=4, precision=None):
    """tile_matmul after the passes up to accelerate_dots, verified after each."""
    signature = {"a_ptr": f"*{element}", "b_ptr": f"*{element}", "c_ptr": "*fp32" if element != "int8" else "*i32",
                 "K": "i32"}
    constexprs = dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, PRECISION=precision,
                      ACC=tl.int32 if element == "int8" else tl.float32)
    kernel = build_kernel(tile_matmul, signature, constexprs, num_warps,
                          {name: "divisible_by_16" for name in signature}, language="highlevel")
    assert any(isinstance(op, Dot) for op in kernel.walk())
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "accelerate_dots":
            return kernel
    raise AssertionError("accelerate_dots is not in TILE_PASSES")


def test_a_dot_left_in_a_layout_stage_kernel_fails_verification():
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    tile = build_kernel(tile_matmul, signature, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, PRECISION=None,
                                                     ACC=tl.float32), 4, {}, language="highlevel")
    verify(tile)
    with pytest.raises(VerificationError, match="`tile`-stage op in a `layout`-stage kernel"):
        verify(tile.with_body(tile.body, stage="layout"))


def test_the_pass_sits_after_coalesce_and_before_propagation():
    names = [name for name, _ in pipeline.TILE_PASSES]
    assert names.index("coalesce") < names.index("accelerate_dots") < names.index("propagate_layouts")
    assert dict(pipeline.TILE_PASSES)["accelerate_dots"] is accelerate_dots


TILE_MATMUL_64x64x32 = """\
#L0 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,0), (2,8), (4,16), (8,0), (16,0), (32,0)]} -> [64x32]
#L1 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0)]} -> [32x64]
#L2 = {register=[(0,1), (0,2), (0,4), (32,0)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [64x32]
#L3 = {register=[(0,1), (0,2), (0,4), (16,0)] lane=[(0,8), (0,16), (0,32), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [32x64]
#L4 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L5 = {register=[(0,1), (0,2), (8,0), (16,0), (32,0)] lane=[(0,4), (0,8), (0,16), (0,32), (1,0)] warp=[(2,0), (4,0)]} -> [64x64]
kernel @tile_matmul(%a_ptr: *fp16, %b_ptr: *fp16, %c_ptr: *fp32, %K: i32) num_warps=4 {
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
  %a_smem = allocate_shared_memory : shared<64x32xfp16, #L0>
  %b_smem = allocate_shared_memory : shared<32x64xfp16, #L1>
  %a_ptrs_30, %b_ptrs_31, %acc_32 = for %26, %K, %27, %a_ptrs, %b_ptrs, %acc : tensor<64x32x*fp16>, tensor<32x64x*fp16>, tensor<64x64xfp32> {
    ^(%k: i32, %a_ptrs_34: tensor<64x32x*fp16>, %b_ptrs_35: tensor<32x64x*fp16>, %acc_36: tensor<64x64xfp32>)
    %37 = convert_layout %a_ptrs_34 : tensor<64x32x*fp16, #L2>
    %38 = load %37 : tensor<64x32xfp16, #L2>
    %39 = convert_layout %38 : tensor<64x32xfp16>
    %40 = convert_layout %b_ptrs_35 : tensor<32x64x*fp16, #L3>
    %41 = load %40 : tensor<32x64xfp16, #L3>
    %42 = convert_layout %41 : tensor<32x64xfp16>
    shared_store %a_smem, %39
    shared_store %b_smem, %42
    fence_async_shared
    %43 = convert_layout %acc_36 : tensor<64x64xfp32, #L4>
    %acc_44 = warpgroup_mma [is_async=True] %a_smem, %b_smem, %43 : tensor<64x64xfp32, #L4>
    %acc_45 = warpgroup_mma_wait [pending=0] %acc_44 : tensor<64x64xfp32, #L4>
    %acc_46 = convert_layout %acc_45 : tensor<64x64xfp32>
    %47 = constant [value=32] : tensor<64x32xi32>
    %a_ptrs_48 = add_ptr %a_ptrs_34, %47 : tensor<64x32x*fp16>
    %49 = constant [value=2048] : tensor<32x64xi32>
    %b_ptrs_50 = add_ptr %b_ptrs_35, %49 : tensor<32x64x*fp16>
    yield %a_ptrs_48, %b_ptrs_50, %acc_46
  }
  %51 = expand_dims [axis=1] %offs_m : tensor<64x1xi32>
  %52 = constant [value=64] : tensor<64x1xi32>
  %53 = binary [kind=mul] %51, %52 : tensor<64x1xi32>
  %54 = splat %c_ptr : tensor<64x1x*fp32>
  %55 = add_ptr %54, %53 : tensor<64x1x*fp32>
  %56 = expand_dims [axis=0] %offs_n : tensor<1x64xi32>
  %57 = broadcast %55 : tensor<64x64x*fp32>
  %58 = broadcast %56 : tensor<64x64xi32>
  %59 = add_ptr %57, %58 : tensor<64x64x*fp32>
  %60 = convert_layout %59 : tensor<64x64x*fp32, #L5>
  %61 = convert_layout %acc_32 : tensor<64x64xfp32, #L5>
  store %60, %61
}
"""


def test_golden_wgmma_with_buffers_before_the_loop():
    kernel = until_accelerated()
    check_golden(print_kernel(kernel), "TILE_MATMUL_64x64x32")
    top = kernel.body.ops
    allocations = [op for op in top if isinstance(op, AllocateSharedMemory)]
    loop = next(op for op in top if isinstance(op, For))
    assert len(allocations) == 2 and all(top.index(a) < top.index(loop) for a in allocations)
    stores = [op for op in loop.body.ops if isinstance(op, SharedStore)]
    assert [s.buffer for s in stores] == [a.result for a in allocations]  # one buffer per operand


@pytest.mark.parametrize("m, num_warps, warps", [(64, 4, (4, 1)), (128, 4, (4, 1)), (128, 8, (8, 1)),
                                                 (64, 8, (4, 2)), (256, 8, (8, 1)), (128, 16, (8, 2))])
def test_warps_stack_along_m_while_it_has_more_than_16_rows_per_warp(m, num_warps, warps):
    assert wgmma_warps(m, num_warps) == warps


@pytest.mark.parametrize("element, m, n, k, num_warps", [
    ("fp16", 128, 256, 64, 8), ("bf16", 64, 64, 16, 4), ("fp16", 64, 32, 32, 8), ("fp32", 128, 128, 32, 8),
    ("fp8e4m3", 128, 128, 128, 4), ("fp8e5m2", 64, 16, 32, 4), ("bf16", 64, 128, 16, 4)])
def test_the_choice_follows_the_tile(element, m, n, k, num_warps):
    element = ScalarType(element)
    choice, why = choose_wgmma(m, n, k, element, num_warps)
    assert choice is not None, why
    warps_m, warps_n = choice.warps_per_cta
    assert (warps_m * warps_n, choice.instr_n, choice.instr_k) == (num_warps, min(256, n // warps_n),
                                                                   256 // element.bits)
    assert choice.acc_encoding.instr_shape == (16, choice.instr_n, choice.instr_k)
    # The widest swizzle the rows allow; B K-major (transposed) unless 16-bit.
    transposed = element.bits != 16
    assert choice.a_shared.swizzle_byte_width == default_nvmma_swizzle((m, k), element.bits)
    assert choice.b_shared.transposed == transposed
    assert choice.b_shared.swizzle_byte_width == default_nvmma_swizzle((k, n), element.bits, transposed)


def test_128_byte_rows_get_the_128_byte_swizzle():
    choice, _ = choose_wgmma(128, 128, 64, ScalarType("fp16"), 8)
    assert (choice.a_shared.swizzle_byte_width, choice.b_shared.swizzle_byte_width) == (128, 128)


@pytest.mark.parametrize("m, n, k, num_warps, reason", [
    (32, 64, 32, 4, "64 rows per warpgroup"), (64, 64, 32, 8 + 2, "whole warpgroups"),
    (64, 64, 24, 4, "steps K by 16"), (64, 64, 32, 2, "whole warpgroups")])
def test_tiles_wgmma_cannot_take_say_why(m, n, k, num_warps, reason):
    choice, why = choose_wgmma(m, n, k, ScalarType("fp16"), num_warps)
    assert choice is None and reason in why


@pytest.mark.parametrize("options, warps", [(dict(m=16, n=32, k=16), (1, 4)),
                                            (dict(m=32, n=32, k=32, num_warps=2), (2, 1)),
                                            (dict(element="bf16", m=32, n=128, k=64, num_warps=8), (2, 4))])
def test_16_bit_tiles_too_small_for_wgmma_run_on_mma_v2(options, warps):
    kernel = until_accelerated(**options)
    ops = list(kernel.walk())
    assert not any(isinstance(op, (WarpgroupMma, FenceAsyncShared)) for op in ops)
    (mma,) = [op for op in ops if isinstance(op, MmaV2)]
    assert mma.result.type.encoding.warps_per_cta == warps
    assert all(isinstance(v.type, SharedType) for v in (mma.a, mma.b))
    assert sum(isinstance(op, AllocateSharedMemory) for op in kernel.body.ops) == 2  # before the loop


@pytest.mark.parametrize("m, n, num_warps, warps", [(16, 32, 4, (1, 4)), (64, 64, 4, (2, 2)), (128, 32, 8, (8, 1)),
                                                    (32, 128, 8, (2, 4))])
def test_mma_v2_warps_follow_the_longer_side(m, n, num_warps, warps):
    assert mma_v2_warps(m, n, num_warps) == warps


@pytest.mark.parametrize("options", [dict(m=16, n=16, k=16, num_warps=8),
                                     dict(element="fp32", precision="ieee", m=32, n=32, k=16),
                                     dict(element="int8", m=16, n=16, k=32)])
def test_other_small_tiles_become_multiply_and_sum(options):
    kernel = until_accelerated(**options)
    ops = list(kernel.walk())
    assert not any(isinstance(op, (WarpgroupMma, WarpgroupMmaWait, AllocateSharedMemory)) for op in ops)
    sums = [op for op in ops if isinstance(op, Reduce)]
    assert len(sums) == 1 and sums[0].kind == "sum" and sums[0].axis == 1
    assert sums[0].operand.type.shape == (options["m"], options["k"], options["n"])


def test_tf32x3_is_three_tf32_wgmmas_of_the_split_operands():
    kernel = until_accelerated(element="fp32", m=64, n=64, k=32, precision="tf32x3")
    loop = next(op for op in kernel.body.ops if isinstance(op, For))
    dots = [op for op in loop.body.ops if isinstance(op, WarpgroupMma)]
    assert len(dots) == 3 and dots[1].acc.type.layout == dots[0].result.type.layout
    # The heads each feed two dots of the loop body: stored once, both dots read that buffer.
    assert sum(isinstance(op, AllocateSharedMemory) for op in kernel.body.ops) == 4
    assert sum(isinstance(op, SharedStore) for op in loop.body.ops) == 4


def test_a_tile_too_large_for_the_fallback_says_what_to_change():
    with pytest.raises(CompilationError) as info:
        until_accelerated(element="fp32", precision="ieee", m=128, n=128, k=32)
    error = info.value
    assert "cannot run on the tensor cores" in error.message and "input_precision='ieee'" in error.message
    assert "tf32" in error.render()
    assert error.loc.line > 0 and "tl.dot(" in error.render()


@tl.jit
def tile_attention_step(q_ptr, k_ptr, v_ptr, o_ptr, N, BLOCK: tl.constexpr):
    """acc += (q @ k_j^T).to(fp16) @ v_j over key blocks j: Q stored once before the loop,
    k_j stored as loaded and read through a transposed view, P from registers."""
    offs = tl.arange(0, BLOCK)
    q = tl.load(q_ptr + offs[:, None] * BLOCK + offs[None, :])
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for n in range(0, N, BLOCK):
        k = tl.load(k_ptr + (n + offs[:, None]) * BLOCK + offs[None, :])
        v = tl.load(v_ptr + (n + offs[:, None]) * BLOCK + offs[None, :])
        acc = tl.dot(tl.dot(q, tl.trans(k)).to(tl.float16), v, acc)
    tl.store(o_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


def test_golden_register_a_and_a_transposed_view():
    signature = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp32", "N": "i32"}
    specialization = {name: "divisible_by_16" for name in signature}
    kernel = build_kernel(tile_attention_step, signature, {"BLOCK": 64}, 4, specialization, language="highlevel")
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "accelerate_dots":
            break
    check_golden(print_kernel(kernel), "TILE_ATTENTION_STEP_64")
TILE_ATTENTION_STEP_64 = """\
#L0 = {register=[(0,1), (0,2), (0,4), (16,0), (32,0)] lane=[(0,8), (0,16), (0,32), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [64x64]
#L1 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0), (32,0)]} -> [64x64]
#L2 = {offset=[(1,0), (2,0), (4,0), (8,0), (16,0), (32,0), (8,1), (16,2), (32,4), (0,8), (0,16), (0,32)]} -> [64x64]
#L3 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x64]
#L4 = {register=[(0,1), (0,2), (8,0), (16,0), (32,0)] lane=[(0,4), (0,8), (0,16), (0,32), (1,0)] warp=[(2,0), (4,0)]} -> [64x64]
kernel @tile_attention_step(%q_ptr: *fp16, %k_ptr: *fp16, %v_ptr: *fp16, %o_ptr: *fp32, %N: i32) num_warps=4 {
  %offs = arange [start=0 end=64] : tensor<64xi32>
  %6 = expand_dims [axis=1] %offs : tensor<64x1xi32>
  %7 = constant [value=64] : tensor<64x1xi32>
  %8 = binary [kind=mul] %6, %7 : tensor<64x1xi32>
  %9 = splat %q_ptr : tensor<64x1x*fp16>
  %10 = add_ptr %9, %8 : tensor<64x1x*fp16>
  %11 = expand_dims [axis=0] %offs : tensor<1x64xi32>
  %12 = broadcast %10 : tensor<64x64x*fp16>
  %13 = broadcast %11 : tensor<64x64xi32>
  %14 = add_ptr %12, %13 : tensor<64x64x*fp16>
  %15 = convert_layout %14 : tensor<64x64x*fp16, #L0>
  %16 = load %15 : tensor<64x64xfp16, #L0>
  %q = convert_layout %16 : tensor<64x64xfp16>
  %acc = constant [value=0.0] : tensor<64x64xfp32>
  %19 = constant [value=0] : i32
  %20 = constant [value=64] : i32
  %a_smem = allocate_shared_memory : shared<64x64xfp16, #L1>
  shared_store %a_smem, %q
  %b_smem = allocate_shared_memory : shared<64x64xfp16, #L1>
  %b_smem_23 = allocate_shared_memory : shared<64x64xfp16, #L1>
  %acc_24 = for %19, %N, %20, %acc : tensor<64x64xfp32> {
    ^(%n: i32, %acc_26: tensor<64x64xfp32>)
    %27 = expand_dims [axis=1] %offs : tensor<64x1xi32>
    %28 = splat %n : tensor<64x1xi32>
    %29 = binary [kind=add] %28, %27 : tensor<64x1xi32>
    %30 = constant [value=64] : tensor<64x1xi32>
    %31 = binary [kind=mul] %29, %30 : tensor<64x1xi32>
    %32 = splat %k_ptr : tensor<64x1x*fp16>
    %33 = add_ptr %32, %31 : tensor<64x1x*fp16>
    %34 = expand_dims [axis=0] %offs : tensor<1x64xi32>
    %35 = broadcast %33 : tensor<64x64x*fp16>
    %36 = broadcast %34 : tensor<64x64xi32>
    %37 = add_ptr %35, %36 : tensor<64x64x*fp16>
    %38 = convert_layout %37 : tensor<64x64x*fp16, #L0>
    %39 = load %38 : tensor<64x64xfp16, #L0>
    %k = convert_layout %39 : tensor<64x64xfp16>
    %41 = expand_dims [axis=1] %offs : tensor<64x1xi32>
    %42 = splat %n : tensor<64x1xi32>
    %43 = binary [kind=add] %42, %41 : tensor<64x1xi32>
    %44 = constant [value=64] : tensor<64x1xi32>
    %45 = binary [kind=mul] %43, %44 : tensor<64x1xi32>
    %46 = splat %v_ptr : tensor<64x1x*fp16>
    %47 = add_ptr %46, %45 : tensor<64x1x*fp16>
    %48 = expand_dims [axis=0] %offs : tensor<1x64xi32>
    %49 = broadcast %47 : tensor<64x64x*fp16>
    %50 = broadcast %48 : tensor<64x64xi32>
    %51 = add_ptr %49, %50 : tensor<64x64x*fp16>
    %52 = convert_layout %51 : tensor<64x64x*fp16, #L0>
    %53 = load %52 : tensor<64x64xfp16, #L0>
    %v = convert_layout %53 : tensor<64x64xfp16>
    shared_store %b_smem, %k
    %b_smem_55 = shared_permute [order=(1, 0)] %b_smem : shared<64x64xfp16, #L2>
    fence_async_shared
    %56 = constant [value=0.0] : tensor<64x64xfp32>
    %57 = convert_layout %56 : tensor<64x64xfp32, #L3>
    %58 = warpgroup_mma [is_async=True] %a_smem, %b_smem_55, %57 : tensor<64x64xfp32, #L3>
    %59 = warpgroup_mma_wait [pending=0] %58 : tensor<64x64xfp32, #L3>
    %60 = convert_layout %59 : tensor<64x64xfp32>
    %61 = cast %60 : tensor<64x64xfp16>
    shared_store %b_smem_23, %v
    fence_async_shared
    %62 = convert_layout %acc_26 : tensor<64x64xfp32, #L3>
    %acc_63 = warpgroup_mma [is_async=True] %61, %b_smem_23, %62 : tensor<64x64xfp32, #L3>
    %acc_64 = warpgroup_mma_wait [pending=0] %acc_63 : tensor<64x64xfp32, #L3>
    %acc_65 = convert_layout %acc_64 : tensor<64x64xfp32>
    yield %acc_65
  }
  %66 = expand_dims [axis=1] %offs : tensor<64x1xi32>
  %67 = constant [value=64] : tensor<64x1xi32>
  %68 = binary [kind=mul] %66, %67 : tensor<64x1xi32>
  %69 = splat %o_ptr : tensor<64x1x*fp32>
  %70 = add_ptr %69, %68 : tensor<64x1x*fp32>
  %71 = expand_dims [axis=0] %offs : tensor<1x64xi32>
  %72 = broadcast %70 : tensor<64x64x*fp32>
  %73 = broadcast %71 : tensor<64x64xi32>
  %74 = add_ptr %72, %73 : tensor<64x64x*fp32>
  %75 = convert_layout %74 : tensor<64x64x*fp32, #L4>
  %76 = convert_layout %acc_24 : tensor<64x64xfp32, #L4>
  store %75, %76
}
"""
