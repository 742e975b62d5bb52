"""plan_data_movement: every reduce, convert_layout and warpgroup_mma carries its plan
after the pass (a reduction with the scratch its partition's warps need, a wgmma with
the static part of its descriptors), and every reader refuses an op without one."""

import dataclasses

import numpy as np
import pytest

from weft.compiler.backend import lower_to_llvm
from weft.compiler.errors import CompilationError
from weft.compiler.ir import Block, ConvertLayout, Kernel, Reduce, Value, WarpSpecialize, WarpgroupMma, Yield
from weft.layouts.rules import reduce_layout
from weft.compiler.passes.allocate_shared_memory import allocate_shared_memory
from weft.compiler.passes.plan_data_movement import plan_data_movement
from weft.compiler.printer import print_kernel
from weft.compiler.types import TensorType, fp32, i32
from weft.compiler.verifier import verify
from weft.layouts import LinearLayout
from weft.layouts.plans import WarpShuffle
from weft.runtime.emulator import EmulationError, emulate

from weft.compiler.warpgroup_mma_descriptors import check_alignment
from weft.compiler.warpgroup_mma_plan import DotPlan

from .backend_kernels import prepare, row_reduce
from .warpgroup_mma_kernels import DotConfig, warpgroup_mma_dot
from .golden import golden_checker

check_golden = golden_checker(__file__, globals())

# [4, 64] over 4 warps: dim1 spans lanes and warps, dim0 lanes only.
LAYOUT = LinearLayout({"register": [(0, 1)], "lane": [(0, 2), (0, 4), (0, 8), (1, 0), (2, 0)],
                       "warp": [(0, 16), (0, 32)], "block": []}, {"dim0": 4, "dim1": 64})
SWAPPED = LinearLayout({"register": [(0, 2)], "lane": [(0, 1), (0, 4), (0, 8), (1, 0), (2, 0)],
                        "warp": [(0, 16), (0, 32)], "block": []}, {"dim0": 4, "dim1": 64})


def _ops(x, kinds=("sum", "argmax")):
    ops = []
    for kind in kinds:
        element = i32 if kind == "argmax" else fp32
        ops.append(Reduce(result=Value(TensorType((4,), element, reduce_layout(LAYOUT, 1)), f"row_{kind}"),
                          operand=x, axis=1, kind=kind))
    ops.append(Reduce(result=Value(TensorType((64,), fp32, reduce_layout(LAYOUT, 0)), "col_sum"),
                      operand=x, axis=0, kind="sum"))
    ops.append(ConvertLayout(result=Value(TensorType((4, 64), fp32, SWAPPED), "y"), operand=x))
    return ops


def _kernel():
    x = Value(TensorType((4, 64), fp32, LAYOUT), "x")
    return Kernel("plans", (x,), Block((), tuple(_ops(x))), 4)


GOLDEN_PLANNED = """\
#L0 = {register=[(0,1)] lane=[(0,2), (0,4), (0,8), (1,0), (2,0)] warp=[(0,16), (0,32)]} -> [4x64]
#L1 = {lane=[(0), (0), (0), (1), (2)] warp=[(0), (0)]} -> [4]
#L2 = {register=[(1)] lane=[(2), (4), (8), (0), (0)] warp=[(16), (32)]} -> [64]
#L3 = {register=[(0,2)] lane=[(0,1), (0,4), (0,8), (1,0), (2,0)] warp=[(0,16), (0,32)]} -> [4x64]
kernel @plans(%x: tensor<4x64xfp32, #L0>) num_warps=4 {
  %row_sum = reduce [axis=1 kind=sum] %x : tensor<4xfp32, #L1>
  %row_argmax = reduce [axis=1 kind=argmax] %x : tensor<4xi32, #L1>
  %col_sum = reduce [axis=0 kind=sum] %x : tensor<64xfp32, #L2>
  %y = convert_layout [plan=WarpShuffle(element_bits=32, local_register=((0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1), (0, -1), (-1, 1)), rounds=(ShuffleRound(source_lane=(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14, 17, 16, 19, 18, 21, 20, 23, 22, 25, 24, 27, 26, 29, 28, 31, 30), send_register=((1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0),), receive_register=((1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0),), lane_xor=1),), warp_register_xor=(0, 0), block_register_xor=(), register_copies=())] %x : tensor<4x64xfp32, #L3>
}
"""


def test_every_reduce_and_conversion_is_planned_once_and_prints_as_before():
    kernel = plan_data_movement(verify(_kernel()))
    verify(kernel)
    check_golden(print_kernel(kernel), "GOLDEN_PLANNED")
    row_sum, row_argmax, col_sum, convert = kernel.body.ops
    assert isinstance(convert.plan, WarpShuffle)
    # Across warps: one partial per (warp, lane, result register), in 32 bits; argmax adds
    # an i32 index. Within a warp: no warp stage, no scratch.
    assert row_sum.plan.warp_steps and row_sum.plan.scratch_bytes == 4 * 32 * 1 * 4
    assert row_argmax.plan.scratch_bytes == 4 * 32 * 1 * 8
    assert not col_sum.plan.warp_steps and col_sum.plan.scratch_bytes == 0
    assert plan_data_movement(kernel) == kernel  # planned ops keep their plans


def test_a_worker_partition_plans_scratch_for_its_own_warps():
    x = Value(TensorType((4, 64), fp32, LAYOUT), "x")
    inner = Value(x.type, "inner")
    row = Value(TensorType((4,), fp32, reduce_layout(LAYOUT, 1)), "row")
    worker = Block((inner,), (Reduce(result=row, operand=inner, axis=1, kind="sum"), Yield()))
    default = Block((Value(x.type, "d"),), (Yield(),))
    split = WarpSpecialize(results=(), captures=(x,), default=default, workers=(worker,),
                           worker_num_warps=(4,), worker_num_regs=(0,))
    kernel = plan_data_movement(Kernel("ws", (x,), Block((), (split,)), 8))
    planned = kernel.body.ops[0].workers[0].ops[0]
    assert planned.plan.scratch_bytes == 4 * 32 * 4  # its 4 warps, not the kernel's 8


def test_readers_refuse_a_reduce_the_pass_did_not_plan():
    with pytest.raises(CompilationError, match="plan_data_movement"):
        allocate_shared_memory(_kernel())
    unplanned = row_reduce("max", rows=8, cols=512, warps=(1, 4))
    with pytest.raises(CompilationError, match="plan_data_movement"):
        lower_to_llvm(unplanned)
    x, out = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32), np.zeros(8, np.float32)
    with pytest.raises(EmulationError, match="plan_data_movement"):
        emulate(unplanned, (1,), [x, out, 512])
    planned = allocate_shared_memory(plan_data_movement(unplanned))
    emulate(planned, (1,), [x, out, 512])
    np.testing.assert_array_equal(out, x.max(axis=1))


# ------------------------------------------------------------------------------ wgmma
def _planned_ops(kernel: Kernel):
    """Every op of a kind that carries a plan (a `plan` field)."""
    return [op for op in kernel.walk() if "plan" in op.__dataclass_fields__]


WGMMA_CONFIGS = [
    DotConfig(element="fp16"),                                         # A and B^T in shared memory
    DotConfig(element="fp16", a_in_registers=True, b_kmajor=False),    # register A, MN-major B
    DotConfig(element="fp16", m=128, n=128, k=32, warpgroups=2, a_mmajor=True, is_async=True),
]


@pytest.mark.parametrize("config", WGMMA_CONFIGS, ids=lambda c: c.name)
def test_every_op_that_moves_data_is_planned_and_a_wgmma_runs_from_its_plan(config):
    kernel = plan_data_movement(warpgroup_mma_dot(config))
    unplanned = [op.NAME for op in _planned_ops(kernel) if op.plan is None]
    assert not unplanned, f"ops left without a plan: {unplanned}"
    (dot,) = [op for op in kernel.walk() if isinstance(op, WarpgroupMma)]
    plan = dot.plan
    assert isinstance(plan, DotPlan) and plan.acc.num_warpgroups == config.warpgroups
    assert (plan.a is None) == config.a_in_registers == (plan.a_registers is not None)
    assert plan.b.major == ("K" if config.b_kmajor else "MN")
    if plan.a is not None:
        assert plan.a.major == ("MN" if config.a_mmajor else "K")
        assert (plan.a.tile_mn, plan.a.tile_k) == (64, 16)
    assert plan.steps == config.k // 16 and plan.b.tile_mn == plan.acc.n
    assert plan_data_movement(kernel) == kernel  # planned ops keep their plans

    rng = np.random.default_rng(1)
    a = rng.standard_normal((config.m, config.k)).astype(np.float16)
    b = rng.standard_normal((config.k, config.n)).astype(np.float16)
    c = rng.standard_normal((config.m, config.n)).astype(np.float32)
    out = np.zeros((config.m, config.n), np.float32)
    b_arg = np.ascontiguousarray(b.T) if config.b_kmajor else b
    emulate(prepare(warpgroup_mma_dot(config)), (1,), [a, b_arg, c, out, 1])  # the passes, barriers too
    expected = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


def test_descriptor_plans_leave_only_the_base_address_to_run_time():
    plan = plan_data_movement(warpgroup_mma_dot(DotConfig(element="fp16"))).body
    (dot,) = [op for op in plan.walk() if isinstance(op, WarpgroupMma)]
    b = dot.plan.b  # a 128-byte swizzle: its pattern repeats every 1024 bytes
    assert b.swizzle == 128 and b.alignment == 1024
    check_alignment(b, 1024)
    with pytest.raises(ValueError, match="multiple of 1024 bytes"):
        check_alignment(b, 512)
    # Moving the base moves every descriptor's start field and nothing else.
    for base in (0, 1024, 4096):
        moved, at_zero = b.descriptor(base + b.start_offset(0, 16)), b.descriptor(b.start_offset(0, 16))
        assert dataclasses.replace(moved, start_address=0) == dataclasses.replace(at_zero, start_address=0)
        assert moved.start_address - at_zero.start_address == base


def test_readers_refuse_a_wgmma_the_pass_did_not_plan():
    unplanned = allocate_shared_memory(warpgroup_mma_dot(DotConfig(element="fp16")))
    assert [op.plan for op in unplanned.walk() if isinstance(op, WarpgroupMma)] == [None]
    with pytest.raises(CompilationError, match="plan_data_movement"):
        lower_to_llvm(unplanned)
    args = [np.zeros((64, 64), np.float16), np.zeros((64, 64), np.float16), np.zeros((64, 64), np.float32),
            np.zeros((64, 64), np.float32), 1]
    with pytest.raises(EmulationError, match="plan_data_movement"):
        emulate(unplanned, (1,), args)


def test_the_verifier_refuses_a_wgmma_whose_plan_is_not_for_its_operands():
    kernel = plan_data_movement(warpgroup_mma_dot(DotConfig(element="fp16")))
    registers = plan_data_movement(warpgroup_mma_dot(DotConfig(element="fp16", a_in_registers=True)))
    (dot,) = [op for op in kernel.walk() if isinstance(op, WarpgroupMma)]
    (other,) = [op for op in registers.walk() if isinstance(op, WarpgroupMma)]
    verify(kernel)
    with pytest.raises(CompilationError, match="reads A from registers"):
        dataclasses.replace(dot, plan=other.plan).verify()
    with pytest.raises(CompilationError, match="4 K steps of 16, but a has K = 32"):
        half_k = Value(dataclasses.replace(dot.a.type, shape=(64, 32)), "a_half")
        dataclasses.replace(dot, a=half_k).verify()
