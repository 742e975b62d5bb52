"""axis_analysis at the `tile` stage: facts need shapes only, so they hold before layouts.

Golden texts are `format_axis_info` tables (what WEFT_DUMP=axis_analysis prints);
WEFT_ACCEPT=1 rewrites them.
"""

from weft import highlevel as tl
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import Load
from weft.compiler.passes.axis_analysis import analyze_axes, format_axis_info

from .backend_kernels import vector_add_kernel
from .golden import golden_checker
from .tile_kernels import tile_kernel

check_golden = golden_checker(__file__, globals())


TRANSPOSE = """\
%rows: contiguity=[32] divisibility=[1073741824] constancy=[1]
%cols: contiguity=[32] divisibility=[1073741824] constancy=[1]
%4: contiguity=[32, 1] divisibility=[1073741824, 1] constancy=[1, 1]
%5: contiguity=[1, 1] divisibility=[32, 32] constancy=[32, 1]
%6: contiguity=[1, 1] divisibility=[1073741824, 32] constancy=[1, 1]
%7: contiguity=[1, 1] divisibility=[16, 16] constancy=[32, 1]
%8: contiguity=[1, 1] divisibility=[16, 16] constancy=[1, 1]
%9: contiguity=[1, 32] divisibility=[1, 1073741824] constancy=[1, 1]
%10: contiguity=[1, 1] divisibility=[16, 16] constancy=[1, 32]
%11: contiguity=[1, 32] divisibility=[1, 1073741824] constancy=[32, 1]
%12: contiguity=[1, 32] divisibility=[2, 16] constancy=[1, 1]
%14: contiguity=[1, 32] divisibility=[1, 1073741824] constancy=[1, 1]
%15: contiguity=[1, 1] divisibility=[32, 32] constancy=[1, 32]
%16: contiguity=[1, 1] divisibility=[32, 1073741824] constancy=[1, 1]
%17: contiguity=[1, 1] divisibility=[16, 16] constancy=[1, 32]
%18: contiguity=[1, 1] divisibility=[16, 16] constancy=[1, 1]
%19: contiguity=[32, 1] divisibility=[1073741824, 1] constancy=[1, 1]
%20: contiguity=[1, 1] divisibility=[16, 16] constancy=[32, 1]
%21: contiguity=[32, 1] divisibility=[1073741824, 1] constancy=[1, 32]
%22: contiguity=[32, 1] divisibility=[16, 2] constancy=[1, 1]
"""

ACCUMULATE = """\
%offsets: contiguity=[256] divisibility=[1073741824] constancy=[1]
%11: contiguity=[1] divisibility=[16] constancy=[256]
%12: contiguity=[256] divisibility=[16] constancy=[1]
%13: contiguity=[1] divisibility=[256] constancy=[256]
%14: contiguity=[256] divisibility=[256] constancy=[1]
%15: contiguity=[1] divisibility=[16] constancy=[256]
%16: contiguity=[1] divisibility=[1] constancy=[16]
%20: contiguity=[1] divisibility=[16] constancy=[256]
%21: contiguity=[256] divisibility=[16] constancy=[1]
"""


def test_transpose_golden():
    check_golden(format_axis_info(tile_kernel("transpose")), "TRANSPOSE")


def test_loop_index_golden_is_divisible_by_the_step():
    check_golden(format_axis_info(tile_kernel("accumulate")), "ACCUMULATE")


@tl.jit
def diagonal_window(x_ptr, out_ptr, N: tl.constexpr):
    rows = tl.program_id(0) * N + tl.arange(0, N)
    cols = tl.arange(0, N)
    # Row r starts at element r: rows are contiguous but not aligned.
    tile = tl.load(x_ptr + rows[:, None] + cols[None, :])
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], tile)


def pointer_facts(fn, signature, constexprs):
    kernel = build_kernel(fn, signature, constexprs, 4, {n: "divisible_by_16" for n in signature},
                          language="highlevel")
    infos = analyze_axes(kernel)
    return [infos[op.pointer] for op in kernel.walk() if isinstance(op, Load)]


def test_a_contiguous_run_inserted_as_a_column_is_not_aligned_along_the_rows():
    """rows[:, None] holds N different values along dim 1's groups; only divisibility 1
    holds for all of them (Triton's expand_dims rule), so no vector may assume more."""
    (info,) = pointer_facts(diagonal_window, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {"N": 32})
    assert info.contiguity == (32, 32)
    assert info.divisibility == (4, 4)  # 16 along dim 1 would allow misaligned 128-bit loads


@tl.jit
def widened(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK).to(tl.int64)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * 2.0)


def test_widening_integer_casts_keep_the_facts():
    (info,) = pointer_facts(widened, {"x_ptr": "*fp32"}, {"BLOCK": 256})
    assert info.contiguity == (256,) and info.divisibility == (16,)


def test_partitions_see_the_facts_of_what_they_capture():
    """A worker's args are the captured values: an aligned pointer and stride stay aligned
    inside the partition, so its accesses vectorize as they would outside."""
    from weft import lowlevel as ll

    @ll.jit
    def idle(x_ptr, out_ptr, stride):
        pass

    @ll.jit
    def copy_rows(x_ptr, out_ptr, stride):
        layout: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
        offsets = ll.arange(0, 512, layout)
        row = ll.program_id(0) * stride
        ll.store(out_ptr + row + offsets, ll.load(x_ptr + row + offsets))

    @ll.jit
    def specialized(x_ptr, out_ptr, stride):
        ll.warp_specialize((x_ptr, out_ptr, stride), idle, (x_ptr, out_ptr, stride), [copy_rows],
                           worker_num_warps=[4], worker_num_regs=[0])

    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "stride": "i32"}
    kernel = build_kernel(specialized, signature, {}, 4, {n: "divisible_by_16" for n in signature})
    (info,) = [analyze_axes(kernel)[op.pointer] for op in kernel.walk() if isinstance(op, Load)]
    assert info.contiguity == (512,) and info.divisibility == (16,)


def test_axis_analysis_of_arange_plus_pointer():
    kernel = vector_add_kernel(4, 16)
    infos = analyze_axes(kernel)
    by_name = {v.hint: info for v, info in infos.items()}
    assert by_name["offs"].contiguity == (1024,)
    assert by_name["ptrs"].contiguity == (1024,)
    assert by_name["ptrs"].divisibility == (16,)
    assert by_name["mask"].constancy == (16,)


@tl.jit
def offset_from_a_branch(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    if n > 0:
        start = BLOCK * 2
    else:
        start = BLOCK
    offsets = start + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


def test_an_if_result_holds_what_both_branches_yield():
    """Both branches give a multiple of BLOCK, so the loads stay aligned 16-byte runs
    (issue_dot_ahead's peeled block hands its loop the block pointers' offsets so)."""
    (info,) = pointer_facts(offset_from_a_branch, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, {"BLOCK": 64})
    assert info.contiguity == (64,) and info.divisibility == (16,)
