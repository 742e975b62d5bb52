"""The shipped hypothesis strategies draw only valid layouts of what was asked for."""

import math

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from weft.layouts import LayoutError, collect, distribute, execute_plan, plan_conversion
from weft.layouts.gf2 import XorBasis
from weft.layouts.strategies import (
    blocked_layouts,
    distributed_layouts,
    linear_layouts,
    shapes,
    shared_layouts,
)

REGISTER_DIMS = ["register", "lane", "warp", "block"]


@given(shapes(rank=3, max_elements=1 << 10))
def test_shapes_are_powers_of_two_within_bounds(shape):
    assert len(shape) == 3 and math.prod(shape) <= 1 << 10
    assert all(s & (s - 1) == 0 for s in shape)


@given(st.data())
def test_distributed_layouts_cover_the_shape(data):
    shape = data.draw(st.one_of(st.none(), shapes(rank=None, max_elements=1 << 11)))
    num_warps = data.draw(st.sampled_from([None, 1, 2, 4, 8]))
    dense = data.draw(st.booleans())
    layout = data.draw(distributed_layouts(shape=shape, num_warps=num_warps, dense_mixing=dense))
    assert list(layout.in_dims) == REGISTER_DIMS
    assert layout.in_dims["lane"] == 32 and layout.in_dims["block"] == 1
    if num_warps is not None:
        assert layout.in_dims["warp"] == num_warps
    if shape is not None:
        assert tuple(layout.out_dims.values()) == shape
    assert list(layout.out_dims) == [f"dim{i}" for i in range(len(layout.out_dims))]
    assert layout.is_surjective()


@given(distributed_layouts(rank=2, num_warps=4, allow_broadcast=False),
       distributed_layouts(rank=2, num_warps=4, allow_broadcast=False, dense_mixing=True))
def test_distributed_layouts_without_broadcast_are_invertible(layout, dense):
    assert layout.is_invertible() and dense.is_invertible()


def _slices_have_dependent_registers(layout) -> bool:
    """Whether, sliced along dim0, three or more registers have dependent, pairwise
    distinct, nonzero slices, as issue 38's (1, 1), (2, 2), (0, 3) do."""
    sliced = [b[1:] for b in layout.bases["register"]]
    nonzero = {b for b in sliced if any(b)}
    return len(nonzero) > XorBasis(layout.flatten_basis((0,) + b) for b in nonzero).rank


def test_dense_mixing_reaches_registers_whose_slices_are_dependent():
    seen = []

    @settings(max_examples=100, database=None, phases=[Phase.generate])
    @given(distributed_layouts(shape=(32, 32), num_warps=1, dense_mixing=True))
    def draw(layout):
        seen.append(_slices_have_dependent_registers(layout))

    draw()
    assert any(seen)  # about a third of the draws


def test_impossible_requests_are_refused_up_front():
    with pytest.raises(LayoutError, match="threads"):
        distributed_layouts(shape=(4, 8), num_warps=4, allow_broadcast=False)
    with pytest.raises(LayoutError, match="num_warps"):
        distributed_layouts(num_warps=3)
    with pytest.raises(LayoutError, match="dim1"):
        shared_layouts((4, 6))
    with pytest.raises(LayoutError, match="rank"):
        distributed_layouts(shape=(4, 8), rank=3)


@pytest.mark.parametrize("shape, num_warps", [((64, 64), 4), ((16, 8), 8), ((128,), 2), ((2, 16, 32), 4)])
@settings(max_examples=30)
@given(data=st.data())
def test_blocked_layouts_are_blocked_and_cover_the_shape(shape, num_warps, data):
    layout = data.draw(blocked_layouts(shape, num_warps))
    assert tuple(layout.out_dims[f"dim{i}"] for i in range(len(shape))) == shape
    assert layout.in_dims["lane"] == 32 and layout.in_dims["warp"] == num_warps
    assert layout.is_surjective()


@pytest.mark.parametrize("shape, bits", [((64, 64), 16), ((8, 128), 8), ((32,), 32), ((4, 8, 64), 16)])
@settings(max_examples=30)
@given(data=st.data())
def test_shared_layouts_are_invertible(shape, bits, data):
    layout = data.draw(shared_layouts(shape, bits))
    assert list(layout.in_dims) == ["offset", "block"]
    assert layout.is_invertible()


@given(linear_layouts({"a": 4, "b": 1}, {"x": 8}))
def test_linear_layouts_have_the_requested_dims(layout):
    assert layout.in_dims == {"a": 4, "b": 1} and layout.out_dims == {"x": 8}


@given(distributed_layouts(shape=(64, 64), num_warps=4), distributed_layouts(shape=(64, 64), num_warps=4))
def test_the_module_docstring_example(src, dst):
    x = np.arange(64 * 64).reshape(64, 64)
    plan = plan_conversion(src, dst, element_bits=16)
    registers = execute_plan(plan, distribute(x, src), src, dst)
    assert (collect(registers, dst) == x).all()
