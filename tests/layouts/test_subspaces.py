"""GF(2) subspace helpers against brute-force enumeration of spans."""

from hypothesis import given
from hypothesis import strategies as st

from weft.layouts.subspaces import Echelon, independent, intersection, kernel, outside_both
from weft.layouts.gf2 import XorBasis

vectors = st.lists(st.integers(0, 63), max_size=6)


def span(vs):
    result = {0}
    for v in vs:
        result |= {x ^ v for x in result}
    return result


@given(vectors, vectors)
def test_intersection_spans_the_common_vectors(a, b):
    found = intersection(a, b)
    assert span(found) == span(a) & span(b)
    assert XorBasis(found).rank == len(found)


@given(vectors)
def test_kernel_spans_every_vanishing_combination(columns):
    vanishing = set()
    for mask in range(1 << len(columns)):
        value = 0
        for i, c in enumerate(columns):
            if mask >> i & 1:
                value ^= c
        if value == 0:
            vanishing.add(mask)
    assert span(kernel(columns)) == vanishing


@given(vectors, vectors)
def test_independent_extends_a_basis(within, candidates):
    picked = independent(candidates, within)
    assert XorBasis(within + picked).rank == XorBasis(within).rank + len(picked)
    assert span(within + picked) == span(within + candidates)


@given(vectors, st.integers(0, 63))
def test_echelon_reduction_is_linear_and_tracks_tags(rows, x):
    echelon = Echelon()
    for row in rows:
        echelon.add(row, row)
    residue, tag = echelon.reduce(x)
    assert residue ^ tag == x  # tags are the rows themselves here
    assert tag in span(rows)


@given(vectors, vectors)
def test_outside_both_finds_a_vector_when_both_spans_are_proper(a, b):
    pool = [1 << i for i in range(6)]
    first, second = XorBasis(a), XorBasis(b)
    found = outside_both(first, second, pool)
    if first.rank < 6 and second.rank < 6:
        assert found is not None and found not in span(a) and found not in span(b)
    else:
        assert found is None
