"""lower_tiles: the inferred kernel enters the `layout` stage, every layout described.

The golden text is `print_kernel` output followed by the description of each layout
alias (the printer shows linear layouts only); WEFT_ACCEPT=1 rewrites it.
"""

import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.compiler.passes.lower_tiles import lower_tiles
from weft.compiler.printer import format_layout, print_kernel
from weft.compiler.types import TensorType

from .golden import golden_checker
from .tile_kernels import run_until, tile_kernel

check_golden = golden_checker(__file__, globals())


def with_descriptions(kernel) -> str:
    """The kernel's text, then `#Ln: <description>` for each layout alias it prints."""
    text = print_kernel(kernel)
    aliases = {}
    for line in text.splitlines():
        if line.startswith("#L"):
            alias, layout = line.split(" = ", 1)
            aliases[layout] = alias
    described = {}
    values = list(kernel.params) + [v for op in kernel.walk() for v in op.defines()]
    values += [a for op in kernel.walk() for block in op.nested_blocks() for a in block.args]
    for value in values:
        if isinstance(value.type, TensorType):
            alias = aliases[format_layout(value.type.layout)]
            described.setdefault(alias, set()).add(str(value.type.encoding))
    lines = [f"{alias}: {' | '.join(sorted(described[alias]))}"
             for alias in sorted(described, key=lambda a: int(a[2:]))]
    return text + "\n".join(lines) + "\n"


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
#L0: SliceLayout(dim=1, parent=BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[2, 1], order=[1, 0]))
#L1: SliceLayout(dim=0, parent=BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[2, 1], order=[1, 0]))
#L2: BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[2, 1], order=[1, 0])
#L3: BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[2, 1], order=[1, 0])
#L4: BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[2, 1], order=[1, 0])
"""


def test_row_softmax_golden_names_blocked_and_slice_layouts():
    kernel = run_until("row_softmax", "lower_tiles")
    assert kernel.stage == "layout"
    check_golden(with_descriptions(kernel), "ROW_SOFTMAX")


def test_every_tensor_is_described_by_a_lowlevel_layout_class():
    kernel = run_until("transpose", "lower_tiles")
    encodings = {type(v.type.encoding) for op in kernel.walk() for v in op.defines()
                 if isinstance(v.type, TensorType)}
    assert encodings <= {ll.BlockedLayout, ll.SliceLayout, ll.LinearDistributedLayout}
    assert ll.BlockedLayout in encodings and ll.SliceLayout in encodings


def test_a_tensor_left_without_a_layout_is_reported_at_its_line():
    kernel = tile_kernel("vector_add")  # no inference ran: nothing has a layout
    with pytest.raises(CompilationError) as info:
        lower_tiles(kernel)
    error = info.value
    assert "no layout was inferred" in error.message
    assert "tl.arange(0, BLOCK)" in error.loc.source_line
