"""drop_deadlocking_turns: a plainly written attention loop that also stores the column sums
of its scores, launched with num_warps=8 and num_stages=3 and no schedule option, is split and takes ping-pong turns by
default; the column sum is a reduction across warps through shared memory (a bar.sync of
the consumer partition) that lands after the take of P V. Without the pass the emulator's
warpgroup replay reports the deadlock; with it the split runs without turns and agrees
with numpy float64. Asked for with pingpong=True, the loop warns; by default it is silent;
a loop with nothing inside its turns keeps them. The golden text is the consumer
partition after the pass; WEFT_ACCEPT=1 rewrites it."""

import inspect
import warnings

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationWarning
from weft.compiler.ir import WarpgroupTurn, WarpSpecialize
from weft.compiler.passes.drop_deadlocking_turns import drop_deadlocking_turns
from weft.compiler.printer import print_kernel
from weft.highlevel.jit import compile_kernel
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator import emulate
from weft.runtime.emulator.errors import EmulationError

from .golden import golden_checker

check_golden = golden_checker(__file__, globals())

HEAD_DIM, BLOCK_M, BLOCK_N = 128, 128, 64  # a ring large enough to be split by default at 8 warps


@tl.jit
def scores_and_column_sums(desc_q, desc_k, desc_v, Out, ColSum, n_ctx, COLUMN_SUMS: tl.constexpr,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Out = (Q K^T) V; ColSum[program, key] = the sum of Q K^T over the program's rows."""
    row = tl.program_id(0) * BLOCK_M
    q = desc_q.load([row, 0])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(0, n_ctx, BLOCK_N):
        p = tl.dot(q, desc_k.load([start, 0]).T)
        acc = tl.dot(p.to(tl.float16), desc_v.load([start, 0]), acc)
        if COLUMN_SUMS:
            tl.store(ColSum + tl.program_id(0) * n_ctx + start + offs_n, tl.sum(p, 0))
    rows = row + tl.arange(0, BLOCK_M)
    tl.store(Out + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], acc)


SIGNATURE = {"desc_q": f"tensordesc<fp16[{BLOCK_M},{HEAD_DIM}]>", "desc_k": f"tensordesc<fp16[{BLOCK_N},{HEAD_DIM}]>",
             "desc_v": f"tensordesc<fp16[{BLOCK_N},{HEAD_DIM}]>", "Out": "*fp32", "ColSum": "*fp32", "n_ctx": "i32"}


def compiled(column_sums: bool = True, **options):
    return compile_kernel(scores_and_column_sums, SIGNATURE,
                          dict(COLUMN_SUMS=column_sums, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N), {},
                          {"num_warps": 8, "num_stages": 3, "target": "emulator", **options})


def turns(kernel) -> int:
    return sum(isinstance(op, WarpgroupTurn) for op in kernel.walk())


def without_the_pass(monkeypatch):
    monkeypatch.setattr(pipeline, "LAYOUT_PASSES",
                        tuple(p for p in pipeline.LAYOUT_PASSES if p[0] != "drop_deadlocking_turns"))


def run(kernel, n_ctx: int = 256):
    rng = np.random.default_rng(40)
    q, k, v = ((0.5 * rng.standard_normal((n_ctx, HEAD_DIM))).astype(np.float16) for _ in range(3))
    out = np.zeros((n_ctx, HEAD_DIM), np.float32)
    column_sums = np.zeros((n_ctx // BLOCK_M, n_ctx), np.float32)
    descs = [TensorDescriptor(t, [n_ctx, HEAD_DIM], [HEAD_DIM, 1], [rows, HEAD_DIM])
             for t, rows in ((q, BLOCK_M), (k, BLOCK_N), (v, BLOCK_N))]
    emulate(kernel, (n_ctx // BLOCK_M, 1), (*descs, out, column_sums, n_ctx))
    scores = q.astype(np.float64) @ k.astype(np.float64).T
    # P is rounded to fp16 before the second dot, as the kernel does.
    np.testing.assert_allclose(out, scores.astype(np.float16).astype(np.float64) @ v.astype(np.float64),
                               atol=2e-2, rtol=2e-3)
    np.testing.assert_allclose(column_sums, scores.reshape(-1, BLOCK_M, n_ctx).sum(axis=1), atol=1e-2, rtol=1e-3)


def test_without_the_pass_the_default_schedule_deadlocks(monkeypatch):
    without_the_pass(monkeypatch)
    kernel = compiled()
    assert turns(kernel)
    with pytest.raises(EmulationError, match="deadlock on the GPU") as caught:
        run(kernel)
    assert "bar.sync of the partition" in str(caught.value)


def test_the_default_schedule_runs_without_turns_and_matches_numpy():
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)  # the default says nothing
        kernel = compiled()
    assert any(isinstance(op, WarpSpecialize) for op in kernel.walk())  # still split
    assert not turns(kernel)
    run(kernel)


def test_asked_for_pingpong_warns_at_the_loop():
    with pytest.warns(CompilationWarning, match="pingpong is not applied to this loop") as caught:
        kernel = compiled(pingpong=True)
    assert not turns(kernel)
    (warning,) = caught
    assert "launch without pingpong" in str(warning.message)
    source, first = inspect.getsourcelines(scores_and_column_sums.fn)
    loop = first + next(i for i, text in enumerate(source) if "for start in" in text)
    column_sum = first + next(i for i, text in enumerate(source) if "tl.sum(p, 0)" in text)
    assert warning.lineno == loop and f"at line {column_sum}" in str(warning.message)


def test_turns_with_no_barrier_inside_are_kept():
    kernel = compiled(column_sums=False)
    assert turns(kernel) and print_kernel(drop_deadlocking_turns(kernel)) == print_kernel(kernel)


def test_drop_deadlocking_turns_golden(monkeypatch):
    without_the_pass(monkeypatch)
    kernel = drop_deadlocking_turns(compiled())
    (split,) = [op for op in kernel.body.ops if isinstance(op, WarpSpecialize)]
    check_golden(print_kernel(kernel.with_body(split.default)), "CONSUMER")
CONSUMER = """\
#L0 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32), (0,64)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0), (64,0)]} -> [128x128]
#L1 = {lane=[(1), (2), (4), (8), (16)] warp=[(32), (0), (0)]} -> [64]
#L2 = {} -> [1]
#L3 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (0,32), (1,8), (2,16), (4,32), (8,0), (16,0), (32,0), (0,64)]} -> [64x128]
#L4 = {offset=[(1,0), (2,0), (4,0), (8,0), (16,0), (32,0), (8,1), (16,2), (32,4), (0,8), (0,16), (0,32), (64,0)]} -> [128x64]
#L5 = {register=[(0,1), (8,0), (0,8), (0,16), (0,32)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0), (64,0)]} -> [128x64]
#L6 = {register=[(1), (8), (16), (32)] lane=[(2), (4), (0), (0), (0)] warp=[(0), (0), (0)]} -> [64]
#L7 = {register=[(2,0), (4,0), (8,0), (16,0), (32,0), (64,0)] lane=[(0,1), (0,2), (0,4), (0,8), (0,16)] warp=[(0,32), (0,64), (1,0)]} -> [128x128]
#L8 = {register=[(2), (4), (8), (16), (32), (64)] lane=[(0), (0), (0), (0), (0)] warp=[(0), (0), (1)]} -> [128]
#L9 = {register=[(2,0), (4,0), (8,0), (16,0), (32,0), (64,0)] lane=[(0,0), (0,0), (0,0), (0,0), (0,0)] warp=[(0,0), (0,0), (1,0)]} -> [128x1]
#L10 = {lane=[(1), (2), (4), (8), (16)] warp=[(32), (64), (0)]} -> [128]
#L11 = {lane=[(0,1), (0,2), (0,4), (0,8), (0,16)] warp=[(0,32), (0,64), (0,0)]} -> [1x128]
kernel @scores_and_column_sums(%desc_q: tensordesc<128x128xfp16>, %desc_k: tensordesc<64x128xfp16>, %desc_v: tensordesc<64x128xfp16>, %Out: *fp32, %ColSum: *fp32, %n_ctx: i32) num_warps=8 shared=180536 {
  %acc = constant [value=0.0] : tensor<128x128xfp32, #L0>
  %offs_n = arange [start=0 end=64] : tensor<64xi32, #L1>
  %8 = constant [value=0] : i32
  %9 = constant [value=0] : i32
  %acc_10, %slot, %phase = for [schedule={}] %13, %n_ctx_14, %15, %acc, %8, %9 : tensor<128x128xfp32, #L0>, i32, i32 {
    ^(%start: i32, %acc_17: tensor<128x128xfp32, #L0>, %slot_18: i32, %phase_19: i32)
    %bar = shared_index %bars, %slot_18 : shared<1xi64, #L2>
    mbarrier_wait %bar, %phase_19
    %22 = shared_index %23, %slot_18 : shared<64x128xfp16, #L3>
    %24 = shared_index %25, %slot_18 : shared<64x128xfp16, #L3>
    %26 = shared_permute [order=(1, 0)] %22 : shared<128x64xfp16, #L4>
    %27 = constant [value=0.0] : tensor<128x64xfp32, #L5>
    %p = warpgroup_mma [is_async=True] %29, %26, %27 : tensor<128x64xfp32, #L5>
    %p_30, %acc_31 = warpgroup_mma_wait [pending=0] %p, %acc_17 : tensor<128x64xfp32, #L5>, tensor<128x128xfp32, #L0>
    %32 = cast %p_30 : tensor<128x64xfp16, #L5>
    %acc_33 = warpgroup_mma [is_async=True] %32, %24, %acc_31 : tensor<128x128xfp32, #L0>
    %34 = constant [value=2] : i32
    %35 = binary [kind=add] %slot_18, %34 : i32
    %36 = constant [value=3] : i32
    %37 = binary [kind=mod] %35, %36 : i32
    %38 = compare [predicate=ne] %start, %13 : i1
    %empty = shared_index %empties, %37 : shared<1xi64, #L2>
    mbarrier_arrive [per_warp=True] %empty, %38
    %41 = program_id [axis=0] : i32
    %42 = binary [kind=mul] %41, %n_ctx_14 : i32
    %43 = add_ptr %ColSum_44, %42 : *fp32
    %45 = add_ptr %43, %start : *fp32
    %46 = splat %45 : tensor<64x*fp32, #L1>
    %47 = add_ptr %46, %offs_n : tensor<64x*fp32, #L1>
    %48 = reduce [axis=0 kind=sum scratch_offset=163840] %p_30 : tensor<64xfp32, #L6>
    %49 = convert_layout [plan=SharedRoundTrip(element_bits=32, scratch=LinearLayout(
  offset   [(1), (8), (2), (4), (16), (32)]
  repetition []
  block    []
  -> dim0=64), store_map=LinearLayout(
  register [(1,0,0), (2,0,0), (16,0,0), (32,0,0)]
  lane     [(4,0,0), (8,0,0), (0,0,0), (0,0,0), (0,0,0)]
  warp     [(0,0,0), (0,0,0), (0,0,0)]
  block    []
  -> offset=64, repetition=1, block=1), load_map=LinearLayout(
  register []
  lane     [(1,0,0), (4,0,0), (8,0,0), (2,0,0), (16,0,0)]
  warp     [(32,0,0), (0,0,0), (0,0,0)]
  block    []
  -> offset=64, repetition=1, block=1), store_vector=4, load_vector=1, store_conflicts=0, load_conflicts=0, store_groups=(((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)),), load_groups=(((0,),),), register_copies=()) scratch_offset=180224] %48 : tensor<64xfp32, #L1>
    store %47, %49
    %50 = constant [value=1] : i32
    %51 = binary [kind=add] %slot_18, %50 : i32
    %52 = constant [value=3] : i32
    %slot_53 = binary [kind=mod] %51, %52 : i32
    %54 = constant [value=0] : i32
    %55 = compare [predicate=eq] %slot_53, %54 : i1
    %56 = cast %55 : i32
    %phase_57 = binary [kind=xor] %phase_19, %56 : i32
    yield %acc_33, %slot_53, %phase_57
  }
  %acc_58 = warpgroup_mma_wait [pending=0] %acc_10 : tensor<128x128xfp32, #L0>
  %acc_59 = convert_layout [plan=SharedRoundTrip(element_bits=32, scratch=LinearLayout(
  offset   [(0,1), (0,8), (0,2), (0,4), (1,0), (16,0), (32,0), (64,0), (0,32), (0,64), (2,0), (4,0), (1,16)]
  repetition [(8,0)]
  block    []
  -> dim0=128, dim1=128), store_map=LinearLayout(
  register [(1,0,0), (0,1,0), (2,0,0), (4112,0,0), (256,0,0), (512,0,0)]
  lane     [(4,0,0), (8,0,0), (16,0,0), (1024,0,0), (2048,0,0)]
  warp     [(32,0,0), (64,0,0), (128,0,0)]
  block    []
  -> offset=8192, repetition=2, block=1), load_map=LinearLayout(
  register [(1024,0,0), (2048,0,0), (0,1,0), (32,0,0), (64,0,0), (128,0,0)]
  lane     [(1,0,0), (4,0,0), (8,0,0), (2,0,0), (4112,0,0)]
  warp     [(256,0,0), (512,0,0), (16,0,0)]
  block    []
  -> offset=8192, repetition=2, block=1), store_vector=4, load_vector=1, store_conflicts=0, load_conflicts=0, store_groups=(((0, 1, 4, 5), (16, 17, 20, 21), (32, 33, 36, 37), (48, 49, 52, 53), (8, 9, 12, 13), (24, 25, 28, 29), (40, 41, 44, 45), (56, 57, 60, 61)), ((2, 3, 6, 7), (18, 19, 22, 23), (34, 35, 38, 39), (50, 51, 54, 55), (10, 11, 14, 15), (26, 27, 30, 31), (42, 43, 46, 47), (58, 59, 62, 63))), load_groups=(((0,), (8,), (16,), (24,), (32,), (40,), (48,), (56,), (1,), (9,), (17,), (25,), (33,), (41,), (49,), (57,), (2,), (10,), (18,), (26,), (34,), (42,), (50,), (58,), (3,), (11,), (19,), (27,), (35,), (43,), (51,), (59,)), ((4,), (12,), (20,), (28,), (36,), (44,), (52,), (60,), (5,), (13,), (21,), (29,), (37,), (45,), (53,), (61,), (6,), (14,), (22,), (30,), (38,), (46,), (54,), (62,), (7,), (15,), (23,), (31,), (39,), (47,), (55,), (63,))), register_copies=()) scratch_offset=131072] %acc_58 : tensor<128x128xfp32, #L7>
  %60 = arange [start=0 end=128] : tensor<128xi32, #L8>
  %61 = splat %row : tensor<128xi32, #L8>
  %rows = binary [kind=add] %61, %60 : tensor<128xi32, #L8>
  %64 = expand_dims [axis=1] %rows : tensor<128x1xi32, #L9>
  %65 = constant [value=128] : tensor<128x1xi32, #L9>
  %66 = binary [kind=mul] %64, %65 : tensor<128x1xi32, #L9>
  %67 = splat %Out_68 : tensor<128x1x*fp32, #L9>
  %69 = add_ptr %67, %66 : tensor<128x1x*fp32, #L9>
  %70 = arange [start=0 end=128] : tensor<128xi32, #L10>
  %71 = expand_dims [axis=0] %70 : tensor<1x128xi32, #L11>
  %72 = broadcast %69 : tensor<128x128x*fp32, #L7>
  %73 = broadcast %71 : tensor<128x128xi32, #L7>
  %74 = add_ptr %72, %73 : tensor<128x128x*fp32, #L7>
  store %74, %acc_59
  yield
}
"""
