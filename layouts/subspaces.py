"""Subspaces of GF(2)^n as lists of int vectors: spans, intersections, kernels, complements.

The conversion planner and the swizzle search reason about sets of tensor coordinates
reached by some hardware bits (for example "every element a warp's lanes touch") and these
sets are subspaces. Vectors are Python ints (bit i = coordinate i), as in `gf2.py`.

Example: the spans of {0b011, 0b100} and {0b111, 0b001} meet in span{0b111}::

    intersection([0b011, 0b100], [0b111, 0b001]) == [0b111]
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from .gf2 import XorBasis


class Echelon:
    """A fully reduced echelon basis whose rows carry a tag (any vector XORed alongside).

    Reducing a vector clears every pivot bit, highest first, so the residue is a linear
    function of the input, and the tag accumulates the tags of the rows that were used.
    """

    __slots__ = ("rows",)

    def __init__(self, vectors: Iterable[int] = ()):
        self.rows: dict[int, tuple[int, int]] = {}
        for vector in vectors:
            self.add(vector)

    def reduce(self, vector: int, tag: int = 0) -> tuple[int, int]:
        for pivot in sorted(self.rows, reverse=True):
            if vector >> pivot & 1:
                row, row_tag = self.rows[pivot]
                vector ^= row
                tag ^= row_tag
        return vector, tag

    def add(self, vector: int, tag: int = 0) -> bool:
        """Insert a vector; False (and nothing stored) when it is already in the span."""
        vector, tag = self.reduce(vector, tag)
        if not vector:
            return False
        self.rows[vector.bit_length() - 1] = (vector, tag)
        return True

    def contains(self, vector: int) -> bool:
        return self.reduce(vector)[0] == 0

    @property
    def rank(self) -> int:
        return len(self.rows)


def span_rank(vectors: Iterable[int]) -> int:
    return XorBasis(vectors).rank


def independent(vectors: Iterable[int], within: Iterable[int] = ()) -> list[int]:
    """The vectors (in order) that are not in the span of `within` and of earlier picks."""
    basis = XorBasis(within)
    return [v for v in vectors if basis.add(v)]


def intersection(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """A basis of span(a) ∩ span(b).

    Every b that reduces to zero against a and the earlier b's yields the combination of
    b's equal to a combination of a's: an element of both spans (Zassenhaus, by tags).
    """
    echelon = Echelon(a)
    found = XorBasis()
    result = []
    for vector in b:
        residue, tag = echelon.reduce(vector, vector)
        if residue:
            echelon.add(residue, tag)
        elif tag and found.add(tag):
            result.append(tag)
    return result


def kernel(columns: Sequence[int]) -> list[int]:
    """A basis of {x : XOR of columns[i] over the set bits i of x == 0}.

    One vector per free column: the column itself plus the earlier columns that make it.
    """
    basis = XorBasis()
    result = []
    for index, column in enumerate(columns):
        combination = basis.solve(column)
        if combination is not None:
            result.append(combination | 1 << index)
        basis.add(column)
    return result


def apply(columns: Sequence[int], x: int) -> int:
    result, bit = 0, 0
    while x:
        if x & 1:
            result ^= columns[bit]
        x >>= 1
        bit += 1
    return result


def outside_both(first: XorBasis, second: XorBasis, pool: Sequence[int]) -> Optional[int]:
    """A vector of span(pool) outside both spans, or None when one span covers the pool.

    No space is the union of two proper subspaces: with a outside the first span and b
    outside the second, one of a, b, a ^ b is outside both.
    """
    a = next((v for v in pool if not first.contains(v)), None)
    b = next((v for v in pool if not second.contains(v)), None)
    if a is None or b is None:
        return None
    for candidate in (a, b, a ^ b):
        if not first.contains(candidate) and not second.contains(candidate):
            return candidate
    raise AssertionError("unreachable: a ^ b lies outside both spans")
