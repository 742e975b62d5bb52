"""TMA boxes whose inner dim spans several swizzle rows (a [128, 128] fp16 box with the
128-byte swizzle: 256 bytes a row): moved as one copy per row-wide column strip, each
strip landing where the NVMMA layout puts those columns, and awaited as one box."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.compiler.types import parse_signature_type
from weft.lowlevel import fence_async_shared, mbarrier, tma

ROWS = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])


@ll.jit
def copy_tiles(in_desc, out_desc, check_ptr, n_tiles):
    """Every tile of the tensor in by TMA, read back through registers (to `check`) and out
    by TMA from a second buffer that was written by a register store."""
    BM: ll.constexpr = in_desc.block_shape[0]
    BN: ll.constexpr = in_desc.block_shape[1]
    tile = ll.allocate_shared_memory(in_desc.dtype, in_desc.block_shape, in_desc.layout)
    out = ll.allocate_shared_memory(out_desc.dtype, out_desc.block_shape, out_desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    rows = ll.arange(0, BM, ll.SliceLayout(1, ROWS))
    cols = ll.arange(0, BN, ll.SliceLayout(0, ROWS))
    for t in range(n_tiles):
        row = ll.program_id(0) * BM
        col = t * BN
        mbarrier.expect(bar, in_desc.nbytes)
        tma.async_copy_global_to_shared(in_desc, [row, col], bar, tile)
        mbarrier.wait(bar, t & 1)
        values = tile.load(ROWS)
        ll.store(check_ptr + (row + rows)[:, None] * (n_tiles * BN) + col + cols[None, :], values)
        tma.store_wait(0)
        out.store(values + values)
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [row, col], out)
    tma.store_wait(0)
    mbarrier.invalidate(bar)


def _descriptor(x, block):
    return ll.TensorDescriptor.from_tensor(x, block, ll.NVMMASharedLayout.get_default_for(block, ll.float16))


@pytest.mark.parametrize("block", [[128, 128], [16, 256], [8, 128]])
def test_a_wide_box_lands_as_numpy_reads_it(block):
    """Inner dims of 2, 4 and 2 swizzle rows; the tensor's edges cut the last tiles (a
    box at the edge loads zeros and stores only what is inside)."""
    rng = np.random.default_rng(0)
    rows, tiles = 2 * block[0] - 3, 2
    x = rng.standard_normal((rows, tiles * block[1] - 24)).astype(np.float16)
    x_padded = np.zeros((2 * block[0], tiles * block[1]), np.float16)
    x_padded[:rows, :x.shape[1]] = x
    check = np.zeros_like(x_padded)
    out = np.zeros_like(x)
    copy_tiles[(2,)](_descriptor(x, block), _descriptor(out, block), check, tiles)
    np.testing.assert_array_equal(check, x_padded)
    np.testing.assert_array_equal(out, x + x)


def test_the_box_is_copied_one_swizzle_row_at_a_time():
    type_ = parse_signature_type("tensordesc<fp16[128,128],swizzle=128>")
    assert (type_.copies, type_.copy_box, type_.strip_bytes, type_.box_bytes) == (2, (128, 64), 16384, 32768)
    desc = _descriptor(np.zeros((256, 256), np.float16), [128, 128])
    assert desc.type == type_ and desc.signature == "tensordesc<fp16[128,128],swizzle=128>"


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
@pytest.mark.parametrize("block, strips", [("128,128", 2), ("16,256", 4)])
def test_a_wide_box_compiles_to_one_copy_per_strip(block, strips):
    box = f"tensordesc<fp16[{block}],swizzle=128>"
    compiled = copy_tiles.compile(signature={"in_desc": box, "out_desc": box, "check_ptr": "*fp16",
                                             "n_tiles": "i32"}, num_warps=4)
    ptx = compiled.asm["ptx"]
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") == strips
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == strips
    assert ptx.count("cp.async.bulk.commit_group") == 1  # store_wait counts whole boxes
    assert compiled.asm["cubin"] and compiled.metadata["spill_stores"] == 0


# ------------------------------------------------------------------ wgmma on wide boxes
@ll.jit
def matmul_wide_k(a_desc, b_desc, c_ptr, M, N, K):
    """C = A @ B with BLOCK_K = 128: A's [64, 128] and B's [128, 128] boxes are both wider
    than the 128-byte swizzle row."""
    BM: ll.constexpr = a_desc.block_shape[0]
    BK: ll.constexpr = a_desc.block_shape[1]
    BN: ll.constexpr = b_desc.block_shape[1]
    acc_layout: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, BN, 16])
    a = ll.allocate_shared_memory(a_desc.dtype, a_desc.block_shape, a_desc.layout)
    b = ll.allocate_shared_memory(b_desc.dtype, b_desc.block_shape, b_desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    off_m = ll.program_id(0) * BM
    off_n = ll.program_id(1) * BN
    acc = ll.zeros([BM, BN], ll.float32, acc_layout)
    phase = 0
    for k in range(0, K, BK):
        mbarrier.expect(bar, a_desc.nbytes + b_desc.nbytes)
        tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a)
        tma.async_copy_global_to_shared(b_desc, [k, off_n], bar, b)
        mbarrier.wait(bar, phase)
        phase ^= 1
        acc = ll.warpgroup_mma(a, b, acc, is_async=True)
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
    mbarrier.invalidate(bar)
    rows = off_m + ll.arange(0, BM, ll.SliceLayout(1, acc_layout))
    cols = off_n + ll.arange(0, BN, ll.SliceLayout(0, acc_layout))
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    ll.store(c_ptr + rows[:, None] * N + cols[None, :], acc, mask=mask)


def _matmul_wide_k(a, b):
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    grid = (-(-a.shape[0] // 64), -(-b.shape[1] // 128))
    matmul_wide_k[grid](_descriptor(a, [64, 128]), _descriptor(b, [128, 128]), c, *c.shape, a.shape[1])
    return c


def test_wgmma_reads_wide_boxes_as_numpy_does():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((72, 200)).astype(np.float16)  # K and N cut the last boxes
    b = rng.standard_normal((200, 136)).astype(np.float16)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(_matmul_wide_k(a, b), expected, rtol=1e-3, atol=1e-2)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_the_wide_k_matmul_compiles_without_spills():
    compiled = matmul_wide_k.compile(signature={"a_desc": "tensordesc<fp16[64,128],swizzle=128>",
                                                "b_desc": "tensordesc<fp16[128,128],swizzle=128>",
                                                "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"}, num_warps=4)
    assert compiled.asm["ptx"].count("cp.async.bulk.tensor.2d.shared::cluster.global") == 4
    assert compiled.metadata["spill_stores"] == 0


@pytest.mark.gpu
def test_wide_boxes_on_the_gpu():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    a = rng.standard_normal((200, 384)).astype(np.float16)
    b = rng.standard_normal((384, 264)).astype(np.float16)
    c = torch.zeros((200, 264), dtype=torch.float32, device="cuda")
    a_t, b_t = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    matmul_wide_k[(4, 3)](_descriptor(a_t, [64, 128]), _descriptor(b_t, [128, 128]), c, 200, 264, 384)
    np.testing.assert_allclose(c.cpu().numpy(), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-2)
    x = torch.from_numpy(rng.standard_normal((253, 232)).astype(np.float16)).cuda()
    out = torch.zeros_like(x)
    check = torch.zeros((256, 256), dtype=torch.float16, device="cuda")
    copy_tiles[(2,)](_descriptor(x, [128, 128]), _descriptor(out, [128, 128]), check, 2)
    torch.cuda.synchronize()
    assert torch.equal(check[:253, :232], x) and not check[253:].any() and not check[:, 232:].any()
    assert torch.equal(out, x + x)
