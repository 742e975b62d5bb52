"""The emulator's value helpers: element types (bf16, fp8, C integer semantics, casts) and
per-thread registers, checked against exact expectations."""

import numpy as np
import pytest

from weft.compiler import types as t
from weft.layouts import blocked
from weft.runtime.emulator import from_bf16, registers_to_tensor, tensor_to_registers, to_bf16
from weft.runtime.emulator.dtypes import c_divide, c_remainder, cast, from_fp8, to_fp8

RNG = np.random.default_rng(1)


# ---------------------------------------------------------------- element types
def test_bf16_round_to_nearest_even():
    values = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, 3.4e38, np.inf, np.nan], np.float32)
    bits = to_bf16(values)
    back = from_bf16(bits)
    assert back[0] == 1.0 and back[1] == 1.0  # tie to even
    assert back[2] == 1 + 2 ** -6            # tie rounds up to the even mantissa
    assert back[3] == -2.5
    largest = (2 - 2 ** -7) * 2.0 ** 127  # below the halfway point to 2**128 rounds down ...
    assert from_bf16(to_bf16(np.float32(3.39e38))) == np.float32(largest)
    assert np.isinf(back[4]) and np.isinf(back[5]) and np.isnan(back[6])  # ... above it overflows


def test_fp8_formats_saturate_and_round():
    values = np.array([0.0, 1.0, 1.0625, 1.1875, 500.0, -1e6, np.nan])
    e4m3 = from_fp8(to_fp8(values, "fp8e4m3"), "fp8e4m3")
    np.testing.assert_array_equal(e4m3[:6], [0.0, 1.0, 1.0, 1.25, 448.0, -448.0])
    assert np.isnan(e4m3[6])
    e5m2 = from_fp8(to_fp8(values, "fp8e5m2"), "fp8e5m2")
    np.testing.assert_array_equal(e5m2[:6], [0.0, 1.0, 1.0, 1.25, 512.0, -57344.0])


def test_integer_semantics_follow_c():
    a = np.array([7, -7, 7, -7, 5, -2 ** 31], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1], np.int32)
    np.testing.assert_array_equal(c_divide(a, b), [3, -3, -3, 3, -1, -2 ** 31])
    np.testing.assert_array_equal(c_remainder(a, b), [1, -1, 1, -1, 5, 0])
    with np.errstate(all="ignore"):
        assert (np.array([2 ** 31 - 1], np.int32) + np.int32(1))[0] == -2 ** 31  # wraparound
    floats = np.array([1e10, -1e10, np.nan, -2.7, 2.7], np.float32)
    np.testing.assert_array_equal(cast(floats, t.fp32, t.i32), [2 ** 31 - 1, -2 ** 31, 0, -2, 2])
    np.testing.assert_array_equal(cast(np.array([300, -1]), t.i32, t.u8), [44, 255])


# ------------------------------------------------------------- registers helpers
def test_registers_round_trip_and_duplicate_check():
    layout = blocked([16, 64], [1, 4], [4, 8], [2, 2], [1, 0])  # 16 rows over 4*2... wraps: copies
    tensor = RNG.standard_normal((16, 64)).astype(np.float32)
    registers = tensor_to_registers(tensor, layout, 4)
    assert registers.shape == (4, 32, 8)
    np.testing.assert_array_equal(registers_to_tensor(registers, layout), tensor)
    from weft.layouts.execute import distribute

    np.testing.assert_array_equal(distribute(tensor, layout)[0], registers)
    broadcast = blocked([4, 64], [1, 4], [4, 8], [4, 1], [1, 0])  # warps 2, 3 copy warps 0, 1
    copies = tensor_to_registers(tensor[:4], broadcast, 4)
    copies[3, 0, 0] += 1
    with pytest.raises(Exception, match="disagree"):
        registers_to_tensor(copies, broadcast)
