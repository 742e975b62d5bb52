"""The frontend: golden `layout` IR for small lowlevel kernels, and located errors.

Golden texts are the exact `print_kernel` output. Run with WEFT_ACCEPT=1 to rewrite the
expected strings in this file from the current output (then review the diff).
"""

import ast
import inspect
import os
from pathlib import Path

import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify

# ------------------------------------------------------------------ golden helper


def check_golden(actual: str, name: str) -> None:
    """Compare with the module constant `name`; under WEFT_ACCEPT=1 rewrite it instead."""
    expected = globals().get(name)
    if actual == expected:
        return
    if os.environ.get("WEFT_ACCEPT") == "1":
        _rewrite_constant(Path(__file__), name, actual)
        globals()[name] = actual
        return
    assert actual == expected, f"golden text {name} differs (WEFT_ACCEPT=1 rewrites it)"


def _rewrite_constant(path: Path, name: str, text: str) -> None:
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            start, end = node.lineno - 1, node.end_lineno
            break
    else:
        start = end = len(lines)
    assert '"""' not in text and "\\" not in text
    lines[start:end] = [f'{name} = """\\\n{text}"""\n']
    path.write_text("".join(lines))


def line_of(fn, text: str) -> int:
    """The file line of the first line of `fn` containing `text`."""
    lines, first = inspect.getsourcelines(getattr(fn, "fn", fn))
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(f"{text!r} not in {fn}")


def compile_error(fn, signature=None, constexprs=None, num_warps=4) -> CompilationError:
    with pytest.raises(CompilationError) as info:
        build_kernel(fn, signature or {}, constexprs or {}, num_warps)
    return info.value


BL1 = ll.constexpr(ll.BlockedLayout([4], [32], [4], [0]))
BL2 = ll.constexpr(ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))

# ------------------------------------------------------------------ kernels


@ll.jit
def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK: ll.constexpr):
    offsets = ll.program_id(0) * BLOCK + ll.arange(0, BLOCK, layout=BL1)
    mask = offsets < n
    x = ll.load(x_ptr + offsets, mask=mask, other=0.0)
    y = ll.load(y_ptr + offsets, mask=mask)
    ll.store(out_ptr + offsets, x + y, mask=mask)


@ll.jit
def row_softmax(x_ptr, out_ptr, stride, n_cols, ROWS: ll.constexpr, COLS: ll.constexpr):
    rows = ll.program_id(0) * ROWS + ll.arange(0, ROWS, layout=ll.SliceLayout(1, BL2))
    cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, BL2))
    offsets = rows[:, None] * stride + cols[None, :]
    mask = cols[None, :] < n_cols
    x = ll.load(x_ptr + offsets, mask=mask, other=-float("inf")).to(ll.float32)
    shifted = x - ll.max(x, axis=1)[:, None]
    e = ll.exp(shifted)
    ll.store(out_ptr + offsets, e / e.sum(1)[:, None], mask=mask)


@ll.jit
def smem_transpose(x_ptr, out_ptr, N: ll.constexpr):
    LT: ll.constexpr = ll.BlockedLayout([4, 1], [8, 4], [1, 4], [0, 1])
    rows = ll.arange(0, N, layout=ll.SliceLayout(1, BL2))
    cols = ll.arange(0, N, layout=ll.SliceLayout(0, BL2))
    tile = ll.load(x_ptr + rows[:, None] * N + cols[None, :])
    smem = ll.allocate_shared_memory(ll.float16, [N, N], ll.SwizzledSharedLayout(4, 1, 8, [1, 0]), tile)
    ll.barrier()
    t = smem.load(LT)
    rows_t = ll.arange(0, N, layout=ll.SliceLayout(1, LT))
    cols_t = ll.arange(0, N, layout=ll.SliceLayout(0, LT))
    ll.store(out_ptr + cols_t[None, :] * N + rows_t[:, None], t)


@ll.jit
def accumulate(x_ptr, out_ptr, n, BLOCK: ll.constexpr):
    offsets = ll.arange(0, BLOCK, layout=BL1)
    acc = ll.zeros([BLOCK], ll.float32, BL1)
    for start in range(0, n, BLOCK):
        acc += ll.load(x_ptr + start + offsets, mask=start + offsets < n, other=0.0)
    ll.store(out_ptr + offsets, acc)


@ll.jit
def scale_if(x_ptr, flag, BLOCK: ll.constexpr):
    offsets = ll.arange(0, BLOCK, layout=BL1)
    x = ll.load(x_ptr + offsets)
    if flag > 0:
        x = x * 2.0
    else:
        x = x - 1.0
    ll.store(x_ptr + offsets, x)


@ll.jit
def halve(x):
    return x * 0.5, x.to(ll.float16)


@ll.jit
def count_steps(out_ptr, n, HELPER_SCALE: ll.constexpr):
    steps = 0
    while steps < n:
        steps += HELPER_SCALE
    value = ll.full([128], steps, ll.int32, BL1)
    half, narrow = halve(value.to(ll.float32))
    ll.store(out_ptr + ll.arange(0, 128, layout=BL1), half + narrow.to(ll.float32))


# ------------------------------------------------------------------ golden tests


def golden(fn, signature, constexprs, name):
    kernel = build_kernel(fn, signature, constexprs, 4)
    verify(kernel)
    check_golden(print_kernel(kernel), name)


VECTOR_ADD = """\
#L0 = {register=[(1), (2)] lane=[(4), (8), (16), (32), (64)] warp=[(128), (256)]} -> [512]
kernel @vector_add(%x_ptr: *fp32, %y_ptr: *fp32, %out_ptr: *fp32, %n: i32) num_warps=4 {
  %4 = program_id [axis=0] : i32
  %5 = constant [value=512] : i32
  %6 = binary [kind=mul] %4, %5 : i32
  %7 = arange [start=0 end=512] : tensor<512xi32, #L0>
  %8 = splat %6 : tensor<512xi32, #L0>
  %offsets = binary [kind=add] %8, %7 : tensor<512xi32, #L0>
  %10 = splat %n : tensor<512xi32, #L0>
  %mask = compare [predicate=lt] %offsets, %10 : tensor<512xi1, #L0>
  %12 = splat %x_ptr : tensor<512x*fp32, #L0>
  %13 = add_ptr %12, %offsets : tensor<512x*fp32, #L0>
  %14 = constant [value=0.0] : tensor<512xfp32, #L0>
  %x = load %13, %mask, %14 : tensor<512xfp32, #L0>
  %16 = splat %y_ptr : tensor<512x*fp32, #L0>
  %17 = add_ptr %16, %offsets : tensor<512x*fp32, #L0>
  %y = load %17, %mask : tensor<512xfp32, #L0>
  %19 = splat %out_ptr : tensor<512x*fp32, #L0>
  %20 = add_ptr %19, %offsets : tensor<512x*fp32, #L0>
  %21 = binary [kind=add] %x, %y : tensor<512xfp32, #L0>
  store %20, %21, %mask
}
"""


def test_vector_add():
    golden(vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
           {"BLOCK": 512}, "VECTOR_ADD")


ROW_SOFTMAX = """\
#L0 = {lane=[(0), (0), (0), (1), (2)] warp=[(4), (8)]} -> [16]
#L1 = {register=[(1), (2), (32)] lane=[(4), (8), (16), (0), (0)] warp=[(0), (0)]} -> [64]
#L2 = {lane=[(0,0), (0,0), (0,0), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [16x1]
#L3 = {register=[(0,1), (0,2), (0,32)] lane=[(0,4), (0,8), (0,16), (0,0), (0,0)] warp=[(0,0), (0,0)]} -> [1x64]
#L4 = {register=[(0,1), (0,2), (0,32)] lane=[(0,4), (0,8), (0,16), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [16x64]
kernel @row_softmax(%x_ptr: *bf16, %out_ptr: *bf16, %stride: i32, %n_cols: i32) num_warps=4 {
  %4 = program_id [axis=0] : i32
  %5 = constant [value=16] : i32
  %6 = binary [kind=mul] %4, %5 : i32
  %7 = arange [start=0 end=16] : tensor<16xi32, #L0>
  %8 = splat %6 : tensor<16xi32, #L0>
  %rows = binary [kind=add] %8, %7 : tensor<16xi32, #L0>
  %cols = arange [start=0 end=64] : tensor<64xi32, #L1>
  %11 = expand_dims [axis=1] %rows : tensor<16x1xi32, #L2>
  %12 = splat %stride : tensor<16x1xi32, #L2>
  %13 = binary [kind=mul] %11, %12 : tensor<16x1xi32, #L2>
  %14 = expand_dims [axis=0] %cols : tensor<1x64xi32, #L3>
  %15 = broadcast %13 : tensor<16x64xi32, #L4>
  %16 = broadcast %14 : tensor<16x64xi32, #L4>
  %offsets = binary [kind=add] %15, %16 : tensor<16x64xi32, #L4>
  %18 = expand_dims [axis=0] %cols : tensor<1x64xi32, #L3>
  %19 = splat %n_cols : tensor<1x64xi32, #L3>
  %mask = compare [predicate=lt] %18, %19 : tensor<1x64xi1, #L3>
  %21 = splat %x_ptr : tensor<16x64x*bf16, #L4>
  %22 = add_ptr %21, %offsets : tensor<16x64x*bf16, #L4>
  %23 = broadcast %mask : tensor<16x64xi1, #L4>
  %24 = constant [value=-inf] : tensor<16x64xbf16, #L4>
  %25 = load %22, %23, %24 : tensor<16x64xbf16, #L4>
  %x = cast %25 : tensor<16x64xfp32, #L4>
  %27 = reduce [axis=1 kind=max] %x : tensor<16xfp32, #L0>
  %28 = expand_dims [axis=1] %27 : tensor<16x1xfp32, #L2>
  %29 = broadcast %28 : tensor<16x64xfp32, #L4>
  %shifted = binary [kind=sub] %x, %29 : tensor<16x64xfp32, #L4>
  %e = unary [kind=exp] %shifted : tensor<16x64xfp32, #L4>
  %32 = splat %out_ptr : tensor<16x64x*bf16, #L4>
  %33 = add_ptr %32, %offsets : tensor<16x64x*bf16, #L4>
  %34 = reduce [axis=1 kind=sum] %e : tensor<16xfp32, #L0>
  %35 = expand_dims [axis=1] %34 : tensor<16x1xfp32, #L2>
  %36 = broadcast %35 : tensor<16x64xfp32, #L4>
  %37 = binary [kind=div] %e, %36 : tensor<16x64xfp32, #L4>
  %38 = broadcast %mask : tensor<16x64xi1, #L4>
  %39 = cast %37 : tensor<16x64xbf16, #L4>
  store %33, %39, %38
}
"""


def test_row_softmax():
    golden(row_softmax, {"x_ptr": "*bf16", "out_ptr": "*bf16", "stride": "i32", "n_cols": "i32"},
           {"ROWS": 16, "COLS": 64}, "ROW_SOFTMAX")


SMEM_TRANSPOSE = """\
#L0 = {register=[(16)] lane=[(0), (0), (0), (1), (2)] warp=[(4), (8)]} -> [32]
#L1 = {register=[(1), (2)] lane=[(4), (8), (16), (0), (0)] warp=[(0), (0)]} -> [32]
#L2 = {register=[(16,0)] lane=[(0,0), (0,0), (0,0), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [32x1]
#L3 = {register=[(0,1), (0,2)] lane=[(0,4), (0,8), (0,16), (0,0), (0,0)] warp=[(0,0), (0,0)]} -> [1x32]
#L4 = {register=[(0,1), (0,2), (16,0)] lane=[(0,4), (0,8), (0,16), (1,0), (2,0)] warp=[(4,0), (8,0)]} -> [32x32]
#L5 = {offset=[(0,1), (0,2), (0,4), (0,8), (0,16), (1,4), (2,8), (4,16), (8,0), (16,0)]} -> [32x32]
#L6 = {register=[(1,0), (2,0), (0,16)] lane=[(4,0), (8,0), (16,0), (0,1), (0,2)] warp=[(0,4), (0,8)]} -> [32x32]
#L7 = {register=[(0,16)] lane=[(0,0), (0,0), (0,0), (0,1), (0,2)] warp=[(0,4), (0,8)]} -> [1x32]
#L8 = {register=[(1,0), (2,0)] lane=[(4,0), (8,0), (16,0), (0,0), (0,0)] warp=[(0,0), (0,0)]} -> [32x1]
kernel @smem_transpose(%x_ptr: *fp16, %out_ptr: *fp16) num_warps=4 {
  %rows = arange [start=0 end=32] : tensor<32xi32, #L0>
  %cols = arange [start=0 end=32] : tensor<32xi32, #L1>
  %4 = expand_dims [axis=1] %rows : tensor<32x1xi32, #L2>
  %5 = constant [value=32] : tensor<32x1xi32, #L2>
  %6 = binary [kind=mul] %4, %5 : tensor<32x1xi32, #L2>
  %7 = splat %x_ptr : tensor<32x1x*fp16, #L2>
  %8 = add_ptr %7, %6 : tensor<32x1x*fp16, #L2>
  %9 = expand_dims [axis=0] %cols : tensor<1x32xi32, #L3>
  %10 = broadcast %8 : tensor<32x32x*fp16, #L4>
  %11 = broadcast %9 : tensor<32x32xi32, #L4>
  %12 = add_ptr %10, %11 : tensor<32x32x*fp16, #L4>
  %tile = load %12 : tensor<32x32xfp16, #L4>
  %smem = allocate_shared_memory %tile : shared<32x32xfp16, #L5>
  barrier
  %t = shared_load %smem : tensor<32x32xfp16, #L6>
  %rows_t = arange [start=0 end=32] : tensor<32xi32, #L1>
  %cols_t = arange [start=0 end=32] : tensor<32xi32, #L0>
  %18 = expand_dims [axis=0] %cols_t : tensor<1x32xi32, #L7>
  %19 = constant [value=32] : tensor<1x32xi32, #L7>
  %20 = binary [kind=mul] %18, %19 : tensor<1x32xi32, #L7>
  %21 = splat %out_ptr : tensor<1x32x*fp16, #L7>
  %22 = add_ptr %21, %20 : tensor<1x32x*fp16, #L7>
  %23 = expand_dims [axis=1] %rows_t : tensor<32x1xi32, #L8>
  %24 = broadcast %22 : tensor<32x32x*fp16, #L6>
  %25 = broadcast %23 : tensor<32x32xi32, #L6>
  %26 = add_ptr %24, %25 : tensor<32x32x*fp16, #L6>
  store %26, %t
}
"""


def test_smem_transpose():
    golden(smem_transpose, {"x_ptr": "*fp16", "out_ptr": "*fp16"}, {"N": 32}, "SMEM_TRANSPOSE")


ACCUMULATE = """\
#L0 = {register=[(1), (2)] lane=[(4), (8), (16), (32), (64)] warp=[(0), (0)]} -> [128]
kernel @accumulate(%x_ptr: *fp32, %out_ptr: *fp32, %n: i32) num_warps=4 {
  %offsets = arange [start=0 end=128] : tensor<128xi32, #L0>
  %acc = constant [value=0.0] : tensor<128xfp32, #L0>
  %5 = constant [value=0] : i32
  %6 = constant [value=128] : i32
  %acc_7 = for %5, %n, %6, %acc : tensor<128xfp32, #L0> {
    ^(%start: i32, %acc_9: tensor<128xfp32, #L0>)
    %10 = add_ptr %x_ptr, %start : *fp32
    %11 = splat %10 : tensor<128x*fp32, #L0>
    %12 = add_ptr %11, %offsets : tensor<128x*fp32, #L0>
    %13 = splat %start : tensor<128xi32, #L0>
    %14 = binary [kind=add] %13, %offsets : tensor<128xi32, #L0>
    %15 = splat %n : tensor<128xi32, #L0>
    %16 = compare [predicate=lt] %14, %15 : tensor<128xi1, #L0>
    %17 = constant [value=0.0] : tensor<128xfp32, #L0>
    %18 = load %12, %16, %17 : tensor<128xfp32, #L0>
    %acc_19 = binary [kind=add] %acc_9, %18 : tensor<128xfp32, #L0>
    yield %acc_19
  }
  %20 = splat %out_ptr : tensor<128x*fp32, #L0>
  %21 = add_ptr %20, %offsets : tensor<128x*fp32, #L0>
  store %21, %acc_7
}
"""


def test_loop_with_carried_tensor():
    golden(accumulate, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, {"BLOCK": 128},
           "ACCUMULATE")


SCALE_IF = """\
#L0 = {register=[(1), (2)] lane=[(4), (8), (16), (32), (64)] warp=[(0), (0)]} -> [128]
kernel @scale_if(%x_ptr: *fp32, %flag: i32) num_warps=4 {
  %offsets = arange [start=0 end=128] : tensor<128xi32, #L0>
  %3 = splat %x_ptr : tensor<128x*fp32, #L0>
  %4 = add_ptr %3, %offsets : tensor<128x*fp32, #L0>
  %x = load %4 : tensor<128xfp32, #L0>
  %6 = constant [value=0] : i32
  %7 = compare [predicate=gt] %flag, %6 : i1
  %x_8 = if %7 : tensor<128xfp32, #L0> {
    %9 = constant [value=2.0] : tensor<128xfp32, #L0>
    %x_10 = binary [kind=mul] %x, %9 : tensor<128xfp32, #L0>
    yield %x_10
  } {
    %11 = constant [value=1.0] : tensor<128xfp32, #L0>
    %x_12 = binary [kind=sub] %x, %11 : tensor<128xfp32, #L0>
    yield %x_12
  }
  %13 = splat %x_ptr : tensor<128x*fp32, #L0>
  %14 = add_ptr %13, %offsets : tensor<128x*fp32, #L0>
  store %14, %x_8
}
"""


def test_dynamic_if():
    golden(scale_if, {"x_ptr": "*fp32", "flag": "i32"}, {"BLOCK": 128}, "SCALE_IF")


COUNT_STEPS = """\
#L0 = {register=[(1), (2)] lane=[(4), (8), (16), (32), (64)] warp=[(0), (0)]} -> [128]
kernel @count_steps(%out_ptr: *fp32, %n: i32) num_warps=4 {
  %steps = constant [value=0] : i32
  %steps_3 = while %steps : i32 {
    ^(%steps_4: i32)
    %5 = compare [predicate=lt] %steps_4, %n : i1
    condition %5, %steps_4
  } {
    ^(%steps_6: i32)
    %7 = constant [value=4] : i32
    %steps_8 = binary [kind=add] %steps_6, %7 : i32
    yield %steps_8
  }
  %value = splat %steps_3 : tensor<128xi32, #L0>
  %10 = cast %value : tensor<128xfp32, #L0>
  %11 = constant [value=0.5] : tensor<128xfp32, #L0>
  %half = binary [kind=mul] %10, %11 : tensor<128xfp32, #L0>
  %narrow = cast %10 : tensor<128xfp16, #L0>
  %14 = arange [start=0 end=128] : tensor<128xi32, #L0>
  %15 = splat %out_ptr : tensor<128x*fp32, #L0>
  %16 = add_ptr %15, %14 : tensor<128x*fp32, #L0>
  %17 = cast %narrow : tensor<128xfp32, #L0>
  %18 = binary [kind=add] %half, %17 : tensor<128xfp32, #L0>
  store %16, %18
}
"""


def test_while_and_inlined_call():
    golden(count_steps, {"out_ptr": "*fp32", "n": "i32"}, {"HELPER_SCALE": 4}, "COUNT_STEPS")


def test_kernel_facts():
    kernel = build_kernel(vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
                                       "n": "i32"}, {"BLOCK": 512}, 4, {"n": "divisible_by_16"})
    assert kernel.name == "vector_add"
    assert [p.hint for p in kernel.params] == ["x_ptr", "y_ptr", "out_ptr", "n"]
    assert kernel.constexprs == (("BLOCK", 512),)
    assert kernel.param_divisibility == (1, 1, 1, 16)
    assert "def vector_add" in kernel.source
    sources = build_kernel(count_steps, {"out_ptr": "*fp32", "n": "i32"}, {"HELPER_SCALE": 1}, 4).source
    assert "def count_steps" in sources and "def halve" in sources


def test_every_op_is_located_at_the_users_line():
    kernel = build_kernel(vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
                                       "n": "i32"}, {"BLOCK": 512}, 4)
    first = line_of(vector_add, "offsets = ll.program_id")
    last = line_of(vector_add, "ll.store(out_ptr")
    for op in kernel.walk():
        assert op.loc.file == __file__
        assert first <= op.loc.line <= last, op
    store = kernel.body.ops[-1]
    assert store.loc.line == last and store.loc.col == 4 and "ll.store" in store.loc.source_line


def test_equal_to_1_specialization_makes_a_constant():
    kernel = build_kernel(scale_if, {"x_ptr": "*fp32", "flag": "i32"}, {"BLOCK": 128}, 4,
                          {"flag": "equal_to_1"})
    assert "if" not in [op.NAME for op in kernel.body.ops]  # `1 > 0` decided at compile time
    assert [p.hint for p in kernel.params] == ["x_ptr", "flag"]


# ------------------------------------------------------------------ errors


@ll.jit
def mismatched_layouts(BLOCK: ll.constexpr):
    a = ll.arange(0, BLOCK, layout=BL1)
    b = ll.arange(0, BLOCK, layout=ll.BlockedLayout([1], [32], [4], [0]))
    c = a + b  # error here


def test_layout_mismatch_names_both_layouts():
    error = compile_error(mismatched_layouts, constexprs={"BLOCK": 128})
    text = str(error)
    assert error.loc.line == line_of(mismatched_layouts, "c = a + b")
    assert error.loc.col == 8
    assert f"{__file__}:{error.loc.line}:8: error:" in text
    assert "BlockedLayout(size_per_thread=[4], threads_per_warp=[32], warps_per_cta=[4], order=[0])" in text
    assert "BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[4], order=[0])" in text
    assert "convert_layout" in text
    assert "    c = a + b  # error here\n        ^" in text
    assert "T1:R0" in text  # the rendered tables


@ll.jit
def uses_try(x_ptr):
    try:
        x = 1
    except Exception:
        x = 2


@ll.jit
def uses_lambda(x_ptr):
    f = lambda v: v  # noqa: E731


@ll.jit
def uses_comprehension(x_ptr):
    values = [i for i in (1, 2)]


@ll.jit
def uses_break(x_ptr, n):
    for i in range(n):
        break


@pytest.mark.parametrize("fn, text, what", [
    (uses_try, "try:", "try/except"),
    (uses_lambda, "f = lambda", "lambda"),
    (uses_comprehension, "values = [i for", "list comprehension"),
    (uses_break, "        break", "break"),
])
def test_unsupported_syntax(fn, text, what):
    error = compile_error(fn, {"x_ptr": "*fp32", "n": "i32"} if "n" in fn.arg_names else {"x_ptr": "*fp32"})
    assert error.loc.line == line_of(fn, text)
    assert f"unsupported Python syntax in a kernel: " in error.message and what in error.message
    assert "kernels support" in str(error)


@ll.jit
def changes_carried_type(n):
    acc = ll.zeros([128], ll.float16, BL1)
    for i in range(n):
        acc = acc.to(ll.float32) + 1.0


def test_loop_carried_type_change():
    error = compile_error(changes_carried_type, {"n": "i32"})
    assert error.loc.line == line_of(changes_carried_type, "acc = acc.to(")
    assert "'acc'" in error.message
    assert "fp16" in error.expected and "fp32" in error.found


@ll.jit
def runtime_arange_bound(n):
    offsets = ll.arange(0, n, layout=BL1)


@ll.jit
def bad_layout_constexpr(n):
    L: ll.constexpr = ll.BlockedLayout([4], [16], [4], [0])


def test_runtime_value_where_a_constexpr_is_needed():
    error = compile_error(runtime_arange_bound, {"n": "i32"})
    assert error.loc.line == line_of(runtime_arange_bound, "offsets = ll.arange")
    assert "compile-time int" in error.message and "constexpr" in error.suggestion


def test_invalid_constexpr_layout():
    error = compile_error(bad_layout_constexpr, {"n": "i32"})
    assert error.loc.line == line_of(bad_layout_constexpr, "L: ll.constexpr =")
    assert "threads_per_warp [16]" in error.message


def test_missing_constexpr_value():
    error = compile_error(vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"})
    assert "constexpr parameter 'BLOCK' has no value" in error.message
    assert error.loc.line == line_of(vector_add, "def vector_add")


@ll.jit
def unknown_name(x_ptr):
    y = undefined_thing + 1  # noqa: F821


def test_unknown_name():
    error = compile_error(unknown_name, {"x_ptr": "*fp32"})
    assert error.loc.line == line_of(unknown_name, "undefined_thing")
    assert error.message == "name 'undefined_thing' is not defined"


def plain_python(value):
    return value


@ll.jit
def calls_plain_python(x_ptr):
    y = plain_python(1)


def test_call_to_a_plain_function():
    error = compile_error(calls_plain_python, {"x_ptr": "*fp32"})
    assert error.loc.line == line_of(calls_plain_python, "plain_python(1)")
    assert "@ll.jit" in error.suggestion


@ll.jit
def adds(a, b):
    return a + b


@ll.jit
def error_in_callee():
    total = adds(ll.arange(0, 128, BL1), ll.arange(0, 128, ll.BlockedLayout([1], [32], [4], [0])))


def test_error_inside_an_inlined_call_shows_the_chain():
    error = compile_error(error_in_callee)
    assert error.loc.line == line_of(adds, "return a + b")
    assert any(f"inlined from {__file__}:{line_of(error_in_callee, 'total = adds(')}" in note
               for note in error.notes)


@ll.jit
def used_after_loop(n):
    for i in range(n):
        t = i * 2
    u = t + 1


def test_name_bound_only_inside_a_loop():
    error = compile_error(used_after_loop, {"n": "i32"})
    assert error.loc.line == line_of(used_after_loop, "u = t + 1")
    assert "only inside the runtime loop" in error.message


@ll.jit
def return_in_runtime_if(n):
    if n > 0:
        return


def test_return_inside_runtime_control_flow():
    error = compile_error(return_in_runtime_if, {"n": "i32"})
    assert error.loc.line == line_of(return_in_runtime_if, "        return")


@ll.jit
def static_check(BLOCK: ll.constexpr):
    ll.static_assert(BLOCK % 16 == 0, f"BLOCK={BLOCK} is not a multiple of 16")


def test_static_assert():
    build_kernel(static_check, {}, {"BLOCK": 32}, 4)
    error = compile_error(static_check, constexprs={"BLOCK": 24})
    assert error.message == "static_assert failed: BLOCK=24 is not a multiple of 16"
    assert error.loc.line == line_of(static_check, "ll.static_assert")


def test_signature_must_cover_runtime_parameters():
    error = compile_error(scale_if, {"x_ptr": "*fp32"}, {"BLOCK": 128})
    assert "'flag'" in error.message
    error = compile_error(scale_if, {"x_ptr": "*fp32", "flag": "i32", "extra": "i32"}, {"BLOCK": 128})
    assert "extra" in error.message


@ll.jit
def layout_parameter(out_ptr, BLOCK: ll.constexpr, L: ll.constexpr):
    per_thread: ll.constexpr = BLOCK // 128
    inner = ll.BlockedLayout([per_thread], [32], [4], [0])
    a = ll.arange(0, BLOCK, layout=L)
    b = ll.arange(0, BLOCK, layout=inner)
    ll.store(out_ptr + a, a)
    ll.store(out_ptr + b, b)


def test_layouts_from_constexprs():
    given = ll.BlockedLayout([2], [32], [4], [0])
    ops = list(build_kernel(layout_parameter, {"out_ptr": "*i32"}, {"BLOCK": 512, "L": given}, 4).walk())
    a, b = [op.result.type for op in ops if op.NAME == "arange"]
    assert a.encoding == given and a.layout == given.to_linear([512])
    assert b.encoding == ll.BlockedLayout([4], [32], [4], [0])


@ll.jit
def nested_adoption(x_ptr, n, m):
    offsets = ll.arange(0, 128, layout=BL1)
    total = 0.0
    steps = 0
    for i in range(n):
        for j in range(m):
            total += ll.load(x_ptr + offsets)
            steps += 1
    ll.store(x_ptr + offsets, total / steps)


def test_numbers_carried_through_nested_loops_adopt_the_body_type():
    kernel = build_kernel(nested_adoption, {"x_ptr": "*fp32", "n": "i32", "m": "i32"}, {}, 4)
    verify(kernel)
    outer = [op for op in kernel.body.ops if op.NAME == "for"][0]
    assert [str(r.type) for r in outer.results] == ["tensor<128xfp32>", "i32"]
    assert [r.hint for r in outer.results] == ["total", "steps"]


@ll.jit
def same_value_in_both_branches(x_ptr, flag):
    if flag > 0:
        L = BL1
        y = 1
    else:
        L = BL1
        y = 2
    ll.store(x_ptr + ll.arange(0, 128, layout=L), y)


def test_if_yields_only_values_that_differ():
    kernel = build_kernel(same_value_in_both_branches, {"x_ptr": "*i32", "flag": "i32"}, {}, 4)
    verify(kernel)
    branch = [op for op in kernel.body.ops if op.NAME == "if"][0]
    assert [(r.hint, str(r.type)) for r in branch.results] == [("y", "i32")]


@ll.jit
def endless_while(x_ptr):
    while True:
        x = 1


def test_while_on_a_compile_time_true_condition():
    error = compile_error(endless_while, {"x_ptr": "*fp32"})
    assert error.loc.line == line_of(endless_while, "while True")
    assert "never end" in error.message


# ------------------------------------------------------------------ rebinding a loop variable
# A runtime loop's variable bound before the loop (by a static loop, an assignment or an
# earlier runtime loop) is carried through it, as in Python: after the loop it holds the
# last iteration's value, or its old value when the loop did not run.
@ll.jit
def rebound_loop_variables(x_ptr, out_ptr, n, m):
    total = 0.0
    for _ in ll.static_range(1):  # the example: `_` bound by a static loop ...
        total += ll.load(x_ptr + 7)
    for _ in range(n):  # ... then the variable of a runtime loop
        total += ll.load(x_ptr + _)
    ll.store(out_ptr, total)
    ll.store(out_ptr + 1, ll.load(x_ptr + _))  # n - 1, or 0 (the static loop's) if n == 0
    j = 5
    for j in range(n):
        j = j * 2  # the body's last value of j is what the loop leaves
    ll.store(out_ptr + 2, ll.load(x_ptr + j))
    for j in range(m):  # rebinds the previous runtime loop's variable
        total += ll.load(x_ptr + j)
    ll.store(out_ptr + 3, total + ll.load(x_ptr + j))


def _rebound_reference(x, n, m):
    total = x[7] + sum(x[i] for i in range(n))
    last = n - 1 if n else 0
    j = 2 * (n - 1) if n else 5
    first = total
    total += sum(x[i] for i in range(m))
    j_after = m - 1 if m else j
    return [first, x[last], x[j], total + x[j_after]]


@pytest.mark.parametrize("n, m", [(0, 0), (1, 0), (0, 3), (4, 2), (6, 1)])
def test_a_runtime_loop_rebinds_a_variable_bound_before_it(n, m):
    np = pytest.importorskip("numpy")
    x = np.random.default_rng(n * 10 + m).standard_normal(16).astype(np.float32)
    out = np.zeros(4, np.float32)
    rebound_loop_variables[(1,)](x, out, n, m)
    np.testing.assert_allclose(out, np.array(_rebound_reference(x.astype(np.float64), n, m)), rtol=1e-6)


def test_a_runtime_loop_variable_that_held_another_type_says_what_to_change():
    def kernel(x_ptr, n):
        i = ll.load(x_ptr)  # an fp32 scalar: after the loop `i` would be fp32 or the i32 index
        for i in range(n):
            ll.store(x_ptr + i, 0.0)

    with pytest.raises(CompilationError, match="'i', the variable of this runtime loop, holds fp32") as info:
        build_kernel(kernel, {"x_ptr": "*fp32", "n": "i32"}, {}, 1)
    assert "for i in range(n):" in str(info.value)
    assert "name the loop variable differently" in str(info.value)


# ------------------------------------------------------------------ numbers computed from carried ones
# A number reassigned in a runtime loop from a carried counter may end the body's walk
# with the value it had before the loop (0 == 1 * 64 - 64 here), and still change from one
# iteration to the next: it is carried too (Gluon's tutorial 04 with two buffers does this).
@ll.jit
def offset_from_a_counter(x_ptr, out_ptr, n):
    copy = 1
    offset = 0
    for _ in range(n):
        offset = copy * 4  # 4 in the first walk: copy is still the number 1 there
        copy += 1
        ll.store(out_ptr + copy - 2, ll.load(x_ptr + offset))
        offset = (copy - 2) * 4  # ... and 0 again at the walk's end, as before the loop
    ll.store(out_ptr + 15, ll.load(x_ptr + offset))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_a_number_computed_from_a_carried_counter_is_carried(n):
    np = pytest.importorskip("numpy")
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(16, np.float32)
    offset_from_a_counter[(1,)](x, out, n)
    expected = np.zeros(16, np.float32)
    expected[:n] = x[4 * np.arange(1, n + 1)]
    expected[15] = x[4 * (n - 1)] if n else x[0]
    np.testing.assert_array_equal(out, expected)
