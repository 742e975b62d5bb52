"""propagate_layouts: anchors spread forward, free values rematerialized, few conversions.

Golden texts are exact `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites them.
"""

import dataclasses

from weft import highlevel as tl
from weft import lowlevel as ll
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import Binary, Broadcast, ConvertLayout, Reduce
from weft.compiler.passes.coalesce import coalesce
from weft.compiler.passes.propagate_layouts import LAYOUT_RULES, Decision, propagate_layouts
from weft.compiler.printer import print_kernel
from weft.compiler.types import TensorType
from weft.compiler.verifier import verify

from .golden import golden_checker
from .tile_kernels import count_conversions, run_until

check_golden = golden_checker(__file__, globals())


ROW_SOFTMAX = """\
#L0 = {lane=[(0), (0), (0), (0), (1)] warp=[(2)]} -> [4]
#L1 = {register=[(1), (2), (4)] lane=[(8), (16), (32), (64), (0)] warp=[(0)]} -> [128]
#L2 = {lane=[(0,0), (0,0), (0,0), (0,0), (1,0)] warp=[(2,0)]} -> [4x1]
#L3 = {register=[(0,1), (0,2), (0,4)] lane=[(0,8), (0,16), (0,32), (0,64), (0,0)] warp=[(0,0)]} -> [1x128]
#L4 = {register=[(0,1), (0,2), (0,4)] lane=[(0,8), (0,16), (0,32), (0,64), (1,0)] warp=[(2,0)]} -> [4x128]
kernel @row_softmax(%x_ptr: *bf16, %out_ptr: *bf16, %stride: i32, %n_cols: i32) num_warps=2 {
  %4 = program_id [axis=0] : i32
  %5 = constant [value=4] : i32
  %6 = binary [kind=mul] %4, %5 : i32
  %7 = arange [start=0 end=4] : tensor<4xi32, #L0>
  %8 = splat %6 : tensor<4xi32, #L0>
  %rows = binary [kind=add] %8, %7 : tensor<4xi32, #L0>
  %cols = arange [start=0 end=128] : tensor<128xi32, #L1>
  %11 = expand_dims [axis=1] %rows : tensor<4x1xi32, #L2>
  %12 = splat %stride : tensor<4x1xi32, #L2>
  %13 = binary [kind=mul] %11, %12 : tensor<4x1xi32, #L2>
  %14 = expand_dims [axis=0] %cols : tensor<1x128xi32, #L3>
  %15 = broadcast %13 : tensor<4x128xi32, #L4>
  %16 = broadcast %14 : tensor<4x128xi32, #L4>
  %offsets = binary [kind=add] %15, %16 : tensor<4x128xi32, #L4>
  %18 = expand_dims [axis=0] %cols : tensor<1x128xi32, #L3>
  %19 = splat %n_cols : tensor<1x128xi32, #L3>
  %mask = compare [predicate=lt] %18, %19 : tensor<1x128xi1, #L3>
  %21 = splat %x_ptr : tensor<4x128x*bf16, #L4>
  %22 = add_ptr %21, %offsets : tensor<4x128x*bf16, #L4>
  %23 = broadcast %mask : tensor<4x128xi1, #L4>
  %24 = constant [value=-inf] : tensor<4x128xbf16, #L4>
  %25 = load %22, %23, %24 : tensor<4x128xbf16, #L4>
  %x = cast %25 : tensor<4x128xfp32, #L4>
  %27 = reduce [axis=1 kind=max] %x : tensor<4xfp32, #L0>
  %28 = expand_dims [axis=1] %27 : tensor<4x1xfp32, #L2>
  %29 = broadcast %28 : tensor<4x128xfp32, #L4>
  %30 = binary [kind=sub] %x, %29 : tensor<4x128xfp32, #L4>
  %e = unary [kind=exp] %30 : tensor<4x128xfp32, #L4>
  %32 = splat %out_ptr : tensor<4x128x*bf16, #L4>
  %33 = add_ptr %32, %offsets : tensor<4x128x*bf16, #L4>
  %34 = reduce [axis=1 kind=sum] %e : tensor<4xfp32, #L0>
  %35 = expand_dims [axis=1] %34 : tensor<4x1xfp32, #L2>
  %36 = broadcast %35 : tensor<4x128xfp32, #L4>
  %37 = binary [kind=div] %e, %36 : tensor<4x128xfp32, #L4>
  %38 = broadcast %mask : tensor<4x128xi1, #L4>
  %39 = cast %37 : tensor<4x128xbf16, #L4>
  store %33, %39, %38
}
"""

TRANSPOSE = """\
#L0 = {lane=[(0), (0), (1), (2), (4)] warp=[(8), (16)]} -> [32]
#L1 = {register=[(1), (2), (4)] lane=[(8), (16), (0), (0), (0)] warp=[(0), (0)]} -> [32]
#L2 = {lane=[(0,0), (0,0), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [32x1]
#L3 = {register=[(0,1), (0,2), (0,4)] lane=[(0,8), (0,16), (0,0), (0,0), (0,0)] warp=[(0,0), (0,0)]} -> [1x32]
#L4 = {register=[(0,1), (0,2), (0,4)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [32x32]
#L5 = {register=[(1,0), (2,0), (4,0)] lane=[(8,0), (16,0), (0,1), (0,2), (0,4)] warp=[(0,8), (0,16)]} -> [32x32]
#L6 = {lane=[(0,0), (0,0), (0,1), (0,2), (0,4)] warp=[(0,8), (0,16)]} -> [1x32]
#L7 = {register=[(1,0), (2,0), (4,0)] lane=[(8,0), (16,0), (0,0), (0,0), (0,0)] warp=[(0,0), (0,0)]} -> [32x1]
kernel @transpose(%x_ptr: *fp16, %out_ptr: *fp16) num_warps=4 {
  %rows = arange [start=0 end=32] : tensor<32xi32, #L0>
  %rows_3 = arange [start=0 end=32] : tensor<32xi32, #L1>
  %cols = arange [start=0 end=32] : tensor<32xi32, #L1>
  %cols_5 = arange [start=0 end=32] : tensor<32xi32, #L0>
  %6 = expand_dims [axis=1] %rows : tensor<32x1xi32, #L2>
  %7 = constant [value=32] : tensor<32x1xi32, #L2>
  %8 = binary [kind=mul] %6, %7 : tensor<32x1xi32, #L2>
  %9 = splat %x_ptr : tensor<32x1x*fp16, #L2>
  %10 = add_ptr %9, %8 : tensor<32x1x*fp16, #L2>
  %11 = expand_dims [axis=0] %cols : tensor<1x32xi32, #L3>
  %12 = broadcast %10 : tensor<32x32x*fp16, #L4>
  %13 = broadcast %11 : tensor<32x32xi32, #L4>
  %14 = add_ptr %12, %13 : tensor<32x32x*fp16, #L4>
  %tile = load %14 : tensor<32x32xfp16, #L4>
  %tile_16 = convert_layout %tile : tensor<32x32xfp16, #L5>
  %17 = expand_dims [axis=0] %cols_5 : tensor<1x32xi32, #L6>
  %18 = constant [value=32] : tensor<1x32xi32, #L6>
  %19 = binary [kind=mul] %17, %18 : tensor<1x32xi32, #L6>
  %20 = splat %out_ptr : tensor<1x32x*fp16, #L6>
  %21 = add_ptr %20, %19 : tensor<1x32x*fp16, #L6>
  %22 = expand_dims [axis=1] %rows_3 : tensor<32x1xi32, #L7>
  %23 = broadcast %21 : tensor<32x32x*fp16, #L5>
  %24 = broadcast %22 : tensor<32x32xi32, #L5>
  %25 = add_ptr %23, %24 : tensor<32x32x*fp16, #L5>
  store %25, %tile_16
}
"""

ACCUMULATE = """\
#L0 = {register=[(1), (2)] lane=[(4), (8), (16), (32), (64)] warp=[(128)]} -> [256]
kernel @accumulate(%x_ptr: *fp32, %out_ptr: *fp32, %n: i32) num_warps=2 {
  %offsets = arange [start=0 end=256] : tensor<256xi32, #L0>
  %acc = constant [value=0.0] : tensor<256xfp32, #L0>
  %5 = constant [value=0] : i32
  %6 = constant [value=256] : i32
  %acc_7 = for %5, %n, %6, %acc : tensor<256xfp32, #L0> {
    ^(%start: i32, %acc_9: tensor<256xfp32, #L0>)
    %10 = add_ptr %x_ptr, %start : *fp32
    %11 = splat %10 : tensor<256x*fp32, #L0>
    %12 = add_ptr %11, %offsets : tensor<256x*fp32, #L0>
    %13 = splat %start : tensor<256xi32, #L0>
    %14 = binary [kind=add] %13, %offsets : tensor<256xi32, #L0>
    %15 = splat %n : tensor<256xi32, #L0>
    %16 = compare [predicate=lt] %14, %15 : tensor<256xi1, #L0>
    %17 = constant [value=0.0] : tensor<256xfp32, #L0>
    %18 = load %12, %16, %17 : tensor<256xfp32, #L0>
    %acc_19 = binary [kind=add] %acc_9, %18 : tensor<256xfp32, #L0>
    yield %acc_19
  }
  %20 = splat %out_ptr : tensor<256x*fp32, #L0>
  %21 = add_ptr %20, %offsets : tensor<256x*fp32, #L0>
  store %21, %acc_7
}
"""


def test_row_softmax_golden_has_no_conversion():
    kernel = run_until("row_softmax", "propagate_layouts")
    check_golden(print_kernel(kernel), "ROW_SOFTMAX")
    assert count_conversions(kernel) == 0


def test_transpose_golden_converts_the_tile_once_and_recomputes_the_indices():
    kernel = run_until("transpose", "propagate_layouts")
    check_golden(print_kernel(kernel), "TRANSPOSE")
    assert count_conversions(kernel) == 1


def test_loop_carried_accumulator_takes_the_loaded_layout():
    kernel = run_until("accumulate", "propagate_layouts")
    check_golden(print_kernel(kernel), "ACCUMULATE")
    assert count_conversions(kernel) == 0


@tl.jit
def outer(a_ptr, b_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    rows = tl.arange(0, R)
    cols = tl.arange(0, C)
    a = tl.load(a_ptr + rows)
    b = tl.load(b_ptr + cols)
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], a[:, None] * b[None, :])


def propagated(fn, signature, constexprs, warps=4, rules=None):
    kernel = build_kernel(fn, signature, constexprs, warps, {n: "divisible_by_16" for n in signature},
                          language="highlevel")
    return verify(propagate_layouts(coalesce(kernel), rules=rules))


def test_conversions_happen_before_broadcasting_on_the_smaller_tensors():
    kernel = propagated(outer, {"a_ptr": "*fp32", "b_ptr": "*fp32", "out_ptr": "*fp32"}, {"R": 16, "C": 64})
    conversions = [op for op in kernel.walk() if isinstance(op, ConvertLayout)]
    assert [op.operand.type.shape for op in conversions] == [(16,), (64,)]


@tl.jit
def reduce_then_store(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    tl.store(out_ptr + r, tl.max(x, axis=1))


def test_a_small_store_of_a_reduction_takes_the_reductions_layout():
    kernel = propagated(reduce_then_store, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {"R": 8, "C": 128})
    assert count_conversions(kernel) == 0
    (reduce,) = [op for op in kernel.walk() if isinstance(op, Reduce)]
    assert isinstance(reduce.result.type.encoding, ll.SliceLayout)


@tl.jit
def dead_index(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    unused = offsets * 2  # noqa: F841  (rematerialized nowhere: dropped)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1.0)


def test_values_nothing_uses_are_dropped():
    kernel = propagated(dead_index, {"x_ptr": "*fp32"}, {"BLOCK": 128})
    assert not any(isinstance(op, Binary) and op.kind == "mul" for op in kernel.walk())


def test_rules_are_a_table_tests_can_extend():
    """A local copy whose Broadcast rule never forwards: consumers decide instead, and the
    result is the same kernel (both ways reach the anchors' layout)."""
    rules = LAYOUT_RULES.copy()
    rules.forward_rules[Broadcast] = lambda op, operands, ctx: None
    signature = {"x_ptr": "*bf16", "out_ptr": "*bf16", "stride": "i32", "n_cols": "i32"}
    from .tile_kernels import row_softmax

    default = propagated(row_softmax, signature, {"ROWS": 4, "COLS": 128}, 2)
    changed = propagated(row_softmax, signature, {"ROWS": 4, "COLS": 128}, 2, rules=rules)
    assert print_kernel(changed) == print_kernel(default)
    assert LAYOUT_RULES.forward_rules[Broadcast] is not rules.forward_rules[Broadcast]


def test_every_tensor_has_a_layout_after_the_pass():
    kernel = run_until("row_softmax", "propagate_layouts")
    for op in kernel.walk():
        for value in op.defines():
            if isinstance(value.type, TensorType):
                assert value.type.layout is not None, op
                assert value.type.encoding is not None, op
    assert dataclasses.is_dataclass(Decision)


@tl.jit
def row_pairs(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    pairs = tl.reshape(tl.load(x_ptr + offs), N // 2, 2)
    tl.store(out_ptr + tl.arange(0, N // 2), tl.sum(pairs, axis=1))


ROW_PAIRS = """\
#L0 = {register=[(1), (2), (128)] lane=[(4), (8), (16), (32), (64)]} -> [256]
#L1 = {register=[(0,1), (1,0), (64,0)] lane=[(2,0), (4,0), (8,0), (16,0), (32,0)]} -> [128x2]
#L2 = {register=[(1), (64)] lane=[(2), (4), (8), (16), (32)]} -> [128]
kernel @row_pairs(%x_ptr: *fp32, %out_ptr: *fp32) num_warps=1 {
  %offs = arange [start=0 end=256] : tensor<256xi32, #L0>
  %3 = splat %x_ptr : tensor<256x*fp32, #L0>
  %4 = add_ptr %3, %offs : tensor<256x*fp32, #L0>
  %5 = load %4 : tensor<256xfp32, #L0>
  %pairs = reshape %5 : tensor<128x2xfp32, #L1>
  %7 = arange [start=0 end=128] : tensor<128xi32, #L2>
  %8 = splat %out_ptr : tensor<128x*fp32, #L2>
  %9 = add_ptr %8, %7 : tensor<128x*fp32, #L2>
  %10 = reduce [axis=1 kind=sum] %pairs : tensor<128xfp32, #L2>
  store %9, %10
}
"""


def test_a_reshape_takes_its_operands_layout_reindexed():
    """The loaded layout, re-indexed row-major (layouts.rules.reshape_layout): a pair sits
    in one thread's registers, so the sum needs no shuffle and nothing is converted."""
    kernel = propagated(row_pairs, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {"N": 256}, warps=1)
    check_golden(print_kernel(kernel), "ROW_PAIRS")
    assert count_conversions(kernel) == 0
