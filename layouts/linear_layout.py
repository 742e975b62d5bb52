"""Linear layouts: maps from hardware indices to tensor coordinates, linear over GF(2).

A layout has named input dims (hardware indices such as `register`, `lane`, `warp`,
`block`, or `offset` for shared memory) and named output dims (tensor coordinates `dim0`,
`dim1`, ...). Every size is a power of two, so an index is a bit vector, and the layout is
a bit matrix: each input bit has a *basis*, the coordinates it maps to on its own, and an
input maps to the XOR of the bases of its set bits.

Worked example: 4 lanes holding a 2x2 tile, lane bit 0 moving along dim1 and lane bit 1
along dim0::

    L = LinearLayout({"lane": [(0, 1), (1, 0)]}, {"dim0": 2, "dim1": 2})
    L(lane=3) == (1, 1)          # (0, 1) XOR (1, 0)

A basis of all zeros broadcasts (two lanes hold the same element); two input bits with
the same basis make the map non-injective in another way; XOR instead of addition is what
lets one algebra describe both blocked layouts (plain bit placement) and swizzled shared
memory (row bits XORed into column bits).

Flattening convention: the first dim is the most minor, for inputs and outputs alike, so
a layout is one matrix whose columns are the input bits in in-dim order and whose rows are
the output bits in out-dim order.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import LayoutError
from .gf2 import XorBasis

Basis = tuple[int, ...]
DimSizes = Union[Mapping[str, int], Sequence[tuple[str, int]]]


def _log2(size: int, what: str) -> int:
    if not isinstance(size, (int, np.integer)) or size < 1 or size & (size - 1):
        raise LayoutError(f"{what} must be a power of two, got {size!r}")
    return int(size).bit_length() - 1


def _dim_items(dims: DimSizes) -> tuple[tuple[str, int], ...]:
    items = tuple(dims.items()) if isinstance(dims, Mapping) else tuple(tuple(d) for d in dims)
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise LayoutError(f"duplicate dim names in {names}")
    for name, size in items:
        _log2(size, f"size of dim {name!r}")
    return tuple((str(name), int(size)) for name, size in items)


class LinearLayout:
    """An immutable linear map over GF(2) from named input dims to named output dims.

    `bases` maps each in-dim to its list of bases (one per input bit, so the in-dim has size
    2**len(bases)); a basis is a tuple with one coordinate per out-dim. `out_dims` gives the
    out-dims in order with their sizes (a dict or a sequence of pairs).
    """

    __slots__ = ("_bases", "_out_dims", "_hash")

    def __init__(self, bases: Mapping[str, Sequence[Sequence[int]]], out_dims: DimSizes):
        self._out_dims = _dim_items(out_dims)
        sizes = [size for _, size in self._out_dims]
        checked = []
        for in_dim, dim_bases in bases.items():
            rows = []
            for bit, basis in enumerate(dim_bases):
                basis = tuple(int(v) for v in basis)
                if len(basis) != len(sizes):
                    raise LayoutError(
                        f"basis {bit} of in-dim {in_dim!r} has {len(basis)} coordinates, "
                        f"expected one per out-dim {self.out_dim_names}"
                    )
                for (out_name, size), value in zip(self._out_dims, basis):
                    if not 0 <= value < size:
                        raise LayoutError(
                            f"basis {bit} of in-dim {in_dim!r} is {basis}: coordinate "
                            f"{value} is outside out-dim {out_name!r} of size {size}"
                        )
                rows.append(basis)
            checked.append((str(in_dim), tuple(rows)))
        if len({name for name, _ in checked}) != len(checked):
            raise LayoutError(f"duplicate in-dim names in {[n for n, _ in checked]}")
        self._bases: tuple[tuple[str, tuple[Basis, ...]], ...] = tuple(checked)
        self._hash: Optional[int] = None

    # ----------------------------------------------------------------- inspection
    @property
    def bases(self) -> dict[str, tuple[Basis, ...]]:
        return dict(self._bases)

    @property
    def in_dims(self) -> dict[str, int]:
        return {name: 1 << len(rows) for name, rows in self._bases}

    @property
    def out_dims(self) -> dict[str, int]:
        return dict(self._out_dims)

    @property
    def in_dim_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._bases)

    @property
    def out_dim_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._out_dims)

    def in_dim_size(self, name: str) -> int:
        sizes = self.in_dims
        if name not in sizes:
            self._missing_in(name)
        return sizes[name]

    def in_dim_bits(self, name: str) -> int:
        return _log2(self.in_dim_size(name), name)

    def out_dim_size(self, name: str) -> int:
        sizes = self.out_dims
        if name not in sizes:
            raise LayoutError(f"layout has no out-dim {name!r}; its out-dims are {list(sizes)}")
        return sizes[name]

    def out_dim_bits(self, name: str) -> int:
        return _log2(self.out_dim_size(name), name)

    def _missing_in(self, name: str) -> int:
        raise LayoutError(f"layout has no in-dim {name!r}; its in-dims are {list(self.in_dims)}")

    @property
    def total_in_bits(self) -> int:
        return sum(len(rows) for _, rows in self._bases)

    @property
    def total_out_bits(self) -> int:
        return sum(_log2(size, name) for name, size in self._out_dims)

    @property
    def total_in_size(self) -> int:
        return 1 << self.total_in_bits

    @property
    def total_out_size(self) -> int:
        return 1 << self.total_out_bits

    # ---------------------------------------------------------- flat (matrix) view
    def _out_shifts(self) -> list[int]:
        shifts, shift = [], 0
        for name, size in self._out_dims:
            shifts.append(shift)
            shift += _log2(size, name)
        return shifts

    def flatten_basis(self, basis: Sequence[int]) -> int:
        """One basis as a flat output bit vector (first out-dim most minor)."""
        return sum(int(v) << s for v, s in zip(basis, self._out_shifts()))

    def unflatten_out(self, flat: int) -> Basis:
        coords = []
        for (name, size), shift in zip(self._out_dims, self._out_shifts()):
            coords.append((flat >> shift) & (size - 1))
        return tuple(coords)

    def columns(self, in_dims: Optional[Iterable[str]] = None) -> list[int]:
        """The matrix: one flat output vector per input bit, in in-dim order."""
        names = self.in_dim_names if in_dims is None else tuple(in_dims)
        bases = self.bases
        shifts = self._out_shifts()
        return [
            sum(v << s for v, s in zip(basis, shifts)) for name in names for basis in bases[name]
        ]

    @classmethod
    def from_columns(cls, columns: Sequence[int], in_dims: DimSizes, out_dims: DimSizes) -> "LinearLayout":
        """Build a layout from flat columns (inverse of `columns`)."""
        in_items = _dim_items(in_dims)
        out_items = _dim_items(out_dims)
        template = cls({}, out_items)
        bases, position = {}, 0
        for name, size in in_items:
            bits = _log2(size, name)
            bases[name] = [template.unflatten_out(c) for c in columns[position : position + bits]]
            position += bits
        if position != len(columns):
            raise LayoutError(
                f"{len(columns)} columns given for in-dims {dict(in_items)} with {position} bits"
            )
        return cls(bases, out_items)

    # ---------------------------------------------------------------- evaluation
    def __call__(self, **indices):
        """Coordinates of one index, e.g. `layout(register=3, lane=5, warp=0)`.

        Missing in-dims count as 0. With numpy arrays (broadcastable) as indices, returns
        one array per out-dim: the vectorised form for whole index ranges.
        """
        unknown = set(indices) - set(self.in_dims)
        if unknown:
            raise LayoutError(f"unknown in-dims {sorted(unknown)}; layout has {list(self.in_dims)}")
        if any(isinstance(v, np.ndarray) for v in indices.values()):
            return self._apply_arrays(indices)
        flat = 0
        shifts = self._out_shifts()
        for name, rows in self._bases:
            index = int(indices.get(name, 0))
            if not 0 <= index < 1 << len(rows):
                raise LayoutError(f"index {index} out of range for in-dim {name!r} of size {1 << len(rows)}")
            for bit, basis in enumerate(rows):
                if index >> bit & 1:
                    flat ^= sum(v << s for v, s in zip(basis, shifts))
        return self.unflatten_out(flat)

    def _apply_arrays(self, indices) -> tuple[np.ndarray, ...]:
        arrays = {k: np.asarray(v, dtype=np.int64) for k, v in indices.items()}
        shape = np.broadcast_shapes(*(a.shape for a in arrays.values()))
        outs = [np.zeros(shape, dtype=np.int64) for _ in self._out_dims]
        for name, rows in self._bases:
            if name not in arrays:
                continue
            index = arrays[name]
            if index.size and (index.min() < 0 or index.max() >= 1 << len(rows)):
                bad = index[(index < 0) | (index >= 1 << len(rows))].flat[0]
                raise LayoutError(f"index {bad} out of range for in-dim {name!r} of size {1 << len(rows)}")
            for bit, basis in enumerate(rows):
                set_bit = (index >> bit) & 1
                for out, value in zip(outs, basis):
                    if value:
                        out ^= set_bit * value
        return tuple(outs)

    def table(self) -> np.ndarray:
        """Coordinates of every input, in flat input order: shape (total_in_size, num_out_dims)."""
        flat = self.flat_table()
        columns = []
        for (name, size), shift in zip(self._out_dims, self._out_shifts()):
            columns.append((flat >> shift) & (size - 1))
        return np.stack(columns, axis=1) if columns else np.zeros((flat.size, 0), np.int64)

    def flat_table(self) -> np.ndarray:
        """Flat output of every flat input, built by doubling: fast for 2**24 inputs."""
        flat = np.zeros(1, dtype=np.int64)
        for column in self.columns():
            flat = np.concatenate([flat, flat ^ column])
        return flat

    # ------------------------------------------------------------------ properties
    def rank(self) -> int:
        return XorBasis(self.columns()).rank

    def is_injective(self) -> bool:
        return self.rank() == self.total_in_bits

    def is_surjective(self) -> bool:
        return self.rank() == self.total_out_bits

    def is_invertible(self) -> bool:
        return self.total_in_bits == self.total_out_bits and self.is_surjective()

    def free_variable_masks(self) -> dict[str, int]:
        """Per in-dim, a mask of the input bits whose basis is in the span of earlier bits.

        These are the non-pivot columns of the matrix: flipping such a bit (after
        compensating with earlier bits) does not change the output, so broadcast bits and
        duplicates are free.
        """
        basis = XorBasis()
        masks = {}
        for name, rows in self._bases:
            mask = 0
            for bit, row in enumerate(rows):
                if not basis.add(self.flatten_basis(row)):
                    mask |= 1 << bit
            masks[name] = mask
        return masks

    def num_consecutive_in_out(self) -> int:
        """Largest N with L(i) == L(0) + i for flat inputs i < N (flat in and out).

        This is how many consecutive registers hold consecutive elements: the vector width
        before alignment is considered.
        """
        count = 0
        for bit, column in enumerate(self.columns()):
            if column != 1 << bit:
                break
            count += 1
        return 1 << count

    # --------------------------------------------------------------------- algebra
    def compose(self, outer: "LinearLayout") -> "LinearLayout":
        """outer(self(x)): self's out-dims must be outer's in-dims (same names, fitting sizes)."""
        if set(self.out_dim_names) != set(outer.in_dim_names):
            raise LayoutError(
                f"cannot compose: out-dims {self.out_dims} of the inner layout must be the "
                f"in-dims {outer.in_dims} of the outer layout"
            )
        for name, size in self._out_dims:
            if outer.in_dims[name] < size:
                raise LayoutError(
                    f"cannot compose: inner out-dim {name!r} has size {size} but outer in-dim "
                    f"has only {outer.in_dims[name]}"
                )
        bases = {}
        for name, rows in self._bases:
            bases[name] = [outer(**dict(zip(self.out_dim_names, row))) for row in rows]
        return LinearLayout(bases, outer._out_dims)

    def invert_and_compose(self, outer: "LinearLayout") -> "LinearLayout":
        """C with outer(C(x)) == self(x) for every x; C maps self's in-dims to outer's in-dims.

        This is the conversion map between two layouts of one tensor: for each hardware
        index of `self`, where the same element lives under `outer`. When several choices
        exist (outer broadcasts or duplicates), the minimal one is taken: free bits are 0.
        """
        if set(self.out_dim_names) != set(outer.out_dim_names):
            raise LayoutError(
                f"cannot relate layouts with out-dims {self.out_dims} and {outer.out_dims}"
            )
        # Express both in outer's out-dim order so the flat vectors agree.
        source = self.transpose_outs(outer.out_dim_names)
        for name, size in source._out_dims:
            if size > outer.out_dims[name]:
                raise LayoutError(
                    f"out-dim {name!r} has size {size} in the source but {outer.out_dims[name]} "
                    f"in the target layout"
                )
        source = LinearLayout(source.bases, outer._out_dims)
        solver = XorBasis(outer.columns())
        solutions = []
        for column in source.columns():
            solution = solver.solve(column)
            if solution is None:
                raise LayoutError(
                    f"the target layout never reaches coordinates {source.unflatten_out(column)} "
                    f"(out-dims {outer.out_dims}), so it cannot hold every element of the source"
                )
            solutions.append(solution)
        # A solution is a mask over outer's flat input bits, which is exactly the flat
        # encoding of a point of outer's in-dims (first dim most minor).
        return LinearLayout.from_columns(
            solutions, tuple(self.in_dims.items()), tuple(outer.in_dims.items())
        )

    def invert(self) -> "LinearLayout":
        """The inverse map (out-dims become in-dims); the layout must be invertible."""
        if not self.is_invertible():
            raise LayoutError(
                f"layout is not invertible: {self.total_in_bits} input bits of {self.in_dims}, "
                f"{self.total_out_bits} output bits of {self.out_dims}, rank {self.rank()}"
            )
        return self.pseudo_invert()

    def pseudo_invert(self) -> "LinearLayout":
        """P with self(P(y)) == y for every y: a minimal right inverse of a surjective layout."""
        if not self.is_surjective():
            raise LayoutError(
                f"layout is not surjective (rank {self.rank()} < {self.total_out_bits} output "
                f"bits of {self.out_dims}); it has no right inverse"
            )
        return identity_layout(self._out_dims).invert_and_compose(self)

    def __mul__(self, other: "LinearLayout") -> "LinearLayout":
        """Direct product: self occupies the minor bits of shared in- and out-dims."""
        if not isinstance(other, LinearLayout):
            return NotImplemented
        out_dims = dict(self._out_dims)
        for name, size in other._out_dims:
            out_dims[name] = out_dims.get(name, 1) * size
        out_names = list(out_dims)
        shift = {name: _log2(self.out_dims.get(name, 1), name) for name in out_names}
        bases: dict[str, list[Basis]] = {}
        for name, rows in self._bases:
            self_out = self.out_dim_names
            bases[name] = [
                tuple(row[self_out.index(o)] if o in self_out else 0 for o in out_names)
                for row in rows
            ]
        for name, rows in other._bases:
            other_out = other.out_dim_names
            bases.setdefault(name, []).extend(
                tuple(row[other_out.index(o)] << shift[o] if o in other_out else 0 for o in out_names)
                for row in rows
            )
        return LinearLayout(bases, out_dims)

    def divide_left(self, divisor: "LinearLayout") -> "LinearLayout":
        """C with divisor * C == self (divisor in the minor bits); LayoutError if none."""
        return self._divide(divisor, divisor_minor=True)

    def divide_right(self, divisor: "LinearLayout") -> "LinearLayout":
        """C with C * divisor == self (divisor in the major bits); LayoutError if none."""
        return self._divide(divisor, divisor_minor=False)

    def _divide(self, divisor: "LinearLayout", divisor_minor: bool) -> "LinearLayout":
        side = "left" if divisor_minor else "right"

        def fail(reason: str):
            raise LayoutError(
                f"cannot divide_{side}: {reason} (dividend in {self.in_dims} out {self.out_dims}; "
                f"divisor in {divisor.in_dims} out {divisor.out_dims})"
            )

        for name, size in divisor._out_dims:
            if name not in self.out_dims or self.out_dims[name] % size:
                fail(f"divisor out-dim {name!r} of size {size} does not divide the dividend's")
        for name, size in divisor.in_dims.items():
            if name not in self.in_dims or self.in_dims[name] < size:
                fail(f"divisor in-dim {name!r} of size {size} is larger than the dividend's")
        quotient_out = {n: s // divisor.out_dims.get(n, 1) for n, s in self._out_dims}
        bases = {}
        for name, rows in self._bases:
            d_bits = divisor.in_dim_bits(name) if name in divisor.in_dims else 0
            q_bits = len(rows) - d_bits
            if divisor_minor:
                d_rows, q_rows = rows[:d_bits], rows[d_bits:]
                d_shift = {n: 0 for n in self.out_dim_names}
                q_shift = {n: _log2(divisor.out_dims.get(n, 1), n) for n in self.out_dim_names}
            else:
                q_rows, d_rows = rows[:q_bits], rows[q_bits:]
                q_shift = {n: 0 for n in self.out_dim_names}
                d_shift = {n: _log2(quotient_out[n], n) for n in self.out_dim_names}
            expected = divisor.bases.get(name, ())
            for got, want in zip(d_rows, expected):
                want_full = tuple(
                    (want[divisor.out_dim_names.index(n)] if n in divisor.out_dims else 0) << d_shift[n]
                    for n in self.out_dim_names
                )
                if got != want_full:
                    fail(f"in-dim {name!r} has basis {got} where the divisor needs {want_full}")
            quotient_rows = []
            for row in q_rows:
                coords = []
                for n, value in zip(self.out_dim_names, row):
                    low_mask = (1 << q_shift[n]) - 1
                    high_limit = quotient_out[n] << q_shift[n]
                    if value & low_mask or value >= high_limit:
                        fail(f"in-dim {name!r} basis {row} overlaps the divisor's part of out-dim {n!r}")
                    coords.append(value >> q_shift[n])
                quotient_rows.append(tuple(coords))
            bases[name] = quotient_rows
        return LinearLayout(bases, quotient_out)

    def sublayout(self, in_dims: Iterable[str], out_dims: Iterable[str]) -> "LinearLayout":
        """Restrict to some in-dims and project onto some out-dims (orders as given)."""
        in_dims, out_dims = tuple(in_dims), tuple(out_dims)
        for name in in_dims:
            if name not in self.in_dims:
                self._missing_in(name)
        for name in out_dims:
            self.out_dim_size(name)
        bases = self.bases
        index = {name: i for i, name in enumerate(self.out_dim_names)}
        return LinearLayout(
            {n: [tuple(row[index[o]] for o in out_dims) for row in bases[n]] for n in in_dims},
            [(o, self.out_dims[o]) for o in out_dims],
        )

    def concat_ins(self, other: "LinearLayout") -> "LinearLayout":
        """Both layouts side by side on disjoint in-dims over the same out-dims."""
        if self.out_dims != other.out_dims:
            raise LayoutError(f"concat_ins needs equal out-dims, got {self.out_dims} and {other.out_dims}")
        shared = set(self.in_dims) & set(other.in_dims)
        if shared:
            raise LayoutError(f"concat_ins needs disjoint in-dims; both have {sorted(shared)}")
        other = other.transpose_outs(self.out_dim_names)
        return LinearLayout({**self.bases, **other.bases}, self._out_dims)

    def concat_outs(self, other: "LinearLayout") -> "LinearLayout":
        """One layout producing both layouts' out-dims from the same in-dims."""
        if self.in_dims != other.in_dims:
            raise LayoutError(f"concat_outs needs equal in-dims, got {self.in_dims} and {other.in_dims}")
        shared = set(self.out_dims) & set(other.out_dims)
        if shared:
            raise LayoutError(f"concat_outs needs disjoint out-dims; both have {sorted(shared)}")
        other_bases = other.bases
        return LinearLayout(
            {n: [a + b for a, b in zip(rows, other_bases[n])] for n, rows in self._bases},
            self._out_dims + other._out_dims,
        )

    def transpose_ins(self, order: Iterable[str]) -> "LinearLayout":
        """Reorder the in-dims (this changes the flat input order, not the map)."""
        order = tuple(order)
        if sorted(order) != sorted(self.in_dim_names):
            raise LayoutError(f"transpose_ins order {list(order)} is not a permutation of {list(self.in_dim_names)}")
        bases = self.bases
        return LinearLayout({n: bases[n] for n in order}, self._out_dims)

    def transpose_outs(self, order: Iterable[str]) -> "LinearLayout":
        """Reorder the out-dims (this changes the flat output order, not the map)."""
        order = tuple(order)
        if sorted(order) != sorted(self.out_dim_names):
            raise LayoutError(f"transpose_outs order {list(order)} is not a permutation of {list(self.out_dim_names)}")
        index = [self.out_dim_names.index(n) for n in order]
        return LinearLayout(
            {n: [tuple(row[i] for i in index) for row in rows] for n, rows in self._bases},
            [(n, self.out_dims[n]) for n in order],
        )

    def reshape_ins(self, new_in_dims: DimSizes) -> "LinearLayout":
        """Flatten the input bits (first dim minor) and split them into new in-dims."""
        items = _dim_items(new_in_dims)
        total = sum(_log2(s, n) for n, s in items)
        if total != self.total_in_bits:
            raise LayoutError(
                f"reshape_ins to {dict(items)} ({1 << total} indices) from {self.in_dims} "
                f"({self.total_in_size} indices): sizes differ"
            )
        return LinearLayout.from_columns(self.columns(), items, self._out_dims)

    def reshape_outs(self, new_out_dims: DimSizes) -> "LinearLayout":
        """Flatten the output bits (first dim minor) and split them into new out-dims."""
        items = _dim_items(new_out_dims)
        total = sum(_log2(s, n) for n, s in items)
        if total != self.total_out_bits:
            raise LayoutError(
                f"reshape_outs to {dict(items)} ({1 << total} elements) from {self.out_dims} "
                f"({self.total_out_size} elements): sizes differ"
            )
        return LinearLayout.from_columns(self.columns(), tuple(self.in_dims.items()), items)

    def flatten_ins(self, name: str = "flat") -> "LinearLayout":
        return self.reshape_ins([(name, self.total_in_size)])

    def flatten_outs(self, name: str = "flat") -> "LinearLayout":
        return self.reshape_outs([(name, self.total_out_size)])

    def with_in_dim_bases(self, name: str, rows: Sequence[Sequence[int]]) -> "LinearLayout":
        """A copy with one in-dim's bases replaced (added at the end if new)."""
        bases = self.bases
        bases[name] = tuple(tuple(r) for r in rows)
        return LinearLayout(bases, self._out_dims)

    # ------------------------------------------------------------ value semantics
    def __eq__(self, other) -> bool:
        """Equal as maps: same in-dims with the same bases, same out-dims and sizes.

        The order of dims does not matter; it only fixes the flat encoding.
        """
        if not isinstance(other, LinearLayout):
            return NotImplemented
        if self.in_dims != other.in_dims or self.out_dims != other.out_dims:
            return False
        return self.transpose_outs(other.out_dim_names).bases == other.bases

    def __hash__(self) -> int:
        if self._hash is None:
            canonical = self.transpose_outs(sorted(self.out_dim_names))
            self._hash = hash((frozenset(canonical._bases), frozenset(canonical._out_dims)))
        return self._hash

    def __repr__(self) -> str:
        lines = ["LinearLayout("]
        for name, rows in self._bases:
            shown = ", ".join("(" + ",".join(str(v) for v in row) + ")" for row in rows)
            lines.append(f"  {name:<8} [{shown}]")
        outs = ", ".join(f"{n}={s}" for n, s in self._out_dims)
        lines.append(f"  -> {outs})")
        return "\n".join(lines)

    def render(self, **options) -> str:
        from .render import render_text

        return render_text(self, **options)

    def to_svg(self, **options) -> str:
        from .render import render_svg

        return render_svg(self, **options)


def identity_1d(size: int, in_dim: str, out_dim: str) -> LinearLayout:
    """in_dim index i maps to out_dim coordinate i."""
    bits = _log2(size, f"size of {in_dim!r}")
    return LinearLayout({in_dim: [(1 << b,) for b in range(bits)]}, {out_dim: size})


def zeros_1d(size: int, in_dim: str, out_dim: str, out_dim_size: int = 1) -> LinearLayout:
    """Every index of in_dim maps to coordinate 0 (a broadcast)."""
    bits = _log2(size, f"size of {in_dim!r}")
    return LinearLayout({in_dim: [(0,) for _ in range(bits)]}, {out_dim: out_dim_size})


def identity_layout(dims: DimSizes) -> LinearLayout:
    """The identity from dims to the same-named dims (each in-dim to its own out-dim)."""
    items = _dim_items(dims)
    bases = {}
    for position, (name, size) in enumerate(items):
        bases[name] = [
            tuple((1 << bit) if i == position else 0 for i in range(len(items)))
            for bit in range(_log2(size, name))
        ]
    return LinearLayout(bases, items)
