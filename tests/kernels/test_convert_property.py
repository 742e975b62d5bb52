"""Hypothesis drives the conversion kernel over random layout pairs through the emulator."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from weft.kernels import convert
from weft.layouts.strategies import distributed_layouts


@st.composite
def layout_pairs(draw):
    rows = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    cols = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
    warps = draw(st.sampled_from([1, 2, 4]))
    src = draw(distributed_layouts(shape=(rows, cols), num_warps=warps))
    dst = draw(distributed_layouts(shape=(rows, cols), num_warps=warps))
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int8]))
    return src, dst, dtype


@settings(max_examples=40, deadline=None)
@given(layout_pairs(), st.integers(0, 2**32 - 1))
def test_conversion_kernel_moves_every_element(pair, seed):
    src, dst, dtype = pair
    shape = tuple(src.out_dims.values())
    x = (np.random.default_rng(seed).standard_normal(shape) * 100).astype(dtype)
    assert np.array_equal(convert.convert(x, src, dst), x)
