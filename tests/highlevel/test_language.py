"""weft.highlevel: Triton's `tl` surface at the `tile` stage, located errors, and kernels
with loops, branches, broadcasting and reductions run on the CPU emulator.

The golden text is the exact `tile`-stage `print_kernel` output; WEFT_ACCEPT=1 rewrites it.
"""

import inspect
import math

import numpy as np
import pytest

from weft import highlevel as tl
from weft import highlevel as triton  # what `import triton` becomes in ported code
from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import ConvertLayout
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.runtime.arguments import LaunchError

from ..compiler.golden import golden_checker

check_golden = golden_checker(__file__, globals())
RNG = np.random.default_rng(6)


def conversions(jit_fn) -> int:
    """convert_layout ops in the emulated variants of `jit_fn` (the most of any)."""
    return max(sum(isinstance(op, ConvertLayout) for op in kernel.walk())
               for kernel in jit_fn._compiled.values())


# ------------------------------------------------------------------ the tile stage
@tl.jit
def scaled_rows(x_ptr, out_ptr, scale, n_cols, ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    mask = cols[None, :] < n_cols
    x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rows, tl.sum(x * scale, axis=1))


SCALED_ROWS = """\
kernel @scaled_rows(%x_ptr: *fp32, %out_ptr: *fp32, %scale: fp32, %n_cols: i32) num_warps=4 {
  %4 = program_id [axis=0] : i32
  %5 = constant [value=2] : i32
  %6 = binary [kind=mul] %4, %5 : i32
  %7 = arange [start=0 end=2] : tensor<2xi32>
  %8 = splat %6 : tensor<2xi32>
  %rows = binary [kind=add] %8, %7 : tensor<2xi32>
  %cols = arange [start=0 end=64] : tensor<64xi32>
  %11 = expand_dims [axis=0] %cols : tensor<1x64xi32>
  %12 = splat %n_cols : tensor<1x64xi32>
  %mask = compare [predicate=lt] %11, %12 : tensor<1x64xi1>
  %14 = expand_dims [axis=1] %rows : tensor<2x1xi32>
  %15 = splat %n_cols : tensor<2x1xi32>
  %16 = binary [kind=mul] %14, %15 : tensor<2x1xi32>
  %17 = splat %x_ptr : tensor<2x1x*fp32>
  %18 = add_ptr %17, %16 : tensor<2x1x*fp32>
  %19 = expand_dims [axis=0] %cols : tensor<1x64xi32>
  %20 = broadcast %18 : tensor<2x64x*fp32>
  %21 = broadcast %19 : tensor<2x64xi32>
  %22 = add_ptr %20, %21 : tensor<2x64x*fp32>
  %23 = broadcast %mask : tensor<2x64xi1>
  %24 = constant [value=0.0] : tensor<2x64xfp32>
  %x = load %22, %23, %24 : tensor<2x64xfp32>
  %26 = splat %out_ptr : tensor<2x*fp32>
  %27 = add_ptr %26, %rows : tensor<2x*fp32>
  %28 = splat %scale : tensor<2x64xfp32>
  %29 = binary [kind=mul] %x, %28 : tensor<2x64xfp32>
  %30 = reduce [axis=1 kind=sum] %29 : tensor<2xfp32>
  store %27, %30
}
"""


def test_tile_stage_golden_has_no_layouts():
    kernel = build_kernel(scaled_rows, {"x_ptr": "*fp32", "out_ptr": "*fp32", "scale": "fp32", "n_cols": "i32"},
                          {"ROWS": 2, "COLS": 64}, 4, language="highlevel")
    assert kernel.stage == "tile" and kernel.language == "highlevel"
    verify(kernel)
    check_golden(print_kernel(kernel), "SCALED_ROWS")


def test_triton_names_are_the_same_objects():
    assert tl.float32 is ll.float32 and tl.bfloat16 is ll.bf16 and tl.int1 is ll.i1
    assert tl.constexpr is ll.constexpr and tl.static_range is ll.static_range
    for name in ("program_id", "num_programs", "arange", "zeros", "full", "load", "store", "where", "exp",
                 "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "maximum", "minimum", "fma", "erf", "sum",
                 "max", "min", "argmax", "cdiv", "trans", "expand_dims", "broadcast_to", "range"):
        assert hasattr(tl, name), name
    assert list(inspect.signature(tl.load).parameters)[:3] == ["pointer", "mask", "other"]


@triton.jit
def ported_scale(x_ptr, out_ptr, n, alpha, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + offsets, x * alpha + tl.next_power_of_2(5), mask=mask, cache_modifier=".cs")


def test_triton_code_runs_with_only_the_imports_changed():
    x = RNG.standard_normal(1000).astype(np.float32)
    out = np.zeros_like(x)
    grid = lambda meta: (triton.cdiv(meta["n"], meta["BLOCK_SIZE"]),)  # noqa: E731
    ported_scale[grid](x, out, 1000, 2.0, BLOCK_SIZE=256)
    np.testing.assert_allclose(out, x * 2 + 8, rtol=1e-6)
    assert triton.cdiv(1000, 256) == 4 and triton.next_power_of_2(1000) == 1024


def test_triton_cache_hints_reach_the_ptx():
    compiled = ported_scale.compile(signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"},
                                    constexprs={"BLOCK_SIZE": 256})
    ptx = compiled.asm["ptx"]
    assert "ld.global.L1::evict_first" in ptx and "st.global.cs" in ptx


def test_the_cluster_option_is_kept_and_checked():
    """`cluster=` reaches the launch of a highlevel kernel as of a lowlevel one (it was
    accepted and dropped), with the same checks, on the GPU and the emulator."""
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
    compiled = ported_scale.compile(signature=signature, constexprs={"BLOCK_SIZE": 256}, cluster=(2, 1))
    assert compiled.cluster == (2, 1, 1)
    assert ported_scale.compile(signature=signature, constexprs={"BLOCK_SIZE": 256}).cluster is None
    with pytest.raises(LaunchError, match="portable limit is 8"):
        ported_scale.compile(signature=signature, constexprs={"BLOCK_SIZE": 256}, cluster=16)
    x = RNG.standard_normal(512).astype(np.float32)
    out = np.zeros_like(x)
    ported_scale[(2,)](x, out, 512, 2.0, BLOCK_SIZE=256, cluster=(2, 1, 1))
    np.testing.assert_allclose(out, x * 2 + 8, rtol=1e-6)
    with pytest.raises(LaunchError, match="not a whole number of clusters"):
        ported_scale[(3,)](x, out, 512, 2.0, BLOCK_SIZE=256, cluster=(2, 1, 1))


# ------------------------------------------------------------------ errors at the user's line
@tl.jit
def bad_broadcast(x_ptr):
    a = tl.arange(0, 64)
    b = tl.arange(0, 128)
    tl.store(x_ptr + a, a + b)


@tl.jit
def bad_reshape(x_ptr):
    a = tl.arange(0, 64)
    tl.store(x_ptr + a, a.reshape(8, 8))


@tl.jit
def helper_with_bad_axis(x):
    return tl.sum(x, axis=2)


@tl.jit
def calls_bad_helper(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 32))
    tl.store(x_ptr, helper_with_bad_axis(a))


@tl.jit
def tensor_condition(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 32))
    if a > 0:
        a = a * 2
    tl.store(x_ptr + tl.arange(0, 32), a)


def error_of(fn) -> CompilationError:
    with pytest.raises(CompilationError) as info:
        build_kernel(fn, {"x_ptr": "*fp32"}, {}, 4, language="highlevel")
    return info.value


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("fn, text, message", [
    (bad_broadcast, "a + b", "shapes [64] and [128] do not broadcast"),
    (bad_reshape, "a.reshape(8, 8)", "do not broadcast"),
    (calls_bad_helper, "tl.sum(x, axis=2)", "axis 2 is not a dim"),
    (tensor_condition, "if a > 0", "must be a scalar"),
])
def test_errors_point_at_the_users_line(fn, text, message):
    error = error_of(fn)
    assert message in error.message
    assert error.loc.line == line_of(helper_with_bad_axis if fn is calls_bad_helper else fn, text)
    assert "layout" not in error.render().split("suggestion")[0].lower() or fn is tensor_condition


@tl.jit
def uses_dot_scaled(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 32))
    tl.store(x_ptr + tl.arange(0, 32), tl.dot_scaled(a, a))


@tl.jit
def prints_a_tile(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 32))
    print(a)


@tl.jit
def formats_a_tile(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 32))
    tl.static_print(f"{a}")


@pytest.mark.parametrize("name", ["dot_scaled", "sort", "cat", "histogram"])
def test_triton_names_highlevel_lacks_say_so(name):
    with pytest.raises(AttributeError, match=f"`tl.{name}` is not supported by weft.highlevel yet"):
        getattr(tl, name)
    assert not hasattr(triton, name)


def test_other_unknown_names_keep_pythons_message():
    with pytest.raises(AttributeError, match="module 'weft.highlevel' has no attribute 'no_such_op'") as info:
        tl.no_such_op
    assert "not supported" not in str(info.value)


def test_tl_dot_scaled_suggests_lowlevel_warpgroup_mma():
    with pytest.raises(AttributeError, match=r"instead, .*ll\.warpgroup_mma"):
        tl.dot_scaled


def test_no_name_listed_as_unsupported_is_defined():
    """A name highlevel gains must leave the unsupported table, or its import would be shadowed."""
    from weft.highlevel.unsupported import TRITON_ONLY_NAMES

    assert not sorted(set(TRITON_ONLY_NAMES) & set(vars(tl))), "remove these from highlevel/unsupported.py"


def test_an_unsupported_triton_name_in_a_kernel_points_at_the_users_line():
    error = error_of(uses_dot_scaled)
    assert "`tl.dot_scaled` is not supported by weft.highlevel yet" in error.message
    assert "ll.warpgroup_mma" in error.message
    assert error.loc.line == line_of(uses_dot_scaled, "tl.dot_scaled(a, a)")


@pytest.mark.parametrize("fn, text", [(prints_a_tile, "print(a)"), (formats_a_tile, 'f"{a}"')])
def test_printing_a_tile_suggests_the_highlevel_device_print(fn, text):
    error = error_of(fn)
    assert "use tl.device_print" in error.render() or "with tl.device_print" in error.render()
    assert "ll." not in error.render()
    assert error.loc.line == line_of(fn, text)
    assert tl.device_print is ll.device_print


# ------------------------------------------------------------------ kernels on the emulator
@tl.jit
def chunked_row_sum(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def test_a_loop_carries_a_tile():
    x = RNG.standard_normal((3, 1000)).astype(np.float32)
    out = np.zeros(3, np.float32)
    chunked_row_sum[(3,)](x, out, 1000, 1000, BLOCK=256)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-4, atol=1e-4)
    assert conversions(chunked_row_sum) == 0


@tl.jit
def column_max(x_ptr, out_ptr, n_rows, N: tl.constexpr):
    ptrs = x_ptr + tl.arange(0, N)
    best = tl.full([N], -float("inf"), tl.float32)
    for _ in range(0, n_rows):
        best = tl.maximum(best, tl.load(ptrs))
        ptrs += N
    tl.store(out_ptr + tl.arange(0, N), best)


def test_a_loop_carries_a_tile_of_pointers():
    x = RNG.standard_normal((5, 128)).astype(np.float32)
    out = np.zeros(128, np.float32)
    column_max[(1,)](x, out, 5, N=128)
    assert np.array_equal(out, x.max(0))
    assert conversions(column_max) == 0


@tl.jit
def branches(x_ptr, out_ptr, flag, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    if flag > 0:
        y = x * 2.0
    else:
        y = tl.zeros([BLOCK], tl.float32) + 1.0
    k = 0
    while k < flag:
        y = y + 1.0
        k += 1
    for i in tl.static_range(2):
        y = y + i
    tl.store(out_ptr + offsets, y)


@pytest.mark.parametrize("flag", [0, 3])
def test_if_while_and_static_range_carry_tiles(flag):
    x = RNG.standard_normal(128).astype(np.float32)
    out = np.zeros_like(x)
    branches[(1,)](x, out, flag, BLOCK=128)
    expected = (x * 2 + 3 if flag else np.ones_like(x)) + 1
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert conversions(branches) == 0


@tl.jit
def rows_minus_column_sums(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    sums = tl.sum(x, axis=0)
    tl.store(out_ptr + r[:, None] * C + c[None, :], x - sums[None, :] + tl.max(x, axis=1, keep_dims=True))
    tl.store(out_ptr + R * C + c, sums)


def test_reductions_along_either_axis_broadcast_back_without_conversions():
    x = RNG.standard_normal((16, 32)).astype(np.float32)
    out = np.zeros(16 * 32 + 32, np.float32)
    rows_minus_column_sums[(1,)](x, out, R=16, C=32)
    np.testing.assert_allclose(out[:512].reshape(16, 32), x - x.sum(0) + x.max(1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(out[512:], x.sum(0), atol=1e-5)
    assert conversions(rows_minus_column_sums) == 0


@tl.jit
def outer_product(a_ptr, b_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    rows = tl.arange(0, R)
    cols = tl.arange(0, C)
    a = tl.load(a_ptr + rows)
    b = tl.load(b_ptr + cols)
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], a[:, None] * b[None, :])


def test_broadcast_operands_are_converted_before_they_are_stretched():
    a, b = RNG.standard_normal(16).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    out = np.zeros((16, 64), np.float32)
    outer_product[(1,)](a, b, out, R=16, C=64)
    np.testing.assert_allclose(out, np.outer(a, b), rtol=1e-6)
    assert conversions(outer_product) == 2  # the two vectors, not the 16 x 64 product


@tl.jit
def transposed_copy(x_ptr, out_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tile = tl.load(x_ptr + r[:, None] * N + r[None, :])
    tl.store(out_ptr + r[:, None] * N + r[None, :], tl.trans(tile))
    tl.store(out_ptr + N * N + r[:, None] * N + r[None, :], tile.T + 0.0)


def test_trans_reorders_the_layout_and_conversions_keep_stores_coalesced():
    x = RNG.standard_normal((32, 32)).astype(np.float32)
    out = np.zeros(2 * 32 * 32, np.float32)
    transposed_copy[(1,)](x, out, N=32)
    assert np.array_equal(out[:1024].reshape(32, 32), x.T)
    assert np.array_equal(out[1024:].reshape(32, 32), x.T)
    # Both permutes (and the sum after the second) are redone from one converted tile.
    assert conversions(transposed_copy) == 1


@tl.jit
def math_zoo(x_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    x = tl.load(x_ptr + offsets)
    a = tl.abs(x) + 0.5
    results = (tl.exp(x), tl.exp2(x), tl.log(a), tl.log2(a), tl.sqrt(a), tl.rsqrt(a), tl.erf(x),
               tl.maximum(x, 0.25), tl.minimum(x, 0.25), tl.fma(x, a, 1.0), tl.where(x > 0, x, -x),
               x.to(tl.float16).to(tl.float32), (x * 8).to(tl.int32).to(tl.float32), tl.cdiv(N, 3) + x)
    for i in tl.static_range(len(results)):
        tl.store(out_ptr + i * N + offsets, results[i])


def test_elementwise_math_and_casts_match_numpy():
    x = RNG.standard_normal(64).astype(np.float32)
    out = np.zeros(14 * 64, np.float32)
    math_zoo[(1,)](x, out, N=64)
    a = np.abs(x) + 0.5
    erf = np.vectorize(math.erf)
    expected = [np.exp(x), np.exp2(x), np.log(a), np.log2(a), np.sqrt(a), 1 / np.sqrt(a), erf(x),
                np.maximum(x, 0.25), np.minimum(x, 0.25), x * a + 1, np.abs(x),
                x.astype(np.float16).astype(np.float32), np.trunc(x * 8), 22 + x]
    for got, want in zip(out.reshape(14, 64), expected):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@tl.jit
def row_sums_stored_by_column(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    # Stored column-major: the sums, not the R x C tile built from them, change layout.
    tl.store(out_ptr + c[None, :] * R + r[:, None], tl.sum(x, axis=1)[:, None] + tl.zeros([R, C], tl.float32))


def test_elementwise_ops_are_redone_after_converting_their_smaller_operand():
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    out = np.zeros((64, 16), np.float32)
    row_sums_stored_by_column[(1,)](x, out, R=16, C=64)
    np.testing.assert_allclose(out, np.broadcast_to(x.sum(1), (64, 16)), rtol=1e-5)
    (kernel,) = row_sums_stored_by_column._compiled.values()
    assert [op.operand.type.shape for op in kernel.walk() if isinstance(op, ConvertLayout)] == [(16,)]


@tl.jit
def if_with_loads_in_both_branches(x_ptr, out_ptr, flag, N: tl.constexpr):
    r = tl.arange(0, N)
    if flag > 0:
        t = tl.load(x_ptr + r[:, None] * N + r[None, :])
    else:
        t = tl.load(x_ptr + r[None, :] * N + r[:, None])
    tl.store(out_ptr + r[:, None] * N + r[None, :], t)


@pytest.mark.parametrize("flag", [0, 1])
def test_branches_yield_tiles_loaded_in_different_layouts(flag):
    x = RNG.standard_normal((32, 32)).astype(np.float32)
    out = np.zeros_like(x)
    if_with_loads_in_both_branches[(1,)](x, out, flag, N=32)
    assert np.array_equal(out, x if flag else x.T)


@tl.jit
def reduce_index_tiles(out_ptr, n, N: tl.constexpr):
    r = tl.arange(0, N)
    counts = tl.zeros([N], tl.int32)
    for _ in range(0, n):
        counts += 1
    tl.store(out_ptr + r, tl.sum(r[:, None] + r[None, :], axis=1) + tl.sum(r, axis=0) + counts)


def test_tiles_built_without_loads_get_default_layouts():
    out = np.zeros(16, np.int32)
    reduce_index_tiles[(1,)](out, 3, N=16)
    r = np.arange(16)
    assert np.array_equal(out, (r[:, None] + r[None, :]).sum(1) + r.sum() + 3)


@tl.jit
def gather(idx_ptr, x_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, tl.load(x_ptr + tl.load(idx_ptr + offsets)))


def test_a_gather_shares_the_layout_of_the_coalesced_index_load():
    idx = RNG.integers(0, 1000, 256).astype(np.int32)
    x = RNG.standard_normal(1000).astype(np.float32)
    out = np.zeros(256, np.float32)
    gather[(1,)](idx, x, out, N=256)
    assert np.array_equal(out, x[idx])
    assert conversions(gather) == 0


@pytest.mark.parametrize("warps", [1, 2, 8, 16])
def test_tiles_smaller_than_the_cta_wrap_for_any_warp_count(warps):
    @tl.jit
    def small(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
        r = tl.arange(0, R)
        c = tl.arange(0, C)
        x = tl.load(x_ptr + r[:, None] * C + c[None, :])
        y = x - tl.max(x, axis=0)[None, :] + tl.sum(x, axis=1)[:, None]
        tl.store(out_ptr + c[None, :] * R + r[:, None], y)

    x = RNG.standard_normal((4, 8)).astype(np.float32)
    out = np.zeros((8, 4), np.float32)
    small[(1,)](x, out, R=4, C=8, num_warps=warps)
    np.testing.assert_allclose(out, (x - x.max(0) + x.sum(1)[:, None]).T, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ atomics
@tl.jit
def tile_histogram(bins_ptr, hist_ptr, old_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    bins = tl.load(bins_ptr + offsets, mask=mask)
    old = tl.atomic_add(hist_ptr + bins, 1, mask=mask)
    tl.store(old_ptr + offsets, old, mask=mask)
    tl.atomic_max(hist_ptr + bins[:, None] * 0 + tl.arange(0, 2)[None, :] * 0, bins[:, None], mask=mask[:, None],
                  sem="relaxed")


@pytest.mark.parametrize("block", [32, 256])  # 32 elements on 4 warps: every warp holds a copy
def test_tile_atomics_update_each_element_once(block):
    n, bins = 900, 23
    index = RNG.integers(1, bins, n).astype(np.int32)
    hist = np.zeros(bins, np.int32)
    old = np.full(n, -1, np.int32)
    tile_histogram[(triton.cdiv(n, block),)](index, hist, old, n, block)
    expected = np.bincount(index, minlength=bins)
    expected[0] = index.max()  # each element also maxes its bin into bin 0 (from both columns)
    np.testing.assert_array_equal(hist, expected)
    for b in range(1, bins):
        np.testing.assert_array_equal(np.sort(old[index == b]), np.arange((index == b).sum()))
