"""Triton's loop keywords, compiler hints and Python operators on runtime values in
weft.highlevel: `tl.range(..., num_stages=, ...)` recorded on the loop, `tl.multiple_of` /
`tl.max_contiguous` feeding axis analysis (wider loads in the PTX), `tl.assume`, a kernel
parameter named `num_stages`, `min`/`max`/`and`/`or` on runtime values, `tl.fma` and
`tl.math.*`, `@jit(launch_metadata=)`. Values are checked against numpy float64."""

import re

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import ir
from weft.compiler.frontend import build_kernel

from ._compile import error_of, line_of, ptx_through_ptxas

RNG = np.random.default_rng(40)


# ------------------------------------------------------------------ tl.range
@tl.jit
def pipelined_row_sums(x_ptr, out_ptr, n_rows, n_cols, STAGES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES, warp_specialize=False, flatten=False,
                          loop_unroll_factor=2, disallow_acc_multi_buffer=True):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def test_range_keywords_are_recorded_on_the_loop_and_the_loop_runs():
    kernel = build_kernel(pipelined_row_sums, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32"},
                          {"STAGES": 3, "BLOCK": 32}, 4, language="highlevel")
    (loop,) = [op for op in kernel.walk() if isinstance(op, ir.For)]
    assert loop.schedule == ir.LoopSchedule(num_stages=3, warp_specialize=False, loop_unroll_factor=2,
                                            disallow_acc_multi_buffer=True)
    x = RNG.standard_normal((5, 100)).astype(np.float32)
    out = np.zeros(5, np.float32)
    pipelined_row_sums[(5,)](x, out, 5, 100, STAGES=3, BLOCK=32)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


@tl.jit
def bad_stages(x_ptr, n):
    for i in tl.range(0, n, num_stages=-1):
        tl.store(x_ptr + i, 0.0)


@tl.jit
def runtime_stages(x_ptr, n):
    for i in tl.range(0, n, num_stages=n):
        tl.store(x_ptr + i, 0.0)


@tl.jit
def bad_warp_specialize(x_ptr, n):
    for i in tl.range(0, n, warp_specialize=1):
        tl.store(x_ptr + i, 0.0)


@pytest.mark.parametrize("fn, message", [
    (bad_stages, "num_stages=...) takes a compile-time int >= 0"),
    (runtime_stages, "num_stages=...) takes a compile-time int >= 0, found a scalar i32"),
    (bad_warp_specialize, "warp_specialize=...) takes True or False"),
])
def test_bad_range_keywords_point_at_the_loop(fn, message):
    error = error_of(fn, {"x_ptr": "*fp32", "n": "i32"})
    assert message in error.message
    assert error.loc.line == line_of(fn, "tl.range(")


# ------------------------------------------------------------------ hints
@tl.jit
def copy_from(x_ptr, out_ptr, start_ptr, HINT: tl.constexpr, BLOCK: tl.constexpr):
    start = tl.load(start_ptr)  # axis analysis knows nothing of a loaded offset
    if HINT:
        start = tl.multiple_of(start, 4)
    offs = start + tl.arange(0, BLOCK)
    if HINT:
        offs = tl.max_contiguous(tl.multiple_of(offs, [4]), [BLOCK])
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def test_multiple_of_and_max_contiguous_widen_the_accesses():
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "start_ptr": "*i32"}
    aligned = {"x_ptr": "divisible_by_16", "out_ptr": "divisible_by_16"}
    plain = ptx_through_ptxas(copy_from, signature, {"HINT": False, "BLOCK": 512}, specialization=aligned)
    hinted = ptx_through_ptxas(copy_from, signature, {"HINT": True, "BLOCK": 512}, specialization=aligned)
    assert not re.search(r"ld\.global(\.\w+)*\.v4", plain)
    assert re.search(r"ld\.global(\.\w+)*\.v4", hinted) and re.search(r"st\.global(\.\w+)*\.v4", hinted)
    x = RNG.standard_normal(1024).astype(np.float32)
    for hint in (False, True):
        out = np.zeros_like(x)
        copy_from[(1,)](x, out, np.array([256], np.int32), HINT=hint, BLOCK=512)
        np.testing.assert_array_equal(out[256:768], x[256:768])
        assert not out[:256].any() and not out[768:].any()


@tl.jit
def hint_on_floats(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 32))
    tl.store(x_ptr + tl.arange(0, 32), tl.multiple_of(x, 4))


@tl.jit
def hint_rank_mismatch(x_ptr):
    offs = tl.arange(0, 32)
    tl.store(x_ptr + tl.max_contiguous(offs, [32, 1]), 1.0)


@tl.jit
def assume_false(x_ptr):
    tl.assume(False)


@tl.jit
def assume_a_float(x_ptr):
    tl.assume(tl.load(x_ptr))


@pytest.mark.parametrize("fn, text, message", [
    (hint_on_floats, "tl.multiple_of(x, 4)", "multiple_of describes integers or pointers"),
    (hint_rank_mismatch, "tl.max_contiguous(", "expected 1 positive compile-time int, one per dim"),
    (assume_false, "tl.assume(False)", "the assumption is false at compile time"),
    (assume_a_float, "tl.assume(", "tl.assume needs a condition"),
])
def test_bad_hints_point_at_the_users_line(fn, text, message):
    error = error_of(fn, {"x_ptr": "*fp32"})
    assert message in error.message
    assert error.loc.line == line_of(fn, text)


@tl.jit
def assumes(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    tl.assume(n > 0)
    tl.assume(True)
    offs = tl.arange(0, BLOCK)
    tl.assume(offs >= 0)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_assume_is_accepted_and_changes_nothing():
    x = RNG.standard_normal(64).astype(np.float32)
    out = np.zeros_like(x)
    assumes[(1,)](x, out, 50, BLOCK=64)
    np.testing.assert_array_equal(out[:50], x[:50] * 2)


# ------------------------------------------------------------------ a parameter named num_stages
@tl.jit
def scaled_by_stages(x_ptr, out_ptr, BLOCK: tl.constexpr, num_stages: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in tl.range(0, num_stages, num_stages=num_stages):
        acc += tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, acc)


@tl.jit
def runtime_num_stages(x_ptr, out_ptr, num_stages, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * num_stages)


def test_a_kernel_parameter_named_num_stages_takes_the_launch_option():
    x = RNG.standard_normal(64).astype(np.float32)
    out = np.zeros_like(x)
    scaled_by_stages[(1,)](x, out, BLOCK=64, num_stages=3)
    np.testing.assert_allclose(out, x.astype(np.float64) * 3, rtol=1e-6)
    runtime_num_stages[(1,)](x, out, num_stages=5, BLOCK=64)
    np.testing.assert_allclose(out, x.astype(np.float64) * 5, rtol=1e-6)
    runtime_num_stages[(1,)](x, out, 2, BLOCK=64)
    np.testing.assert_allclose(out, x.astype(np.float64) * 2, rtol=1e-6)


# ------------------------------------------------------------------ Python operators on runtime values
@tl.jit
def python_operators(x_ptr, y_ptr, out_ptr, lo, hi, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    bound = min(hi, max(lo, 3))  # scalars
    both = (x > 0 and y > 0) or (FLAG and x < -1)
    either = x > 1 or y > 1 or offs == bound
    tl.store(out_ptr + offs, tl.where(both, max(x, y), min(x, 0.25)) + either.to(tl.float32) * 10)


@pytest.mark.parametrize("flag", [False, True])
def test_min_max_and_or_on_runtime_values_follow_triton(flag):
    x = RNG.standard_normal(64).astype(np.float32)
    y = RNG.standard_normal(64).astype(np.float32)
    out = np.zeros_like(x)
    python_operators[(1,)](x, y, out, 5, 9, FLAG=flag, BLOCK=64)
    both = ((x > 0) & (y > 0)) | (flag & (x < -1))
    either = (x > 1) | (y > 1) | (np.arange(64) == min(9, max(5, 3)))
    expected = np.where(both, np.maximum(x, y), np.minimum(x, 0.25)) + either * 10.0
    np.testing.assert_array_equal(out, expected.astype(np.float32))


@tl.jit
def and_of_a_pointer(x_ptr):
    if x_ptr and True:
        tl.store(x_ptr, 1.0)


def test_and_of_a_pointer_is_refused_at_the_users_line():
    error = error_of(and_of_a_pointer, {"x_ptr": "*fp32"})
    assert "`and` needs boolean or number operands" in error.message
    assert error.loc.line == line_of(and_of_a_pointer, "x_ptr and True")


# ------------------------------------------------------------------ tl.fma and tl.math
@tl.jit
def math_names(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(out_ptr + 0 * BLOCK + offs, tl.fma(x, y, 1.5))
    tl.store(out_ptr + 1 * BLOCK + offs, tl.math.fma(x, 2.0, y))
    tl.store(out_ptr + 2 * BLOCK + offs, tl.math.exp(x) + tl.math.exp2(y))
    tl.store(out_ptr + 3 * BLOCK + offs, tl.math.log(tl.math.abs(x) + 1) + tl.math.log2(y * y + 1))
    tl.store(out_ptr + 4 * BLOCK + offs, tl.math.sqrt_rn(x * x) + tl.math.rsqrt(y * y + 1))
    tl.store(out_ptr + 5 * BLOCK + offs, tl.math.div_rn(x, y) + tl.math.fdiv(y, 3.0))
    tl.store(out_ptr + 6 * BLOCK + offs, tl.math.sin(x) + tl.math.cos(y) + tl.math.erf(x))
    tl.store(out_ptr + 7 * BLOCK + offs, tl.math.floor(x * 4) + tl.math.ceil(y * 4))


def test_fma_and_math_names_match_numpy():
    import math

    x = RNG.standard_normal(64).astype(np.float32)
    y = RNG.standard_normal(64).astype(np.float32) + 3
    out = np.zeros(8 * 64, np.float32)
    math_names[(1,)](x, y, out, BLOCK=64)
    X, Y = x.astype(np.float64), y.astype(np.float64)
    erf = np.vectorize(math.erf)
    expected = [X * Y + 1.5, X * 2 + Y, np.exp(X) + np.exp2(Y), np.log(np.abs(X) + 1) + np.log2(Y * Y + 1),
                np.abs(X) + 1 / np.sqrt(Y * Y + 1), X / Y + Y / 3, np.sin(X) + np.cos(Y) + erf(X),
                np.floor(X * 4) + np.ceil(Y * 4)]
    np.testing.assert_allclose(out.reshape(8, 64), np.array(expected), rtol=2e-5, atol=2e-5)


@tl.jit
def high_products(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.umulhi(tl.load(a_ptr + offs), tl.load(b_ptr + offs)))


@pytest.mark.parametrize("dtype, signature", [(np.uint32, "*u32"), (np.int32, "*i32")])
def test_umulhi_is_the_high_word_of_the_unsigned_product(dtype, signature):
    a = RNG.integers(0, 1 << 32, 128, dtype=np.uint64)
    b = RNG.integers(0, 1 << 32, 128, dtype=np.uint64)
    out = np.zeros(128, dtype)
    high_products[(1,)](a.astype(np.uint32).view(dtype), b.astype(np.uint32).view(dtype), out, BLOCK=128)
    np.testing.assert_array_equal(out.view(np.uint32), ((a * b) >> 32).astype(np.uint32))
    assert tl.math.umulhi is tl.umulhi
    ptx = ptx_through_ptxas(high_products, {"a_ptr": signature, "b_ptr": signature, "out_ptr": signature},
                            {"BLOCK": 128})
    assert "mul.hi.u32" in ptx or "mul.wide.u32" in ptx


# ------------------------------------------------------------------ @jit(launch_metadata=)
def test_jit_accepts_launch_metadata():
    def metadata(grid, kernel, args):
        return {"name": "copy"}

    @tl.jit(launch_metadata=metadata)
    def copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs))

    assert copy.launch_metadata is metadata
    x = RNG.standard_normal(32).astype(np.float32)
    out = np.zeros_like(x)
    copy[(1,)](x, out, BLOCK=32)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(TypeError, match="launch_metadata"):
        tl.jit(launch_metadata="copy")


def test_axis_analysis_takes_the_hints_and_keeps_what_it_proved():
    from weft.compiler.passes.axis_analysis import analyze_axes

    kernel = build_kernel(copy_from, {"x_ptr": "*fp32", "out_ptr": "*fp32", "start_ptr": "*i32"},
                          {"HINT": True, "BLOCK": 512}, 4, language="highlevel")
    infos = analyze_axes(kernel)
    hints = [op for op in kernel.walk() if isinstance(op, ir.AxisHint)]
    assert [(op.kind, op.values) for op in hints] == [("multiple_of", (4,)), ("multiple_of", (4,)),
                                                      ("max_contiguous", (512,))]
    scalar, tile, contiguous = (op.result for op in hints)
    assert infos[scalar].divisibility == (4,)
    assert infos[tile].divisibility == (4,) and infos[tile].contiguity == (512,)  # arange's run is kept
    assert infos[contiguous].contiguity == (512,) and infos[contiguous].divisibility == (4,)
