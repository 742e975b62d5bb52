"""compiler/mma.py's ldmatrix_addresses against a model of ldmatrix: over shared layouts
(128-, 64-, 32-byte swizzles and none), operand shapes and warps, the row addresses it
gives every lane load exactly the elements each lane's mma.sync words hold; what
ldmatrix cannot load is refused."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft import lowlevel as ll
from weft.compiler.backend.indexing import addressing_of, offset_map
from weft.compiler.mma import ldmatrix_addresses, plan_mma_v2
from weft.layouts import LinearLayout

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def _offsets(layout: LinearLayout, register: int, lane: int, warp: int) -> int:
    return layout(register=register, lane=lane, warp=warp, block=0)[0]


def _ldmatrix_model(addresses: LinearLayout, first: int, count: int, warp: int, xor: int) -> np.ndarray:
    """What ldmatrix.x{count} hands each lane: [lane, word, element] element offsets, from
    the row address lane i gives (row i % 8 of matrix i // 8)."""
    rows = [_offsets(addresses, first, lane, warp) ^ xor for lane in range(8 * count)]
    out = np.empty((32, count, 2), np.int64)
    for lane in range(32):
        for word in range(count):
            row = rows[8 * word + lane // 4]
            out[lane, word] = (row + 2 * (lane % 4), row + 2 * (lane % 4) + 1)
    return out


def _operand_offsets(operand: str, m: int, n: int, k: int, warps: tuple[int, int], swizzle: int):
    acc = ll.NVMMADistributedLayout([2, 0], list(warps), [16, 8])
    register_layout = ll.DotOperandLayout(0 if operand == "a" else 1, acc, 2)
    if operand == "a":  # [M, K], K contiguous
        shape, stored = (m, k), (m, k)
    else:  # B = K^T: a [N, K] buffer, K contiguous, viewed transposed
        shape, stored = (k, n), (n, k)
    swizzle = min(swizzle, 2 * k)  # a swizzle row fits in the contiguous K
    shared = ll.NVMMASharedLayout(swizzle, 16) if swizzle else ll.SwizzledSharedLayout(1, 1, 1, [1, 0])
    addressing = addressing_of(shared.to_linear(stored))
    if operand == "b":
        bases = addressing.bases
        addressing = LinearLayout({"dim0": bases["dim1"], "dim1": bases["dim0"]}, addressing.out_dims)
    tensor = register_layout.to_linear(shape)
    plan = plan_mma_v2(acc.to_linear((m, n)), *(
        (tensor, ll.DotOperandLayout(1, acc, 2).to_linear((k, n))) if operand == "a" else
        (ll.DotOperandLayout(0, acc, 2).to_linear((m, k)), tensor)))
    return offset_map(tensor, addressing), plan


@settings(max_examples=30 if DEEP else 10, deadline=None)
@given(operand=st.sampled_from(["a", "b"]), swizzle=st.sampled_from([0, 32, 64, 128]),
       m_tiles=st.integers(0, 2), n_tiles=st.integers(0, 3), k_tiles=st.integers(0, 3),
       warps=st.sampled_from([(1, 1), (2, 1), (4, 1), (2, 2), (1, 4)]), xor_rows=st.integers(0, 3))
def test_ldmatrix_rows_load_each_lanes_words(operand, swizzle, m_tiles, n_tiles, k_tiles, warps, xor_rows):
    m, n, k = 16 * warps[0] << m_tiles, 8 * warps[1] << n_tiles, 16 << k_tiles
    offsets, plan = _operand_offsets(operand, m, n, k, warps, swizzle)
    xor = 8 * xor_rows * (1 << 6)  # whole rows further in: a view's XOR keeps 16-byte rows
    for i, instr in enumerate(plan):
        words = instr.a if operand == "a" else instr.b
        # B: one word, an instruction's two, or two instructions' (x4, as lower_mma_v2 pairs them)
        groups = [words] if operand == "a" else [words[:1], words]
        if operand == "b" and i + 1 < len(plan) and plan[i + 1].b != words:
            groups.append(words + plan[i + 1].b)
        for group in groups:
            addresses = ldmatrix_addresses(offsets, tuple(group), xor)
            assert addresses is not None, (operand, swizzle, group)
            for warp in range(warps[0] * warps[1]):
                loaded = _ldmatrix_model(addresses, group[0][0], len(group), warp, xor)
                held = np.array([[[_offsets(offsets, r, lane, warp) ^ xor for r in pair] for pair in group]
                                 for lane in range(32)])
                np.testing.assert_array_equal(loaded, held)


def test_what_ldmatrix_cannot_load_is_refused():
    offsets, plan = _operand_offsets("a", 64, 64, 64, (4, 1), 128)
    words = plan[0].a
    assert ldmatrix_addresses(offsets, words) is not None
    assert ldmatrix_addresses(offsets, words, align=8) is None  # rows not 16-byte aligned
    assert ldmatrix_addresses(offsets, words, xor=4) is None  # a view 4 elements in
    assert ldmatrix_addresses(offsets, words, element_bytes=4) is None  # 32-bit elements
    assert ldmatrix_addresses(offsets, words[:3]) is None  # x3 does not exist
    assert ldmatrix_addresses(offsets, (words[0], words[2], words[1], words[3])) is not None
    assert ldmatrix_addresses(offsets, (words[0], words[1], words[2], words[2])) is None  # not linear
    # B stored [K, N] (N contiguous): a word's two elements are rows apart, not adjacent.
    acc = ll.NVMMADistributedLayout([2, 0], [4, 1], [16, 8])
    b = ll.DotOperandLayout(1, acc, 2).to_linear((64, 64))
    b_offsets = offset_map(b, addressing_of(ll.NVMMASharedLayout(128, 16).to_linear((64, 64))))
    b_plan = plan_mma_v2(acc.to_linear((64, 64)), ll.DotOperandLayout(0, acc, 2).to_linear((64, 64)), b)
    assert ldmatrix_addresses(b_offsets, b_plan[0].b) is None
