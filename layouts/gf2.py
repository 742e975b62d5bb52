"""Linear algebra over GF(2) on Python ints.

A vector is an int whose bit i is coordinate i. A matrix is a list of column vectors.
Everything here is exact and small: layouts have at most a few dozen input bits, so
Gaussian elimination over ints is faster than any numpy formulation.
"""

from __future__ import annotations

from typing import Iterable, Optional


class XorBasis:
    """An echelon basis of a span, remembering how each basis vector was made.

    Each stored vector is keyed by its highest set bit. `combination` records which of the
    inserted columns (as a bit mask over their insertion indices) XOR to the stored vector,
    so a reduction also yields a preimage. Columns that reduce to zero are *free*: they are
    never used in a solution, which makes every solution minimal-norm (broadcast and
    duplicate inputs map to 0).
    """

    __slots__ = ("_rows", "free_columns", "_count")

    def __init__(self, columns: Iterable[int] = ()):
        self._rows: dict[int, tuple[int, int]] = {}
        self.free_columns: list[int] = []
        self._count = 0
        for column in columns:
            self.add(column)

    def add(self, vector: int) -> bool:
        """Insert the next column; return False when it was already in the span."""
        index = self._count
        self._count += 1
        residual, combination = self._reduce(vector, 1 << index)
        if residual == 0:
            self.free_columns.append(index)
            return False
        self._rows[residual.bit_length() - 1] = (residual, combination)
        return True

    def _reduce(self, vector: int, combination: int) -> tuple[int, int]:
        while vector:
            top = vector.bit_length() - 1
            row = self._rows.get(top)
            if row is None:
                # Bits below `top` may still reduce; continue with the rest.
                rest, rest_combination = self._reduce(vector & ((1 << top) - 1), combination)
                return (1 << top) | rest, rest_combination
            vector ^= row[0]
            combination ^= row[1]
        return 0, combination

    @property
    def rank(self) -> int:
        return len(self._rows)

    def contains(self, vector: int) -> bool:
        return self._reduce(vector, 0)[0] == 0

    def solve(self, target: int) -> Optional[int]:
        """The minimal combination of inserted columns equal to `target`, or None."""
        residual, combination = self._reduce(target, 0)
        return combination if residual == 0 else None

