"""Register layouts for copying a 2-d tile from one shared layout into another whose
contiguous dim is the other one (an 8-bit B box [K, N], N contiguous, into the K-major
buffer wgmma reads: PTX ISA 9.7.15.5.1 reads 8- and 32-bit operands K-major only).

A thread holds small square blocks: with v elements per 32-bit word, its first log2(v)
register bits step along the source's contiguous dim and the next log2(v) along the
target's, so it reads a v x v block as v words of the source and, after renaming its
registers (a register-local conversion), writes it as v words of the target.

The lanes decide the bank conflicts (layouts/banks.py): a lane bit moving along one dim
only hits new banks in one of the two buffers (a row step of the other is a whole number
of rows of 128 bytes, outside the swizzle's reach), so each lane bit is chosen greedily,
preferring a diagonal (one step along both dims at once: in each buffer the step along its
contiguous dim picks the bank, the other lands rows away), to add a bank to both accesses.

Example, fp8 [128, 128] with 128-byte swizzles both ways: registers (0,1), (0,2), (1,0),
(2,0) are a 4 x 4 block; lanes (4,4), (8,8), (16,16), (32,32), (64,64), each a new bank
for the read along dim 1 and for the write along dim 0: no conflicts either way.
"""

from __future__ import annotations

from typing import Optional

from .gf2 import XorBasis
from .linear_layout import LinearLayout

WORD_BITS = 32
WARP_LANE_BITS = 5
BANK_WORDS = 32


def contiguous_dim(shared: LinearLayout) -> int:
    """The dim a shared layout's consecutive offsets step along."""
    first = shared.bases["offset"][0]
    return next(dim for dim, value in enumerate(first) if value)


def transpose_copy_layouts(source: LinearLayout, target: LinearLayout, shape: tuple[int, int], element_bits: int,
                           num_warps: int) -> Optional[tuple[LinearLayout, LinearLayout]]:
    """(read, write): the register layout that reads the tile from `source` and the one,
    the same but for its register order, that writes it to `target`; None when the tile
    has too few elements for a block per thread or the two share a contiguous dim."""
    read_dim, write_dim = contiguous_dim(source), contiguous_dim(target)
    block_bits = max(0, (WORD_BITS // element_bits).bit_length() - 1)
    bits = [size.bit_length() - 1 for size in shape]
    warp_bits = num_warps.bit_length() - 1
    if read_dim == write_dim or min(bits) < block_bits or \
            sum(bits) < 2 * block_bits + WARP_LANE_BITS + warp_bits:
        return None
    flat = _Flat(bits)
    block = [flat.bit(dim, bit) for dim in (read_dim, write_dim) for bit in range(block_bits)]
    span = XorBasis(block)
    banks = [_BankRank(source, element_bits, shape), _BankRank(target, element_bits, shape)]
    plain = [flat.bit(dim, bit) for bit in range(block_bits, max(bits)) for dim in (0, 1) if bit < bits[dim]]
    diagonals = [flat.bit(0, bit) | flat.bit(1, bit) for bit in range(block_bits, min(bits))]
    lanes = []
    for _ in range(WARP_LANE_BITS):
        free = [vector for vector in diagonals + plain if not span.contains(vector)]
        chosen = max(free, key=lambda vector: sum(rank.gain(vector) for rank in banks))  # first of the best
        for rank in banks:
            rank.add(chosen)
        span.add(chosen)
        lanes.append(chosen)
    rest = [vector for vector in plain if span.add(vector)]
    warps, registers = rest[len(rest) - warp_bits:], rest[:len(rest) - warp_bits]
    out_dims = {"dim0": shape[0], "dim1": shape[1]}
    made = []
    for order in (block, block[block_bits:] + block[:block_bits]):
        made.append(LinearLayout({"register": [flat.basis(v) for v in order + registers],
                                  "lane": [flat.basis(v) for v in lanes],
                                  "warp": [flat.basis(v) for v in warps]}, out_dims))
    return made[0], made[1]


class _Flat:
    """A [dim0, dim1] coordinate as one integer: dim0's bits low, dim1's above them."""

    def __init__(self, bits: list[int]):
        self.bits = bits

    def bit(self, dim: int, bit: int) -> int:
        return 1 << (bit + (self.bits[0] if dim else 0))

    def basis(self, vector: int) -> tuple[int, int]:
        return vector & ((1 << self.bits[0]) - 1), vector >> self.bits[0]


class _BankRank:
    """The banks one warp-wide 32-bit access of a shared layout has reached so far."""

    def __init__(self, shared: LinearLayout, element_bits: int, shape: tuple[int, int]):
        self.offsets = shared.invert()
        self.element_bytes = element_bits // 8
        self.bits0 = shape[0].bit_length() - 1
        self.reached = XorBasis()

    def bank(self, vector: int) -> int:
        coords = self.offsets(dim0=vector & ((1 << self.bits0) - 1), dim1=vector >> self.bits0)
        offset = dict(zip(self.offsets.out_dim_names, coords))["offset"]
        return (offset * self.element_bytes // (WORD_BITS // 8)) % BANK_WORDS

    def gain(self, vector: int) -> int:
        return int(not self.reached.contains(self.bank(vector)))

    def add(self, vector: int) -> None:
        self.reached.add(self.bank(vector))
