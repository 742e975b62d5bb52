"""Named hardware layouts against PTX ISA fragment formulas, Triton's golden cases and
brute-force enumeration.

The PTX formulas below are written out from the ISA's fragment figures (9.7.14.5 for
mma.sync, 9.7.15.5.1 for wgmma), independently of the constructors.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weft.layouts import (
    LayoutError,
    LinearLayout,
    blocked,
    default_nvmma_swizzle,
    dot_operand,
    mma_v2,
    nvmma_shared,
    slice_layout,
    swizzled_shared,
    wgmma_accumulator,
    wgmma_operand_a,
)


def layout_of(bases, shape):
    """A register layout from `{in_dim: [basis, ...]}` (missing in-dims have no bases)."""
    full = {name: bases.get(name, []) for name in ("register", "lane", "warp", "block")}
    return LinearLayout(full, [(f"dim{d}", s) for d, s in enumerate(shape)])


def hardware_grid(layout):
    """(register, lane, warp) index arrays covering every hardware index of `layout`."""
    sizes = [layout.in_dims[name] for name in ("register", "lane", "warp")]
    return np.meshgrid(*(np.arange(s) for s in sizes), indexing="ij")


def assert_fragment(layout, rows, cols, registers):
    """`layout` holds element (rows(i, lane, warp), cols(i, lane, warp)) in register i."""
    assert layout.in_dims["register"] == registers
    i, lane, warp = hardware_grid(layout)
    got_row, got_col = layout(register=i, lane=lane, warp=warp)
    np.testing.assert_array_equal(got_row, rows(i, lane, warp))
    np.testing.assert_array_equal(got_col, cols(i, lane, warp))


def covers_shape(layout, shape):
    table = layout.table()
    flat = np.ravel_multi_index(tuple(table.T), shape)
    return len(np.unique(flat)) == math.prod(shape)


# ------------------------------------------------------------------ exact bases
def test_wgmma_accumulator_documented_example():
    assert wgmma_accumulator([64, 16], [4, 1], 16) == layout_of(
        {
            "register": [(0, 1), (8, 0), (0, 8)],
            "lane": [(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)],
            "warp": [(16, 0), (32, 0)],
        },
        [64, 16],
    )


LANE_MMA = [(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)]


@pytest.mark.parametrize(
    "shape, registers, warps",
    [  # Triton's MMAv3_4x2Warps (instr 16x32): N repeats before M
        ([64, 32], [(0, 1), (8, 0), (0, 8), (0, 16)], [(16, 0), (32, 0), (0, 0)]),
        ([64, 64], [(0, 1), (8, 0), (0, 8), (0, 16)], [(16, 0), (32, 0), (0, 32)]),
        ([128, 64], [(0, 1), (8, 0), (0, 8), (0, 16), (64, 0)], [(16, 0), (32, 0), (0, 32)]),
        ([256, 64], [(0, 1), (8, 0), (0, 8), (0, 16), (64, 0), (128, 0)], [(16, 0), (32, 0), (0, 32)]),
    ],
)
def test_wgmma_accumulator_4x2_warps(shape, registers, warps):
    expected = layout_of({"register": registers, "lane": LANE_MMA, "warp": warps}, shape)
    assert wgmma_accumulator(shape, [4, 2], 32) == expected


def test_blocked_documented_example():
    assert blocked([4, 8], [1, 2], [4, 8], [1, 1], [1, 0]) == layout_of(
        {"register": [(0, 1)], "lane": [(0, 2), (0, 4), (0, 0), (1, 0), (2, 0)]}, [4, 8]
    )


def test_blocked_repeats_in_order():
    # Triton's BlockedOrder for one CTA: dim1 repeats first (order [1, 0]), then dim0.
    assert blocked([512, 64], [2, 2], [4, 8], [2, 2], [1, 0]) == layout_of(
        {
            "register": [(0, 1), (1, 0), (0, 32), (16, 0), (32, 0), (64, 0), (128, 0), (256, 0)],
            "lane": [(0, 2), (0, 4), (0, 8), (2, 0), (4, 0)],
            "warp": [(0, 16), (8, 0)],
        },
        [512, 64],
    )


def test_blocked_skinny_broadcasts():
    # Triton's Skinny: lanes and warps beyond the single column wrap to zero.
    assert blocked([64, 1], [8, 1], [8, 4], [1, 4], [0, 1]) == layout_of(
        {
            "register": [(1, 0), (2, 0), (4, 0)],
            "lane": [(8, 0), (16, 0), (32, 0), (0, 0), (0, 0)],
            "warp": [(0, 0), (0, 0)],
        },
        [64, 1],
    )


def test_slice_of_blocked():
    parent = blocked([16, 32], [1, 4], [4, 8], [2, 1], [1, 0])
    assert slice_layout(parent, 0) == layout_of(
        {
            "register": [(1,), (2,)],
            "lane": [(4,), (8,), (16,), (0,), (0,)],
            "warp": [(0,)],
        },
        [32],
    )
    assert slice_layout(parent, 1) == layout_of(
        {"register": [(8,)], "lane": [(0,)] * 3 + [(1,), (2,)], "warp": [(4,)]}, [16]
    )


def test_slice_of_dot_operands():
    # Triton's SliceDot, for mma.sync and wgmma register operands.
    v2 = slice_layout(dot_operand([16, 64], [1, 1], 0, 8, 2), 1)
    assert v2 == layout_of({"register": [(8,)], "lane": [(0,), (0,), (1,), (2,), (4,)]}, [16])
    v3 = slice_layout(dot_operand([64, 16], [4, 1], 0, 2, 3), 0)
    assert v3 == layout_of(
        {"register": [(1,), (8,)], "lane": [(2,), (4,), (0,), (0,), (0,)], "warp": [(0,), (0,)]},
        [16],
    )


@pytest.mark.parametrize(
    "shape, registers",
    [  # Triton's MMAv2_16x16, MMAv2_32x32, MMAv2_ExtendDim2
        ([16, 16], [(0, 1), (8, 0), (0, 8)]),
        ([32, 32], [(0, 1), (8, 0), (0, 8), (0, 16), (16, 0)]),
        ([16, 128], [(0, 1), (8, 0), (0, 8), (0, 16), (0, 32), (0, 64)]),
    ],
)
def test_mma_v2_single_warp(shape, registers):
    assert mma_v2(shape, [1, 1]) == layout_of({"register": registers, "lane": LANE_MMA}, shape)


def test_dot_operand_golden_cases():
    # Triton's DotMMAv2_split_warp_kwidth8 and DotMMAv3_mixed_warp_kwidth4.
    lanes_a = [(0, 8), (0, 16), (1, 0), (2, 0), (4, 0)]
    assert dot_operand([64, 128], [2, 2], 0, 8, 2) == layout_of(
        {
            "register": [(0, 1), (0, 2), (0, 4), (8, 0), (0, 32), (0, 64), (32, 0)],
            "lane": lanes_a,
            "warp": [(0, 0), (16, 0)],
        },
        [64, 128],
    )
    assert dot_operand([128, 32], [2, 2], 1, 8, 2) == layout_of(
        {
            "register": [(1, 0), (2, 0), (4, 0), (32, 0), (64, 0), (0, 16)],
            "lane": [(8, 0), (16, 0), (0, 1), (0, 2), (0, 4)],
            "warp": [(0, 8), (0, 0)],
        },
        [128, 32],
    )
    assert wgmma_operand_a([128, 64], [4, 2], 8) == layout_of(
        {
            "register": [(0, 1), (0, 2), (8, 0), (0, 16), (0, 32), (64, 0)],
            "lane": [(0, 4), (0, 8), (1, 0), (2, 0), (4, 0)],
            "warp": [(16, 0), (32, 0), (0, 0)],
        },
        [128, 64],
    )


def test_dot_operand_batched():
    # Triton's DotMMAv2_3D: batch dims repeat last and take the outermost warps.
    assert dot_operand([16, 128, 128], [2, 4, 2], 0, 8, 2) == layout_of(
        {
            "register": [(0, 0, 1), (0, 0, 2), (0, 0, 4), (0, 8, 0), (0, 0, 32), (0, 0, 64),
                         (0, 64, 0), (2, 0, 0), (4, 0, 0), (8, 0, 0)],
            "lane": [(0, 0, 8), (0, 0, 16), (0, 1, 0), (0, 2, 0), (0, 4, 0)],
            "warp": [(0, 0, 0), (0, 16, 0), (0, 32, 0), (1, 0, 0)],
        },
        [16, 128, 128],
    )


def test_nvmma_128b_bf16_element_positions():
    layout = nvmma_shared([8, 64], 128, 16)
    assert layout.bases["offset"] == (
        (0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (0, 32), (1, 8), (2, 16), (4, 32)
    )
    # Row r is 64 elements (128 bytes); its 16-byte chunk j holds columns 8 * (j ^ r) ...
    assert layout(offset=0) == (0, 0)
    assert layout(offset=64) == (1, 8)  # row 1 starts with chunk 1 of the logical row
    assert layout(offset=64 + 8) == (1, 0)
    assert layout(offset=3 * 64 + 2 * 8 + 1) == (3, 9)  # chunk 2 of row 3 holds 1 ^ 3
    assert layout(offset=7 * 64 + 7) == (7, 63)


@pytest.mark.parametrize(
    "shape, swizzle, bits, transposed, offsets",
    [  # Triton's LeadingOffset_* cases
        ([8, 16], 32, 16, False, [(0, 1), (0, 2), (0, 4), (0, 8), (1, 0), (2, 0), (4, 8)]),
        ([8, 32], 64, 16, False, [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (1, 0), (2, 8), (4, 16)]),
        ([8, 64], 128, 32, False,
         [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16), (1, 4), (2, 8), (4, 16), (0, 32)]),
        ([128, 128], 128, 32, True,
         [(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (4, 1), (8, 2), (16, 4), (0, 8), (0, 16),
          (0, 32), (0, 64), (32, 0), (64, 0)]),
        ([32, 4, 64], 64, 32, False,
         [(0, 0, 1), (0, 0, 2), (0, 0, 4), (0, 0, 8), (0, 1, 0), (0, 2, 4), (1, 0, 8), (2, 0, 0),
          (4, 0, 0), (8, 0, 0), (16, 0, 0), (0, 0, 16), (0, 0, 32)]),
    ],
)
def test_nvmma_golden_cases(shape, swizzle, bits, transposed, offsets):
    assert nvmma_shared(shape, swizzle, bits, transposed).bases["offset"] == tuple(offsets)


def test_swizzled_shared_golden():
    # Triton's SharedSwizzled2D_Order01: dim0 is contiguous, rows are dim1.
    layout = swizzled_shared([4, 8], 1, 1, 4, [0, 1])
    assert layout.bases["offset"] == ((1, 0), (2, 0), (1, 1), (2, 2), (0, 4))


# ------------------------------------------------------- PTX fragment formulas
def group(lane):
    return lane >> 2


def thread_in_group(lane):
    return lane % 4


@pytest.mark.parametrize("n", [8, 16, 32, 64, 128, 256])
@pytest.mark.parametrize("warps_m", [4, 8])
def test_wgmma_accumulator_matches_ptx(n, warps_m):
    # PTX 9.7.15.5.1.1, accumulator D of m64nNk16: warp w owns rows 16w .. 16w + 15.
    layout = wgmma_accumulator([16 * warps_m, n], [warps_m, 1], n)
    assert_fragment(
        layout,
        rows=lambda i, lane, w: 16 * w + lane // 4 + 8 * ((i // 2) % 2),
        cols=lambda i, lane, w: (lane % 4) * 2 + i % 2 + 8 * (i // 4),
        registers=n // 2,
    )


def test_mma_sync_accumulator_matches_ptx():
    # PTX 9.7.14.5, m16n8k16 C/D: c0..c3.
    assert_fragment(
        mma_v2([16, 8], [1, 1]),
        rows=lambda i, lane, w: group(lane) + 8 * (i >= 2),
        cols=lambda i, lane, w: thread_in_group(lane) * 2 + (i & 1),
        registers=4,
    )


def test_mma_sync_a_16bit_matches_ptx():
    # PTX 9.7.14.5, m16n8k16 A (.f16/.bf16): a0..a7.
    assert_fragment(
        dot_operand([16, 16], [1, 1], 0, 2, 2),
        rows=lambda i, lane, w: group(lane) + 8 * ((i // 2) % 2),
        cols=lambda i, lane, w: thread_in_group(lane) * 2 + (i & 1) + 8 * (i >= 4),
        registers=8,
    )


def test_mma_sync_b_16bit_matches_ptx():
    # PTX 9.7.14.5, m16n8k16 B (.f16/.bf16): b0..b3, B is [K, N].
    assert_fragment(
        dot_operand([16, 8], [1, 1], 1, 2, 2),
        rows=lambda i, lane, w: thread_in_group(lane) * 2 + (i & 1) + 8 * (i >= 2),
        cols=lambda i, lane, w: group(lane),
        registers=4,
    )


def test_mma_sync_8bit_operands_match_ptx():
    # PTX 9.7.14.5, m16n8k32 A and B (.s8/.e4m3): four elements per 32-bit register.
    assert_fragment(
        dot_operand([16, 32], [1, 1], 0, 4, 2),
        rows=lambda i, lane, w: group(lane) + 8 * ((i // 4) % 2),
        cols=lambda i, lane, w: thread_in_group(lane) * 4 + (i & 3) + 16 * (i >= 8),
        registers=16,
    )
    assert_fragment(
        dot_operand([32, 8], [1, 1], 1, 4, 2),
        rows=lambda i, lane, w: thread_in_group(lane) * 4 + (i & 3) + 16 * (i >= 4),
        cols=lambda i, lane, w: group(lane),
        registers=8,
    )


def test_mma_sync_a_tf32_matches_ptx():
    # PTX 9.7.14.5, m16n8k8 A (.tf32): one element per register.
    assert_fragment(
        dot_operand([16, 8], [1, 1], 0, 1, 2),
        rows=lambda i, lane, w: group(lane) + 8 * (i % 2),
        cols=lambda i, lane, w: thread_in_group(lane) + 4 * (i >= 2),
        registers=4,
    )


def test_wgmma_register_a_matches_ptx():
    # PTX 9.7.15.5.1.1, A in registers: the m16n8k16 (16-bit) and m16n8k32 (8-bit) A
    # patterns per warp, warp w of the warpgroup on rows 16w .. 16w + 15.
    assert_fragment(
        wgmma_operand_a([64, 16], [4, 1], 16),
        rows=lambda i, lane, w: 16 * w + group(lane) + 8 * ((i // 2) % 2),
        cols=lambda i, lane, w: thread_in_group(lane) * 2 + (i & 1) + 8 * (i >= 4),
        registers=8,
    )
    assert_fragment(
        wgmma_operand_a([64, 32], [4, 1], 8),
        rows=lambda i, lane, w: 16 * w + group(lane) + 8 * ((i // 4) % 2),
        cols=lambda i, lane, w: thread_in_group(lane) * 4 + (i & 3) + 16 * (i >= 8),
        registers=16,
    )


def test_wgmma_accumulator_repeats_n_before_m():
    n = 16
    layout = wgmma_accumulator([128, 2 * n], [4, 1], n)
    per_tile = n // 2
    assert_fragment(
        layout,
        rows=lambda i, lane, w: 16 * w + lane // 4 + 8 * ((i // 2) % 2) + 64 * (i // (2 * per_tile)),
        cols=lambda i, lane, w: (lane % 4) * 2 + i % 2 + 8 * ((i % per_tile) // 4)
        + n * ((i // per_tile) % 2),
        registers=4 * per_tile,
    )


@pytest.mark.parametrize("warps", [[1, 1], [2, 2], [4, 1], [1, 4]])
def test_mma_sync_operands_cover_each_warps_accumulator_tile(warps):
    # A warp must hold, in A, every row of its accumulator tile (all of K) and, in B,
    # every column: that is why operand warps are copies along the accumulator's other dim.
    m, n, k = 64, 64, 32
    acc = mma_v2([m, n], warps)
    a = dot_operand([m, k], warps, 0, 2, 2)
    b = dot_operand([k, n], warps, 1, 2, 2)

    def held_by_warp(layout, warp):
        register, lane = np.meshgrid(
            np.arange(layout.in_dims["register"]), np.arange(32), indexing="ij"
        )
        coords = layout(register=register, lane=lane, warp=np.full_like(lane, warp))
        return {tuple(p) for p in np.stack([c.ravel() for c in coords], axis=1)}

    for warp in range(math.prod(warps)):
        tile = held_by_warp(acc, warp)
        rows, cols = {r for r, _ in tile}, {c for _, c in tile}
        assert held_by_warp(a, warp) == {(r, kk) for r in rows for kk in range(k)}
        assert held_by_warp(b, warp) == {(kk, c) for kk in range(k) for c in cols}


# ------------------------------------------------------------------ NVMMA swizzle
def nvmma_offset(row, col, rows, swizzle, bits):
    """HOPPER.md: element (r, c) is in 16-byte chunk (c / vec) ^ ((r / per_phase) % max_phase)
    of row r; rows are one swizzle wide, wider columns are successive [rows x width] blocks."""
    vec = 128 // bits
    width = max(swizzle, 16) * 8 // bits
    per_phase, max_phase = {128: (1, 8), 64: (2, 4), 32: (4, 2), 0: (1, 1)}[swizzle]
    chunk = ((col % width) // vec) ^ ((row // per_phase) % max_phase)
    return (col // width) * rows * width + row * width + chunk * vec + col % vec


SWIZZLE_CASES = [
    (swizzle, bits, rows, widths)
    for swizzle in (0, 32, 64, 128)
    for bits in (8, 16, 32)
    for rows in (8, 32)
    for widths in (1, 4)
]


@pytest.mark.parametrize("swizzle, bits, rows, widths", SWIZZLE_CASES)
def test_nvmma_matches_xor_formula(swizzle, bits, rows, widths):
    cols = widths * max(swizzle, 16) * 8 // bits
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    expected_offsets = nvmma_offset(r, c, rows, swizzle, bits)

    layout = nvmma_shared([rows, cols], swizzle, bits)
    assert layout.is_invertible()
    got = layout(offset=expected_offsets)
    np.testing.assert_array_equal(got[0], r)
    np.testing.assert_array_equal(got[1], c)

    # Transposed: the same map with the contiguous dim first.
    flipped = nvmma_shared([cols, rows], swizzle, bits, transposed=True)
    got = flipped(offset=expected_offsets)
    np.testing.assert_array_equal(got[0], c)
    np.testing.assert_array_equal(got[1], r)


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_nvmma_batch_dims_are_more_rows(swizzle):
    batch, rows = 4, 8
    cols = 2 * (max(swizzle, 16) * 8 // 16)  # two swizzle rows of 16-bit elements
    layout = nvmma_shared([batch, rows, cols], swizzle, 16)
    b, r, c = np.meshgrid(np.arange(batch), np.arange(rows), np.arange(cols), indexing="ij")
    got = layout(offset=nvmma_offset(b * rows + r, c, batch * rows, swizzle, 16))
    for axis, expected in enumerate((b, r, c)):
        np.testing.assert_array_equal(got[axis], expected)


@pytest.mark.parametrize(
    "shape, bits, transposed, expected",
    [
        ([64, 64], 16, False, 128),
        ([64, 32], 16, False, 64),
        ([64, 16], 16, False, 32),
        ([64, 8], 16, False, 0),
        ([64, 8], 16, True, 128),
        ([4, 64], 16, False, 0),  # fewer than the 8 rows a swizzle pattern spans
        ([64, 16], 8, False, 0),
        ([64, 32], 32, False, 128),
    ],
)
def test_default_nvmma_swizzle(shape, bits, transposed, expected):
    assert default_nvmma_swizzle(shape, bits, transposed) == expected
    nvmma_shared(shape, expected, bits, transposed)  # always accepted by the constructor


def test_swizzled_shared_xor_form():
    shape, vec, per_phase, max_phase = [16, 64], 4, 2, 4
    layout = swizzled_shared(shape, vec, per_phase, max_phase, [1, 0])
    assert layout.is_invertible()
    offsets = np.arange(math.prod(shape))
    row, col = layout(offset=offsets)
    raw_col = offsets % shape[1]
    np.testing.assert_array_equal(row, offsets // shape[1])
    np.testing.assert_array_equal(col, raw_col ^ (vec * ((row // per_phase) % max_phase)))


# ---------------------------------------------------------- broadcast and repeat
def test_small_shapes_broadcast_lanes_and_warps():
    layout = wgmma_accumulator([32, 8], [4, 1], 16)
    assert layout.bases["warp"] == ((16, 0), (0, 0))
    assert layout.bases["register"] == ((0, 1), (8, 0))  # column 8 is outside: dropped
    assert covers_shape(layout, [32, 8])

    tiny = blocked([2, 2], [1, 1], [4, 8], [2, 2], [1, 0])
    assert tiny.bases["register"] == ()
    assert tiny.bases["lane"] == ((0, 1), (0, 0), (0, 0), (1, 0), (0, 0))
    assert tiny.bases["warp"] == ((0, 0), (0, 0))
    assert covers_shape(tiny, [2, 2])


def test_register_bases_beyond_shape_are_dropped():
    layout = blocked([2, 4], [4, 4], [8, 4], [1, 1], [1, 0])
    assert layout.bases["register"] == ((0, 1), (0, 2), (1, 0))


@pytest.mark.parametrize("shape", [[64, 256], [256, 64], [512, 512]])
def test_large_shapes_repeat_in_registers(shape):
    layout = mma_v2(shape, [2, 2])
    assert layout.in_dims["lane"] == 32 and layout.in_dims["warp"] == 4
    assert layout.in_dims["register"] * 32 * 4 == math.prod(shape)
    assert layout.is_invertible()  # every element held exactly once


# ---------------------------------------------------------- hypothesis properties
@st.composite
def blocked_parameters(draw):
    rank = draw(st.integers(1, 3))
    shape = [1 << draw(st.integers(0, 6)) for _ in range(rank)]
    per_thread = [1 << draw(st.integers(0, 3)) for _ in range(rank)]
    lane_bits = [0] * rank
    for _ in range(5):
        lane_bits[draw(st.integers(0, rank - 1))] += 1
    warp_bits = [0] * rank
    for _ in range(draw(st.integers(0, 3))):
        warp_bits[draw(st.integers(0, rank - 1))] += 1
    order = draw(st.permutations(range(rank)))
    return shape, per_thread, [1 << b for b in lane_bits], [1 << b for b in warp_bits], list(order)


def mixed_radix(index, sizes, order):
    """Split `index` into one digit per dim, dims taken in `order` (minor first)."""
    digits = [0] * len(sizes)
    for d in order:
        digits[d] = index % sizes[d]
        index = index // sizes[d]  # not //=: index may be a caller's numpy array
    return digits


@given(blocked_parameters())
def test_blocked_covers_exactly_the_shape(params):
    shape, per_thread, threads, warps, order = params
    layout = blocked(shape, per_thread, threads, warps, order)
    assert layout.out_dims == {f"dim{d}": s for d, s in enumerate(shape)}
    assert list(layout.in_dims) == ["register", "lane", "warp", "block"]
    assert layout.is_surjective() and covers_shape(layout, shape)
    registers = layout.sublayout(["register"], layout.out_dim_names)
    assert registers.is_injective()  # no thread holds an element twice


@given(blocked_parameters())
def test_blocked_matches_brute_force(params):
    # Per dim: element = (held + per_thread * (lane + threads * (warp + warps * repeat))) mod
    # shape, where each hardware index splits into per-dim digits in `order`, and the
    # register index is the held digits (at most the shape) followed by the repeat digits.
    shape, per_thread, threads, warps, order = params
    layout = blocked(shape, per_thread, threads, warps, order)
    held = [min(p, s) for p, s in zip(per_thread, shape)]
    repeats = [max(1, s // (p * t * w)) for s, p, t, w in zip(shape, per_thread, threads, warps)]
    assert layout.in_dims["register"] == math.prod(held) * math.prod(repeats)
    register, lane, warp = hardware_grid(layout)
    inner = mixed_radix(register % math.prod(held), held, order)
    outer = mixed_radix(register // math.prod(held), repeats, order)
    lanes, warp_digits = mixed_radix(lane, threads, order), mixed_radix(warp, warps, order)
    got = layout(register=register, lane=lane, warp=warp)
    for d, size in enumerate(shape):
        thread = lanes[d] + threads[d] * (warp_digits[d] + warps[d] * outer[d])
        np.testing.assert_array_equal(got[d], (inner[d] + per_thread[d] * thread) % size)


def elements_per_thread(layout):
    """{(lane, warp): list of the elements that thread holds, one per register}."""
    register, lane, warp = hardware_grid(layout)
    coords = np.stack(layout(register=register, lane=lane, warp=warp), axis=-1)
    return {
        (l, w): [tuple(p) for p in coords[:, l, w]]
        for l in range(coords.shape[1])
        for w in range(coords.shape[2])
    }


@given(blocked_parameters().filter(lambda p: len(p[0]) >= 2), st.data())
def test_slice_of_blocked_is_the_projection(params, data):
    shape, per_thread, threads, warps, order = params
    parent = blocked(shape, per_thread, threads, warps, order)
    dim = data.draw(st.integers(0, len(shape) - 1))
    sliced = slice_layout(parent, dim)
    assert sliced.out_dims == {f"dim{j}": s for j, s in enumerate(shape[:dim] + shape[dim + 1:])}
    parent_elements = elements_per_thread(parent)
    for thread, elements in elements_per_thread(sliced).items():
        projected = {p[:dim] + p[dim + 1:] for p in parent_elements[thread]}
        assert len(set(elements)) == len(elements)  # duplicated registers were dropped
        assert set(elements) == projected


# ------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: blocked([48, 64], [1, 1], [4, 8], [1, 1], [1, 0]), "shape[0] = 48"),
        (lambda: blocked([64, 64], [1, 3], [4, 8], [1, 1], [1, 0]), "size_per_thread[1] = 3"),
        (lambda: blocked([64, 64], [1, 1], [4, 4], [1, 1], [1, 0]), "threads_per_warp [4, 4]"),
        (lambda: blocked([64, 64], [1, 1], [4, 8], [1], [1, 0]), "warps_per_cta [1]"),
        (lambda: blocked([64, 64], [1, 1], [4, 8], [1, 1], [0, 0]), "order [0, 0]"),
        (lambda: blocked([64, 64], [1, 1], [4, 8], [8, 8], [1, 0]), "64 warps"),
        (lambda: wgmma_accumulator([64, 64], [2, 2], 64), "warps_per_cta[0] = 2"),
        (lambda: wgmma_accumulator([64, 64], [4, 1], 24), "instr_n = 24"),
        (lambda: mma_v2([64, 64], [2, 2], (16, 16)), "instr_shape [16, 16]"),
        (lambda: dot_operand([64, 64], [4, 1], 1, 2, 3), "op_idx=1"),
        (lambda: dot_operand([64, 64], [4, 1], 0, 3, 2), "k_width = 3"),
        (lambda: dot_operand([64, 64], [4, 1], 2, 2, 2), "op_idx 2"),
        (lambda: wgmma_operand_a([64, 64], [2, 1], 16), "warps_per_cta[0] = 2"),
        (lambda: nvmma_shared([64, 32], 128, 16), "contiguous dim1"),
        (lambda: nvmma_shared([64, 64], 96, 16), "swizzle_bytes 96"),
        (lambda: nvmma_shared([64, 64], 128, 12), "element_bits 12"),
        (lambda: nvmma_shared([4, 64], 128, 16), "4 rows"),
        (lambda: swizzled_shared([64, 64], 3, 1, 8, [1, 0]), "vec = 3"),
        (lambda: slice_layout(blocked([8, 8], [1, 1], [4, 8], [1, 1], [1, 0]), 2), "dim 2"),
    ],
)
def test_bad_input_names_the_argument(make, words):
    with pytest.raises(LayoutError, match=words.replace("[", r"\[").replace("]", r"\]")):
        make()


def test_slicing_a_1d_layout_leaves_one_element_every_thread_holds():
    # The reduction of a 1-D tensor to a scalar uses the same rule.
    sliced = slice_layout(blocked([64], [2], [32], [1], [0]), 0)
    assert sliced.out_dims == {}
    assert sliced.bases == {"register": (), "lane": ((),) * 5, "warp": (), "block": ()}
