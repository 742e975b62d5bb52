"""tl.cumsum, tl.cumprod and tl.associative_scan along either axis of a 2-D tile, forward
and reverse, against numpy float64 (and a sequential loop for a combine function that is
associative but not commutative), through ptxas, with errors at the user's line."""

import numpy as np
import pytest

from weft import highlevel as tl

from ._compile import error_of, line_of, ptx_through_ptxas

RNG = np.random.default_rng(43)


def reference_scan(x: np.ndarray, axis: int, reverse: bool, ufunc) -> np.ndarray:
    if reverse:
        return np.flip(ufunc.accumulate(np.flip(x, axis), axis=axis), axis)
    return ufunc.accumulate(x, axis=axis)


@tl.jit
def builtin_scans(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr, REVERSE: tl.constexpr):
    tile = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + tile)
    tl.store(out_ptr + tile, tl.cumsum(x, axis=AXIS, reverse=REVERSE))
    tl.store(out_ptr + R * C + tile, x.cumprod(AXIS, reverse=REVERSE))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_and_cumprod_along_either_axis(axis, reverse):
    x = RNG.uniform(0.5, 1.5, (8, 16)).astype(np.float32)
    out = np.zeros((2, 8, 16), np.float32)
    builtin_scans[(1,)](x, out, R=8, C=16, AXIS=axis, REVERSE=reverse)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out[0], reference_scan(x64, axis, reverse, np.add), rtol=1e-5)
    np.testing.assert_allclose(out[1], reference_scan(x64, axis, reverse, np.multiply), rtol=1e-5)


@tl.jit
def small_int_cumsum(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    total = tl.cumsum(tl.load(x_ptr + offs))
    tl.static_assert(total.dtype == tl.int32)  # int8 accumulates in 32 bits, as in Triton
    tl.store(out_ptr + offs, total)


def test_cumsum_of_int8_accumulates_in_int32():
    x = RNG.integers(-128, 128, 256).astype(np.int8)
    out = np.zeros(256, np.int32)
    small_int_cumsum[(1,)](x, out, N=256)
    np.testing.assert_array_equal(out, np.cumsum(x.astype(np.int64)))


@tl.jit
def affine(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2) of the maps y -> a * y + b: associative, not commutative."""
    return a1 * a2, b1 * a2 + b2


@tl.jit
def recurrence(a_ptr, b_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr,
               REVERSE: tl.constexpr):
    tile = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    a = tl.load(a_ptr + tile)
    b = tl.load(b_ptr + tile)
    _, y = tl.associative_scan((a, b), AXIS, affine, reverse=REVERSE)
    tl.store(out_ptr + tile, y)


def sequential_recurrence(a: np.ndarray, b: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """y_i = a_i * y_(i-1) + b_i from y = 0, element by element (from the end if reverse)."""
    a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
    y = np.zeros_like(b)
    state = np.zeros(b.shape[:-1])
    steps = range(b.shape[-1] - 1, -1, -1) if reverse else range(b.shape[-1])
    for i in steps:
        state = a[..., i] * state + b[..., i]
        y[..., i] = state
    return np.moveaxis(y, -1, axis)


@pytest.mark.parametrize("axis, reverse", [(0, False), (1, True)])
def test_associative_scan_keeps_the_order_of_a_non_commutative_combine(axis, reverse):
    a = RNG.uniform(0.5, 1.0, (16, 8)).astype(np.float32)
    b = RNG.standard_normal((16, 8)).astype(np.float32)
    out = np.zeros_like(a)
    recurrence[(1,)](a, b, out, R=16, C=8, AXIS=axis, REVERSE=reverse)
    expected = sequential_recurrence(a.astype(np.float64), b.astype(np.float64), axis, reverse)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_a_scan_compiles_through_ptxas():
    ptx = ptx_through_ptxas(recurrence, {"a_ptr": "*fp32", "b_ptr": "*fp32", "out_ptr": "*fp32"},
                            {"R": 16, "C": 64, "AXIS": 1, "REVERSE": False})
    assert ".target sm_90a" in ptx


# ------------------------------------------------------------------ errors
@tl.jit
def first_only(a, b):
    return a


@tl.jit
def wrong_arity(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    tl.store(x_ptr + tl.arange(0, 16), tl.associative_scan(x, 0, affine))


@tl.jit
def bad_axis(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    tl.store(x_ptr + tl.arange(0, 16), tl.cumsum(x, axis=1))


@tl.jit
def changes_type(a, b):
    return (a + b).to(tl.float16)


@tl.jit
def wrong_type(x_ptr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    tl.store(x_ptr + tl.arange(0, 16), tl.associative_scan(x, 0, changes_type))


@pytest.mark.parametrize("fn, text, message", [
    (wrong_arity, "tl.associative_scan(x, 0, affine)", "affine(): missing"),
    (bad_axis, "tl.cumsum(x, axis=1)", "cumsum: axis 1 is not a dim"),
    (wrong_type, "tl.associative_scan(x, 0, changes_type)", "combine_fn returned fp16 values for an input of fp32"),
])
def test_bad_scans_point_at_the_users_line(fn, text, message):
    error = error_of(fn, {"x_ptr": "*fp32"})
    assert message in error.message
    assert error.loc.line == line_of(fn, text)
