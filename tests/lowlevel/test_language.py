"""weft.lowlevel: layout classes, type promotion, broadcasting, reductions, shape ops and
shared-memory views, checked through the IR the frontend builds (no GPU)."""

import re

import numpy as np
import pytest

from weft import layouts as standard
from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.compiler.types import SharedType, TensorType
from weft.layouts import LayoutError

BLOCKED = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
WGMMA = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64, 16])
MMA2 = ll.NVMMADistributedLayout([2, 0], [2, 2], [16, 8])


def ops_of(fn, signature=None, constexprs=None, num_warps=4):
    kernel = build_kernel(fn, signature or {}, constexprs or {}, num_warps)
    return list(kernel.walk())


def last(ops, op_class):
    return [op for op in ops if isinstance(op, op_class)][-1]


# ------------------------------------------------------------------ layout classes


def test_blocked_layout_is_a_checked_frozen_value():
    layout = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    assert layout == BLOCKED and hash(layout) == hash(BLOCKED)
    assert layout.size_per_thread == (1, 4) and layout.rank == 2 and layout.num_warps == 4
    assert str(layout) == ("BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[4, 8], "
                           "warps_per_cta=[4, 1], order=[1, 0])")
    assert layout.to_linear([32, 64]) == standard.blocked([32, 64], [1, 4], [4, 8], [4, 1], [1, 0])
    with pytest.raises(AttributeError):
        layout.order = (0, 1)


@pytest.mark.parametrize("args, message", [
    (([1], [16], [4], [0]), "covers 16 lanes"),
    (([1, 3], [4, 8], [4, 1], [1, 0]), "size_per_thread[1] = 3"),
    (([1, 4], [4, 8], [4, 1], [0, 0]), "order"),
    (([1, 4], [32], [4, 1], [1, 0]), "threads_per_warp"),
])
def test_blocked_layout_rejects_bad_fields(args, message):
    with pytest.raises(LayoutError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ll.BlockedLayout(*args)


@pytest.mark.parametrize("parent", [BLOCKED, WGMMA, MMA2,
                                    ll.BlockedLayout([2, 2], [8, 4], [2, 2], [0, 1])])
@pytest.mark.parametrize("shape", [[64, 64], [128, 32], [16, 256]])
@pytest.mark.parametrize("dim", [0, 1])
def test_slice_layout_is_what_reductions_produce(parent, shape, dim):
    full = parent.to_linear(shape)
    reduced = shape[:dim] + shape[dim + 1:]
    sliced = ll.SliceLayout(dim, parent).to_linear(reduced)
    assert sliced == standard.slice_layout(full, dim)


def test_nvmma_and_dot_operand_layouts():
    assert WGMMA.to_linear([64, 64]) == standard.wgmma_accumulator([64, 64], [4, 1], 64)
    assert MMA2.to_linear([32, 16]) == standard.mma_v2([32, 16], [2, 2])
    a = ll.DotOperandLayout(0, WGMMA, 2)
    assert a.to_linear([64, 32]) == standard.dot_operand([64, 32], [4, 1], 0, 2, 3)
    b = ll.DotOperandLayout(1, MMA2, 2)
    assert b.to_linear([16, 32]) == standard.dot_operand([16, 32], [2, 2], 1, 2, 2)
    with pytest.raises(LayoutError, match="wgmma instr_shape"):
        ll.NVMMADistributedLayout([3, 0], [4, 1], [16, 64])
    with pytest.raises(LayoutError, match="NVMMADistributedLayout"):
        ll.DotOperandLayout(0, BLOCKED, 2)


def test_linear_layouts_round_trip():
    linear = BLOCKED.to_linear([16, 32])
    described = ll.LinearDistributedLayout.from_linear(linear)
    assert described.to_linear([16, 32]) == linear
    assert described == ll.LinearDistributedLayout(
        [list(b) for b in described.reg_bases], described.lane_bases, described.warp_bases, [], [16, 32])
    shared = standard.nvmma_shared([64, 64], 128, 16)
    assert ll.LinearSharedLayout.from_linear(shared).to_linear([64, 64]) == shared
    with pytest.raises(LayoutError, match="5"):
        ll.LinearDistributedLayout([], [[1]], [], [], [32])


def test_shared_layouts_stack_leading_buffer_dims():
    nvmma = ll.NVMMASharedLayout(128, 16)
    single = nvmma.to_linear([64, 64])
    assert single == standard.nvmma_shared([64, 64], 128, 16)
    stacked = nvmma.to_linear([4, 64, 64]).bases["offset"]
    assert [b[1:] for b in stacked[:12]] == list(single.bases["offset"])
    assert [b[0] for b in stacked[12:]] == [1, 2]
    swizzled = ll.SwizzledSharedLayout(4, 1, 8, [1, 0])
    assert swizzled.to_linear([32, 32]) == standard.swizzled_shared([32, 32], 4, 1, 8, [1, 0])
    assert ll.NVMMASharedLayout.get_default_for([64, 32], 16).swizzle_byte_width == 64


# ------------------------------------------------------------------ kernels under test


@ll.jit
def promote(a_ptr, b_ptr, out_ptr):
    L: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
    offs = ll.arange(0, 128, layout=L)
    ll.store(out_ptr + offs, ll.load(a_ptr + offs) + ll.load(b_ptr + offs))


@pytest.mark.parametrize("a, b, result", [
    ("i32", "i64", "i64"), ("i32", "fp32", "fp32"), ("bf16", "fp32", "fp32"),
    ("fp16", "bf16", "fp32"), ("fp16", "fp16", "fp16"), ("i8", "i16", "i16"),
    ("i32", "u32", "u32"), ("i1", "i8", "i8"), ("i64", "fp16", "fp16"),
])
def test_type_promotion(a, b, result):
    ops = ops_of(promote, {"a_ptr": f"*{a}", "b_ptr": f"*{b}", "out_ptr": "*fp64"})
    add = last(ops, ir.Binary)
    assert str(add.result.type.element) == result
    assert str(last(ops, ir.Cast).result.type.element) == "fp64"  # stores convert


@ll.jit
def scalar_adoption(x_ptr, out_ptr, SCALE: ll.constexpr):
    L: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
    offs = ll.arange(0, 128, layout=L)
    y = ll.load(x_ptr + offs) * SCALE
    ll.store(out_ptr + offs, y)


@pytest.mark.parametrize("element, scale, result", [
    ("fp16", 2, "fp16"), ("fp16", 0.5, "fp16"), ("i32", 0.5, "fp32"), ("i8", 3, "i8"),
    ("i8", 1000, "i32"), ("bf16", True, "bf16"),
])
def test_python_numbers_adopt_the_tensor_type(element, scale, result):
    ops = ops_of(scalar_adoption, {"x_ptr": f"*{element}", "out_ptr": "*fp32"}, {"SCALE": scale})
    mul = last(ops, ir.Binary)
    assert str(mul.result.type.element) == result
    constant = [op for op in ops if isinstance(op, ir.Constant)][-1]
    assert isinstance(constant.result.type, TensorType)  # a full tensor, not scalar + splat


@ll.jit
def broadcasting(out_ptr, n):
    L: ll.constexpr = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = ll.arange(0, 32, layout=ll.SliceLayout(1, L))
    cols = ll.arange(0, 64, layout=ll.SliceLayout(0, L))
    grid = rows[:, None] * 64 + cols  # cols gains a leading dim through expand_dims(0)
    ll.store(out_ptr + grid, grid + n)


def test_broadcasting_rank_and_size_one_dims():
    ops = ops_of(broadcasting, {"out_ptr": "*i32", "n": "i32"})
    expands = [op for op in ops if isinstance(op, ir.ExpandDims)]
    assert [op.axis for op in expands] == [1, 0]
    broadcasts = [op for op in ops if isinstance(op, ir.Broadcast)]
    assert {op.result.type.shape for op in broadcasts} == {(32, 64)}
    for op in broadcasts:
        assert op.result.type.layout == BLOCKED.to_linear([32, 64])
        assert op.result.type.encoding == BLOCKED
    splat = [op for op in ops if isinstance(op, ir.Splat)]
    assert all(op.result.type.layout == BLOCKED.to_linear([32, 64]) for op in splat)


@ll.jit
def reductions(x_ptr, out_ptr):
    L: ll.constexpr = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = ll.arange(0, 32, layout=ll.SliceLayout(1, L))
    cols = ll.arange(0, 64, layout=ll.SliceLayout(0, L))
    x = ll.load(x_ptr + rows[:, None] * 64 + cols[None, :])
    row_max = ll.max(x, axis=1)
    col_sum = x.sum(0)
    best = ll.argmax(x, 1)
    total = ll.sum(row_max, 0)
    kept = ll.min(x, 1, keep_dims=True)
    ll.store(out_ptr + rows, row_max + total + best.to(ll.float32) + ll.sum(kept, 1))


def test_reductions_give_slice_layouts():
    ops = ops_of(reductions, {"x_ptr": "*fp32", "out_ptr": "*fp32"})
    reduces = [op for op in ops if isinstance(op, ir.Reduce)]
    kinds = [(op.kind, op.axis) for op in reduces]
    assert kinds == [("max", 1), ("sum", 0), ("argmax", 1), ("sum", 0), ("min", 1), ("sum", 1)]
    row_max, col_sum, best, total, kept, _ = (op.result.type for op in reduces)
    assert row_max.encoding == ll.SliceLayout(1, BLOCKED)
    assert row_max.layout == ll.SliceLayout(1, BLOCKED).to_linear([32])
    assert col_sum.encoding == ll.SliceLayout(0, BLOCKED)
    assert str(best.element) == "i32"
    assert str(total) == "fp32"  # a 1-D tensor reduces to a scalar
    keep = [op for op in ops if isinstance(op, ir.ExpandDims) and op.operand is reduces[4].result]
    assert keep and keep[0].result.type.shape == (32, 1)


@ll.jit
def shape_ops(x_ptr, out_ptr):
    L: ll.constexpr = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = ll.arange(0, 32, layout=ll.SliceLayout(1, L))
    cols = ll.arange(0, 64, layout=ll.SliceLayout(0, L))
    x = ll.load(x_ptr + rows[:, None] * 64 + cols[None, :])
    t = ll.permute(x, [1, 0])
    flat = x.reshape(2048)
    same = ll.convert_layout(x, ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]), assert_trivial=True)
    moved = ll.convert_layout(x, ll.BlockedLayout([4, 1], [8, 4], [1, 4], [0, 1]))
    ll.store(out_ptr + rows[:, None] * 64 + cols[None, :], ll.convert_layout(moved, L) + same)


def test_permute_reshape_convert():
    ops = ops_of(shape_ops, {"x_ptr": "*fp32", "out_ptr": "*fp32"})
    permute = last(ops, ir.Permute)
    assert permute.result.type.shape == (64, 32)
    assert permute.result.type.encoding == ll.BlockedLayout([4, 1], [8, 4], [1, 4], [0, 1])
    reshape = last(ops, ir.Reshape)
    assert reshape.result.type.shape == (2048,)
    assert isinstance(reshape.result.type.encoding, ll.LinearDistributedLayout)
    converts = [op for op in ops if isinstance(op, ir.ConvertLayout)]
    assert len(converts) == 2  # converting to the same layout emits nothing


@ll.jit
def bad_trivial_convert(x_ptr):
    L: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
    x = ll.load(x_ptr + ll.arange(0, 512, layout=L))
    y = ll.convert_layout(x, ll.BlockedLayout([1], [32], [4], [0]), assert_trivial=True)


@ll.jit
def expand_without_slice(x_ptr):
    L: ll.constexpr = ll.BlockedLayout([4], [32], [4], [0])
    x = ll.arange(0, 512, layout=L)
    y = x[:, None]


@ll.jit
def wrong_warps(x_ptr):
    x = ll.arange(0, 512, layout=ll.BlockedLayout([4], [32], [4], [0]))


@ll.jit
def bool_of_tensor(x_ptr):
    x = ll.arange(0, 512, layout=ll.BlockedLayout([4], [32], [4], [0]))
    y = x if x else x


@pytest.mark.parametrize("fn, num_warps, message", [
    (bad_trivial_convert, 4, "assert_trivial=True moves data"),
    (expand_without_slice, 4, "needs a tensor in SliceLayout(dim=1"),
    (wrong_warps, 8, "spans 4 warps, but the kernel runs with num_warps=8"),
    (bool_of_tensor, 4, "compile-time condition"),
])
def test_rule_violations(fn, num_warps, message):
    with pytest.raises(CompilationError) as info:
        build_kernel(fn, {"x_ptr": "*fp32"}, {}, num_warps)
    assert message in info.value.message


@ll.jit
def shared_views(x_ptr, stage):
    L: ll.constexpr = ll.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    S: ll.constexpr = ll.NVMMASharedLayout(128, 16)
    rows = ll.arange(0, 64, layout=ll.SliceLayout(1, L))
    cols = ll.arange(0, 64, layout=ll.SliceLayout(0, L))
    tile = ll.load(x_ptr + rows[:, None] * 64 + cols[None, :])
    buffers = ll.allocate_shared_memory(ll.float16, [3, 64, 64], S)
    buffers.index(stage).store(tile)
    ll.barrier()
    top = buffers.index(0).slice(32, 32, dim=0)
    back = top.load(ll.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0]))


def test_shared_memory_views():
    ops = ops_of(shared_views, {"x_ptr": "*fp16", "stage": "i32"})
    alloc = last(ops, ir.AllocateSharedMemory)
    assert alloc.result.type == SharedType((3, 64, 64), ll.float16,
                                           ll.NVMMASharedLayout(128, 16).to_linear([3, 64, 64]))
    index = last(ops, ir.SharedIndex)
    assert index.result.type.layout == standard.nvmma_shared([64, 64], 128, 16)
    assert index.result.type.encoding == ll.NVMMASharedLayout(128, 16)
    view = last(ops, ir.SharedSlice)
    assert (view.dim, view.start, view.result.type.shape) == (0, 32, (32, 64))
    offsets = view.result.type.layout.bases["offset"]
    assert all(b[0] < 32 for b in offsets) and len(offsets) == 11  # the top row bit is gone
    assert isinstance(last(ops, ir.Barrier), ir.Barrier)
    assert last(ops, ir.SharedLoad).result.type.shape == (32, 64)


def test_ops_outside_a_kernel_say_so():
    with pytest.raises(RuntimeError, match="inside a @jit kernel"):
        ll.program_id(0)


def test_dtype_names():
    assert ll.float32 == ll.fp32 and str(ll.float32) == "fp32"
    assert str(ll.bfloat16) == "bf16" and str(ll.int1) == "i1" and str(ll.float8e4nv) == "fp8e4m3"
    assert str(ll.pointer_type(ll.float16)) == "*fp16"


@ll.jit
def normalize_rows(x_ptr, out_ptr, n_rows, ROWS: ll.constexpr, COLS: ll.constexpr):
    L: ll.constexpr = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = ll.program_id(0) * ROWS + ll.arange(0, ROWS, layout=ll.SliceLayout(1, L))
    cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, L))
    mask = rows[:, None] < n_rows
    x = ll.load(x_ptr + rows[:, None] * COLS + cols[None, :], mask=mask, other=0.0)
    centered = x - ll.sum(x, 1)[:, None] / COLS
    scale = ll.rsqrt(ll.sum(centered * centered, 1) / COLS + 1e-5)
    y = ll.where(cols[None, :] % 2 == 0, centered * scale[:, None], -1.0)
    ll.store(out_ptr + rows[:, None] * COLS + cols[None, :], y, mask=mask)


def test_a_kernel_runs_on_the_emulator():
    np = pytest.importorskip("numpy")
    x = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
    out = np.zeros_like(x)
    normalize_rows[(3,)](x, out, 40, ROWS=16, COLS=64)
    centered = x - x.mean(1, keepdims=True)
    expected = centered / np.sqrt((centered ** 2).mean(1, keepdims=True) + 1e-5)
    expected[:, 1::2] = -1.0
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@ll.jit
def tile_loop(out_ptr, n_tiles, inner, REMAT: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
    for tile in ll.range(ll.program_id(0), n_tiles, ll.num_programs(0), rematerialize=REMAT):
        offs = ll.arange(0, 128, layout)  # its thread part: from the entry, or per tile
        acc = ll.zeros([128], ll.float32, layout)
        for k in range(0, inner):
            acc += offs.to(ll.float32) * k
        ll.store(out_ptr + tile * 128 + offs, acc)


TILE_LOOP_SIGNATURE = {"out_ptr": "*fp32", "n_tiles": "i32", "inner": "i32"}


def _check_tid_read_per_tile(kernel):
    """%tid.x read once at the entry, or (REMAT) by a volatile read at the top of every
    tile, which LLVM can neither hoist nor merge with another."""
    ptx = {remat: kernel.compile(signature=TILE_LOOP_SIGNATURE, constexprs={"REMAT": remat}).asm["ptx"]
           for remat in (False, True)}
    per_tile = re.compile(r"begin inline asm\s+mov\.u32\s+%r\d+, %tid\.x;")
    assert "%tid.x" in ptx[False] and not per_tile.search(ptx[False])
    assert per_tile.search(ptx[True])


def test_rematerialized_loops_recompute_thread_values_per_iteration():
    _check_tid_read_per_tile(tile_loop)
    out = np.zeros((5, 128), np.float32)
    tile_loop[(2,)](out, 5, 4, REMAT=True)  # the emulator: two CTAs walk five tiles
    np.testing.assert_array_equal(out, np.tile(np.arange(128, dtype=np.float32) * 6, (5, 1)))
    with pytest.raises(CompilationError, match=r"rematerialize=\) takes True or False"):
        tile_loop.compile(signature=TILE_LOOP_SIGNATURE, constexprs={"REMAT": 1})


@ll.jit
def tile_while(out_ptr, n_tiles, inner, REMAT: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
    tile = ll.program_id(0)
    while ll.condition(tile < n_tiles, rematerialize=REMAT):
        offs = ll.arange(0, 128, layout)
        acc = ll.zeros([128], ll.float32, layout)
        for k in range(0, inner):
            acc += offs.to(ll.float32) * k
        ll.store(out_ptr + tile * 128 + offs, acc + tile)
        tile += ll.num_programs(0)


def test_rematerialized_while_loops_recompute_thread_values_per_iteration():
    _check_tid_read_per_tile(tile_while)
    out = np.zeros((5, 128), np.float32)
    tile_while[(2,)](out, 5, 4, REMAT=True)  # the emulator: two CTAs walk five tiles
    expected = np.arange(128, dtype=np.float32)[None, :] * 6 + np.arange(5, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(CompilationError, match=r"ll.condition\(..., rematerialize=\) takes True or False"):
        tile_while.compile(signature=TILE_LOOP_SIGNATURE, constexprs={"REMAT": 1})


@ll.jit
def tile_after_loop(out_ptr, n_tiles, inner):
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
    tile = ll.program_id(0)
    while ll.condition(tile < n_tiles, rematerialize=True):
        total = 0.0
        for k in range(0, inner):
            total += k * 1.0
        offs = ll.arange(0, 128, layout)  # used only after the inner loop
        ll.store(out_ptr + tile * 128 + offs, offs.to(ll.float32) + total)
        tile += ll.num_programs(0)


def test_thread_values_used_after_an_inner_loop_are_computed_after_it():
    """In a rematerialized loop, thread positions first needed after an inner loop are
    computed there (a fresh volatile %tid.x read), not at the top of the iteration, where
    they would be held in registers across the inner loop."""
    llir = tile_after_loop.compile(signature=TILE_LOOP_SIGNATURE).asm["llir"]
    read = re.compile(r'asm sideeffect "mov\.u32 \$0, %tid\.x;"')
    after = re.search(r"^for_exit[\w.]*:", llir, re.M)  # the inner loop's exit
    assert after is not None and read.search(llir, after.end()) and not read.search(llir[:after.start()])
    out = np.zeros((5, 128), np.float32)
    tile_after_loop[(2,)](out, 5, 4)
    np.testing.assert_array_equal(out, np.tile(np.arange(128, dtype=np.float32) + 6, (5, 1)))


@ll.jit
def broadcast_through_shared(x_ptr, out_ptr):
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [4], [0])
    smem = ll.allocate_shared_memory(ll.float32, [1], ll.SwizzledSharedLayout(1, 1, 1, [0]))
    smem.store(ll.full([1], ll.load(x_ptr), ll.float32, layout))  # every thread holds the one value
    offs = ll.arange(0, 128, layout)
    ll.store(out_ptr + offs, ll.max(smem.load(layout), axis=0) + offs.to(ll.float32))


def test_a_broadcast_value_is_stored_to_shared_memory_by_one_thread():
    """All 128 threads hold the element; thread 0 alone writes it (so an mbarrier arrive
    by that thread would release it), a barrier, then every thread reads it."""
    ptx = broadcast_through_shared.compile(signature={"x_ptr": "*fp32", "out_ptr": "*fp32"}).asm["ptx"]
    lines = ptx.splitlines()
    (store,) = [i for i, line in enumerate(lines) if "st.shared" in line]
    guard = re.compile(r"@!?%p\d+ bra")
    assert any(guard.search(line) for line in lines[store - 3:store])  # skipped by other threads
    assert any("bar.sync" in line for line in lines[store:])
    x = np.array([2.5], np.float32)
    out = np.zeros(128, np.float32)
    broadcast_through_shared[(1,)](x, out)  # the emulator, with the owner-only write
    np.testing.assert_array_equal(out, 2.5 + np.arange(128, dtype=np.float32))
