"""coalesce: one blocked layout per global access, from the pointers' axis facts.

Golden texts are exact `print_kernel` output after the pass; WEFT_ACCEPT=1 rewrites them.
"""

import pytest

from weft import lowlevel as ll
from weft.compiler.ir import Load, Store
from weft.compiler.passes.axis_analysis import AxisInfo, analyze_axes
from weft.compiler.passes.coalesce import (access_placements, blocked, contiguity_order, elements_per_access,
                                           fill_blocked, normalized)
from weft.compiler.printer import print_kernel

from .golden import golden_checker
from .tile_kernels import KERNELS, run_until, tile_kernel

check_golden = golden_checker(__file__, globals())


VECTOR_ADD = """\
#L0 = {register=[(1), (2)] lane=[(4), (8), (16), (32), (64)] warp=[(128), (256)]} -> [512]
kernel @vector_add(%x_ptr: *fp32, %y_ptr: *fp32, %out_ptr: *fp32, %n: i32) num_warps=4 {
  %4 = program_id [axis=0] : i32
  %5 = constant [value=512] : i32
  %6 = binary [kind=mul] %4, %5 : i32
  %7 = arange [start=0 end=512] : tensor<512xi32>
  %8 = splat %6 : tensor<512xi32>
  %offsets = binary [kind=add] %8, %7 : tensor<512xi32>
  %10 = splat %n : tensor<512xi32>
  %mask = compare [predicate=lt] %offsets, %10 : tensor<512xi1>
  %12 = splat %x_ptr : tensor<512x*fp32>
  %13 = add_ptr %12, %offsets : tensor<512x*fp32>
  %14 = convert_layout %13 : tensor<512x*fp32, #L0>
  %15 = convert_layout %mask : tensor<512xi1, #L0>
  %16 = load %14, %15 : tensor<512xfp32, #L0>
  %x = convert_layout %16 : tensor<512xfp32>
  %18 = splat %y_ptr : tensor<512x*fp32>
  %19 = add_ptr %18, %offsets : tensor<512x*fp32>
  %20 = convert_layout %19 : tensor<512x*fp32, #L0>
  %21 = convert_layout %mask : tensor<512xi1, #L0>
  %22 = load %20, %21 : tensor<512xfp32, #L0>
  %y = convert_layout %22 : tensor<512xfp32>
  %24 = splat %out_ptr : tensor<512x*fp32>
  %25 = add_ptr %24, %offsets : tensor<512x*fp32>
  %26 = binary [kind=add] %x, %y : tensor<512xfp32>
  %27 = convert_layout %25 : tensor<512x*fp32, #L0>
  %28 = convert_layout %26 : tensor<512xfp32, #L0>
  %29 = convert_layout %mask : tensor<512xi1, #L0>
  store %27, %28, %29
}
"""

TRANSPOSE = """\
#L0 = {register=[(0,1), (0,2), (0,4)] lane=[(0,8), (0,16), (1,0), (2,0), (4,0)] warp=[(8,0), (16,0)]} -> [32x32]
#L1 = {register=[(1,0), (2,0), (4,0)] lane=[(8,0), (16,0), (0,1), (0,2), (0,4)] warp=[(0,8), (0,16)]} -> [32x32]
kernel @transpose(%x_ptr: *fp16, %out_ptr: *fp16) num_warps=4 {
  %rows = arange [start=0 end=32] : tensor<32xi32>
  %cols = arange [start=0 end=32] : tensor<32xi32>
  %4 = expand_dims [axis=1] %rows : tensor<32x1xi32>
  %5 = constant [value=32] : tensor<32x1xi32>
  %6 = binary [kind=mul] %4, %5 : tensor<32x1xi32>
  %7 = splat %x_ptr : tensor<32x1x*fp16>
  %8 = add_ptr %7, %6 : tensor<32x1x*fp16>
  %9 = expand_dims [axis=0] %cols : tensor<1x32xi32>
  %10 = broadcast %8 : tensor<32x32x*fp16>
  %11 = broadcast %9 : tensor<32x32xi32>
  %12 = add_ptr %10, %11 : tensor<32x32x*fp16>
  %13 = convert_layout %12 : tensor<32x32x*fp16, #L0>
  %14 = load %13 : tensor<32x32xfp16, #L0>
  %tile = convert_layout %14 : tensor<32x32xfp16>
  %16 = expand_dims [axis=0] %cols : tensor<1x32xi32>
  %17 = constant [value=32] : tensor<1x32xi32>
  %18 = binary [kind=mul] %16, %17 : tensor<1x32xi32>
  %19 = splat %out_ptr : tensor<1x32x*fp16>
  %20 = add_ptr %19, %18 : tensor<1x32x*fp16>
  %21 = expand_dims [axis=1] %rows : tensor<32x1xi32>
  %22 = broadcast %20 : tensor<32x32x*fp16>
  %23 = broadcast %21 : tensor<32x32xi32>
  %24 = add_ptr %22, %23 : tensor<32x32x*fp16>
  %25 = convert_layout %24 : tensor<32x32x*fp16, #L1>
  %26 = convert_layout %tile : tensor<32x32xfp16, #L1>
  store %25, %26
}
"""


def test_vector_add_golden():
    check_golden(print_kernel(run_until("vector_add", "coalesce")), "VECTOR_ADD")


def test_transpose_golden_reads_rows_and_writes_columns():
    check_golden(print_kernel(run_until("transpose", "coalesce")), "TRANSPOSE")


def test_each_access_gets_the_blocked_layout_of_its_contiguity():
    kernel = tile_kernel("transpose")
    placements = access_placements(kernel)
    (load,) = [op for op in kernel.walk() if isinstance(op, Load)]
    (store,) = [op for op in kernel.walk() if isinstance(op, Store)]
    # fp16 rows 32 long: 8 elements (128 bits) per thread along the contiguous dim.
    assert placements[id(load)].encoding == ll.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    assert placements[id(store)].encoding == ll.BlockedLayout([8, 1], [4, 8], [1, 4], [0, 1])


@pytest.mark.parametrize("shape, per_thread, order, warps, lanes_warps", [
    ((4096,), (4,), (0,), 8, ((32,), (8,))),
    ((16, 64), (1, 4), (1, 0), 4, ((2, 16), (4, 1))),     # 16 threads span a row
    ((64, 16), (4, 1), (0, 1), 4, ((16, 2), (1, 4))),
    ((2, 8), (1, 1), (1, 0), 4, ((4, 8), (4, 1))),         # more threads than elements: wrap
    ((1, 1024), (1, 8), (1, 0), 8, ((1, 32), (2, 4))),     # 4 warps cover a row; the rest wrap
])
def test_fill_blocked_follows_tritons_rule(shape, per_thread, order, warps, lanes_warps):
    assert fill_blocked(shape, per_thread, order, warps) == lanes_warps


def test_contiguity_orders_dims_and_ties_are_row_major():
    assert contiguity_order(AxisInfo((1, 64), (1, 16), (1, 1))) == (1, 0)
    assert contiguity_order(AxisInfo((64, 1), (16, 1), (1, 1))) == (0, 1)
    assert contiguity_order(AxisInfo((1, 1), (1, 1), (1, 1))) == (1, 0)


@pytest.mark.parametrize("alignment, expected", [("divisible_by_16", 4), ("", 1)])
def test_elements_per_access_is_limited_by_alignment(alignment, expected):
    fn, signature, constexprs, warps = KERNELS["vector_add"]
    from weft.compiler.frontend import build_kernel

    kernel = build_kernel(fn, signature, constexprs, warps, {"x_ptr": alignment, "n": "divisible_by_16"},
                          language="highlevel")
    (load, _) = [op for op in kernel.walk() if isinstance(op, Load)]
    info = analyze_axes(kernel)[load.pointer]
    assert elements_per_access(load.pointer, info, (0,)) == expected


def test_loads_of_one_shape_and_order_share_the_widest_vector_but_stores_keep_theirs():
    fn, signature, constexprs, warps = KERNELS["vector_add"]
    from weft.compiler.frontend import build_kernel

    kernel = build_kernel(fn, signature, constexprs, warps,
                          {"x_ptr": "divisible_by_16", "n": "divisible_by_16"}, language="highlevel")
    placements = access_placements(kernel)
    per_thread = {type(op).__name__ + str(i): placements[id(op)].encoding.size_per_thread
                  for i, op in enumerate(op for op in kernel.walk() if isinstance(op, (Load, Store)))}
    assert per_thread == {"Load0": (4,), "Load1": (4,), "Store2": (1,)}


def test_a_chosen_blocked_layout_is_described_by_the_blocked_layout_class():
    """The compiler names its choice with layouts/'s BlockedLayout (no language lends it
    classes), and the description gives exactly the layout chosen."""
    placement = blocked((64,), (2,), (0,), 1)
    assert placement.encoding == ll.BlockedLayout([2], [32], [1], [0])
    assert placement.layout.out_dims == {"dim0": 64}
    assert normalized(placement.encoding.to_linear((64,))) == placement.layout
