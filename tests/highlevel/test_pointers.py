"""Pointer features of Triton's language in weft.highlevel: int-to-pointer casts
(`x.to(tl.pointer_type(tl.float16))`), tensors passed to constexpr-annotated parameters
of helpers, and block pointers (`tl.make_block_ptr`, `tl.advance`, loads and stores with
`boundary_check` and `padding_option`, lowered to masked pointer accesses), against numpy
on random inputs, through ptxas, with errors at the user's line."""

import numpy as np
import pytest

from weft import highlevel as tl

from ._compile import error_of, line_of, ptx_through_ptxas

RNG = np.random.default_rng(44)


# ------------------------------------------------------------------ int <-> pointer
@tl.jit
def reversed_through_addresses(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    address = x_ptr.to(tl.int64)  # a scalar address, in bytes
    reversed_ptrs = (address + 2 * (N - 1 - offs)).to(tl.pointer_type(tl.float16))  # a tile of them
    halves = tl.load(reversed_ptrs)
    out_addresses = (out_ptr + offs).to(tl.int64)
    tl.store(out_addresses.to(tl.pointer_type(tl.float32)), halves.to(tl.float32) * 3)


def test_integers_cast_to_pointers_address_the_same_bytes():
    x = RNG.standard_normal(128).astype(np.float16)
    out = np.zeros(128, np.float32)
    reversed_through_addresses[(1,)](x, out, N=128)
    np.testing.assert_array_equal(out, x[::-1].astype(np.float64) * 3)
    ptx = ptx_through_ptxas(reversed_through_addresses, {"x_ptr": "*fp16", "out_ptr": "*fp32"}, {"N": 128})
    assert "ld.global" in ptx and "st.global" in ptx


@tl.jit
def narrow_int_to_pointer(x_ptr):
    p = tl.arange(0, 16).to(tl.pointer_type(tl.float32))
    tl.store(p, 1.0)


def test_a_32_bit_integer_to_pointer_is_refused_at_the_users_line():
    error = error_of(narrow_int_to_pointer, {"x_ptr": "*fp32"})
    assert "cannot convert i32 to *fp32" in error.message and ".to(ll.int64) first" in error.render()
    assert error.loc.line == line_of(narrow_int_to_pointer, "tl.pointer_type(tl.float32)")


# ------------------------------------------------------------------ tensors to constexpr parameters
@tl.jit
def scaled(x, factor: tl.constexpr, OFFSET: tl.constexpr):
    return x * factor + OFFSET


@tl.jit
def passes_a_tensor_as_constexpr(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, scaled(x, x, 1.5) + scaled(x, 2.0, 0.0))


def test_a_tensor_may_be_passed_to_a_constexpr_parameter_of_a_helper():
    x = RNG.standard_normal(64).astype(np.float32)
    out = np.zeros_like(x)
    passes_a_tensor_as_constexpr[(1,)](x, out, N=64)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, x64 * x64 + 1.5 + x64 * 2, rtol=1e-6)


# ------------------------------------------------------------------ block pointers
@tl.jit
def block_copy(x_ptr, out_ptr, M, N, stride_m, stride_n, BM: tl.constexpr, BN: tl.constexpr,
               PADDING: tl.constexpr):
    """Each program copies a row band of x, BN columns at a time, through block pointers;
    the last band and the last chunk hang over the edges. Row 0 of the padded tiles (what
    the loads read beyond the edge) is summed into the last output row."""
    pid = tl.program_id(0)
    src = tl.make_block_ptr(x_ptr, shape=(M, N), strides=(stride_m, stride_n), offsets=(pid * BM, 0),
                            block_shape=(BM, BN), order=(1, 0))
    dst = tl.make_block_ptr(out_ptr, (M, N), (stride_m, stride_n), (pid * BM, 0), (BM, BN), (1, 0))
    for _ in range(0, N, BN):
        tile = tl.load(src, boundary_check=(0, 1), padding_option=PADDING)
        tl.store(dst, tile * 2, boundary_check=(0, 1))
        src = tl.advance(src, (0, BN))
        dst = tl.advance(dst, [0, BN])


@pytest.mark.parametrize("rows, cols", [(20, 50), (32, 64)])
def test_block_pointers_copy_with_boundary_checks(rows, cols):
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    out = np.full((rows, cols), -1.0, np.float32)
    block_copy[(triton_cdiv(rows, 16),)](x, out, rows, cols, cols, 1, BM=16, BN=32, PADDING="zero")
    np.testing.assert_array_equal(out, x.astype(np.float64) * 2)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@tl.jit
def padded_tile(x_ptr, out_ptr, M, N, row, col, PADDING: tl.constexpr, CHECK: tl.constexpr):
    src = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (row, col), (8, 16), (1, 0))
    dst = tl.make_block_ptr(out_ptr, (8, 16), (16, 1), (0, 0), (8, 16), (1, 0))
    tl.store(dst, tl.load(src, boundary_check=CHECK, padding_option=PADDING))


@pytest.mark.parametrize("padding, fill", [("zero", 0.0), ("nan", np.nan), ("", 0.0)])
def test_loads_past_the_edges_read_the_padding(padding, fill):
    x = RNG.standard_normal((10, 20)).astype(np.float32)
    out = np.zeros((8, 16), np.float32)
    padded_tile[(1,)](x, out, 10, 20, 6, -4, PADDING=padding, CHECK=(0, 1))
    expected = np.full((8, 16), fill)
    expected[:4, 4:] = x[6:10, 0:12]
    np.testing.assert_array_equal(out, expected.astype(np.float32))


def test_only_the_checked_dims_are_masked():
    x = RNG.standard_normal((10, 20)).astype(np.float32)
    out = np.zeros((8, 16), np.float32)
    padded_tile[(1,)](x, out, 10, 20, 6, 2, PADDING="nan", CHECK=(0,))  # dim 1 stays inside
    expected = np.full((8, 16), np.nan)
    expected[:4] = x[6:10, 2:18]
    np.testing.assert_array_equal(out, expected.astype(np.float32))


def test_a_block_pointer_loop_compiles_through_ptxas():
    signature = {"x_ptr": "*fp16", "out_ptr": "*fp16", "M": "i32", "N": "i32", "stride_m": "i32", "stride_n": "i32"}
    ptx = ptx_through_ptxas(block_copy, signature, {"BM": 64, "BN": 64, "PADDING": "zero"})
    assert "ld.global" in ptx


@tl.jit
def block_load_with_mask(x_ptr):
    p = tl.make_block_ptr(x_ptr, (16, 16), (16, 1), (0, 0), (16, 16), (1, 0))
    tl.store(p, tl.load(p, mask=None, other=0.0))


@tl.jit
def bad_padding(x_ptr):
    p = tl.make_block_ptr(x_ptr, (16, 16), (16, 1), (0, 0), (16, 16), (1, 0))
    tl.store(p, tl.load(p, boundary_check=(0,), padding_option="inf"))


@tl.jit
def bad_check(x_ptr):
    p = tl.make_block_ptr(x_ptr, (16, 16), (16, 1), (0, 0), (16, 16), (1, 0))
    tl.store(p, 1.0, boundary_check=(2,))


@tl.jit
def advance_a_tensor(x_ptr):
    p = x_ptr + tl.arange(0, 16)
    tl.store(tl.advance(p, (16,)), 1.0)


@tl.jit
def bad_order(x_ptr):
    p = tl.make_block_ptr(x_ptr, (16, 16), (16, 1), (0, 0), (16, 16), (1, 1))
    tl.store(p, 1.0)


@pytest.mark.parametrize("fn, text, message", [
    (block_load_with_mask, "tl.load(p, mask=None, other=0.0)", "a block pointer load takes no mask or other"),
    (bad_padding, 'padding_option="inf"', "padding_option must be one of"),
    (bad_check, "boundary_check=(2,)", "2 is not a dim of the 2-d block"),
    (advance_a_tensor, "tl.advance(p, (16,))", "advance needs a block pointer"),
    (bad_order, "tl.make_block_ptr(", "order [1, 1] is not a permutation"),
])
def test_bad_block_pointers_point_at_the_users_line(fn, text, message):
    error = error_of(fn, {"x_ptr": "*fp32"})
    assert message in error.message
    assert error.loc.line == line_of(fn, text)
