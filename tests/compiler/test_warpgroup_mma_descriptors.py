"""wgmma descriptors and fragments on the CPU: decode(encode(layout)) == layout.

The descriptor plan comes from a buffer's addressing (`plan_operand`); the expected bytes
come straight from the shared layout's own table (offset -> coordinates, inverted by
enumeration), so the check does not reuse the addressing the plan was made from. A
random 1024-byte-aligned base stands for where the allocator put the buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from weft.layouts.rules import shared_addressing, shared_index_addressing, shared_slice_addressing
from weft.compiler.warpgroup_mma_descriptors import (MatrixDescriptor, OperandView, WgmmaError, accumulator_position, check_types,
                                 decode, instruction_k, operand_a_position, plan_accumulator, plan_operand,
                                 plan_register_a, swizzle_address)
from weft.layouts import LinearLayout, blocked, dot_operand, nvmma_shared, swizzled_shared, wgmma_accumulator


# ------------------------------------------------------------------ the bit layout
def test_descriptor_bit_positions_follow_the_ptx_table():
    d = MatrixDescriptor(start_address=0x1230, leading_byte_offset=0x40, stride_byte_offset=0x400, swizzle=128)
    value = d.value
    assert value & 0x3FFF == 0x123                  # bits 0-13: start >> 4
    assert (value >> 16) & 0x3FFF == 0x4             # bits 16-29: LBO >> 4
    assert (value >> 32) & 0x3FFF == 0x40            # bits 32-45: SBO >> 4
    assert (value >> 49) & 7 == 0                    # bits 49-51: base offset
    assert value >> 62 == 1                          # bits 62-63: 1 = 128B swizzle
    assert value & ((0b11 << 14) | (0b11 << 30) | (0b111 << 46) | (0x3FF << 52)) == 0
    assert {s: MatrixDescriptor(0, 16, 16, s).value >> 62 for s in (0, 32, 64, 128)} == {0: 0, 32: 3, 64: 2, 128: 1}
    assert MatrixDescriptor.from_value(value) == d


@given(st.integers(0, (1 << 14) - 1), st.integers(1, (1 << 14) - 1), st.integers(1, (1 << 14) - 1),
       st.sampled_from([0, 32, 64, 128]))
def test_descriptor_fields_round_trip(start, lbo, sbo, swizzle):
    d = MatrixDescriptor(start << 4, lbo << 4, sbo << 4, swizzle)
    assert MatrixDescriptor.from_value(d.value) == d


def test_swizzle_is_the_nvmma_xor_and_its_own_inverse():
    addresses = np.arange(4096)
    for swizzle in (0, 32, 64, 128):
        assert np.array_equal(swizzle_address(swizzle_address(addresses, swizzle), swizzle), addresses)
    # 128B: the 16-byte chunk index (bits 4-6) is XORed with the row within 8 rows (bits 7-9).
    assert swizzle_address(3 * 128 + 16, 128) == 3 * 128 + 16 * (1 ^ 3)


# ------------------------------------------------------------------ decode(encode)
def layout_table(shared: LinearLayout, view=None) -> np.ndarray:
    """Element offset of every (dim0, dim1), from the shared layout's own table (oriented
    as the operand: `view` reorders or cuts it like the buffer view does)."""
    offsets = np.arange(shared.in_dims["offset"], dtype=np.int64)
    rows, cols = shared(offset=offsets)
    where = np.full((shared.out_dims["dim0"], shared.out_dims["dim1"]), -1, dtype=np.int64)
    where[rows[::-1], cols[::-1]] = offsets[::-1]  # the lowest offset of a repeated element
    return where if view is None else view(where)


def check_decodes(shared, addressing, xor, bits, mn_dim, tile_mn, base, view=None, allow_mn_major=None):
    operand = OperandView.from_addressing(addressing, xor, bits, mn_dim)
    tile_k = instruction_k(bits)
    mn_total, k_total = operand.shape
    origins = [(m, k) for m in range(0, mn_total, tile_mn) for k in range(0, k_total, tile_k)]
    plan = plan_operand(operand, tile_mn, tile_k, origins, allow_mn_major=allow_mn_major)
    assert base % plan.alignment == 0
    table = layout_table(shared, view) * (bits // 8)
    table = table.T if mn_dim == 1 else table
    for mn0, k0 in origins:
        descriptor = plan.descriptor(base + plan.start_offset(mn0, k0))
        read = decode(descriptor.value, plan.major, bits, tile_mn, tile_k) - base
        assert np.array_equal(read, table[mn0:mn0 + tile_mn, k0:k0 + tile_k]), (mn0, k0)
    return plan


@st.composite
def nvmma_operands(draw):
    bits = draw(st.sampled_from([8, 16, 32]))
    swizzle = draw(st.sampled_from([0, 32, 64, 128]))
    transposed = draw(st.booleans())
    mn_dim = draw(st.sampled_from([0, 1]))  # 0: A [M, K]; 1: B [K, N]
    row = max(swizzle, 16) * 8 // bits       # elements of one swizzle row
    contiguous = draw(st.sampled_from([s for s in (16, 32, 64, 128, 256) if s >= row]))
    other = draw(st.sampled_from([8, 16, 32, 64, 128, 256]))
    shape = (other, contiguous) if not transposed else (contiguous, other)
    return bits, swizzle, transposed, mn_dim, shape


@given(nvmma_operands(), st.integers(0, 63), st.data())
def test_decode_of_the_planned_descriptor_reads_the_layout(operand, base_blocks, data):
    bits, swizzle, transposed, mn_dim, shape = operand
    k_total = shape[1 - mn_dim]
    mn_total = shape[mn_dim]
    tile_k = instruction_k(bits)
    mn_major = transposed != (mn_dim == 1)  # is the contiguous dim M or N?
    if k_total < tile_k or (bits != 16 and mn_major) or mn_total < 8 or shape[0] * shape[1] * bits > 8 << 17:
        return  # not an operand; or more than 128 KB (shared memory is 227 KB)
    tiles = [t for t in (8, 16, 32, 64, 128, 256) if t <= mn_total]
    tile_mn = 64 if mn_dim == 0 and mn_total >= 64 else data.draw(st.sampled_from(tiles))
    shared = nvmma_shared(shape, swizzle, bits, transposed)
    plan = check_decodes(shared, shared_addressing(shared), 0, bits, mn_dim, tile_mn, 1024 * base_blocks)
    assert plan.major == ("MN" if mn_major else "K") and plan.swizzle == swizzle


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
@pytest.mark.parametrize("bits", [8, 16])
def test_views_decode_too_stage_index_slice_and_permute(swizzle, bits):
    """Stage 1 of a [2, 128, 64] buffer, its rows 64..127, and the [N, K] -> [K, N] permute."""
    rows, cols = 128, max(64, max(swizzle, 16) * 8 // bits)
    tile = nvmma_shared((rows, cols), swizzle, bits)
    stacked = LinearLayout({"offset": [(0,) + b for b in tile.bases["offset"]] + [(1, 0, 0)], "block": []},
                           {"dim0": 2, "dim1": rows, "dim2": cols})
    stage = shared_index_addressing(shared_addressing(stacked), (2, rows, cols), 0)
    base = 1024 + rows * cols * bits // 8  # stage 1 starts one stage into an aligned buffer
    check_decodes(tile, stage, 0, bits, 0, 64, base)
    window, xor = shared_slice_addressing(shared_addressing(tile), 0, 64, 64)
    check_decodes(tile, window, xor, bits, 0, 64, 0, view=lambda where: where[64:])
    permuted = LinearLayout({"dim0": shared_addressing(tile).bases["dim1"],
                             "dim1": shared_addressing(tile).bases["dim0"]}, {"offset": rows * cols})
    plan = check_decodes(tile, permuted, 0, bits, 1, 128, 0, view=lambda where: where.T)
    assert plan.major == "K"  # an [N, K] K-contiguous buffer seen as [K, N]


def test_k_steps_and_tiles_move_the_start_by_unswizzled_offsets():
    shared = nvmma_shared((128, 64), 128, 16)
    plan = plan_operand(OperandView.from_addressing(shared_addressing(shared), 0, 16, 0), 64, 16,
                        [(0, 0), (64, 48)])
    assert (plan.major, plan.leading_byte_offset, plan.stride_byte_offset) == ("K", 16, 1024)  # CUTLASS's values
    assert [plan.start_offset(0, k) for k in (0, 16, 32, 48)] == [0, 32, 64, 96]
    assert plan.start_offset(64, 0) == 64 * 128


def test_mn_major_strides_match_cutlass_and_triton():
    # B [K=64, N=128] bf16, N contiguous, 128B swizzle: 64-wide N blocks of 64 rows x 128 B.
    shared = nvmma_shared((64, 128), 128, 16)
    plan = plan_operand(OperandView.from_addressing(shared_addressing(shared), 0, 16, 1), 128, 16, [(0, 0)])
    assert (plan.major, plan.transposed) == ("MN", 1)
    assert plan.leading_byte_offset == 64 * 128   # next 64 columns of N
    assert plan.stride_byte_offset == 8 * 128     # next 8 rows of K
    unswizzled = nvmma_shared((64, 64), 0, 16)
    plan = plan_operand(OperandView.from_addressing(shared_addressing(unswizzled), 0, 16, 1), 64, 16, [(0, 0)])
    assert (plan.swizzle, plan.leading_byte_offset, plan.stride_byte_offset) == (0, 128, 64 * 16)


# ------------------------------------------------------------------ refusals
def test_fp8_operands_must_be_k_major():
    shared = nvmma_shared((64, 64), 64, 8)  # B [K, N] with N contiguous
    with pytest.raises(WgmmaError, match="must be K-major"):
        plan_operand(OperandView.from_addressing(shared_addressing(shared), 0, 8, 1), 64, 32, [(0, 0)])


def test_layouts_without_core_matrices_are_refused():
    row_major = LinearLayout({"offset": [(0, 1 << b) for b in range(6)] + [(1 << b, 0) for b in range(6)],
                              "block": []}, {"dim0": 64, "dim1": 64})
    padded_like = swizzled_shared((64, 64), 1, 1, 8, (1, 0))
    for shared in (row_major, padded_like):
        with pytest.raises(WgmmaError, match="cannot read this shared layout"):
            plan_operand(OperandView.from_addressing(shared_addressing(shared), 0, 16, 0), 64, 16, [(0, 0)])


def test_swizzled_views_need_an_aligned_base():
    shared = nvmma_shared((64, 64), 128, 16)
    with pytest.raises(WgmmaError, match="1024 bytes"):
        plan_operand(OperandView.from_addressing(shared_addressing(shared), 0, 16, 0), 64, 16, [(0, 0)],
                     base_alignment=512)


def test_types():
    assert check_types("bf16", "bf16", "fp32") == ("bf16", "bf16", "f32")
    assert check_types("fp8e4m3", "fp8e5m2", "fp16") == ("e4m3", "e5m2", "f16")
    assert check_types("fp32", "fp32", "fp32") == ("tf32", "tf32", "f32")
    for bad in (("bf16", "fp16", "fp32"), ("bf16", "bf16", "fp16"), ("i8", "i8", "fp32")):
        with pytest.raises(WgmmaError):
            check_types(*bad)


# ------------------------------------------------------------------ register fragments
def ptx_accumulator(warp, lane, i):
    """PTX ISA 9.7.15.5.1.1, wgmma D: (row, col) of d_i."""
    return 16 * (warp % 4) + lane // 4 + 8 * ((i // 2) % 2), 2 * (lane % 4) + i % 2 + 8 * (i // 4)


def ptx_operand_a(warp, lane, i, bits):
    """PTX ISA 9.7.15.5.1.1, register A: (row, k) of element i (4 registers of 32/bits)."""
    kw = 32 // bits
    return 16 * (warp % 4) + lane // 4 + 8 * ((i // kw) % 2), kw * (lane % 4) + i % kw + 4 * kw * (i // (2 * kw))


@pytest.mark.parametrize("shape, warps, instr_n", [
    ((64, 64), (4, 1), 64), ((128, 256), (8, 1), 256), ((128, 128), (4, 2), 64), ((256, 64), (8, 1), 32),
    ((64, 16), (4, 1), 16), ((256, 128), (4, 1), 128)])
def test_accumulator_registers_are_the_ptx_fragment(shape, warps, instr_n):
    layout = wgmma_accumulator(shape, warps, instr_n)
    plan = plan_accumulator(layout, shape)
    assert plan.n == min(256, shape[1] // warps[1])  # the widest N the layout allows
    for group in range(plan.num_warpgroups):
        gm, gn = plan.warpgroup_origin(group)
        for (m0, n0), registers in zip(plan.tiles, plan.registers):
            for warp in range(4):
                for lane in range(32):
                    for i, r in enumerate(registers):
                        row, col = ptx_accumulator(warp, lane, i)
                        got = layout(register=r, lane=lane, warp=4 * group + warp, block=0)
                        assert got == (gm + m0 + row, gn + n0 + col)
    assert sorted(r for t in plan.registers for r in t) == list(range(layout.in_dims["register"]))
    assert accumulator_position(5) == ptx_accumulator(0, 0, 5)


@pytest.mark.parametrize("bits", [8, 16, 32])
@pytest.mark.parametrize("shape, warps", [((64, 64), (4, 1)), ((128, 128), (8, 1)), ((128, 64), (4, 2))])
def test_register_a_words_are_the_ptx_fragment(bits, shape, warps):
    m, k = shape[0], 128
    acc_layout = wgmma_accumulator((m, shape[1]), warps, shape[1] // warps[1])
    acc = plan_accumulator(acc_layout, (m, shape[1]))
    layout = dot_operand((m, k), warps, 0, 32 // bits, 3)
    words = plan_register_a(layout, bits, acc, k)
    k_instr = instruction_k(bits)
    for group in range(acc.num_warpgroups):
        gm = acc.warpgroup_origin(group)[0]
        for (m0, step), groups in words.items():
            for warp in range(4):
                for lane in (0, 5, 17, 31):
                    flat = [r for g in groups for r in g]
                    for i, r in enumerate(flat):
                        row, col = ptx_operand_a(warp, lane, i, bits)
                        got = layout(register=r, lane=lane, warp=4 * group + warp, block=0)
                        assert got == (gm + m0 + row, step * k_instr + col)
    assert operand_a_position(9, 8) == ptx_operand_a(0, 0, 9, 8)


def test_accumulator_refusals():
    with pytest.raises(WgmmaError, match="multiple of 64"):
        plan_accumulator(wgmma_accumulator((64, 64), (4, 1), 64), (32, 64))
    with pytest.raises(WgmmaError, match="not the wgmma accumulator fragment"):
        plan_accumulator(blocked((64, 64), (1, 4), (4, 8), (4, 1), (1, 0)), (64, 64))
    with pytest.raises(WgmmaError, match="whole"):
        plan_accumulator(blocked((64, 64), (1, 4), (4, 8), (2, 1), (1, 0)), (64, 64))
    acc = plan_accumulator(wgmma_accumulator((64, 64), (4, 1), 64), (64, 64))
    with pytest.raises(WgmmaError, match="register A"):
        plan_register_a(blocked((64, 64), (1, 2), (8, 4), (4, 1), (1, 0)), 16, acc, 64)
