"""`desc.shape` and `desc.strides` of a tensor descriptor argument inside the kernel: run-time
scalars the kernel takes as hidden parameters after the caller's, filled in from the
descriptor by the emulator, the launcher and prepared launches."""

import struct
import sys

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.lowlevel import fence_async_shared, mbarrier, tma
from weft.runtime.cache import decode_kernel, encode_kernel

ROWS = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])


@ll.jit
def row_sums(desc, out_ptr):
    """Each row's sum, walking the whole tensor box by box: the bounds come from the
    descriptor alone."""
    BM: ll.constexpr = desc.block_shape[0]
    BN: ll.constexpr = desc.block_shape[1]
    tile = ll.allocate_shared_memory(desc.dtype, desc.block_shape, desc.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    rows = ll.arange(0, BM, ll.SliceLayout(1, ROWS))
    phase = 0
    for r in range(ll.program_id(0) * BM, desc.shape[0], ll.num_programs(0) * BM):
        acc = ll.zeros([BM], ll.float32, ll.SliceLayout(1, ROWS))
        for c in range(0, desc.shape[1], BN):
            mbarrier.expect(bar, desc.nbytes)
            tma.async_copy_global_to_shared(desc, [r, c], bar, tile)
            mbarrier.wait(bar, phase)
            phase ^= 1
            acc += ll.sum(tile.load(ROWS).to(ll.float32), 1)
            fence_async_shared()  # the reads before the next copy overwrites the tile
        ll.store(out_ptr + r + rows, acc, mask=r + rows < desc.shape[0])
    mbarrier.invalidate(bar)


@ll.jit
def shape_and_strides(desc, out_ptr):
    ll.store(out_ptr, desc.shape[0].to(ll.int64))
    ll.store(out_ptr + 1, desc.shape[2].to(ll.int64))
    ll.store(out_ptr + 2, desc.strides[0])
    ll.store(out_ptr + 3, desc.strides[1])


def _padded(rng, rows, cols, pad_to=8):
    """A float16 [rows, cols] view into rows padded to a multiple of 16 bytes (TMA strides)."""
    width = -(-cols // pad_to) * pad_to
    return rng.standard_normal((rows, width)).astype(np.float16)[:, :cols]


@pytest.mark.parametrize("rows, cols, block, grid", [(100, 90, [16, 64], 1), (37, 200, [32, 64], 2),
                                                     (5, 13, [8, 128], 3)])
def test_a_kernel_walks_the_whole_tensor_from_desc_shape(rows, cols, block, grid):
    x = _padded(np.random.default_rng(rows), rows, cols)
    out = np.zeros(rows + block[0], np.float32)
    row_sums[(grid,)](ll.TensorDescriptor.from_tensor(x, block), out)
    np.testing.assert_allclose(out[:rows], x.astype(np.float64).sum(1), rtol=1e-3, atol=1e-3)
    assert not out[rows:].any()


def test_strides_are_in_elements_and_64_bit():
    x = np.zeros((6, 5, 24), np.float16)[:, 1:4, :16]
    out = np.zeros(4, np.int64)
    shape_and_strides[(1,)](ll.TensorDescriptor.from_tensor(x, [2, 2, 8]), out)
    assert out.tolist() == [6, 16, 5 * 24, 24]


def _compile(fn, box="tensordesc<fp16[16,64],swizzle=128>", out="*fp32"):
    return fn.compile(signature={"desc": box, "out_ptr": out}, num_warps=4)


def test_only_the_fields_read_become_hidden_parameters():
    compiled = _compile(row_sums)
    assert [(p.name, p.type, p.hidden) for p in compiled.params[2:]] == [
        ("desc.shape[0]", "i32", ("desc", "shape", 0)), ("desc.shape[1]", "i32", ("desc", "shape", 1))]
    assert decode_kernel(encode_kernel(compiled)).params == compiled.params  # the disk cache keeps them
    assert compiled.asm["ptx"].count(".param .u32 row_sums_param_") == 2
    strided = _compile(shape_and_strides, "tensordesc<fp16[2,2,8]>", "*i64")
    assert [p.name for p in strided.params[2:]] == ["desc.shape[0]", "desc.shape[2]", "desc.strides[0]",
                                                    "desc.strides[1]"]
    assert [p.type for p in strided.params[2:]] == ["i32", "i32", "i64", "i64"]


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_the_shape_reading_kernel_assembles():
    assert _compile(row_sums).asm["cubin"]


def test_the_launcher_and_prepared_launches_pass_the_shape():
    """On a stand-in GPU (tests/kernels/fake_gpu.py): the launch packs the caller's
    arguments, then the descriptor's shape."""
    pytest.importorskip("torch")
    import torch

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "kernels"))
    from fake_gpu import fake_gpu

    x = torch.zeros((100, 96), dtype=torch.float16)[:, :90]
    out = torch.zeros(128, dtype=torch.float32)
    with fake_gpu() as fake:
        desc = ll.TensorDescriptor.from_tensor(x, [16, 64])
        row_sums[(2,)](desc, out)
        params = fake.launches[-1]["params"]
        assert params[0] == desc.tensor_map and params[2:] == [struct.pack("<i", 100), struct.pack("<i", 90)]
        prepared = row_sums.prepare((2,), desc, out)
        assert prepared.packed()[2:] == [struct.pack("<i", 100), struct.pack("<i", 90)]
        prepared.holder("desc")  # the descriptor's holder is still found by name (rebinding outputs)
        assert prepared.holder("desc") is not None


@pytest.mark.gpu
def test_desc_shape_on_the_gpu():
    torch = pytest.importorskip("torch")
    x = torch.randn((300, 200), dtype=torch.float16, device="cuda")[:, :190]
    out = torch.zeros(300 + 16, dtype=torch.float32, device="cuda")
    row_sums[(4,)](ll.TensorDescriptor.from_tensor(x, [16, 64]), out)
    expected = x.double().sum(1).cpu().numpy()
    np.testing.assert_allclose(out[:300].cpu().numpy(), expected, rtol=1e-3, atol=1e-2)


# ------------------------------------------------------------------ inside warp_specialize
WARPGROUP = ll.BlockedLayout([1], [32], [4], [0])


@ll.jit
def rows_partition(desc, out_ptr):
    ll.store(out_ptr + ll.arange(0, 128, WARPGROUP), ll.full([128], 0, ll.int32, WARPGROUP) + desc.shape[0])


@ll.jit
def cols_partition(desc, out_ptr):
    ll.store(out_ptr + 128 + ll.arange(0, 128, WARPGROUP), ll.full([128], 0, ll.int32, WARPGROUP) + desc.shape[1])


@ll.jit
def shape_in_partitions(desc, out_ptr):
    ll.warp_specialize((desc, out_ptr), rows_partition, (desc, out_ptr), [cols_partition], [4], [40])


def test_partitions_read_the_shape_of_the_descriptor_they_were_handed():
    out = np.zeros(256, np.int32)
    shape_in_partitions[(1,)](ll.TensorDescriptor.from_tensor(np.zeros((40, 24), np.float16), [8, 16]), out)
    assert (out[:128] == 40).all() and (out[128:] == 24).all()
    compiled = shape_in_partitions.compile(signature={"desc": "tensordesc<fp16[8,16]>", "out_ptr": "*i32"})
    assert [p.name for p in compiled.params] == ["desc", "out_ptr", "desc.shape[0]", "desc.shape[1]"]
    assert ptxas.find_ptxas() is None or compiled.asm["cubin"]
