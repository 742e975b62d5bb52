"""Shared-memory bank conflicts and vector widths of register <-> shared-memory accesses.

Hardware rules: shared memory has 32 banks of 4 bytes; 4-byte word w sits in bank w mod 32
(CUDA C++ Programming Guide, "Shared Memory", compute capability 5.x and later, which
Hopper keeps). A warp-wide ld/st.shared is served in *wavefronts*; in one wavefront each
bank delivers one word, and lanes that touch the same word share it (broadcast, or merged
stores). Accesses wider than 4 bytes per lane are split into phases served one after
another: 64-bit accesses per half warp (2 phases), 128-bit per quarter warp (4) -- the
measured behaviour HOPPER.md records; the guide itself only states the 32-bit rule.

Linear view: with element offsets given by a linear layout, one instruction's lanes touch
the words base XOR X, where X is spanned by the lanes' word offsets (and, for a vector
access, the words inside one lane's vector). Two touched words share a bank but differ
(a conflict) exactly when their difference has zero bank bits (word bits 0..4), so every
bank that is hit holds 2^d distinct words, d = dim(X ∩ span(word bits >= 5)); this is
HOPPER.md's 2^dim(span(segment bases) ∩ span(lane bases)). Extra wavefronts per
instruction = phases * (2^d - 1).

Example: 32 lanes storing fp32 column 0 of a row-major 32x32 tile (lane i -> offset 32 i):
the lane bits add word offsets 32, 64, ..., 512, all with zero bank bits: d = 5, 31 extra wavefronts.
"""

from __future__ import annotations

from typing import Optional, Sequence

from .errors import LayoutError
from .gf2 import XorBasis
from .linear_layout import LinearLayout

WARP_LANES = 32
NUM_BANKS = 32
BANK_BYTES = 4
MAX_ACCESS_BITS = 128  # ld/st.shared.v4.b32


def _log2(value: int) -> int:
    return value.bit_length() - 1


def check_element_bits(element_bits: int) -> int:
    if not isinstance(element_bits, int) or element_bits < 8 or element_bits > 128 or element_bits & (element_bits - 1):
        raise LayoutError(f"element_bits must be a power of two between 8 and 128, got {element_bits!r}")
    return element_bits


def access_phases(vector: int, element_bits: int) -> int:
    """How many phases one warp-wide access of `vector` elements per lane is served in."""
    return max(1, vector * element_bits // 32)


def extra_wavefronts(lane_offsets: Sequence[int], vector: int, element_bits: int) -> int:
    """Extra wavefronts of one warp access, from the element offsets of lane bits 0, 1, ...

    `lane_offsets[i]` is the offset (in elements) that lane bit i adds to a lane's address;
    every lane accesses `vector` consecutive elements starting at an aligned offset.
    """
    phases = access_phases(vector, element_bits)
    phase_lane_bits = _log2(WARP_LANES // phases)
    byte_shift = _log2(element_bits // 8)
    words = [(offset << byte_shift) >> 2 for offset in lane_offsets[:phase_lane_bits]]
    access_bytes = vector * element_bits // 8
    words += [1 << bit for bit in range(_log2(access_bytes // BANK_BYTES))] if access_bytes > BANK_BYTES else []
    touched = XorBasis(words).rank
    banks = XorBasis(word & (NUM_BANKS - 1) for word in words).rank
    return phases * ((1 << (touched - banks)) - 1)


def register_to_shared(register_layout: LinearLayout, shared_layout: LinearLayout) -> LinearLayout:
    """For each hardware index of a distributed layout, where its element sits in shared memory.

    The result maps `register_layout`'s in-dims to `shared_layout`'s (`offset`, `block`).
    """
    if "offset" not in shared_layout.in_dims:
        raise LayoutError(
            f"expected a shared layout with an 'offset' in-dim, got in-dims {shared_layout.in_dims} "
            f"(out-dims {shared_layout.out_dims})"
        )
    if register_layout.out_dims != shared_layout.out_dims:
        raise LayoutError(
            f"register layout out-dims {register_layout.out_dims} (in-dims {register_layout.in_dims}) "
            f"differ from shared layout out-dims {shared_layout.out_dims} (in-dims {shared_layout.in_dims})"
        )
    try:
        return register_layout.invert_and_compose(shared_layout)
    except LayoutError as error:
        raise LayoutError(
            f"shared layout (in-dims {shared_layout.in_dims}) does not hold every element of the "
            f"register layout (in-dims {register_layout.in_dims}): {error}"
        ) from None


def _parts(composed: LinearLayout) -> dict[str, list[tuple[int, int]]]:
    """Per in-dim, per bit: (offset, block) of the composed register -> shared map."""
    names = composed.out_dim_names
    offset_index = names.index("offset")
    block_index = names.index("block") if "block" in names else None
    return {
        dim: [(row[offset_index], row[block_index] if block_index is not None else 0) for row in rows]
        for dim, rows in composed.bases.items()
    }


def vector_width_of(composed: LinearLayout, element_bits: int) -> int:
    """`vector_width` from an already composed register -> (offset, block) map."""
    parts = _parts(composed)
    registers = parts.get("register", [])
    limit = _log2(MAX_ACCESS_BITS // element_bits)
    bits = 0
    while bits < min(limit, len(registers)) and registers[bits] == (1 << bits, 0):
        bits += 1
    # Every other input bit must keep a lane's vector aligned: no offset bit below the width.
    while bits and not _aligned(parts, bits):
        bits -= 1
    return 1 << bits


def _aligned(parts: dict[str, list[tuple[int, int]]], bits: int) -> bool:
    mask = (1 << bits) - 1
    for dim, rows in parts.items():
        for index, (offset, _) in enumerate(rows):
            if offset & mask and not (dim == "register" and index < bits):
                return False
    return True


def vector_width(register_layout: LinearLayout, shared_layout: LinearLayout, element_bits: int) -> int:
    """Widest ld/st.shared (in elements, at most 128 bits) a thread can use for this pair.

    Registers 0..v-1 of a thread must hold elements at consecutive shared offsets o..o+v-1
    with o a multiple of v (vector accesses must be naturally aligned, PTX ISA "Vectors":
    ld.shared.v2/.v4 need an address aligned to the whole vector).
    """
    check_element_bits(element_bits)
    return vector_width_of(register_to_shared(register_layout, shared_layout), element_bits)


def bank_conflicts(
    register_layout: LinearLayout,
    shared_layout: LinearLayout,
    element_bits: int,
    vector: Optional[int] = None,
) -> int:
    """Extra wavefronts per warp-wide ld/st.shared between these layouts (0 = conflict free).

    Each lane accesses `vector` elements (default: `vector_width`) consecutive in shared
    memory. See the module docstring for the bank rule and the linear formula.
    """
    check_element_bits(element_bits)
    composed = register_to_shared(register_layout, shared_layout)
    widest = vector_width_of(composed, element_bits)
    if vector is None:
        vector = widest
    elif not isinstance(vector, int) or vector < 1 or vector & (vector - 1) or vector > widest:
        raise LayoutError(
            f"vector must be a power of two up to the layouts' vector width {widest}, got {vector!r} "
            f"(register in-dims {register_layout.in_dims}, shared in-dims {shared_layout.in_dims})"
        )
    lane_offsets = [offset for offset, _ in _parts(composed).get("lane", [])]
    return extra_wavefronts(lane_offsets, vector, element_bits)
