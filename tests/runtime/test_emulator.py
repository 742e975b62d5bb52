"""The CPU emulator on hand-built `layout` IR, checked against float64 numpy references."""

from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest

from weft.compiler import ir
from weft.compiler import types as t
from weft.compiler.errors import Loc
from weft.layouts.rules import expand_dims_layout, plan_reduction
from weft.layouts import slice_layout
from weft.compiler.passes.plan_data_movement import plan_data_movement
from weft.compiler.verifier import verify
from weft.layouts import blocked, swizzled_shared
from weft.runtime.emulator import EMULATION_RULES, EmulationError, emulate, from_bf16, to_bf16

RNG = np.random.default_rng(0)


class Builder:
    """Appends ops to a block; every op gets its own source line (kernel.py:<n>)."""

    def __init__(self, num_warps: int = 4):
        self.num_warps = num_warps
        self.ops: list[ir.Op] = []
        self.lines = itertools.count(10)
        self.params: list[ir.Value] = []

    def param(self, type_, hint):
        value = ir.Value(type_, hint)
        self.params.append(value)
        return value

    def loc(self, text):
        line = next(self.lines)
        return Loc("kernel.py", line, 4, f"    {text}")

    def emit(self, cls, type_=None, text=None, **fields):
        result = ir.Value(type_) if type_ is not None else None
        if result is not None:
            fields["result"] = result
        op = cls(loc=self.loc(text or cls.NAME), **fields)
        self.ops.append(op)
        return result if result is not None else op

    # conveniences
    def const(self, value, type_):
        return self.emit(ir.Constant, type_, value=value)

    def binary(self, kind, lhs, rhs, type_=None):
        return self.emit(ir.Binary, type_ or lhs.type, kind=kind, lhs=lhs, rhs=rhs)

    def splat(self, scalar, like: t.TensorType):
        return self.emit(ir.Splat, t.TensorType(like.shape, scalar.type, like.layout), operand=scalar)

    def block(self, args=()):
        return ir.Block(tuple(args), tuple(self.ops))

    def kernel(self, name="k", shared_bytes=0, verify_ir=True):
        """The kernel with its data movement planned (reduce and convert_layout carry the
        plans the emulator runs); scratch offsets are the test's own."""
        kernel = plan_data_movement(ir.Kernel(name, tuple(self.params), self.block(), self.num_warps,
                                              shared_bytes=shared_bytes))
        return verify(kernel) if verify_ir else kernel


def T(shape, element, layout):
    return t.TensorType(tuple(shape), element, layout)


def ptr(element):
    return t.PointerType(element)


def layout_1d(size, num_warps=4, per_thread=1):
    return blocked([size], [per_thread], [32], [num_warps], [0])


def pointer_tensor(b, base, offsets):
    """add_ptr(splat(base), offsets) with the offsets' shape and layout."""
    pointers = b.splat(base, offsets.type)
    return b.emit(ir.AddPtr, pointers.type, pointer=pointers, offset=offsets)


# ------------------------------------------------------------------ vector add
def build_vector_add(block_size=256, num_warps=4, vector=1, per_thread=2):
    b = Builder(num_warps)
    x, y, out = (b.param(ptr(t.fp32), n) for n in ("x_ptr", "y_ptr", "out_ptr"))
    n = b.param(t.i32, "n")
    layout = layout_1d(block_size, num_warps, per_thread=per_thread)
    pid = b.emit(ir.ProgramId, t.i32, axis=0)
    start = b.binary("mul", pid, b.const(block_size, t.i32))
    offsets = b.emit(ir.Arange, T([block_size], t.i32, layout), start=0, end=block_size)
    offsets = b.binary("add", offsets, b.splat(start, offsets.type))
    mask = b.emit(ir.Compare, T([block_size], t.i1, layout), predicate="lt", lhs=offsets,
                  rhs=b.splat(n, offsets.type))
    xs = b.emit(ir.Load, T([block_size], t.fp32, layout), pointer=pointer_tensor(b, x, offsets),
                mask=mask, vector=vector, text="x = load(x_ptr + offsets, mask)")
    ys = b.emit(ir.Load, xs.type, pointer=pointer_tensor(b, y, offsets), mask=mask, vector=vector)
    total = b.binary("add", xs, ys)
    b.emit(ir.Store, pointer=pointer_tensor(b, out, offsets), value=total, mask=mask, vector=vector)
    return b.kernel("vector_add")


def test_vector_add_with_masked_tail():
    n = 1000
    x, y = RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    emulate(build_vector_add(), (math.ceil(n / 256), 1, 1), [x, y, out, n])
    np.testing.assert_array_equal(out, x + y)  # fp32 add is exact to the reference rounding


def test_vectorized_access_checks_alignment():
    n = 1024
    x, y = np.ones(n, np.float32), np.ones(n, np.float32)
    emulate(build_vector_add(vector=2), (4,), [x, y, np.zeros(n, np.float32), n])
    with pytest.raises(EmulationError, match="not 4 consecutive elements") as info:
        # two elements per thread, repeated every 256: registers 0, 1 are consecutive but
        # register 2 is 256 elements further, so a 4-wide access would read wrong data
        emulate(build_vector_add(block_size=1024, vector=4, per_thread=2), (1,),
                [x, y, np.zeros(n, np.float32), n])
    assert "x = load(x_ptr + offsets, mask)" in str(info.value)


def test_out_of_bounds_load_names_line_and_index():
    n = 1000
    x, y = np.zeros(n, np.float32), np.zeros(n, np.float32)
    kernel = build_vector_add()
    # drop the masks: the last program reads past the end
    ops = tuple(ir.Load(result=op.result, pointer=op.pointer, loc=op.loc)
                if isinstance(op, ir.Load) else op for op in kernel.body.ops)
    kernel = kernel.with_body(ir.Block((), ops))
    with pytest.raises(EmulationError) as info:
        emulate(kernel, (4,), [x, y, np.zeros(n, np.float32), n])
    text = str(info.value)
    assert "kernel.py:" in text and "x = load(x_ptr + offsets, mask)" in text
    assert "load out of bounds: element 1000 of `x_ptr` (1000 elements of fp32)" in text
    assert "in program (3, 0, 0)" in text


# --------------------------------------------------------------------- softmax
def reduce_scratch_bytes(layout, axis, num_warps):
    return plan_reduction(layout, axis).scratch_elements(num_warps) * 4


def build_softmax(block_m, block_n, num_warps=4, barrier_between=True, element=t.fp32,
                  warps_per_cta=(1, 4)):
    """One program per block_m rows (block_n >= n_cols); with warps_per_cta (1, 4) the max and
    sum reduce across the 4 warps through shared memory."""
    b = Builder(num_warps)
    x_ptr, out_ptr = b.param(ptr(element), "x_ptr"), b.param(ptr(element), "out_ptr")
    n_rows, n_cols = b.param(t.i32, "n_rows"), b.param(t.i32, "n_cols")
    layout = blocked([block_m, block_n], [1, 4], [1, 32], list(warps_per_cta), [1, 0])
    rows_layout, cols_layout = slice_layout(layout, 1), slice_layout(layout, 0)
    tile = T([block_m, block_n], t.i32, layout)

    def column(values, axis_layout, axis):  # [n] -> [n, 1] or [1, n] -> [block_m, block_n]
        expanded_layout = expand_dims_layout(axis_layout, axis)
        shape = [block_m, 1] if axis == 1 else [1, block_n]
        expanded = b.emit(ir.ExpandDims, T(shape, values.type.element, expanded_layout),
                          operand=values, axis=axis)
        return b.emit(ir.Broadcast, T([block_m, block_n], values.type.element, layout), operand=expanded)

    pid = b.emit(ir.ProgramId, t.i32, axis=0)
    row0 = b.binary("mul", pid, b.const(block_m, t.i32))
    rows = b.emit(ir.Arange, T([block_m], t.i32, rows_layout), start=0, end=block_m)
    rows = b.binary("add", rows, b.splat(row0, rows.type))
    cols = b.emit(ir.Arange, T([block_n], t.i32, cols_layout), start=0, end=block_n)
    row_ok = b.emit(ir.Compare, T([block_m], t.i1, rows_layout), predicate="lt", lhs=rows,
                    rhs=b.splat(n_rows, rows.type))
    col_ok = b.emit(ir.Compare, T([block_n], t.i1, cols_layout), predicate="lt", lhs=cols,
                    rhs=b.splat(n_cols, cols.type))
    mask = b.binary("and", column(row_ok, rows_layout, 1), column(col_ok, cols_layout, 0))
    offsets = b.binary("add", b.binary("mul", column(rows, rows_layout, 1), b.splat(n_cols, tile)),
                       column(cols, cols_layout, 0))
    values_type = T([block_m, block_n], element, layout)
    minus_inf = b.const(float("-inf"), values_type)
    x = b.emit(ir.Load, values_type, pointer=pointer_tensor(b, x_ptr, offsets), mask=mask,
               other=minus_inf, text="x = load(x_ptr + offsets, mask, other=-inf)")
    result_layout = plan_reduction(layout, 1).result_layout
    row_max = b.emit(ir.Reduce, T([block_m], element, result_layout), operand=x, axis=1, kind="max",
                     scratch_offset=0, text="row_max = max(x, axis=1)")
    shifted = b.binary("sub", x, column(row_max, result_layout, 1))
    numerator = b.emit(ir.Unary, values_type, kind="exp", operand=shifted)
    if barrier_between:
        b.emit(ir.Barrier)
    denominator = b.emit(ir.Reduce, T([block_m], element, result_layout), operand=numerator, axis=1,
                         kind="sum", scratch_offset=0, text="denominator = sum(numerator, axis=1)")
    softmax = b.binary("div", numerator, column(denominator, result_layout, 1))
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, offsets), value=softmax, mask=mask)
    return b.kernel("softmax", shared_bytes=reduce_scratch_bytes(layout, 1, num_warps))


def softmax_reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n_rows, n_cols, block_m, block_n, warps", [
    (37, 1000, 2, 1024, (1, 4)),   # reduce over registers, lanes and the 4 warps
    (10, 512, 2, 512, (1, 4)),     # exactly one CTA tile wide
    (9, 100, 4, 128, (4, 1)),      # one row per warp: no shared memory
])
def test_row_softmax(n_rows, n_cols, block_m, block_n, warps):
    x = RNG.standard_normal((n_rows, n_cols)).astype(np.float32) * 4
    out = np.zeros_like(x)
    kernel = build_softmax(block_m, block_n, warps_per_cta=warps)
    emulate(kernel, (math.ceil(n_rows / block_m),), [x, out, n_rows, n_cols])
    np.testing.assert_allclose(out, softmax_reference(x), rtol=2e-6, atol=1e-9)


def test_softmax_on_a_layout_wider_than_the_tile():
    x = RNG.standard_normal((4, 128)).astype(np.float32)
    out = np.zeros_like(x)
    emulate(build_softmax(4, 128), (1,), [x, out, 4, 128])  # 4x128 tile in a 4-warp x 512 layout
    np.testing.assert_allclose(out, softmax_reference(x), rtol=2e-6, atol=1e-9)


def test_reduction_scratch_reuse_without_barrier_is_a_race():
    x = RNG.standard_normal((2, 512)).astype(np.float32)
    kernel = build_softmax(2, 512, barrier_between=False)
    with pytest.raises(EmulationError, match=r"race \(WAR\)") as info:
        emulate(kernel, (1,), [x, np.zeros_like(x), 2, 512])
    text = str(info.value)
    assert "denominator = sum(numerator, axis=1)" in text
    assert "row_max = max(x, axis=1)" in text  # the read it races with


def test_bf16_softmax_rounds_like_the_gpu():
    n_rows, n_cols = 4, 512
    values = RNG.standard_normal((n_rows, n_cols)).astype(np.float32)
    bits = to_bf16(values)
    out = np.zeros_like(bits)
    emulate(build_softmax(4, 512, element=t.bf16), (1,), [bits, out, n_rows, n_cols])
    got = from_bf16(out).astype(np.float64)
    reference = softmax_reference(from_bf16(bits))
    # every op rounds to bf16 (8 bits), and the row sum accumulates 512 rounded terms
    np.testing.assert_allclose(got, reference, rtol=2 ** -4)
    assert np.abs(got / reference - 1).mean() < 2 ** -7


# -------------------------------------------------------------------- for loop
def build_row_sum_loop(block, num_warps=4):
    """out[i] = sum_k x[k, i] for k in range(n_chunks): a loop-carried fp32 accumulator."""
    b = Builder(num_warps)
    x_ptr, out_ptr = b.param(ptr(t.fp32), "x_ptr"), b.param(ptr(t.fp32), "out_ptr")
    n_chunks = b.param(t.i32, "n_chunks")
    layout = layout_1d(block, num_warps)
    offsets = b.emit(ir.Arange, T([block], t.i32, layout), start=0, end=block)
    zeros = b.const(0.0, T([block], t.fp32, layout))
    outer_ops = b.ops
    b.ops = []
    iv, acc = ir.Value(t.i32, "k"), ir.Value(zeros.type, "acc")
    row = b.binary("mul", iv, b.const(block, t.i32))
    pointers = pointer_tensor(b, x_ptr, b.binary("add", offsets, b.splat(row, offsets.type)))
    loaded = b.emit(ir.Load, zeros.type, pointer=pointers)
    b.emit(ir.Yield, values=(b.binary("add", acc, loaded),))
    body = b.block((iv, acc))
    b.ops = outer_ops
    total = ir.Value(zeros.type, "total")
    b.ops.append(ir.For(results=(total,), lower=b.const(0, t.i32), upper=n_chunks,
                        step=b.const(1, t.i32), inits=(zeros,), body=body))
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, offsets), value=total)
    return b.kernel("row_sum")


def test_for_loop_accumulates():
    x = RNG.standard_normal((7, 512)).astype(np.float32)
    out = np.zeros(512, np.float32)
    emulate(build_row_sum_loop(512), (1,), [x, out, 7])
    expected = np.zeros(512, np.float32)
    for row in x:  # the same order of fp32 additions as the loop
        expected = expected + row
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ shared memory
def build_shared_transpose(shape=(32, 64), barrier=True, offsets=(256, None), num_warps=4):
    """Load a tile row-major, store it to swizzled shared memory, load it back with threads
    running down columns, and store out = x.T from that layout. With a second allocation
    (offsets[1]) a decoy tile is stored there too, before the barrier."""
    rows, cols = shape
    b = Builder(num_warps)
    x_ptr, out_ptr = b.param(ptr(t.fp16), "x_ptr"), b.param(ptr(t.fp16), "out_ptr")
    row_major = blocked(shape, [1, 8], [4, 8], [num_warps, 1], [1, 0])
    col_major = blocked(shape, [8, 1], [8, 4], [1, num_warps], [0, 1])
    smem = swizzled_shared(shape, 8, 1, 8, [1, 0])

    def grid_offsets(layout, row_stride, col_stride):
        r = b.emit(ir.Arange, T([rows], t.i32, slice_layout(layout, 1)), start=0, end=rows)
        c = b.emit(ir.Arange, T([cols], t.i32, slice_layout(layout, 0)), start=0, end=cols)
        r = b.emit(ir.ExpandDims, T([rows, 1], t.i32, expand_dims_layout(r.type.layout, 1)), operand=r, axis=1)
        c = b.emit(ir.ExpandDims, T([1, cols], t.i32, expand_dims_layout(c.type.layout, 0)), operand=c, axis=0)
        r = b.emit(ir.Broadcast, T(shape, t.i32, layout), operand=r)
        c = b.emit(ir.Broadcast, T(shape, t.i32, layout), operand=c)
        r = b.binary("mul", r, b.splat(b.const(row_stride, t.i32), r.type))
        return b.binary("add", r, b.binary("mul", c, b.splat(b.const(col_stride, t.i32), c.type)))

    tile = b.emit(ir.Load, T(shape, t.fp16, row_major), pointer=pointer_tensor(b, x_ptr, grid_offsets(row_major, cols, 1)))
    buffer = b.emit(ir.AllocateSharedMemory, t.SharedType(shape, t.fp16, smem), offset=offsets[0])
    b.emit(ir.SharedStore, buffer=buffer, value=tile, text="smem.store(tile)")
    if offsets[1] is not None:
        decoy = b.emit(ir.AllocateSharedMemory, t.SharedType(shape, t.fp16, smem), offset=offsets[1])
        b.emit(ir.SharedStore, buffer=decoy, value=b.binary("add", tile, tile))
    if barrier:
        b.emit(ir.Barrier)
    transposed = b.emit(ir.SharedLoad, T(shape, t.fp16, col_major), buffer=buffer,
                        text="tile_t = smem.load(col_major)")
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, grid_offsets(col_major, 1, rows)), value=transposed)
    return b.kernel("transpose", shared_bytes=4 * rows * cols + 512)


def test_shared_store_barrier_load_in_transposed_layout():
    x = RNG.standard_normal((32, 64)).astype(np.float16)
    out = np.zeros((64, 32), np.float16)
    emulate(build_shared_transpose(), (1,), [x, out])
    np.testing.assert_array_equal(out, x.T)


def test_disjoint_second_buffer_leaves_the_first_intact():
    x = RNG.standard_normal((32, 64)).astype(np.float16)
    out = np.zeros((64, 32), np.float16)
    emulate(build_shared_transpose(offsets=(0, 4096)), (1,), [x, out])
    np.testing.assert_array_equal(out, x.T)


def test_overlapping_allocations_show_up_as_wrong_data():
    x = RNG.standard_normal((32, 64)).astype(np.float16)
    out = np.zeros((64, 32), np.float16)
    emulate(build_shared_transpose(offsets=(0, 2048)), (1,), [x, out])  # half of the tile overlaps
    wrong = out != x.T
    assert wrong.sum() == out.size // 2  # the overlapped half holds the decoy's elements
    assert np.isin(out[wrong], x + x).all()


def test_missing_barrier_is_reported_as_a_race():
    x = RNG.standard_normal((32, 64)).astype(np.float16)
    with pytest.raises(EmulationError, match=r"race \(RAW\)") as info:
        emulate(build_shared_transpose(barrier=False), (1,), [x, np.zeros((64, 32), np.float16)])
    text = str(info.value)
    assert "tile_t = smem.load(col_major)" in text and "smem.store(tile)" in text
    assert "insert a barrier" in text


def test_allocation_outside_shared_memory_is_refused():
    x = RNG.standard_normal((32, 64)).astype(np.float16)
    with pytest.raises(EmulationError, match="does not fit"):
        emulate(build_shared_transpose(offsets=(8192, None)), (1,), [x, np.zeros((64, 32), np.float16)])



def build_stages_and_slices(num_warps=4):
    """Two stages of a (2, 32, 64) buffer: stage s holds x * (s + 1); then out_a = stage
    `which` and out_b = columns [32, 64) of stage 0, both read back through views."""
    b = Builder(num_warps)
    x_ptr, a_ptr, b_ptr = (b.param(ptr(t.fp16), n) for n in ("x_ptr", "a_ptr", "b_ptr"))
    which = b.param(t.i32, "which")
    shape, half = (32, 64), (32, 32)
    row_major = blocked(list(shape), [1, 8], [4, 8], [num_warps, 1], [1, 0])
    half_layout = blocked(list(half), [1, 4], [4, 8], [num_warps, 1], [1, 0])

    def offsets(layout, cols, row_stride):
        rows = layout.out_dims["dim0"]
        r = b.emit(ir.Arange, T([rows], t.i32, slice_layout(layout, 1)), start=0, end=rows)
        c = b.emit(ir.Arange, T([cols], t.i32, slice_layout(layout, 0)), start=0, end=cols)
        r = b.emit(ir.ExpandDims, T([rows, 1], t.i32, expand_dims_layout(r.type.layout, 1)), operand=r, axis=1)
        c = b.emit(ir.ExpandDims, T([1, cols], t.i32, expand_dims_layout(c.type.layout, 0)), operand=c, axis=0)
        r = b.emit(ir.Broadcast, T([rows, cols], t.i32, layout), operand=r)
        c = b.emit(ir.Broadcast, T([rows, cols], t.i32, layout), operand=c)
        return b.binary("add", b.binary("mul", r, b.splat(b.const(row_stride, t.i32), r.type)), c)

    tile = b.emit(ir.Load, T(shape, t.fp16, row_major), pointer=pointer_tensor(b, x_ptr, offsets(row_major, 64, 64)))
    stages = b.emit(ir.AllocateSharedMemory,
                    t.SharedType((2,) + shape, t.fp16, swizzled_shared([2, 32, 64], 8, 1, 8, [2, 1, 0])),
                    offset=1024)
    stage_type = t.SharedType(shape, t.fp16, swizzled_shared(list(shape), 8, 1, 8, [1, 0]))
    for s in (0, 1):
        view = b.emit(ir.SharedIndex, stage_type, buffer=stages, index=b.const(s, t.i32))
        value = tile if s == 0 else b.binary("add", tile, tile)
        b.emit(ir.SharedStore, buffer=view, value=value)
    b.emit(ir.Barrier)
    chosen = b.emit(ir.SharedIndex, stage_type, buffer=stages, index=which)
    b.emit(ir.Store, pointer=pointer_tensor(b, a_ptr, offsets(row_major, 64, 64)),
           value=b.emit(ir.SharedLoad, T(shape, t.fp16, row_major), buffer=chosen))
    first = b.emit(ir.SharedIndex, stage_type, buffer=stages, index=b.const(0, t.i32))
    right = b.emit(ir.SharedSlice, t.SharedType(half, t.fp16, swizzled_shared(list(half), 8, 1, 8, [1, 0])),
                   buffer=first, dim=1, start=32)
    b.emit(ir.Store, pointer=pointer_tensor(b, b_ptr, offsets(half_layout, 32, 32)),
           value=b.emit(ir.SharedLoad, T(half, t.fp16, half_layout), buffer=right))
    return b.kernel("stages", shared_bytes=1024 + 2 * 32 * 64 * 2)


@pytest.mark.parametrize("which", [0, 1])
def test_shared_index_and_slice_views(which):
    x = RNG.standard_normal((32, 64)).astype(np.float16)
    out_a, out_b = np.zeros_like(x), np.zeros((32, 32), np.float16)
    emulate(build_stages_and_slices(), (1,), [x, out_a, out_b, which])
    np.testing.assert_array_equal(out_a, x * (which + 1))
    np.testing.assert_array_equal(out_b, x[:, 32:])
    with pytest.raises(EmulationError, match="shared_index 2 out of range"):
        emulate(build_stages_and_slices(), (1,), [x, out_a, out_b, 2])

# ------------------------------------------------------------------- conversions
def build_copy_through_conversion(shape, src, dst, element=t.fp32, plan=None, scratch_offset=None,
                                  shared_bytes=0):
    """out = x, loaded in `src`, converted to `dst`, stored from `dst`."""
    rows, cols = shape
    b = Builder(4)
    x_ptr, out_ptr = b.param(ptr(element), "x_ptr"), b.param(ptr(element), "out_ptr")

    def offsets(layout):
        r = b.emit(ir.Arange, T([rows], t.i32, slice_layout(layout, 1)), start=0, end=rows)
        c = b.emit(ir.Arange, T([cols], t.i32, slice_layout(layout, 0)), start=0, end=cols)
        r = b.emit(ir.ExpandDims, T([rows, 1], t.i32, expand_dims_layout(r.type.layout, 1)), operand=r, axis=1)
        c = b.emit(ir.ExpandDims, T([1, cols], t.i32, expand_dims_layout(c.type.layout, 0)), operand=c, axis=0)
        r = b.emit(ir.Broadcast, T(shape, t.i32, layout), operand=r)
        c = b.emit(ir.Broadcast, T(shape, t.i32, layout), operand=c)
        return b.binary("add", b.binary("mul", r, b.splat(b.const(cols, t.i32), r.type)), c)

    x = b.emit(ir.Load, T(shape, element, src), pointer=pointer_tensor(b, x_ptr, offsets(src)))
    y = b.emit(ir.ConvertLayout, T(shape, element, dst), operand=x, plan=plan, scratch_offset=scratch_offset)
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, offsets(dst)), value=y)
    return b.kernel("convert", shared_bytes=shared_bytes)


_BASE = blocked([64, 64], [2, 4], [8, 4], [2, 2], [1, 0])
CONVERSIONS = {  # kind -> (src, dst, plan class)
    "registers": (_BASE, _BASE.with_in_dim_bases("register", _BASE.bases["register"][::-1]),
                  "RegisterPermutation"),
    "shuffle": (_BASE, _BASE.with_in_dim_bases("lane", _BASE.bases["lane"][::-1]), "WarpShuffle"),
    "shared": (blocked([64, 64], [1, 4], [2, 16], [4, 1], [1, 0]),
               blocked([64, 64], [4, 1], [16, 2], [1, 4], [0, 1]), "SharedRoundTrip"),
}


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
def test_convert_layout_runs_its_plan(kind):
    from weft.layouts.conversion import plan_conversion

    src, dst, plan_class = CONVERSIONS[kind]
    shape = tuple(src.out_dims.values())
    plan = plan_conversion(src, dst, 32)
    assert type(plan).__name__ == plan_class
    scratch = int(getattr(plan, "scratch_bytes", 0) or 0)
    kernel = build_copy_through_conversion(shape, src, dst, plan=plan, scratch_offset=0 if scratch else None,
                                           shared_bytes=scratch)
    x = RNG.standard_normal(shape).astype(np.float32)
    out = np.zeros_like(x)
    emulate(kernel, (1,), [x, out])
    np.testing.assert_array_equal(out, x)
    # without a recorded plan the emulator plans the conversion itself
    out[:] = 0
    emulate(build_copy_through_conversion(shape, src, dst), (1,), [x, out])
    np.testing.assert_array_equal(out, x)


# --------------------------------------------------- the real allocation and barrier passes
def test_softmax_after_allocation_and_barrier_passes():
    from weft.compiler.passes.allocate_shared_memory import allocate_shared_memory
    from weft.compiler.passes.insert_barriers import insert_barriers

    kernel = build_softmax(2, 1024, barrier_between=False)
    body = ir.Block((), tuple(dataclasses_replace(op, scratch_offset=None) if isinstance(op, ir.Reduce) else op
                              for op in kernel.body.ops))
    kernel = insert_barriers(allocate_shared_memory(kernel.with_body(body, shared_bytes=0)))
    # The two reductions' small scratch areas get their own bytes, so no barrier is needed
    # between them; the emulator's race tracking checks that claim while it runs.
    offsets = [op.scratch_offset for op in kernel.body.ops if isinstance(op, ir.Reduce)]
    assert len(set(offsets)) == len(offsets) == 2
    assert not any(isinstance(op, ir.Barrier) for op in kernel.body.ops)
    x = RNG.standard_normal((6, 1000)).astype(np.float32)
    out = np.zeros_like(x)
    emulate(kernel, (3,), [x, out, 6, 1000])
    np.testing.assert_allclose(out, softmax_reference(x), rtol=2e-6, atol=1e-9)


def dataclasses_replace(op, **changes):
    import dataclasses

    return dataclasses.replace(op, **changes)


# ------------------------------------------------------------- argmax / argmin
def build_arg_reduce(kind, shape=(4, 512), element=t.fp32):
    rows, cols = shape
    b = Builder(4)
    x_ptr, out_ptr = b.param(ptr(element), "x_ptr"), b.param(ptr(t.i32), "out_ptr")
    layout = blocked(list(shape), [1, 4], [1, 32], [1, 4], [1, 0])
    r = b.emit(ir.Arange, T([rows], t.i32, slice_layout(layout, 1)), start=0, end=rows)
    c = b.emit(ir.Arange, T([cols], t.i32, slice_layout(layout, 0)), start=0, end=cols)
    r2 = b.emit(ir.ExpandDims, T([rows, 1], t.i32, expand_dims_layout(r.type.layout, 1)), operand=r, axis=1)
    c2 = b.emit(ir.ExpandDims, T([1, cols], t.i32, expand_dims_layout(c.type.layout, 0)), operand=c, axis=0)
    r2 = b.emit(ir.Broadcast, T(shape, t.i32, layout), operand=r2)
    c2 = b.emit(ir.Broadcast, T(shape, t.i32, layout), operand=c2)
    offsets = b.binary("add", b.binary("mul", r2, b.splat(b.const(cols, t.i32), r2.type)), c2)
    x = b.emit(ir.Load, T(shape, element, layout), pointer=pointer_tensor(b, x_ptr, offsets))
    result_layout = plan_reduction(layout, 1).result_layout
    best = b.emit(ir.Reduce, T([rows], t.i32, result_layout), operand=x, axis=1, kind=kind, scratch_offset=0)
    r_out = b.emit(ir.Arange, T([rows], t.i32, result_layout), start=0, end=rows)
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, r_out), value=best)
    return b.kernel(kind, shared_bytes=plan_reduction(layout, 1).scratch_elements(4) * 8)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_arg_reductions_break_ties_to_the_smaller_index(kind):
    x = RNG.integers(-3, 4, size=(4, 512)).astype(np.float32)  # many ties
    out = np.full(4, -1, np.int32)
    emulate(build_arg_reduce(kind), (1,), [x, out])
    expected = np.argmax(x, axis=1) if kind == "argmax" else np.argmin(x, axis=1)
    np.testing.assert_array_equal(out, expected)


# ------------------------------------------------- if / while / assert / print
def build_control_flow():
    """while k < n: k = k * 2 (scalar); if k > 100: out = k else out = -k; assert; print."""
    b = Builder(1)
    out_ptr, n = b.param(ptr(t.i32), "out_ptr"), b.param(t.i32, "n")
    layout = layout_1d(32, 1, per_thread=1)
    one = b.const(1, t.i32)
    outer = b.ops
    k_before, k_after = ir.Value(t.i32, "k"), ir.Value(t.i32, "k2")
    b.ops = []
    keep_going = b.emit(ir.Compare, t.i1, predicate="lt", lhs=k_before, rhs=n)
    b.emit(ir.Condition, condition=keep_going, values=(k_before,))
    before = b.block((k_before,))
    b.ops = []
    b.emit(ir.Yield, values=(b.binary("mul", k_after, b.const(2, t.i32)),))
    after = b.block((k_after,))
    b.ops = outer
    k = ir.Value(t.i32, "k_final")
    b.ops.append(ir.While(results=(k,), inits=(one,), before=before, after=after, loc=b.loc("while")))
    big = b.emit(ir.Compare, t.i1, predicate="gt", lhs=k, rhs=b.const(100, t.i32))
    b.ops, outer = [], b.ops
    b.emit(ir.Yield, values=(k,))
    then_body = b.block()
    b.ops = []
    b.emit(ir.Yield, values=(b.emit(ir.Unary, t.i32, kind="neg", operand=k),))
    else_body = b.block()
    b.ops = outer
    chosen = ir.Value(t.i32, "chosen")
    b.ops.append(ir.If(results=(chosen,), condition=big, then_body=then_body, else_body=else_body,
                       loc=b.loc("if")))
    lanes = b.emit(ir.Arange, T([32], t.i32, layout), start=0, end=32)
    values = b.binary("add", lanes, b.splat(chosen, lanes.type))
    positive = b.emit(ir.Compare, T([32], t.i1, layout), predicate="ge", lhs=values,
                      rhs=b.splat(b.const(0, t.i32), lanes.type))
    b.emit(ir.DeviceAssert, condition=positive, message="values must be non-negative",
           text="device_assert(values >= 0)")
    b.emit(ir.DevicePrint, prefix="values: ", values=(values,))
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, lanes), value=values)
    return b.kernel("control")


def test_while_if_print():
    out = np.zeros(32, np.int32)
    stream = io.StringIO()
    emulate(build_control_flow(), (1,), [out, 100], stream=stream)
    np.testing.assert_array_equal(out, 128 + np.arange(32))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 32 and lines[5] == "pid (0, 0, 0) thread 5 idx (5,) values: 133"


def test_failed_device_assert_names_the_line_and_element():
    with pytest.raises(EmulationError, match="device assertion failed: values must be non-negative") as info:
        emulate(build_control_flow(), (1,), [np.zeros(32, np.int32), 50], stream=io.StringIO())
    text = str(info.value)
    assert "device_assert(values >= 0)" in text and "tensor element (0,)" in text  # -64 + 0 < 0


# ------------------------------------------------------------------ rule table
def test_rule_table_copies_take_local_rules():
    class Twice(ir.Unary):
        NAME = "twice"

    rules = EMULATION_RULES.copy()

    @rules.register(Twice)
    def twice(cta, op):
        cta.bind(op.result, cta[op.operand] * 2)

    b = Builder(1)
    out_ptr = b.param(ptr(t.i32), "out_ptr")
    layout = layout_1d(32, 1, per_thread=1)
    lanes = b.emit(ir.Arange, T([32], t.i32, layout), start=0, end=32)
    doubled = b.emit(Twice, lanes.type, kind="neg", operand=lanes)
    b.emit(ir.Store, pointer=pointer_tensor(b, out_ptr, lanes), value=doubled)
    kernel = b.kernel(verify_ir=False)
    out = np.zeros(32, np.int32)
    emulate(kernel, (1,), [out], rules=rules)
    np.testing.assert_array_equal(out, 2 * np.arange(32))
    assert Twice not in EMULATION_RULES  # the default table is untouched


def test_cpu_torch_tensors_are_updated_in_place():
    torch = pytest.importorskip("torch")
    x, y = torch.randn(1000), torch.randn(1000)
    out = torch.zeros(1000)
    emulate(build_vector_add(), (4,), [x, y, out, 1000])
    assert torch.equal(out, x + y)
