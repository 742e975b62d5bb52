"""Convert a tile between any two distributed layouts of the same shape.

The kernel loads a [M, N] tile in `src`, converts it with `convert_layout` (whose plan is
chosen by weft.layouts: register renaming, warp shuffles or a shared-memory round trip) and
stores it from `dst`. Used to property-test conversions on the emulator and the GPU.
"""

from __future__ import annotations


from .. import lowlevel as ll
from ..layouts import LinearLayout
from ..runtime.host_arrays import check_arrays, contiguous, new_array


@ll.jit
def convert_kernel(in_ptr, out_ptr, M: ll.constexpr, N: ll.constexpr, SRC: ll.constexpr, DST: ll.constexpr):
    rows = ll.arange(0, M, layout=ll.SliceLayout(1, SRC))
    cols = ll.arange(0, N, layout=ll.SliceLayout(0, SRC))
    tile = ll.load(in_ptr + rows[:, None] * N + cols[None, :])
    moved = ll.convert_layout(tile, DST)
    out_rows = ll.arange(0, M, layout=ll.SliceLayout(1, DST))
    out_cols = ll.arange(0, N, layout=ll.SliceLayout(0, DST))
    ll.store(out_ptr + out_rows[:, None] * N + out_cols[None, :], moved)


def as_distributed(layout: LinearLayout) -> "ll.LinearDistributedLayout":
    """A weft.layouts LinearLayout as the language's LinearDistributedLayout."""
    bases = layout.bases
    return ll.LinearDistributedLayout(
        reg_bases=[list(b) for b in bases.get("register", ())],
        lane_bases=[list(b) for b in bases.get("lane", ())],
        warp_bases=[list(b) for b in bases.get("warp", ())],
        block_bases=[list(b) for b in bases.get("block", ())],
        shape=list(layout.out_dims.values()),
    )


def convert(x, src: LinearLayout, dst: LinearLayout):
    """Round-trip an [M, N] array (any strides; copied first when not contiguous) through
    registers laid out by src, then dst, into a new contiguous array."""
    check_arrays("convert", x=x)
    if len(x.shape) != 2:
        raise ValueError(f"convert expects a 2-D array, got shape {tuple(x.shape)}")
    m, n = x.shape
    if tuple(src.out_dims.values()) != (m, n) or tuple(dst.out_dims.values()) != (m, n):
        raise ValueError(f"layouts cover {src.out_dims} and {dst.out_dims}, the array is {m}x{n}")
    warps = src.in_dims.get("warp", 1)
    if dst.in_dims.get("warp", 1) != warps:
        raise ValueError(f"src has {warps} warps but dst has {dst.in_dims.get('warp', 1)}")
    out = new_array(x, (m, n))
    convert_kernel[(1,)](contiguous(x), out, M=m, N=n, SRC=as_distributed(src), DST=as_distributed(dst),
                         num_warps=warps)
    return out
