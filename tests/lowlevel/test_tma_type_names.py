"""Gluon's type names under the `tma` module: an aggregate annotates its descriptor fields
`tma.tensor_descriptor` (Gluon tutorial 08's Hopper matmul does), carries descriptors and a
buffer to helpers, and the copy it drives lands on the emulator as numpy says. (No
`from __future__ import annotations` here: the annotations are evaluated when the class is
made, as in the tutorial.)"""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.lowlevel import mbarrier, tma

RNG = np.random.default_rng(3908)
BOX = [32, 64]


@ll.aggregate
class CopyArgs:
    """What a helper needs to move one box: both descriptors and the staging buffer."""
    src: tma.tensor_descriptor
    dst: tma.tensor_descriptor
    smem: ll.shared_memory_descriptor


@ll.jit
def move_box(args: CopyArgs, row, col):
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, args.src.block_type.nbytes)
    tma.async_copy_global_to_shared(args.src, [row, col], bar, args.smem)
    mbarrier.wait(bar, 0)
    mbarrier.invalidate(bar)
    tma.async_copy_shared_to_global(args.dst, [row, col], args.smem)
    tma.store_wait(0)


@ll.jit
def copy_boxes(src, dst):
    smem = ll.allocate_shared_memory(src.dtype, src.block_type.shape, src.layout)
    args = CopyArgs(src, dst, smem)
    move_box(args, ll.program_id(0) * src.block_type.shape[0], ll.program_id(1) * src.block_type.shape[1])


def test_tma_names_the_descriptor_type():
    assert tma.tensor_descriptor is ll.tensor_descriptor
    assert "tensor_descriptor" in tma.__all__


@pytest.mark.parametrize("shape", [(64, 128), (70, 100)])
def test_aggregate_with_tma_tensor_descriptor_fields_copies(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    y = np.full_like(x, np.nan)
    layout = ll.NVMMASharedLayout.get_default_for(BOX, ll.float32)
    grid = (-(-shape[0] // BOX[0]), -(-shape[1] // BOX[1]))
    copy_boxes[grid](ll.TensorDescriptor.from_tensor(x, BOX, layout),
                     ll.TensorDescriptor.from_tensor(y, BOX, layout))
    np.testing.assert_array_equal(y, x)
