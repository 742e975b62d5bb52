"""layouts/transpose_copy.py: the register layouts that copy an 8-bit [K, N] box (N
contiguous) into the K-major buffer wgmma reads, checked by brute force against the
algebra: every element read and written exactly once, 32-bit words both ways, and no bank
conflicts where both buffers have 128-byte rows."""

import pytest

from weft.layouts import NVMMASharedLayout, bank_conflicts, vector_width
from weft.layouts.transpose_copy import transpose_copy_layouts


def buffers(shape):
    source = NVMMASharedLayout.get_default_for(shape, 8).to_linear(shape)
    target = NVMMASharedLayout.get_default_for(shape, 8, transposed=True).to_linear(shape)
    return source, target


# Extra wavefronts of the read and the write together: none with 128-byte rows both ways;
# with 64-byte rows a row's parity (a register bit of the block) picks bank bit 4.
@pytest.mark.parametrize("shape, num_warps, extra", [((64, 64), 4, 2), ((128, 128), 8, 0), ((128, 256), 8, 0),
                                                     ((64, 256), 4, 1), ((32, 64), 4, 4)])
def test_blocks_read_and_written_in_words(shape, num_warps, extra):
    source, target = buffers(shape)
    read, write = transpose_copy_layouts(source, target, shape, 8, num_warps)
    threads = 32 * num_warps
    for layout in (read, write):
        assert layout.is_invertible() and layout.in_dim_size("warp") == num_warps
        assert layout.in_dim_size("register") * threads == shape[0] * shape[1]
        assert layout.bases["lane"] == read.bases["lane"] and layout.bases["warp"] == read.bases["warp"]
    assert vector_width(read, source, 8) == 4 and vector_width(write, target, 8) == 4
    assert bank_conflicts(read, source, 8) + bank_conflicts(write, target, 8) == extra


def test_none_when_both_buffers_are_contiguous_along_the_same_dim_or_the_tile_is_too_small():
    source, _ = buffers((64, 64))
    assert transpose_copy_layouts(source, source, (64, 64), 8, 4) is None
    small = (16, 16)
    assert transpose_copy_layouts(*buffers(small), small, 8, 4) is None
