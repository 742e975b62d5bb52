"""bank_conflicts and vector_width against brute-force enumeration of byte addresses."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from weft.layouts.gf2 import XorBasis
from weft.layouts import LayoutError, LinearLayout, bank_conflicts, vector_width
from weft.layouts.standard import blocked, nvmma_shared, wgmma_accumulator
from weft.layouts.strategies import blocked_layouts, distributed_layouts, shared_layouts


BANK_EXAMPLES = 3000 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 300


# ------------------------------------------------------------------------ brute force
def thread_offsets(register_layout: LinearLayout, shared_layout: LinearLayout) -> np.ndarray:
    """Shared offset of every (block, warp, lane, register) element, by table lookup."""
    shape = tuple(shared_layout.out_dims[n] for n in register_layout.out_dim_names)
    shared = shared_layout.transpose_outs(register_layout.out_dim_names)
    offset_of = np.full(int(np.prod(shape)), -1)
    offset_bits = shared.in_dim_bits("offset")
    table = shared.table()[: 1 << offset_bits]  # block 0
    offset_of[np.ravel_multi_index(tuple(table.T), shape)] = np.arange(1 << offset_bits)
    elements = np.ravel_multi_index(tuple(register_layout.table().T), shape)
    sizes = [register_layout.in_dims.get(d, 1) for d in ("block", "warp", "lane", "register")]
    return offset_of[elements].reshape(sizes)


def brute_vector_width(offsets: np.ndarray, element_bits: int) -> int:
    registers = offsets.shape[-1]
    width = min(registers, 128 // element_bits)
    while width > 1:
        groups = offsets.reshape(offsets.shape[:-1] + (registers // width, width))
        if (groups == groups[..., :1] + np.arange(width)).all() and (groups[..., 0] % width == 0).all():
            return width
        width //= 2
    return 1


def brute_conflicts(offsets: np.ndarray, element_bits: int, vector: int) -> set[int]:
    """Extra wavefronts of every register group of warp 0 (one value if the model holds)."""
    access_bytes = vector * element_bits // 8
    phases = max(1, access_bytes // 4)
    lanes_per_phase = 32 // phases
    element_bytes = element_bits // 8
    results = set()
    for group in range(offsets.shape[-1] // vector):
        extra = 0
        for phase in range(phases):
            banks: dict[int, set[int]] = {}
            for lane in range(phase * lanes_per_phase, (phase + 1) * lanes_per_phase):
                for offset in offsets[0, 0, lane, group * vector : (group + 1) * vector]:
                    for byte in range(offset * element_bytes, (offset + 1) * element_bytes):
                        banks.setdefault(byte // 4 % 32, set()).add(byte // 4)
            extra += max(len(words) for words in banks.values()) - 1
        results.add(extra)
    return results


# ----------------------------------------------------------------------- properties
@st.composite
def register_shared_pairs(draw):
    shape = draw(st.sampled_from([(32, 32), (64, 32), (16, 128), (64, 64), (8, 256)]))
    element_bits = draw(st.sampled_from([8, 16, 32, 64]))
    warps = draw(st.sampled_from([1, 2, 4]))
    register_layout = draw(st.one_of(blocked_layouts(shape, warps), distributed_layouts(shape, warps)))
    if draw(st.booleans()):
        shared_layout = draw(shared_layouts(shape, element_bits))
    else:
        # Offsets follow the register layout's own directions (registers first), then a
        # random XOR swizzle of line bits into low bits: wide vectors, varied conflicts.
        span, columns = XorBasis(), []
        units = [1 << b for b in range(register_layout.total_out_bits)]
        for column in register_layout.columns(["register", "lane", "warp"]) + units:
            if span.add(column):
                columns.append(column)
        for low, high in draw(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15)), max_size=4)):
            low, high = low % len(columns), high % len(columns)
            if high > low + 2:
                columns[low] ^= columns[high]
        shared_layout = LinearLayout.from_columns(columns, [("offset", 1 << len(columns))], register_layout.out_dims)
    return register_layout, shared_layout, element_bits


@settings(max_examples=BANK_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(register_shared_pairs())
def test_vector_width_and_bank_conflicts_match_brute_force(pair):
    register_layout, shared_layout, element_bits = pair
    offsets = thread_offsets(register_layout, shared_layout)
    width = vector_width(register_layout, shared_layout, element_bits)
    assert width == brute_vector_width(offsets, element_bits)
    event(f"{width * element_bits}-bit vectors")
    vector = 1
    while vector <= width:
        assert brute_conflicts(offsets, element_bits, vector) == {
            bank_conflicts(register_layout, shared_layout, element_bits, vector)
        }
        vector *= 2
    conflicts = bank_conflicts(register_layout, shared_layout, element_bits)
    assert conflicts == bank_conflicts(register_layout, shared_layout, element_bits, width)
    event("conflict free" if conflicts == 0 else "conflicts")


# ------------------------------------------------------------------- named examples
def test_column_of_a_row_major_fp32_tile_hits_one_bank():
    rows = LinearLayout({"register": [(0, 1 << b) for b in range(5)], "lane": [(1 << b, 0) for b in range(5)]}, {"dim0": 32, "dim1": 32})
    row_major = LinearLayout({"offset": [(0, 1 << b) for b in range(5)] + [(1 << b, 0) for b in range(5)]}, {"dim0": 32, "dim1": 32})
    assert vector_width(rows, row_major, 32) == 4
    assert bank_conflicts(rows, row_major, 32, vector=1) == 31  # 32 rows, one bank
    assert bank_conflicts(rows, row_major, 32) == 4 * 7  # 4 quarter-warp phases of 8 rows


def test_64_bit_accesses_are_served_per_half_warp():
    # Lane i reads 8 contiguous bytes at byte 8 i: each half warp covers one 128-byte line.
    lanes = LinearLayout({"register": [(1,)], "lane": [(2,), (4,), (8,), (16,), (32,)]}, {"dim0": 64})
    linear = LinearLayout({"offset": [(1 << b,) for b in range(6)]}, {"dim0": 64})
    assert vector_width(lanes, linear, 32) == 2
    assert bank_conflicts(lanes, linear, 32) == 0
    assert bank_conflicts(lanes, linear, 32, vector=1) == 1  # 32 lanes x 4 bytes span 2 lines


def test_blocked_tile_into_nvmma_128b_swizzle_is_conflict_free():
    shared_layout = nvmma_shared([64, 64], 128, 16)
    full_rows = blocked([64, 64], [1, 8], [4, 8], [4, 1], [1, 0])  # a quarter warp = one 128 B row
    assert vector_width(full_rows, shared_layout, 16) == 8
    assert bank_conflicts(full_rows, shared_layout, 16) == 0
    # Half rows: a quarter warp covers chunks 0-3 of row 0 and (0-3 XOR 1) of row 1, the
    # same 16 banks in two lines: 2 wavefronts in each of the 4 phases.
    half_rows = blocked([64, 64], [1, 8], [8, 4], [4, 1], [1, 0])
    assert bank_conflicts(half_rows, shared_layout, 16) == 4


def test_wgmma_accumulator_into_unswizzled_rows_conflicts():
    accumulator = wgmma_accumulator([64, 64], [4, 1], 64)
    unswizzled = LinearLayout({"offset": [(0, 1 << b) for b in range(6)] + [(1 << b, 0) for b in range(6)]}, {"dim0": 64, "dim1": 64})
    swizzled = nvmma_shared([64, 64], 128, 16)
    assert vector_width(accumulator, unswizzled, 16) == 2
    # Rows 0..7 of a 128-byte pitch share banks; 4 column pairs spread over 4 banks.
    assert bank_conflicts(accumulator, unswizzled, 16) == 7
    assert bank_conflicts(accumulator, swizzled, 16) == 0


def test_bad_inputs_name_the_layouts():
    register_layout = blocked([64, 64], [1, 8], [8, 4], [4, 1], [1, 0])
    with pytest.raises(LayoutError, match="'offset' in-dim"):
        bank_conflicts(register_layout, register_layout, 16)
    with pytest.raises(LayoutError, match=r"'dim1': 64.*'dim1': 32"):
        bank_conflicts(register_layout, nvmma_shared([64, 32], 64, 16), 16)
    with pytest.raises(LayoutError, match="vector width 8"):
        bank_conflicts(register_layout, nvmma_shared([64, 64], 128, 16), 16, vector=16)
    with pytest.raises(LayoutError, match="element_bits"):
        vector_width(register_layout, nvmma_shared([64, 64], 128, 16), 4)
