"""Conversion plans: plain data saying how a tensor moves from one distributed layout to another.

A plan is one of four frozen dataclasses, from cheapest to dearest:

- `NoOp`: both layouts put the same element in the same register of the same thread.
- `RegisterPermutation`: every thread already holds its elements; only register names change.
- `WarpShuffle`: data moves between lanes of a warp with `shfl.sync.idx.b32` rounds
  (PTX ISA, "Data Movement and Conversion Instructions: shfl.sync").
- `SharedRoundTrip`: every thread stores its registers to a scratch buffer in shared memory,
  the CTA synchronises (bar.sync), and every thread loads its new registers.

Tables are indexed by *register index* (the `register` coordinate of a layout) and by
*lane* (0..31); -1 marks "nothing here". The same plan drives the numpy executor
(`weft.layouts.execute`) and the code generator, so what tests run is what the GPU runs.
Registers that a destination layout duplicates inside one thread (a register basis in the
span of earlier ones) are filled last by `register_copies` pairs (dst register, register it
repeats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from .errors import LayoutError
from .linear_layout import LinearLayout


IN_DIMS = ("register", "lane", "warp", "block")  # in-dims of a distributed layout, minor first


def _check_table(name: str, table, row_length: Optional[int] = None) -> None:
    if not isinstance(table, tuple) or not all(isinstance(row, tuple) for row in table):
        raise LayoutError(f"{name} must be a tuple of tuples, got {type(table).__name__}")
    if row_length is not None and any(len(row) != row_length for row in table):
        raise LayoutError(f"every row of {name} must have {row_length} entries")


def _check_pairs(pairs) -> None:
    _check_table("register_copies", pairs, 2)


@dataclass(frozen=True)
class NoOp:
    """The layouts agree on every (register, lane, warp, block): nothing to emit."""

    kind = "no_op"


@dataclass(frozen=True)
class RegisterPermutation:
    """dst register j of every thread is src register `source_register[j]` of that thread."""

    source_register: tuple[int, ...]
    kind = "register_permutation"

    def __post_init__(self):
        if not isinstance(self.source_register, tuple) or any(r < 0 for r in self.source_register):
            raise LayoutError("source_register must be a tuple of register indices")


@dataclass(frozen=True)
class ShuffleRound:
    """One `shfl.sync.idx.b32`: lane L reads the 32-bit word that lane `source_lane[L]` offers.

    A word carries one element per slot (two 16-bit or four 8-bit elements are packed into
    one word; a 64-bit element takes two shuffles of one slot). In slot s, lane L offers its
    src register `send_register[s][L]` (-1: no lane reads it) and writes what it receives
    into its dst register `receive_register[s][L]` (-1: discarded). `lane_xor` is set when
    `source_lane[L] == L ^ lane_xor` for every lane (a butterfly shuffle).
    """

    source_lane: tuple[int, ...]
    send_register: tuple[tuple[int, ...], ...]
    receive_register: tuple[tuple[int, ...], ...]
    lane_xor: Optional[int] = None

    def __post_init__(self):
        lanes = len(self.source_lane)
        _check_table("send_register", self.send_register, lanes)
        _check_table("receive_register", self.receive_register, lanes)
        if len(self.send_register) != len(self.receive_register) or not self.send_register:
            raise LayoutError("a shuffle round needs one send and one receive table per slot")
        if any(not 0 <= lane < lanes for lane in self.source_lane):
            raise LayoutError(f"source_lane entries must be lanes 0..{lanes - 1}")

    @property
    def slots(self) -> int:
        return len(self.send_register)


@dataclass(frozen=True)
class WarpShuffle:
    """Intra-warp exchange: local copies, then shuffle rounds, then duplicate registers.

    `local_register[L][j]` is the src register lane L copies into its dst register j without
    a shuffle (-1: filled by a round or by a copy). Warps and CTAs all run the same tables,
    except that the src register a table names is XORed with `warp_register_xor[b]` for
    every set bit b of the warp id (likewise `block_register_xor` for the CTA id).
    """

    element_bits: int
    local_register: tuple[tuple[int, ...], ...]
    rounds: tuple[ShuffleRound, ...]
    warp_register_xor: tuple[int, ...] = ()
    block_register_xor: tuple[int, ...] = ()
    register_copies: tuple[tuple[int, int], ...] = ()
    kind = "warp_shuffle"

    def __post_init__(self):
        _check_table("local_register", self.local_register)
        if not isinstance(self.rounds, tuple) or not all(isinstance(r, ShuffleRound) for r in self.rounds):
            raise LayoutError("rounds must be a tuple of ShuffleRound")
        _check_pairs(self.register_copies)

    @property
    def num_shuffles(self) -> int:
        """shfl instructions per thread (an element wider than 32 bits needs several)."""
        return len(self.rounds) * max(1, self.element_bits // 32)


@dataclass(frozen=True)
class SharedRoundTrip:
    """Store to a swizzled scratch buffer, bar.sync, load back, repeated per iteration.

    `scratch` maps (`offset` in elements, `repetition`, `block`) to tensor coordinates: in
    iteration i the buffer holds the elements whose `repetition` coordinate is i (a set of
    register bits both layouts share, processed in turn so that the buffer stays below the
    scratch budget; a bar.sync separates iterations). `store_map` / `load_map` give, for a
    src / dst (register, lane, warp, block), the (offset, repetition, block) of its element:
    a thread's address is the XOR of the columns of its set bits (each CTA has its own buffer).

    `store_groups[i]` lists the st.shared instructions of iteration i, each the src registers
    written to offsets base, base+1, ..., base+store_vector-1 in that order (`load_groups`
    likewise for ld.shared into dst registers). `*_conflicts` are the extra wavefronts per
    instruction caused by bank conflicts (`weft.layouts.banks`).
    """

    element_bits: int
    scratch: LinearLayout
    store_map: LinearLayout
    load_map: LinearLayout
    store_vector: int
    load_vector: int
    store_conflicts: int
    load_conflicts: int
    store_groups: tuple[tuple[tuple[int, ...], ...], ...]
    load_groups: tuple[tuple[tuple[int, ...], ...], ...]
    register_copies: tuple[tuple[int, int], ...] = ()
    kind = "shared_round_trip"

    def __post_init__(self):
        if set(self.scratch.in_dims) != {"offset", "repetition", "block"}:
            raise LayoutError(f"scratch must have in-dims offset, repetition, block; got {self.scratch.in_dims}")
        for name, groups, vector in (
            ("store_groups", self.store_groups, self.store_vector),
            ("load_groups", self.load_groups, self.load_vector),
        ):
            if not isinstance(groups, tuple) or len(groups) != self.iterations:
                raise LayoutError(f"{name} needs one entry per iteration ({self.iterations})")
            for iteration in groups:
                _check_table(name, iteration, vector)
        _check_pairs(self.register_copies)

    @property
    def iterations(self) -> int:
        return self.scratch.in_dim_size("repetition")

    @property
    def scratch_elements(self) -> int:
        return self.scratch.in_dim_size("offset")

    @property
    def scratch_bytes(self) -> int:
        return self.scratch_elements * self.element_bits // 8


Plan = Union[NoOp, RegisterPermutation, WarpShuffle, SharedRoundTrip]


# ------------------------------------------------------------------ layout facts used by plans
def linear_table(columns, bits: Optional[int] = None) -> np.ndarray:
    """Image of every input 0..2^bits-1 of a GF(2) matrix given by int columns (by doubling)."""
    table = np.zeros(1, dtype=np.int64)
    for column in columns[:bits] if bits is not None else columns:
        table = np.concatenate([table, table ^ column])
    return table


def unique_register_bits(layout: LinearLayout) -> list[int]:
    """Register bits whose basis is not in the span of earlier register bases.

    Registers whose other bits are all 0 hold every element the thread holds, once each.
    """
    free = layout.free_variable_masks().get("register", 0)
    return [bit for bit in range(layout.in_dim_bits("register")) if not free >> bit & 1]


def register_copies(layout: LinearLayout) -> tuple[tuple[int, int], ...]:
    """(register, the unique register holding the same element) for each duplicate register."""
    from .gf2 import XorBasis

    columns = layout.columns(["register"])
    basis = XorBasis(columns)
    canonical = [basis.solve(column) for column in columns]
    table = linear_table(canonical)
    return tuple((int(j), int(c)) for j, c in enumerate(table) if j != c)
