"""tma.async_reduce_add: a shared box added into global memory by the TMA unit
(cp.reduce.async.bulk.tensor .add), a bulk group as a TMA store. Boxes of several CTAs
overlap, the tensor's edges cut the last ones, and fp32 boxes of 64 columns are two
swizzle rows wide (two strips, one group)."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.lowlevel import fence_async_shared, tma
from weft.runtime.emulator import EmulationError

ROWS = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
BLOCK = [64, 64]


@ll.jit
def add_tiles(desc, tiles_ptr, REPEATS: ll.constexpr, WAIT: ll.constexpr = True):
    """CTA i adds REPEATS tiles (tiles_ptr's [grid * REPEATS, BM, BN], in order) into the
    box at row i * BM / 2: each box overlaps its neighbours' by half."""
    BM: ll.constexpr = desc.block_shape[0]
    BN: ll.constexpr = desc.block_shape[1]
    smem = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    rows = ll.arange(0, BM, ll.SliceLayout(1, ROWS))
    cols = ll.arange(0, BN, ll.SliceLayout(0, ROWS))
    for r in range(REPEATS):
        tile = (ll.program_id(0) * REPEATS + r) * BM
        values = ll.load(tiles_ptr + (tile + rows[:, None]) * BN + cols[None, :])
        if WAIT:
            tma.store_wait(0)  # the previous add has read smem
        smem.store(values)
        fence_async_shared()
        tma.async_reduce_add(desc, [ll.program_id(0) * (BM // 2), 0], smem)
    tma.store_wait(0)


def _descriptor(x):
    return ll.TensorDescriptor.from_tensor(x, BLOCK, ll.NVMMASharedLayout.get_default_for(BLOCK, ll.float32))


def _expected(start, tiles, ctas, repeats):
    """start + every CTA's tiles at its box, in float64, cut to start's shape."""
    total = np.zeros((ctas * BLOCK[0] // 2 + BLOCK[0], BLOCK[1]))
    for i in range(ctas):
        row = i * BLOCK[0] // 2
        total[row:row + BLOCK[0]] += tiles[i * repeats:(i + 1) * repeats].sum(axis=0)
    return start + total[:start.shape[0], :start.shape[1]]


def _case(seed, ctas=3, repeats=2):
    rng = np.random.default_rng(seed)
    # Rows and columns that cut the last boxes (columns: a 16-byte multiple of fp32).
    start = rng.standard_normal(((ctas + 1) * BLOCK[0] // 2 - 5, BLOCK[1] - 12)).astype(np.float32)
    tiles = rng.standard_normal((ctas * repeats, *BLOCK)).astype(np.float32)
    return start, tiles


def test_overlapping_boxes_add_up_as_numpy_adds_them():
    start, tiles = _case(0)
    out = start.copy()
    add_tiles[(3,)](_descriptor(out), tiles, REPEATS=2)
    np.testing.assert_allclose(out, _expected(start.astype(np.float64), tiles, 3, 2), rtol=1e-5, atol=1e-5)


def test_rewriting_the_source_before_store_wait_is_a_race():
    start, tiles = _case(1, ctas=1)
    with pytest.raises(EmulationError, match="TMA reduce-add is still reading") as info:
        add_tiles[(1,)](_descriptor(start.copy()), tiles, REPEATS=2, WAIT=False)
    assert "smem.store(values)" in str(info.value) and "tma.store_wait" in str(info.value)


@ll.jit
def add_then_read(desc, out_ptr):
    """Adds ones into the box at [0, 0], then reads it back by plain loads in the same
    launch: the sums are not there yet."""
    BM: ll.constexpr = desc.block_shape[0]
    BN: ll.constexpr = desc.block_shape[1]
    smem = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout,
                                     ll.full([BM, BN], 1.0, ll.float32, ROWS))
    fence_async_shared()
    tma.async_reduce_add(desc, [0, 0], smem)
    tma.store_wait(0)
    rows = ll.arange(0, BM, ll.SliceLayout(1, ROWS))
    cols = ll.arange(0, BN, ll.SliceLayout(0, ROWS))
    ll.store(out_ptr + rows[:, None] * BN + cols[None, :], ll.load(out_ptr + rows[:, None] * BN + cols[None, :]))


def test_reading_the_target_in_the_launch_that_adds_into_it_is_a_race():
    out = np.zeros(BLOCK, np.float32)
    with pytest.raises(EmulationError, match="a load of global memory that a TMA reduce-add of this launch adds "
                                             "into") as info:
        add_then_read[(1,)](_descriptor(out), out)
    assert "ll.load(out_ptr" in str(info.value) and "in a later launch" in str(info.value)


@ll.jit
def add_fp16(desc):
    smem = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    tma.async_reduce_add(desc, [0, 0], smem)


def test_an_element_type_the_unit_cannot_add_is_refused_at_the_call():
    x = np.zeros((64, 64), np.int8)
    desc = ll.TensorDescriptor.from_tensor(x, [64, 64], ll.NVMMASharedLayout.get_default_for([64, 64], ll.int8))
    with pytest.raises(Exception, match="TMA adds elements of fp32") as info:
        add_fp16[(1,)](desc)
    assert "tma.async_reduce_add(desc, [0, 0], smem)" in str(info.value)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_a_reduce_add_compiles_to_one_instruction_a_strip_and_one_group_a_box():
    box = "tensordesc<fp32[64,64],swizzle=128>"
    compiled = add_tiles.compile(signature={"desc": box, "tiles_ptr": "*fp32"}, constexprs={"REPEATS": 2},
                                 num_warps=4)
    ptx = compiled.asm["ptx"]
    assert ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group") == 2
    assert ptx.count("cp.async.bulk.commit_group") == 1
    assert "cp.async.bulk.wait_group.read 0" in ptx
    assert compiled.asm["cubin"] and compiled.metadata["spill_stores"] == 0


@pytest.mark.gpu
def test_overlapping_boxes_add_up_on_the_gpu():
    import torch

    start, tiles = _case(2, ctas=5, repeats=3)
    out = torch.tensor(start, device="cuda")
    add_tiles[(5,)](_descriptor(out), torch.tensor(tiles, device="cuda"), REPEATS=3)
    np.testing.assert_allclose(out.cpu().numpy(), _expected(start.astype(np.float64), tiles, 5, 3),
                               rtol=1e-5, atol=1e-5)
