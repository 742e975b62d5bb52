"""The LinearLayout algebra laws, checked against brute-force enumeration of every input.

Each law is a hypothesis property over arbitrary matrices (`linear_layouts`) or over the
valid hardware layouts of `weft.layouts.strategies`; the reference evaluator below XORs
bases itself and never calls the code under test.
"""

import statistics
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weft.layouts import LayoutError, LinearLayout, identity_layout
from weft.layouts.strategies import distributed_layouts, linear_layouts

IN_NAMES = ("register", "lane", "warp", "block")
OUT_NAMES = ("dim0", "dim1", "dim2")


# ------------------------------------------------------------------ references
def inputs_of(layout):
    """Every input as a dict of in-dim values, in flat order (first in-dim most minor)."""
    names = list(layout.in_dims)
    bits = [layout.in_dim_bits(n) for n in names]
    result = []
    for flat in range(layout.total_in_size):
        point, shift = {}, 0
        for name, b in zip(names, bits):
            point[name] = (flat >> shift) & ((1 << b) - 1)
            shift += b
        result.append(point)
    return result


def reference(layout, point):
    """Apply the layout by XORing the bases of the set bits: the definition."""
    coords = [0] * len(layout.out_dims)
    for name, rows in layout.bases.items():
        for bit, row in enumerate(rows):
            if point.get(name, 0) >> bit & 1:
                coords = [c ^ v for c, v in zip(coords, row)]
    return tuple(coords)


def reference_table(layout):
    return [reference(layout, p) for p in inputs_of(layout)]


def flat_out(layout, coords):
    flat, shift = 0, 0
    for (name, size), value in zip(layout.out_dims.items(), coords):
        flat |= value << shift
        shift += size.bit_length() - 1
    return flat


def span(columns):
    vectors = {0}
    for column in columns:
        vectors |= {v ^ column for v in vectors}
    return vectors


# ------------------------------------------------------------------ strategies
@st.composite
def dim_sizes(draw, names, max_dims=3, max_bits=3, min_dims=1):
    chosen = draw(st.lists(st.sampled_from(names), min_size=min_dims, max_size=max_dims, unique=True))
    return {n: 1 << draw(st.integers(0, max_bits)) for n in chosen}


@st.composite
def layouts(draw, in_dims=None, out_dims=None):
    in_dims = in_dims if in_dims is not None else draw(dim_sizes(IN_NAMES, min_dims=0))
    out_dims = out_dims if out_dims is not None else draw(dim_sizes(OUT_NAMES))
    return draw(linear_layouts(in_dims, out_dims))


@st.composite
def surjective_layouts(draw, extra_bits=True):
    """A surjective layout: each out bit (XOR-mixed) on its own input bit, the rest random."""
    out_dims = draw(dim_sizes(OUT_NAMES))
    template = LinearLayout({}, out_dims)
    out_bits = template.total_out_bits
    images = [1 << b for b in range(out_bits)]
    for i, j in draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=12)):
        if i != j and max(i, j) < out_bits:
            images[i] ^= images[j]  # an elementary row operation keeps the map invertible
    total = out_bits + (draw(st.integers(0, 3)) if extra_bits else 0)
    columns = [flat_out(template, b) for b in draw(linear_layouts({"x": 1 << total}, out_dims)).bases["x"]]
    for image, slot in zip(images, draw(st.permutations(range(total)))):
        columns[slot] = image
    names = draw(st.permutations(IN_NAMES))[: draw(st.integers(1, 3))]
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=len(names) - 1, max_size=len(names) - 1)))
    bounds = [0, *cuts, total]
    in_dims = [(n, 1 << (bounds[i + 1] - bounds[i])) for i, n in enumerate(names)]
    return LinearLayout.from_columns(columns, in_dims, out_dims)


# ------------------------------------------------------------------ evaluation
@given(layouts())
def test_table_and_call_match_the_definition(layout):
    expected = reference_table(layout)
    assert [tuple(row) for row in layout.table().tolist()] == expected
    assert layout.flat_table().tolist() == [flat_out(layout, c) for c in expected]
    for point, coords in zip(inputs_of(layout), expected):
        assert layout(**point) == coords


@given(layouts())
def test_vectorised_evaluation_equals_scalar(layout):
    points = inputs_of(layout)
    arrays = {n: np.array([p[n] for p in points]) for n in layout.in_dims}
    if not arrays:
        return
    result = layout(**arrays)
    for i, point in enumerate(points):
        assert tuple(int(column[i]) for column in result) == layout(**point)


def test_evaluating_a_million_indices_is_fast():
    layout = _big_layout()
    assert layout.total_in_size == 1 << 20
    layout.table()  # warm-up: first-touch page faults are not the layout's cost
    runs = []
    for _ in range(7):
        start = time.perf_counter()
        table = layout.table()
        runs.append(time.perf_counter() - start)
    assert table.shape == (1 << 20, 2)
    assert statistics.median(runs) < 0.050, f"table() of 2^20 inputs took {runs}"


def _big_layout():
    rows = [(0, 1 << b) for b in range(6)] + [(1 << b, 0) for b in range(7)]
    return LinearLayout(
        {"register": rows, "lane": [(1 << (7 + b), 0) for b in range(5)],
         "warp": [(0, 0), (1 << 12, 0)], "block": []},
        {"dim0": 1 << 13, "dim1": 64},
    )


# ----------------------------------------------------------------- composition
@st.composite
def composable_pairs(draw):
    inner = draw(layouts())
    widen = {n: s << draw(st.integers(0, 1)) for n, s in inner.out_dims.items()}
    order = draw(st.permutations(list(widen)))
    outer = draw(layouts(in_dims={n: widen[n] for n in order}))
    return inner, outer


@given(composable_pairs())
def test_compose_applies_inner_then_outer(pair):
    inner, outer = pair
    composed = inner.compose(outer)
    for point in inputs_of(inner):
        middle = dict(zip(inner.out_dims, reference(inner, point)))
        assert composed(**point) == reference(outer, middle)


@st.composite
def conversion_pairs(draw):
    """(A, B) where every value of A is reachable by B: A = B after a random map R."""
    target = draw(layouts())
    reach = draw(layouts(out_dims=target.in_dims))
    source = reach.compose(target)
    order = draw(st.permutations(list(source.out_dims)))
    return source.transpose_outs(order), target


@given(conversion_pairs())
def test_invert_and_compose_is_a_minimal_solution(pair):
    source, target = pair
    conversion = source.invert_and_compose(target)
    free = target.free_variable_masks()
    for point in inputs_of(source):
        there = conversion(**point)
        assert reference(target, dict(zip(target.in_dims, there))) == reference(
            source.transpose_outs(target.out_dims), point
        )
        for name, value in zip(conversion.out_dims, there):
            assert value & free[name] == 0, "free (broadcast/duplicate) bits must stay 0"
    for name, rows in source.bases.items():
        for bit, row in enumerate(rows):
            if not any(row):
                assert not any(conversion.bases[name][bit]), "broadcast bits map to 0"


def test_invert_and_compose_reports_unreachable_coordinates():
    source = LinearLayout({"lane": [(1,), (2,)]}, {"dim0": 4})
    target = LinearLayout({"lane": [(1,), (0,)]}, {"dim0": 4})
    with pytest.raises(LayoutError, match="never reaches"):
        source.invert_and_compose(target)


@given(surjective_layouts())
def test_pseudo_invert_is_a_right_inverse(layout):
    inverse = layout.pseudo_invert()
    for point in inputs_of(inverse):
        assert reference(layout, dict(zip(layout.in_dims, inverse(**point)))) == tuple(
            point[n] for n in layout.out_dims
        )


@given(surjective_layouts(extra_bits=False))
def test_invert_is_a_two_sided_inverse(layout):
    assert layout.is_invertible()
    inverse = layout.invert()
    for point in inputs_of(layout):
        assert inverse(**dict(zip(layout.out_dims, reference(layout, point)))) == tuple(
            point[n] for n in layout.in_dims
        )
    for point in inputs_of(inverse):
        assert layout(**dict(zip(layout.in_dims, inverse(**point)))) == tuple(
            point[n] for n in inverse.in_dims
        )


@given(layouts())
def test_invert_refuses_non_invertible_layouts(layout):
    if not layout.is_invertible():
        with pytest.raises(LayoutError, match="not invertible"):
            layout.invert()


# ------------------------------------------------------------ product, division
@given(layouts(), layouts())
def test_product_concatenates_bits_left_minor(minor, major):
    product = minor * major
    for point in inputs_of(product):
        low = {n: point[n] & (minor.in_dims[n] - 1) for n in minor.in_dims}
        high = {n: point[n] >> minor.in_dim_bits(n) if n in minor.in_dims else point[n] for n in major.in_dims}
        a = dict(zip(minor.out_dims, reference(minor, low)))
        b = dict(zip(major.out_dims, reference(major, high)))
        expected = tuple(
            a.get(n, 0) | (b.get(n, 0) << (minor.out_dims.get(n, 1).bit_length() - 1))
            for n in product.out_dims
        )
        assert product(**point) == expected


@given(layouts(), layouts())
def test_divide_undoes_product(minor, major):
    product = minor * major
    quotient = product.divide_left(minor)
    assert minor * quotient == product
    quotient = product.divide_right(major)
    assert quotient * major == product


@given(layouts(), layouts())
def test_divide_either_fails_cleanly_or_multiplies_back(dividend, divisor):
    try:
        quotient = dividend.divide_left(divisor)
    except LayoutError as error:
        assert "divide_left" in str(error)
    else:
        assert divisor * quotient == dividend
    try:
        quotient = dividend.divide_right(divisor)
    except LayoutError as error:
        assert "divide_right" in str(error)
    else:
        assert quotient * divisor == dividend


def test_impossible_division_names_the_dims():
    layout = LinearLayout({"register": [(2,), (1,)]}, {"dim0": 4})
    divisor = LinearLayout({"register": [(1,)]}, {"dim0": 2})
    with pytest.raises(LayoutError, match="register"):
        layout.divide_left(divisor)
    with pytest.raises(LayoutError, match="lane"):
        layout.divide_left(LinearLayout({"lane": [(1,)]}, {"dim0": 2}))


# --------------------------------------------------------- reshapes, transposes
@given(layouts(), st.data())
def test_reshape_round_trips_and_keeps_the_flat_map(layout, data):
    bits = layout.total_in_bits
    cut = data.draw(st.integers(0, bits))
    reshaped = layout.reshape_ins({"a": 1 << cut, "b": 1 << (bits - cut)})
    assert reshaped.flat_table().tolist() == layout.flat_table().tolist()
    assert reshaped.reshape_ins(layout.in_dims) == layout
    out_bits = layout.total_out_bits
    cut = data.draw(st.integers(0, out_bits))
    reshaped = layout.reshape_outs({"x": 1 << cut, "y": 1 << (out_bits - cut)})
    assert reshaped.flat_table().tolist() == layout.flat_table().tolist()
    assert reshaped.reshape_outs(layout.out_dims) == layout


@given(layouts(), st.data())
def test_transposes_keep_the_map_and_round_trip(layout, data):
    in_order = data.draw(st.permutations(list(layout.in_dims)))
    out_order = data.draw(st.permutations(list(layout.out_dims)))
    moved = layout.transpose_ins(in_order).transpose_outs(out_order)
    assert list(moved.in_dims) == list(in_order) and list(moved.out_dims) == list(out_order)
    for point in inputs_of(layout):
        coords = dict(zip(out_order, moved(**point)))
        assert tuple(coords[n] for n in layout.out_dims) == reference(layout, point)
    back = moved.transpose_ins(layout.in_dims).transpose_outs(layout.out_dims)
    assert back.bases == layout.bases and back.out_dims == layout.out_dims
    assert list(back.in_dims) == list(layout.in_dims)


@given(layouts(), st.data())
def test_equality_and_hash_ignore_dim_order(layout, data):
    moved = layout.transpose_ins(data.draw(st.permutations(list(layout.in_dims)))).transpose_outs(
        data.draw(st.permutations(list(layout.out_dims)))
    )
    assert moved == layout and hash(moved) == hash(layout)
    assert len({layout, moved}) == 1


@given(layouts(), layouts())
def test_equal_layouts_are_equal_maps(a, b):
    same_map = (
        a.in_dims == b.in_dims
        and a.out_dims == b.out_dims
        and reference_table(a) == reference_table(b.transpose_ins(a.in_dims).transpose_outs(a.out_dims))
    )
    assert (a == b) == same_map
    if a == b:
        assert hash(a) == hash(b)


@given(layouts(), st.data())
def test_sublayouts_concatenate_back(layout, data):
    names = list(layout.in_dims)
    cut = data.draw(st.integers(0, len(names)))
    left = layout.sublayout(names[:cut], layout.out_dims)
    right = layout.sublayout(names[cut:], layout.out_dims)
    assert left.concat_ins(right) == layout
    outs = list(layout.out_dims)
    cut = data.draw(st.integers(1, len(outs)))
    if cut < len(outs):
        top = layout.sublayout(names, outs[:cut])
        bottom = layout.sublayout(names, outs[cut:])
        assert top.concat_outs(bottom) == layout


# ------------------------------------------------------------------ properties
@given(layouts())
def test_free_variable_masks_are_the_dependent_columns(layout):
    masks = layout.free_variable_masks()
    earlier = []
    for name, rows in layout.bases.items():
        expected = 0
        for bit, row in enumerate(rows):
            column = flat_out(layout, row)
            if column in span(earlier):
                expected |= 1 << bit
            earlier.append(column)
        assert masks[name] == expected, name


@given(layouts())
def test_injective_surjective_invertible_match_counts(layout):
    distinct = len(set(reference_table(layout)))
    assert layout.is_injective() == (distinct == layout.total_in_size)
    assert layout.is_surjective() == (distinct == layout.total_out_size)
    assert layout.is_invertible() == (distinct == layout.total_in_size == layout.total_out_size)


@given(layouts())
def test_num_consecutive_in_out_counts_the_identity_prefix(layout):
    flats = [flat_out(layout, c) for c in reference_table(layout)]
    expected = next((i for i, v in enumerate(flats) if v != i), len(flats))
    assert layout.num_consecutive_in_out() == expected


@given(distributed_layouts(num_warps=4))
def test_distributed_strategy_draws_valid_layouts(layout):
    assert layout.in_dims["lane"] == 32 and layout.in_dims["warp"] == 4
    assert layout.is_surjective()


@given(distributed_layouts(shape=(32, 16), num_warps=2, allow_broadcast=False))
def test_distributed_strategy_without_broadcast_is_invertible(layout):
    assert layout.is_invertible() and layout.out_dims == {"dim0": 32, "dim1": 16}


# ---------------------------------------------------------------------- errors
def test_non_power_of_two_sizes_are_refused_with_the_dim_name():
    with pytest.raises(LayoutError, match="dim1"):
        LinearLayout({"lane": [(1, 0)]}, {"dim0": 2, "dim1": 3})
    with pytest.raises(LayoutError, match="warp"):
        identity_layout({"warp": 6})
    with pytest.raises(LayoutError, match="a"):
        LinearLayout({"lane": []}, {"dim0": 1}).reshape_ins({"a": 12})


def test_out_of_range_basis_is_refused_with_the_dim_name():
    with pytest.raises(LayoutError, match="'lane'.*'dim0'"):
        LinearLayout({"lane": [(4,)]}, {"dim0": 4})
    with pytest.raises(LayoutError, match="register"):
        LinearLayout({"register": [(1, 0, 0)]}, {"dim0": 4})


def test_mismatched_dims_are_refused_with_their_names():
    a = LinearLayout({"lane": [(1,)]}, {"dim0": 2})
    b = LinearLayout({"dim1": [(1,)]}, {"dim0": 2})
    with pytest.raises(LayoutError, match="dim0"):
        a.compose(b)
    with pytest.raises(LayoutError, match="lane"):
        a.concat_ins(a)
    with pytest.raises(LayoutError, match="dim0"):
        a.concat_outs(a)
    with pytest.raises(LayoutError, match="dim1"):
        a.concat_ins(LinearLayout({"warp": [(1,)]}, {"dim1": 2}))
    with pytest.raises(LayoutError, match="warp"):
        a(warp=1)
    with pytest.raises(LayoutError, match="'lane'"):
        a(lane=2)
    with pytest.raises(LayoutError, match="'lane'"):
        a(lane=np.array([0, 2]))
