"""Kernel state in weft.lowlevel: `@ll.aggregate` classes (fields, constructors, methods,
carried through runtime loops and ifs, passed to helpers and partitions), `ll.to_tensor`,
`ll.must_use_result`, `ll.num_warps()` and a `num_warps` kernel parameter, Python min/max
on runtime values, and warp_specialize's list form. Values are checked on the emulator
against numpy; the aggregate kernels are also compiled to PTX (and a cubin with ptxas)."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.lowlevel import mbarrier
from weft.compiler.backend import ptxas

ROWS = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
BLOCK = 32


# ------------------------------------------------------------------ aggregates
@ll.aggregate
class RowSums:
    """Running row sums of [BLOCK, BLOCK] tiles, with how many tiles went in."""
    acc: ll.tensor
    count: ll.tensor
    scale: ll.constexpr

    @ll.constexpr_function
    def __init__(self, acc, count, scale):
        self.acc = acc
        self.count = count
        self.scale = ll.constexpr(scale)

    @ll.jit
    def start(scale: ll.constexpr):
        acc = ll.zeros([BLOCK], ll.float32, ll.SliceLayout(1, ROWS))
        return RowSums(acc, ll.to_tensor(0), scale)

    @ll.jit
    def add(self, tile):
        return RowSums(self.acc + ll.sum(tile, 1) * self.scale, self.count + 1, self.scale)

    @ll.constexpr_function
    def doubled_scale(self):
        return 2 * self.scale


@ll.aggregate
class Tile:
    """Where one tile of x lives: pointers and a mask (default __init__: fields in order)."""
    base: ll.tensor
    stride: ll.tensor


@ll.jit
def tile_at(tile: Tile, col):
    rows = ll.arange(0, BLOCK, ll.SliceLayout(1, ROWS))
    cols = ll.arange(0, BLOCK, ll.SliceLayout(0, ROWS)) + col
    return ll.load(tile.base + rows[:, None] * tile.stride + cols[None, :])


@ll.jit
def row_sums(x, out, count_out, n_cols, stride, SCALE: ll.constexpr):
    state = RowSums.start(SCALE)
    where = Tile(x, stride)
    for col in range(0, n_cols, BLOCK):
        state = state.add(tile_at(where, col))
    rows = ll.arange(0, BLOCK, ll.SliceLayout(1, ROWS))
    ll.store(out + rows, state.acc * state.doubled_scale())
    ll.store(count_out + rows, state.count + rows * 0)


def test_aggregate_state_is_carried_through_a_runtime_loop():
    rng = np.random.default_rng(0)
    n_cols = 4 * BLOCK
    x = rng.standard_normal((BLOCK, n_cols)).astype(np.float32)
    out = np.zeros(BLOCK, np.float32)
    count = np.zeros(BLOCK, np.int32)
    row_sums[(1,)](x, out, count, n_cols, n_cols, SCALE=3)
    np.testing.assert_allclose(out, 3 * 6 * x.sum(1), rtol=1e-5, atol=1e-4)
    assert (count == 4).all()


def test_a_loop_carries_only_the_runtime_fields_that_change():
    kernel = build_kernel(row_sums, {"x": "*fp32", "out": "*fp32", "count_out": "*i32",
                                     "n_cols": "i32", "stride": "i32"}, {"SCALE": 3}, 4)
    loop, = [op for op in kernel.walk() if isinstance(op, ir.For)]
    assert [v.hint for v in loop.results] == ["state.acc", "state.count"]


@ll.aggregate
class Flags:
    on: ll.tensor
    value: ll.tensor

    @ll.jit
    def __init__(self, on, value):  # a @jit constructor assigns its fields
        self.on = on
        self.value = value * 1.0


@ll.jit
def pick(x, out, n, threshold):
    offsets = ll.arange(0, 128, ll.BlockedLayout([1], [32], [4], [0]))
    values = ll.load(x + offsets, offsets < n)
    flags = Flags(ll.to_tensor(False), values)
    if threshold > 0:
        flags = Flags(ll.to_tensor(True), values * 2.0)
    ll.store(out + offsets, ll.where(flags.on, flags.value, -flags.value), offsets < n)


@pytest.mark.parametrize("threshold", [0, 1])
def test_a_runtime_if_yields_an_aggregates_fields(threshold):
    x = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    out = np.zeros(100, np.float32)
    pick[(1,)](x, out, 100, threshold)
    np.testing.assert_allclose(out, 2 * x if threshold else -x)


@ll.aggregate
class Ring:
    """A ring of shared buffers and their mbarriers, with a runtime phase and a nested pair."""
    bufs: ll.shared_memory_descriptor
    bars: ll.shared_memory_descriptor
    position: tuple
    STAGES: ll.constexpr


@ll.jit
def ring_worker(ring: Ring, x):
    rows = ll.arange(0, BLOCK, ll.SliceLayout(1, ROWS))
    cols = ll.arange(0, BLOCK, ll.SliceLayout(0, ROWS))
    tile = ll.load(x + rows[:, None] * BLOCK + cols[None, :])
    ring.bufs.index(ring.position[0]).store(tile)
    mbarrier.arrive(ring.bars.index(0))


@ll.jit
def ring_consumer(ring: Ring, scale):
    mbarrier.wait(ring.bars.index(0), ring.position[1])
    return ring.bufs.index(ring.position[0]).load(ROWS) * scale


@ll.jit
def through_partitions(x, out, scale):
    bufs = ll.allocate_shared_memory(ll.float32, [2, BLOCK, BLOCK], ll.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    bars = ll.allocate_shared_memory(ll.int64, [2, 1], ll.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    ring = Ring(bufs, bars, (ll.to_tensor(1), ll.to_tensor(0)), 2)
    result = ll.warp_specialize([(ring_consumer, (ring, scale)), (ring_worker, (ring, x))],
                                [4], [0])
    rows = ll.arange(0, BLOCK, ll.SliceLayout(1, ROWS))
    cols = ll.arange(0, BLOCK, ll.SliceLayout(0, ROWS))
    ll.store(out + rows[:, None] * BLOCK + cols[None, :], result)


def test_aggregates_reach_warp_specialize_partitions_given_as_a_list():
    x = np.random.default_rng(2).standard_normal((BLOCK, BLOCK)).astype(np.float32)
    out = np.zeros_like(x)
    through_partitions[(1,)](x, out, 1.5)
    np.testing.assert_allclose(out, 1.5 * x)
    kernel = build_kernel(through_partitions, {"x": "*fp32", "out": "*fp32", "scale": "fp32"}, {}, 4)
    op, = [o for o in kernel.walk() if isinstance(o, ir.WarpSpecialize)]
    assert op.worker_num_warps == (4,) and len(op.results) == 1


def test_aggregate_kernels_compile_to_ptx():
    compiled = row_sums.compile({"x": "*fp32", "out": "*fp32", "count_out": "*i32", "n_cols": "i32",
                                 "stride": "i32"}, {"SCALE": 3}, num_warps=4)
    assert ".visible .entry row_sums" in compiled.asm["ptx"]
    if ptxas.find_ptxas() is not None:
        assert compiled.asm["cubin"]


# ------------------------------------------------------------------ aggregate misuse
@ll.jit
def field_changes_type(x, n):
    state = RowSums.start(1)
    for i in range(n):
        state = RowSums(state.acc.to(ll.float16), state.count, 1)  # the bad line
    ll.store(x, state.count)


@ll.jit
def field_assigned(x, n):
    state = RowSums.start(1)
    state.count = 3  # the bad line


@ll.jit
def runtime_in_constexpr_field(x, n):
    state = RowSums(ll.zeros([BLOCK], ll.float32, ll.SliceLayout(1, ROWS)), 0, ll.load(x))  # the bad line


@ll.jit
def class_changes_in_loop(x, n):
    state = RowSums.start(1)
    for i in range(n):
        state = Tile(x, n)  # the bad line


@pytest.mark.parametrize("kernel, message", [
    (field_changes_type, "loop-carried variable 'state.acc' changes type"),
    (field_assigned, "aggregates do not change in place"),
    (runtime_in_constexpr_field, "RowSums.scale is annotated constexpr but holds a runtime value"),
    (class_changes_in_loop, "'state' holds a RowSums before and a Tile after"),
])
def test_aggregate_misuse_is_an_error_at_the_users_line(kernel, message):
    with pytest.raises(CompilationError) as info:
        build_kernel(kernel, {"x": "*fp32", "n": "i32"}, {}, 4)
    assert message in str(info.value)
    assert "the bad line" in info.value.loc.source_line


# ------------------------------------------------------------------ to_tensor, must_use_result
@ll.jit
def count_up(out, n):
    total = ll.to_tensor(0)
    for i in range(n):
        total += i
    ll.store(out, total)


def test_to_tensor_makes_a_runtime_scalar():
    out = np.zeros(1, np.int32)
    count_up[(1,)](out, 10)
    assert out[0] == 45
    kernel = build_kernel(count_up, {"out": "*i32", "n": "i32"}, {}, 4)
    assert [str(v.type) for op in kernel.walk() if isinstance(op, ir.For) for v in op.results] == ["i32"]


@ll.must_use_result("it returns the new phase")
@ll.jit
def flipped(phase):
    return phase ^ 1


@ll.jit
def drops_result(out):
    phase = ll.to_tensor(0)
    flipped(phase)  # the bad line
    ll.store(out, phase)


@ll.jit
def uses_result(out):
    phase = flipped(ll.to_tensor(0))
    ll.store(out, phase)


def test_must_use_result_refuses_a_dropped_result():
    with pytest.raises(CompilationError) as info:
        build_kernel(drops_result, {"out": "*i32"}, {}, 4)
    assert "the result of flipped() is dropped: it returns the new phase" in str(info.value)
    assert "the bad line" in info.value.loc.source_line
    out = np.zeros(1, np.int32)
    uses_result[(1,)](out)
    assert out[0] == 1


# ------------------------------------------------------------------ num_warps, min/max
@ll.jit
def warps_and_extremes(out, a, b, num_warps: ll.constexpr):
    layout: ll.constexpr = ll.BlockedLayout([1], [32], [num_warps], [0])
    offsets = ll.arange(0, 32 * num_warps, layout)
    low = min(a, b, 100)
    high = max(a, b)
    values = ll.where(offsets == 0, low, ll.where(offsets == 1, high, ll.num_warps()))
    ll.store(out + offsets, values)


@pytest.mark.parametrize("num_warps", [4, 8])
@pytest.mark.parametrize("a, b", [(3, -7), (250, 120)])
def test_num_warps_parameter_and_min_max_on_runtime_values(num_warps, a, b):
    out = np.zeros(32 * num_warps, np.int32)
    warps_and_extremes[(1,)](out, a, b, num_warps=num_warps)
    assert out[0] == min(a, b, 100) and out[1] == max(a, b)
    assert (out[2:] == num_warps).all()
