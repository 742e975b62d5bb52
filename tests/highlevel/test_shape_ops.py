"""Triton's shape ops in weft.highlevel: reshape (and view, ravel), join, split,
interleave, trans, permute, expand_dims and broadcast_to, laid out by propagate_layouts
(reshape by `layouts.rules.reshape_layout`, so no data moves), checked against numpy on
random inputs, through ptxas, and with errors at the user's line."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.ir import ConvertLayout

from ._compile import error_of, line_of, ptx_through_ptxas

RNG = np.random.default_rng(41)


@tl.jit
def reshapes(x_ptr, out_ptr, R: tl.constexpr, C: tl.constexpr):
    """x (R x C) stored back as reshape to (C, R), view to (R*C/4, 4), ravel, and the
    method spellings, one after another."""
    x = tl.load(x_ptr + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :])
    n = R * C
    flat = tl.arange(0, n)
    tl.store(out_ptr + flat, tl.ravel(tl.reshape(x, C, R)))
    tl.store(out_ptr + n + tl.arange(0, n // 4)[:, None] * 4 + tl.arange(0, 4)[None, :], tl.view(x, (n // 4, 4)))
    tl.store(out_ptr + 2 * n + flat, x.reshape(n, can_reorder=True) * 2)
    tl.store(out_ptr + 3 * n + flat, tl.reshape(x.trans(), [n]))


@pytest.mark.parametrize("rows, cols", [(4, 32), (16, 8), (64, 64)])
def test_reshape_keeps_row_major_order(rows, cols):
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    out = np.zeros(4 * x.size, np.float32)
    reshapes[(1,)](x, out, R=rows, C=cols)
    parts = out.reshape(4, -1)
    np.testing.assert_array_equal(parts[0], x.ravel())
    np.testing.assert_array_equal(parts[1], x.ravel())
    np.testing.assert_array_equal(parts[2], (x.astype(np.float64) * 2).ravel().astype(np.float32))
    np.testing.assert_array_equal(parts[3], x.T.ravel())


@tl.jit
def joins_and_splits(x_ptr, y_ptr, out_ptr, idx_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    pair = tl.join(x, y)  # N x 2
    tl.store(out_ptr + offs[:, None] * 2 + tl.arange(0, 2)[None, :], pair)
    tl.store(out_ptr + 2 * N + tl.arange(0, 2 * N), tl.interleave(y, x))
    a, b = tl.split(pair)
    c, d = pair.split()
    tl.store(out_ptr + 4 * N + offs, a)
    tl.store(out_ptr + 5 * N + offs, b)
    tl.store(out_ptr + 6 * N + offs, c)
    tl.store(out_ptr + 7 * N + offs, d)
    i = tl.load(idx_ptr + offs)
    lo, hi = tl.split(tl.join(i, i + 1).reshape(N // 2, 2, 2).reshape(N, 2))
    tl.store(idx_ptr + offs, lo * 10 + hi)


@pytest.mark.parametrize("n", [16, 256])
def test_join_split_and_interleave_match_numpy(n):
    x = RNG.standard_normal(n).astype(np.float32)
    y = RNG.standard_normal(n).astype(np.float32)
    x[0], y[1] = -0.0, np.nan  # split gives the bits back, even these
    idx = RNG.integers(-1000, 1000, n).astype(np.int32)
    out = np.zeros(8 * n, np.float32)
    expected_idx = idx.astype(np.int64) * 10 + idx + 1
    joins_and_splits[(1,)](x, y, out, idx, N=n)
    np.testing.assert_array_equal(out[:2 * n], np.stack([x, y], -1).ravel())
    np.testing.assert_array_equal(out[2 * n:4 * n], np.stack([y, x], -1).ravel())
    halves = out[4 * n:].reshape(4, n).view(np.uint32)
    for half, expected in zip(halves, (x, y, x, y)):
        np.testing.assert_array_equal(half, expected.view(np.uint32))
    np.testing.assert_array_equal(idx, expected_idx)


def test_join_split_reshape_compile_through_ptxas_without_conversions_for_a_plain_pair():
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "idx_ptr": "*i32"}
    ptx = ptx_through_ptxas(joins_and_splits, signature, {"N": 256})
    assert ".target sm_90a" in ptx

    @tl.jit
    def swap_pairs(x_ptr, N: tl.constexpr):
        offs = tl.arange(0, 2 * N)
        a, b = tl.split(tl.reshape(tl.load(x_ptr + offs), N, 2))
        tl.store(x_ptr + offs, tl.interleave(b, a))

    x = RNG.standard_normal(512).astype(np.float32)
    swapped = x.reshape(-1, 2)[:, ::-1].ravel().copy()
    swap_pairs[(1,)](x, N=256)
    np.testing.assert_array_equal(x, swapped)
    # a pair stays in one thread's registers: reshape and split move nothing between threads
    assert max(sum(isinstance(op, ConvertLayout) for op in k.walk()) for k in swap_pairs._compiled.values()) == 0


@tl.jit
def permutes(x_ptr, out_ptr, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr):
    a = tl.arange(0, A)[:, None, None]
    b = tl.arange(0, B)[None, :, None]
    c = tl.arange(0, C)[None, None, :]
    x = tl.load(x_ptr + a * B * C + b * C + c)
    p = tl.permute(x, (2, 0, 1))  # C x A x B
    tl.store(out_ptr + c.permute(2, 0, 1) * A * B + a.permute(2, 0, 1) * B + b.permute(2, 0, 1), p)
    row = tl.load(x_ptr + tl.arange(0, C))
    wide = tl.broadcast_to(tl.expand_dims(row, 0), (B, C)) + tl.expand_dims(tl.arange(0, B), 1).to(tl.float32)
    tl.store(out_ptr + A * B * C + tl.arange(0, B)[:, None] * C + tl.arange(0, C)[None, :], wide)
    tl.store(out_ptr + A * B * C + B * C + tl.arange(0, C)[:, None] * B + tl.arange(0, B)[None, :], tl.trans(wide))


def test_permute_trans_expand_dims_and_broadcast_to_match_numpy():
    x = RNG.standard_normal((4, 8, 16)).astype(np.float32)
    out = np.zeros(x.size + 2 * 8 * 16, np.float32)
    permutes[(1,)](x, out, A=4, B=8, C=16)
    np.testing.assert_array_equal(out[:x.size].reshape(16, 4, 8), x.transpose(2, 0, 1))
    wide = x.ravel()[:16][None, :] + np.arange(8, dtype=np.float64)[:, None]
    np.testing.assert_array_equal(out[x.size:x.size + 128].reshape(8, 16), wide.astype(np.float32))
    np.testing.assert_array_equal(out[x.size + 128:].reshape(16, 8), wide.T.astype(np.float32))


# ------------------------------------------------------------------ errors
@tl.jit
def reshape_wrong_count(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 64))
    tl.store(x_ptr + tl.arange(0, 64), tl.ravel(tl.reshape(a, 8, 4)))


@tl.jit
def reshape_to_a_runtime_shape(x_ptr, n):
    a = tl.load(x_ptr + tl.arange(0, 64))
    tl.store(x_ptr + tl.arange(0, 64), tl.ravel(a.reshape(8, n)))


@tl.jit
def split_wrong_size(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 64))
    b, c = tl.split(tl.reshape(a, 16, 4))
    tl.store(x_ptr + tl.arange(0, 16), b + c)


@tl.jit
def join_mixed_types(x_ptr):
    a = tl.load(x_ptr + tl.arange(0, 64))
    j = tl.join(a, tl.arange(0, 64))
    tl.store(x_ptr + tl.arange(0, 128), tl.ravel(j))


@pytest.mark.parametrize("fn, text, message", [
    (reshape_wrong_count, "tl.reshape(a, 8, 4)", "(64 elements) to [8, 4] (32 elements)"),
    (reshape_to_a_runtime_shape, "a.reshape(8, n)", "reshape shape entry must be a compile-time int"),
    (split_wrong_size, "tl.split(", "split needs a tensor whose last dim has size 2"),
    (join_mixed_types, "tl.join(a, tl.arange(0, 64))", "join needs operands of one element type"),
])
def test_bad_shape_ops_point_at_the_users_line(fn, text, message):
    error = error_of(fn, {"x_ptr": "*fp32", "n": "i32"} if fn is reshape_to_a_runtime_shape else {"x_ptr": "*fp32"})
    assert message in error.message
    assert error.loc.line == line_of(fn, text)
