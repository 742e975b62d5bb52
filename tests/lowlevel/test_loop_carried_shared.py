"""Shared-memory descriptors and views carried through runtime control flow, as Gluon
carries them: a double buffer advanced by index, two buffers swapped each iteration (by
name and as an aggregate's fields), a view
carried through a while loop and chosen by an if. What comes out is still a descriptor
(`.load`, `.slice`, `.permute` work on it); the emulator runs it against numpy and the
backend compiles it for sm_90a. A view whose addressing would change on the way (another
slice window) is refused at the line that made it."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationError

ROW_MAJOR = ll.SwizzledSharedLayout(1, 1, 1, [1, 0])
BLOCKED = ll.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
R, C = 16, 32
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}


@ll.jit
def double_buffer_by_index(x_ptr, out_ptr, n, R: ll.constexpr, C: ll.constexpr):
    """Each trip reads the current buffer and writes 2x it into the other one."""
    rows = ll.arange(0, R, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    bufs = ll.allocate_shared_memory(ll.float32, [2, R, C], ROW_MAJOR)
    buf = bufs.index(0)
    buf.store(ll.load(x_ptr + rows[:, None] * C + cols[None, :]))
    for i in range(n):
        ll.barrier()
        value = buf.load(BLOCKED)
        buf = bufs.index((i + 1) % 2)
        buf.store(value * 2.0 + 1.0)
    ll.barrier()
    # The carried view is still a descriptor: its views and loads work after the loop.
    half = ll.arange(0, R // 2, ll.SliceLayout(1, BLOCKED))
    ll.store(out_ptr + half[:, None] * C + cols[None, :], buf.slice(0, R // 2, 0).load(BLOCKED))
    tcols = ll.arange(0, C, ll.SliceLayout(1, BLOCKED))
    trows = ll.arange(0, R, ll.SliceLayout(0, BLOCKED))
    ll.store(out_ptr + R * C + tcols[:, None] * R + trows[None, :], buf.permute((1, 0)).load(BLOCKED))


@ll.jit
def swapped_descriptors(x_ptr, out_ptr, n, R: ll.constexpr, C: ll.constexpr):
    """Two allocations trade names every trip: `back` gets 3 * front - 1, then they swap."""
    rows = ll.arange(0, R, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    front = ll.allocate_shared_memory(ll.float32, [R, C], ROW_MAJOR)
    back = ll.allocate_shared_memory(ll.float32, [R, C], ROW_MAJOR)
    front.store(ll.load(x_ptr + rows[:, None] * C + cols[None, :]))
    for i in range(n):
        ll.barrier()
        back.store(front.load(BLOCKED) * 3.0 - 1.0)
        front, back = back, front
    ll.barrier()
    ll.store(out_ptr + rows[:, None] * C + cols[None, :], front.load(BLOCKED))


@ll.aggregate
class PingPong:
    """The two buffers of swapped_descriptors, carried as one piece of kernel state."""
    front: ll.shared_memory_descriptor
    back: ll.shared_memory_descriptor

    @ll.jit
    def swapped(self):
        return PingPong(self.back, self.front)


@ll.jit
def swapped_in_an_aggregate(x_ptr, out_ptr, n, R: ll.constexpr, C: ll.constexpr):
    rows = ll.arange(0, R, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    state = PingPong(ll.allocate_shared_memory(ll.float32, [R, C], ROW_MAJOR),
                     ll.allocate_shared_memory(ll.float32, [R, C], ROW_MAJOR))
    state.front.store(ll.load(x_ptr + rows[:, None] * C + cols[None, :]))
    for i in range(n):
        ll.barrier()
        state.back.store(state.front.load(BLOCKED) * 3.0 - 1.0)
        state = state.swapped()
    ll.barrier()
    ll.store(out_ptr + rows[:, None] * C + cols[None, :], state.front.load(BLOCKED))


@ll.jit
def while_carried(x_ptr, out_ptr, n, R: ll.constexpr, C: ll.constexpr):
    """The double buffer of double_buffer_by_index, advanced by a while loop."""
    rows = ll.arange(0, R, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    bufs = ll.allocate_shared_memory(ll.float32, [2, R, C], ROW_MAJOR)
    buf = bufs.index(0)
    buf.store(ll.load(x_ptr + rows[:, None] * C + cols[None, :]))
    i = 0
    while i < n:
        ll.barrier()
        value = buf.load(BLOCKED)
        i += 1
        buf = bufs.index(i % 2)
        buf.store(value * 2.0 + 1.0)
    ll.barrier()
    ll.store(out_ptr + rows[:, None] * C + cols[None, :], buf.load(BLOCKED))


@ll.jit
def chosen_by_if(x_ptr, out_ptr, n, R: ll.constexpr, C: ll.constexpr):
    """Buffer 0 holds x, buffer 1 holds -x; n > 0 picks buffer 1, else buffer 0."""
    rows = ll.arange(0, R, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    bufs = ll.allocate_shared_memory(ll.float32, [2, R, C], ROW_MAJOR)
    x = ll.load(x_ptr + rows[:, None] * C + cols[None, :])
    bufs.index(0).store(x)
    bufs.index(1).store(-x)
    ll.barrier()
    if n > 0:
        chosen = bufs.index(1)
    else:
        chosen = bufs.index(0)
    ll.store(out_ptr + rows[:, None] * C + cols[None, :], chosen.slice(0, R, 0).load(BLOCKED))


@ll.jit
def swapped_windows(x_ptr, out_ptr, n, R: ll.constexpr, C: ll.constexpr):
    rows = ll.arange(0, R // 2, ll.SliceLayout(1, BLOCKED))
    cols = ll.arange(0, C, ll.SliceLayout(0, BLOCKED))
    whole = ll.allocate_shared_memory(ll.float32, [R, C], ROW_MAJOR)
    top = whole.slice(0, R // 2, 0)
    bottom = whole.slice(R // 2, R // 2, 0)  # the bad line
    top.store(ll.load(x_ptr + rows[:, None] * C + cols[None, :]))
    for i in range(n):
        ll.barrier()
        bottom.store(top.load(BLOCKED) + 1.0)
        top, bottom = bottom, top
    ll.store(out_ptr + rows[:, None] * C + cols[None, :], top.load(BLOCKED))


def _doubled(x, n):
    for _ in range(n):
        x = x * 2 + 1
    return x


def _input(seed):
    return np.random.default_rng(seed).standard_normal((R, C)).astype(np.float32)


@pytest.mark.parametrize("n", [0, 1, 4])
def test_a_double_buffer_advanced_by_index_stays_a_descriptor(n):
    x = _input(n)
    out = np.zeros(2 * R * C, np.float32)
    double_buffer_by_index[(1,)](x, out, n, R=R, C=C)
    expected = _doubled(x.astype(np.float64), n)
    np.testing.assert_allclose(out[:R // 2 * C].reshape(R // 2, C), expected[:R // 2], rtol=1e-6)
    np.testing.assert_allclose(out[R * C:].reshape(C, R), expected.T, rtol=1e-6)


@pytest.mark.parametrize("kernel", [swapped_descriptors, swapped_in_an_aggregate])
@pytest.mark.parametrize("n", [0, 3])
def test_descriptors_swapped_each_iteration(kernel, n):
    x = _input(10 + n)
    out = np.zeros_like(x)
    kernel[(1,)](x, out, n, R=R, C=C)
    expected = x.astype(np.float64)
    for _ in range(n):
        expected = expected * 3 - 1
    np.testing.assert_allclose(out, expected, rtol=1e-5)


@pytest.mark.parametrize("n", [0, 3])
def test_a_view_carried_through_a_while_loop(n):
    x = _input(20 + n)
    out = np.zeros_like(x)
    while_carried[(1,)](x, out, n, R=R, C=C)
    np.testing.assert_allclose(out, _doubled(x.astype(np.float64), n), rtol=1e-6)


@pytest.mark.parametrize("n", [0, 5])  # not 1: a launch specializes n == 1 to a constant
def test_a_view_chosen_by_an_if(n):
    x = _input(30 + n)
    out = np.zeros_like(x)
    chosen_by_if[(1,)](x, out, n, R=R, C=C)
    np.testing.assert_array_equal(out, -x if n > 0 else x)


@pytest.mark.parametrize("kernel", [double_buffer_by_index, swapped_descriptors, swapped_in_an_aggregate,
                                    while_carried, chosen_by_if])
def test_carried_views_compile_for_sm90a(kernel):
    compiled = kernel.compile(SIGNATURE, {"R": R, "C": C}, num_warps=4)
    assert f".visible .entry {kernel.__name__}" in compiled.asm["ptx"]
    if ptxas.find_ptxas() is None:
        pytest.skip("ptxas not found: PTX built, not assembled")
    assert compiled.asm["cubin"]


def test_a_view_whose_window_changes_in_the_loop_is_refused_where_it_is_made():
    x = _input(40)
    with pytest.raises(CompilationError) as caught:
        swapped_windows[(1,)](x, np.zeros((R // 2, C), np.float32), 2, R=R, C=C)
    assert "carried through this loop" in caught.value.message
    assert caught.value.loc.source_line.rstrip().endswith("# the bad line")
