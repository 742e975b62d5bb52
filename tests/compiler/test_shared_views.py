"""shared_views.trace_shared_views: the static addressing of every shared value, checked
element by element against the buffer's own layout.

The reference is the layout read forwards: enumerating every offset o of the allocation's
shared layout gives the coordinates it holds, so `where[c]` is the element offset of
coordinates c with no inverse involved. A traced view's element c must sit at
`addressing(c) XOR xor` from the view's base: the allocation's base for a slice or a
permute, and stage i's (i * the stage's elements) for an index.
"""

from __future__ import annotations

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (AllocateSharedMemory, Block, For, Kernel, SharedIndex, SharedPermute, SharedReinterpret,
                              SharedSlice, Value, WarpSpecialize, Yield)
from weft.compiler.passes.shared_views import StaticView, trace_shared_views
from weft.compiler.types import SharedType, fp16, fp32, i32

from .backend_kernels import row_major_shared

STAGES, ROWS, COLS = 2, 64, 128
SWIZZLED = ll.NVMMASharedLayout.get_default_for([ROWS, COLS], ll.float16)  # 128-byte swizzle


@ll.jit
def views(x_ptr, STAGES: ll.constexpr):
    ring = ll.allocate_shared_memory(ll.float16, [STAGES, 64, 128], SWIZZLED)
    stage = ring.index(ll.program_id(0) % STAGES)
    top = stage.slice(16, 16, 0)      # rows 16..31
    right = stage.slice(64, 64, 1)    # columns 64..127: the second swizzle row
    stage.permute((1, 0))
    top.permute((1, 0))
    right.slice(8, 8, 0)


def element_offsets(layout, shape) -> np.ndarray:
    """where[c]: the element offset holding coordinates c, by enumerating the layout's offsets."""
    count = int(np.prod(shape))
    coords = layout(offset=np.arange(count))
    where = np.full(shape, -1, dtype=np.int64)
    where[tuple(np.asarray(c) for c in coords)] = np.arange(count)
    assert (where >= 0).all(), "the layout does not hold every element"
    return where


def traced_offsets(view: StaticView, shape) -> np.ndarray:
    """addressing(c) XOR xor for every coordinate c of a view of `shape`."""
    grids = np.meshgrid(*(np.arange(s) for s in shape), indexing="ij")
    (flat,) = view.addressing(**{f"dim{i}": g for i, g in enumerate(grids)})
    return np.asarray(flat, dtype=np.int64) ^ view.xor


@pytest.fixture(scope="module")
def traced():
    kernel = build_kernel(views, {"x_ptr": "*fp16"}, {"STAGES": STAGES}, 4)
    return kernel, trace_shared_views(kernel.body)


def ops_of(kernel, kind) -> list:
    return [op for op in kernel.walk() if isinstance(op, kind)]


def test_the_allocation_is_addressed_as_its_layout_places_elements(traced):
    kernel, found = traced
    (alloc,) = ops_of(kernel, AllocateSharedMemory)
    shape = (STAGES, ROWS, COLS)
    view = found[alloc.result]
    assert view.xor == 0
    assert np.array_equal(traced_offsets(view, shape), element_offsets(alloc.result.type.layout, shape))


def test_index_slice_and_permute_views_address_the_elements_they_name(traced):
    kernel, found = traced
    (alloc,) = ops_of(kernel, AllocateSharedMemory)
    where = element_offsets(alloc.result.type.layout, (STAGES, ROWS, COLS))
    stage_op = ops_of(kernel, SharedIndex)[0]
    top_op, right_op, corner_op = ops_of(kernel, SharedSlice)
    permutes = ops_of(kernel, SharedPermute)
    stride = ROWS * COLS
    for i in range(STAGES):  # a run-time index moves the base by i stages; the rest is static
        stage = where[i] - i * stride
        expected = {stage_op: stage, top_op: stage[16:32], right_op: stage[:, 64:],
                    corner_op: stage[8:16, 64:], permutes[0]: stage.T, permutes[1]: stage[16:32].T}
        for op, offsets in expected.items():
            assert np.array_equal(traced_offsets(found[op.result], offsets.shape), offsets), op.NAME
    # the slices start inside the stage: their start is the XOR term, not a new base
    assert found[top_op.result].xor == where[0, 16, 0] and found[right_op.result].xor == where[0, 0, 64]


def _hand_built(*ops) -> dict:
    return trace_shared_views(Block((), ops))


def test_a_loop_carries_the_view_it_is_given():
    """for k in range(n): slice the carried view, carry it on; the results are the init's view."""
    layout = row_major_shared(64, 64)
    buffer, carried, out = (Value(SharedType((64, 64), fp32, layout), name) for name in ("buf", "carried", "out"))
    window = Value(SharedType((16, 64), fp32, row_major_shared(16, 64)), "window")
    bounds = [Value(i32, name) for name in ("lower", "upper", "step", "k")]
    body = Block((bounds[3], carried), (SharedSlice(result=window, buffer=carried, dim=0, start=32),
                                        Yield(values=(carried,))))
    found = _hand_built(AllocateSharedMemory(result=buffer),
                        For(results=(out,), lower=bounds[0], upper=bounds[1], step=bounds[2], inits=(buffer,),
                            body=body))
    assert found[carried] == found[out] == found[buffer]
    where = element_offsets(layout, (64, 64))
    assert np.array_equal(traced_offsets(found[window], (16, 64)), where[32:48])


def test_views_the_ir_does_not_fix_say_why_and_their_views_inherit_it():
    layout = row_major_shared(64, 64)
    buffer = Value(SharedType((64, 64), fp32, layout), "buf")
    odd = Value(SharedType((16, 64), fp32, row_major_shared(16, 64)), "odd")
    window = Value(SharedType((16, 64), fp32, row_major_shared(16, 64)), "window")
    as_halves = Value(SharedType((16, 128), fp16, row_major_shared(16, 128)), "as_halves")
    below = Value(SharedType((64, 16), fp32, row_major_shared(64, 16)), "below")
    found = _hand_built(AllocateSharedMemory(result=buffer),
                        SharedSlice(result=odd, buffer=buffer, dim=0, start=8),
                        SharedSlice(result=window, buffer=buffer, dim=0, start=16),
                        SharedReinterpret(result=as_halves, buffer=window),
                        SharedPermute(result=below, buffer=odd, order=(1, 0)))
    assert "start 8 is not a multiple of the window size 16" in found[odd]
    assert found[below] == found[odd]
    assert "does not start the buffer" in found[as_halves]
    assert found[window].xor == 16 * 64  # row 16 of a row-major buffer


def test_a_reinterpreted_buffer_is_addressed_by_its_new_layout():
    buffer = Value(SharedType((64, 64), fp32, row_major_shared(64, 64)), "buf")
    swizzled = SWIZZLED.to_linear((64, 128))
    halves = Value(SharedType((64, 128), fp16, swizzled), "halves")
    found = _hand_built(AllocateSharedMemory(result=buffer), SharedReinterpret(result=halves, buffer=buffer))
    assert np.array_equal(traced_offsets(found[halves], (64, 128)), element_offsets(swizzled, (64, 128)))


def test_warp_specialize_partitions_see_captured_views():
    """A view captured by a partition is the same view inside it."""
    buffer = Value(SharedType((64, 64), fp32, row_major_shared(64, 64)), "buf")
    worker_arg = Value(buffer.type, "worker_buf")
    default_arg = Value(buffer.type, "default_buf")
    flipped = Value(SharedType((64, 64), fp32, row_major_shared(64, 64)), "flipped")
    ops = (AllocateSharedMemory(result=buffer),
           WarpSpecialize(results=(), captures=(buffer,),
                          default=Block((default_arg,), (Yield(),)),
                          workers=(Block((worker_arg,), (SharedPermute(result=flipped, buffer=worker_arg,
                                                                       order=(1, 0)), Yield())),),
                          worker_num_warps=(4,), worker_num_regs=(0,)))
    kernel = Kernel("partitions", (), Block((), ops), 4)
    found = trace_shared_views(kernel.body)
    assert found[worker_arg] == found[default_arg] == found[buffer]
    where = element_offsets(buffer.type.layout, (64, 64))
    assert np.array_equal(traced_offsets(found[flipped], (64, 64)), where.T)
