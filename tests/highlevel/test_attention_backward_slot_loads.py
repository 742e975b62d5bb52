"""hoist_slot_loads (compiler/passes/hoist_slot_loads.py): a pipelined loop's shared loads of
its ring slots (row loads staged by pipeline_row_loads: attention backward's lse and delta)
issued before the loop's first wgmma, under the launch option hoist_slot_loads=True. A loop
of our own (a dot minus a row loaded each iteration): golden text, emulator (races,
deadlocks) against float64, ptxas without spills, the ld.shared ahead of the first wgmma in
the PTX; the tutorial's backward: its slot loads moved, emulated against float64."""

import dataclasses

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import For, SharedLoad, WarpgroupMma, WarpgroupMmaWait
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.highlevel import attention_backward_example
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator import emulate

from ..compiler.golden import golden_checker
from ._compile import HAS_PTXAS
from .test_attention_backward_source import LAUNCH, SIGNATURE, SPECIALIZATION, constexprs, forward

check_golden = golden_checker(__file__, globals())
RNG = np.random.default_rng(48)


@tl.jit
def shifted_products(a_ptr, b_ptr, r_ptr, out_ptr, steps, N: tl.constexpr):
    """out = sum over `steps` blocks i of a @ b_i - r_i[None, :], a [64, 16], b_i [16, N]."""
    rows = tl.arange(0, 64)
    inner = tl.arange(0, 16)
    cols = tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * 16 + inner[None, :])
    b_ptrs = b_ptr + inner[:, None] * N + cols[None, :]
    r_ptrs = r_ptr + cols
    acc = tl.zeros([64, N], dtype=tl.float32)
    for _ in range(steps):
        s = tl.dot(a, tl.load(b_ptrs))
        r = tl.load(r_ptrs)
        acc += s - r[None, :]
        b_ptrs += 16 * N
        r_ptrs += N
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc)


SHIFTED = {"a_ptr": "*fp16", "b_ptr": "*fp16", "r_ptr": "*fp32", "out_ptr": "*fp32", "steps": "i32"}
SHIFTED_SPECIALIZATION = {name: "divisible_by_16" for name in SHIFTED if name != "steps"}


def shifted(hoist: bool, n: int = 16):
    return compile_kernel(shifted_products, SHIFTED, {"N": n}, SHIFTED_SPECIALIZATION,
                          {"num_warps": 4, "num_stages": 3, "target": "emulator", "hoist_slot_loads": hoist})


def body_order(loop: For) -> list[str]:
    return [("dot" if isinstance(op, WarpgroupMma) else "wait" if isinstance(op, WarpgroupMmaWait) else "load")
            for op in loop.body.ops if isinstance(op, (WarpgroupMma, WarpgroupMmaWait, SharedLoad))]


def test_the_row_load_moves_above_the_dot():
    loop = next(op for op in shifted(True).body.ops if isinstance(op, For))
    assert body_order(loop) == ["load", "dot", "wait"]
    loop = next(op for op in shifted(False).body.ops if isinstance(op, For))
    assert body_order(loop) == ["dot", "wait", "load"]


@pytest.mark.parametrize("hoist", [True, False])
@pytest.mark.parametrize("steps", [0, 1, 5])  # none, shorter than the prologue, a few
def test_shifted_products_match_float64(hoist, steps):
    a = RNG.standard_normal((64, 16)).astype(np.float16)
    b = RNG.standard_normal((max(steps, 1) * 16, 16)).astype(np.float16)
    r = RNG.standard_normal(max(steps, 1) * 16).astype(np.float32)
    out = np.full((64, 16), np.nan, np.float32)
    emulate(shifted(hoist), (1,), [a, b, r, out, steps])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = sum((a64 @ b64[16 * i:16 * i + 16] - r[16 * i:16 * i + 16][None, :] for i in range(steps)),
                   np.zeros((64, 16)))
    np.testing.assert_allclose(out, expected, atol=1e-4 * (1 + np.abs(expected).max()), rtol=0)


def loop_text(kernel) -> str:
    lines = print_kernel(kernel).splitlines()
    start = next(i for i, line in enumerate(lines) if " = for " in line)
    end = next(i for i in range(start, len(lines)) if lines[i] == "  }")
    return "\n".join(lines[start:end + 1]) + "\n"


def test_golden_loop_after_hoist_slot_loads():
    """The slot's shared_load right before the wgmma, the wait and the subtraction after."""
    kernel = build_kernel(shifted_products, SHIFTED, {"N": 16}, 4, SHIFTED_SPECIALIZATION, language="highlevel")
    kernel = dataclasses.replace(kernel, num_stages=3, hoist_slot_loads=True)
    for name, run_pass in pipeline.TILE_PASSES:
        kernel = verify(run_pass(kernel))
        if name == "hoist_slot_loads":
            break
    check_golden(loop_text(kernel), "GOLDEN_LOOP")


def test_the_launch_option_takes_a_bool():
    with pytest.raises(ValueError, match="hoist_slot_loads must be True or False"):
        compile_kernel(shifted_products, SHIFTED, {"N": 16}, SHIFTED_SPECIALIZATION,
                       {"num_warps": 4, "num_stages": 3, "target": "emulator", "hoist_slot_loads": 1})


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
def test_the_tutorial_at_head_dim_64_assembles_without_spills_with_its_loads_first():
    """(With sink_waits=True as well, the causal kernel spills 40 bytes.)"""
    for causal in (False, True):
        compiled = attention_backward_example.attention_backward_kernel.compile(
            signature=SIGNATURE, constexprs=constexprs(64, causal), specialization=SPECIALIZATION, **LAUNCH,
            hoist_slot_loads=True)
        assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
        ptx = compiled.asm["ptx"]
        # the first loop's first wgmma comes after its lse load
        loop = ptx[ptx.index("cp.async.wait_group"):]
        assert loop.index("ld.shared") < loop.index("wgmma.mma_async")


@pytest.mark.parametrize("causal", [False, True])
def test_the_tutorial_loads_its_rows_first_and_matches_float64(causal):
    kernel = compile_kernel(attention_backward_example.attention_backward_kernel, SIGNATURE, constexprs(64, causal),
                            SPECIALIZATION, {**LAUNCH, "target": "emulator", "hoist_slot_loads": True})
    key_loops = [op for op in kernel.body.ops if isinstance(op, For)][:2 if causal else 1]
    assert all(body_order(loop)[:3] == ["load", "load", "dot"] for loop in key_loops)
    from weft.kernels.attention import reference_attention_backward

    q, k, v, do = ((0.5 * RNG.standard_normal((1, 1, 256, 64))).astype(np.float16) for _ in range(4))
    scale = 64 ** -0.5
    out, lse = forward(q, k, v, causal, scale)
    grads = attention_backward_example.attention_backward(q, k, v, out, lse, do, causal, hoist_slot_loads=True,
                                                          sink_waits=True)
    for name, got, expected in zip(("dq", "dk", "dv"), grads, reference_attention_backward(q, k, v, do, causal, scale)):
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=4e-3 * np.abs(expected).max(), rtol=0,
                                   err_msg=name)


GOLDEN_LOOP = """\
  %b_ptrs_66, %r_ptrs_67, %acc_68, %slot, %ahead, %ahead_71 = for %44, %steps, %45, %b_ptrs_40, %r_ptrs, %acc, %65, %b_ptrs_60, %r_ptrs_61 : tensor<16x16x*fp16, #L16>, tensor<16x*fp32, #L6>, tensor<64x16xfp32, #L17>, i32, tensor<16x16x*fp16, #L15>, tensor<16x*fp32, #L6> {
    ^(%_: i32, %b_ptrs_73: tensor<16x16x*fp16, #L16>, %r_ptrs_74: tensor<16x*fp32, #L6>, %acc_75: tensor<64x16xfp32, #L17>, %slot_76: i32, %ahead_77: tensor<16x16x*fp16, #L15>, %ahead_78: tensor<16x*fp32, #L6>)
    async_copy_wait_group [pending=1]
    %b_smem_79 = shared_index %b_smem, %slot_76 : shared<16x16xfp16, #L21>
    %r_smem_80 = shared_index %r_smem, %slot_76 : shared<16xfp32, #L22>
    fence_async_shared
    %81 = constant [value=0.0] : tensor<64x16xfp32, #L17>
    %r = shared_load %r_smem_80 : tensor<16xfp32, #L23>
    %s = warpgroup_mma [is_async=True] %a_smem, %b_smem_79, %81 : tensor<64x16xfp32, #L17>
    %s_84 = warpgroup_mma_wait [pending=0] %s : tensor<64x16xfp32, #L17>
    %85 = constant [value=2] : i32
    %86 = binary [kind=add] %_, %85 : i32
    %87 = constant [value=2] : i32
    %88 = binary [kind=add] %slot_76, %87 : i32
    %89 = constant [value=3] : i32
    %90 = binary [kind=mod] %88, %89 : i32
    %91 = constant [value=256] : tensor<16x16xi32, #L15>
    %92 = constant [value=16] : tensor<16xi32, #L6>
    %ahead_93 = add_ptr %ahead_77, %91 : tensor<16x16x*fp16, #L15>
    %ahead_94 = add_ptr %ahead_78, %92 : tensor<16x*fp32, #L6>
    %95 = compare [predicate=lt] %86, %steps : i1
    if %95 {
      %b_smem_96 = shared_index %b_smem, %90 : shared<16x16xfp16, #L21>
      async_copy_global_to_shared %b_smem_96, %ahead_77
      %r_smem_97 = shared_index %r_smem, %90 : shared<16xfp32, #L22>
      async_copy_global_to_shared %r_smem_97, %ahead_78
      yield
    } {
      yield
    }
    async_copy_commit_group
    %98 = expand_dims [axis=0] %r : tensor<1x16xfp32, #L24>
    %99 = broadcast %98 : tensor<64x16xfp32, #L17>
    %100 = binary [kind=sub] %s_84, %99 : tensor<64x16xfp32, #L17>
    %acc_101 = binary [kind=add] %acc_75, %100 : tensor<64x16xfp32, #L17>
    %102 = constant [value=256] : tensor<16x16xi32, #L16>
    %b_ptrs_103 = add_ptr %b_ptrs_73, %102 : tensor<16x16x*fp16, #L16>
    %104 = constant [value=16] : tensor<16xi32, #L6>
    %r_ptrs_105 = add_ptr %r_ptrs_74, %104 : tensor<16x*fp32, #L6>
    %106 = constant [value=1] : i32
    %107 = binary [kind=add] %slot_76, %106 : i32
    %108 = constant [value=3] : i32
    %slot_109 = binary [kind=mod] %107, %108 : i32
    yield %b_ptrs_103, %r_ptrs_105, %acc_101, %slot_109, %ahead_93, %ahead_94
  }
"""
