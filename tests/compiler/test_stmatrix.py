"""16-bit tensors in MMA fragments stored to shared memory by stmatrix (compiler/mma.py's
stmatrix_groups, lower_shared.store_tensor): against a model of stmatrix, every register
is stored once, at its element's offset, over accumulator and operand layouts, shared
swizzles and warps; the PTX uses it where it can and 32-bit stores elsewhere; on the GPU
(and the emulator, which runs the same kernel) the values land where they belong."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weft import lowlevel as ll
from weft.compiler.backend.indexing import addressing_of, offset_map
from weft.compiler.mma import stmatrix_groups
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(7)


def _offset(layout, register: int, lane: int, warp: int) -> int:
    return layout(register=register, lane=lane, warp=warp, block=0)[0]


def _stored_by_stmatrix(addresses, words, warp: int, xor: int) -> dict:
    """Element offset -> (lane, register) each lane's words land at under stmatrix.x4: lane
    i gives the address of row i % 8 of matrix i // 8, and lane l's word w goes to row
    l // 4 of matrix w, elements 2 (l % 4) and 2 (l % 4) + 1."""
    rows = [_offset(addresses, words[0][0], lane, warp) ^ xor for lane in range(32)]
    placed = {}
    for lane in range(32):
        for w, pair in enumerate(words):
            row = rows[8 * w + lane // 4]
            for e, register in enumerate(pair):
                placed[row + 2 * (lane % 4) + e] = (lane, register)
    return placed


def _register_layout(kind: str, cols: int, warps: int):
    if kind == "wgmma":  # warpgroup accumulators, instruction N = cols
        return ll.NVMMADistributedLayout([3, 0], [warps, 1], [16, cols, 16])
    acc = ll.NVMMADistributedLayout([2, 0], [warps, 1], [16, 8])
    return acc if kind == "mma" else ll.DotOperandLayout(0, acc, 2)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["wgmma", "mma", "operand"]), swizzle=st.sampled_from([0, 32, 64, 128]),
       warps=st.sampled_from([1, 2, 4, 8]), cols=st.sampled_from([16, 32, 64, 128, 256]),
       xor_rows=st.integers(0, 3))
def test_stmatrix_groups_store_every_register_at_its_offset(kind, swizzle, warps, cols, xor_rows):
    if kind == "wgmma":
        warps = max(4, warps)  # whole warpgroups
    rows = 16 * warps
    swizzle = min(swizzle, 2 * cols)  # a swizzle row fits in a row of the buffer
    shared = ll.NVMMASharedLayout(swizzle, 16) if swizzle else ll.SwizzledSharedLayout(1, 1, 1, [1, 0])
    tensor = _register_layout(kind, cols, warps).to_linear((rows, cols))
    offsets = offset_map(tensor, addressing_of(shared.to_linear((rows, cols))))
    count = 1 << len(tensor.bases["register"])
    xor = xor_rows * 8 * cols  # a view whole swizzle periods into its buffer
    groups = stmatrix_groups(offsets, count, xor)
    assert groups is not None, (kind, swizzle, warps, cols)
    assert sorted(r for words, _ in groups for pair in words for r in pair) == list(range(count))
    for warp in range(warps):
        held = {_offset(offsets, r, lane, warp) ^ xor: (lane, r) for lane in range(32) for r in range(count)}
        placed = {}
        for words, addresses in groups:
            placed.update(_stored_by_stmatrix(addresses, words, warp, xor))
        assert placed == held


def test_what_stmatrix_cannot_store_is_refused():
    swizzled = addressing_of(ll.NVMMASharedLayout(128, 16).to_linear((64, 64)))
    offsets = offset_map(_register_layout("wgmma", 64, 4).to_linear((64, 64)), swizzled)
    assert stmatrix_groups(offsets, 32) is not None
    assert stmatrix_groups(offsets, 32, element_bytes=4) is None  # 32-bit elements
    assert stmatrix_groups(offsets, 32, align=8) is None  # rows not 16-byte aligned
    assert stmatrix_groups(offsets, 32, xor=4) is None  # a view 4 elements into a row
    assert stmatrix_groups(offsets, 4) is None  # fewer registers than one stmatrix.x4 stores
    single = ll.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0]).to_linear((64, 64))
    assert stmatrix_groups(offset_map(single, swizzled), 32) is None  # no adjacent pairs


@ll.jit
def round_trip(x_ptr, out_ptr, ROWS: ll.constexpr, COLS: ll.constexpr, KIND: ll.constexpr):
    """x in REG (a wgmma accumulator's layout, or a blocked one), cast to 16 bits, stored
    to a 128-byte-swizzled buffer, read back in a blocked layout."""
    REG: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, COLS, 16])
    if KIND == "blocked":  # one element a register: 16-bit stores
        REG = ll.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0])
    OUT: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, REG))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, REG))
    x = ll.load(x_ptr + rows[:, None] * COLS + cols[None, :])
    smem = ll.allocate_shared_memory(out_ptr.dtype.element_ty, [ROWS, COLS], ll.NVMMASharedLayout(128, 16))
    smem.store(x.to(out_ptr.dtype.element_ty))
    ll.barrier()
    out_rows = ll.arange(0, ROWS, ll.SliceLayout(1, OUT))
    out_cols = ll.arange(0, COLS, ll.SliceLayout(0, OUT))
    ll.store(out_ptr + out_rows[:, None] * COLS + out_cols[None, :], smem.load(OUT))


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_accumulator_stores_by_stmatrix_in_the_ptx():
    signature = {"x_ptr": "*fp32", "out_ptr": "*bf16"}
    ptx = round_trip.compile(signature=signature, constexprs=dict(ROWS=64, COLS=128, KIND="wgmma"),
                             num_warps=4).asm["ptx"]
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == 64 * 128 // 128 // 8  # 8 elements each
    assert "st.shared.b32" not in ptx
    ptx = round_trip.compile(signature=signature, constexprs=dict(ROWS=64, COLS=128, KIND="blocked"),
                             num_warps=4).asm["ptx"]
    assert "stmatrix" not in ptx and "st.shared.b16" in ptx


@pytest.mark.parametrize("kind", ["wgmma", "blocked"])
def test_emulated_round_trip(kind):
    x = RNG.standard_normal((64, 128)).astype(np.float32)
    out = np.zeros((64, 128), np.float16)
    round_trip[(1,)](x, out, ROWS=64, COLS=128, KIND=kind, num_warps=4)
    np.testing.assert_array_equal(out, x.astype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [64, 128, 256])
@pytest.mark.parametrize("kind", ["wgmma", "blocked"])
def test_gpu_round_trip(kind, cols):
    torch = pytest.importorskip("torch")
    x = torch.randn((64, cols), device="cuda")
    for dtype in (torch.bfloat16, torch.float16):
        out = torch.zeros((64, cols), device="cuda", dtype=dtype)
        round_trip[(1,)](x, out, ROWS=64, COLS=cols, KIND=kind, num_warps=4)
        torch.testing.assert_close(out, x.to(dtype), rtol=0, atol=0)
