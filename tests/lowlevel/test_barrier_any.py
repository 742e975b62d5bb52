"""ll.barrier_any: a barrier that ORs a boolean over the threads meeting there, and the
branch the whole CTA (or partition copy) then takes together: on the emulator, through
ptxas, on the GPU, and the errors for what it cannot take."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.lowlevel import mbarrier
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(17)
ROW = ll.BlockedLayout([1], [32], [4], [0])  # 128 values over one warpgroup
COPIES = 3


@ll.jit
def flag_any(x_ptr, out_ptr, flags_ptr, LIMIT: ll.constexpr):
    """out = x + 1 everywhere if any x passed LIMIT, else x; the answer in flags_ptr."""
    offsets = ll.arange(0, 128, ROW)
    x = ll.load(x_ptr + offsets)
    y = x
    hit = ll.barrier_any(x > LIMIT)
    if hit:
        y = x + 1.0
    ll.store(out_ptr + offsets, y)
    ll.store(flags_ptr + offsets, ll.full([128], 1, ll.int32, ROW) * hit.to(ll.int32))


@ll.jit
def wait_for_copies(done):
    mbarrier.wait(done, 0)


@ll.jit
def copy_flags_any(x_ptr, out_ptr, LIMIT: ll.constexpr, done):
    """Copy k ORs (x > LIMIT) over its own 128 values only (its own named barrier)."""
    offsets = ll.replica_index() * 128 + ll.arange(0, 128, ROW)
    x = ll.load(x_ptr + offsets)
    y = x
    if ll.barrier_any(x > LIMIT):
        y = -x
    ll.store(out_ptr + offsets, y)
    mbarrier.arrive(done, per_warp=True)


@ll.jit
def replicated_any(x_ptr, out_ptr, LIMIT: ll.constexpr):
    done = mbarrier.allocate_mbarrier()
    mbarrier.init(done, count=4 * COPIES)
    ll.warp_specialize((done,), wait_for_copies, (x_ptr, out_ptr, LIMIT, done), [copy_flags_any],
                       worker_num_warps=[4], worker_num_regs=[0], worker_replicas=[COPIES])
    mbarrier.invalidate(done)


def _flag_inputs(where):
    """128 values in [0, 1); one of them (at `where`, unless None) set to 2."""
    x = RNG.random(128).astype(np.float32)
    if where is not None:
        x[where] = 2.0
    return x


def _copies_inputs():
    """Copy 1's values all in [0, 1); copy 0 and 2 each have one value of 2 (in
    different warps)."""
    x = RNG.random(COPIES * 128).astype(np.float32)
    x[5] = 2.0
    x[2 * 128 + 100] = 2.0
    return x


def _copies_expected(x):
    expected = x.copy()
    for copy in (0, 2):
        expected[copy * 128:(copy + 1) * 128] *= -1
    return expected


@pytest.mark.parametrize("where", [None, 0, 77, 127])
def test_one_thread_decides_for_the_cta_on_the_emulator(where):
    x = _flag_inputs(where)
    out, flags = np.zeros_like(x), np.zeros(128, np.int32)
    flag_any[(1,)](x, out, flags, LIMIT=1.0, num_warps=4)
    hit = where is not None
    np.testing.assert_array_equal(out, x + (1.0 if hit else 0.0))
    np.testing.assert_array_equal(flags, np.full(128, int(hit)))


def test_each_partition_copy_decides_on_its_own_on_the_emulator():
    x = _copies_inputs()
    out = np.zeros_like(x)
    replicated_any[(1,)](x, out, LIMIT=1.0, num_warps=4)
    np.testing.assert_array_equal(out, _copies_expected(x))


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_it_is_one_barrier_reduction():
    ptx = flag_any.compile(signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "flags_ptr": "*i32"},
                           constexprs={"LIMIT": 1.0}, num_warps=4).asm["ptx"]
    assert ptx.count("bar.red.or.pred") == 1 and "bar.sync" not in ptx and "vote" not in ptx
    ptx = replicated_any.compile(signature={"x_ptr": "*fp32", "out_ptr": "*fp32"}, constexprs={"LIMIT": 1.0},
                                 num_warps=4).asm["ptx"]
    assert ptx.count("bar.red.or.pred") == 1  # one copy of the worker's code, its barrier id a register


@ll.jit
def not_boolean(x_ptr):
    x = ll.load(x_ptr + ll.arange(0, 128, ROW))
    ll.barrier_any(x)


@ll.jit
def in_a_warp_branch(x_ptr):
    x = ll.load(x_ptr + ll.arange(0, 128, ROW))
    if ll.warp_any(x > 0.0):
        x = x * 2.0
        ll.barrier_any(x > 1.0)
    ll.store(x_ptr + ll.arange(0, 128, ROW), x)


@pytest.mark.parametrize("kernel, message, line", [
    (not_boolean, "barrier_any needs a boolean tensor or scalar", "ll.barrier_any(x)"),
    (in_a_warp_branch, "`barrier_any` in a branch taken warp by warp", "ll.barrier_any(x > 1.0)")])
def test_bad_uses_are_refused_at_the_users_line(kernel, message, line):
    with pytest.raises(CompilationError) as info:
        kernel.compile(signature={"x_ptr": "*fp32"}, constexprs={}, num_warps=4)
    assert message in str(info.value) and line in str(info.value)


@pytest.mark.gpu
def test_barrier_any_on_the_gpu():
    torch = pytest.importorskip("torch")
    for where in (None, 0, 77, 127):
        x = torch.from_numpy(_flag_inputs(where)).cuda()
        out, flags = torch.zeros_like(x), torch.zeros(128, dtype=torch.int32, device="cuda")
        flag_any[(1,)](x, out, flags, LIMIT=1.0, num_warps=4)
        hit = where is not None
        assert torch.equal(out, x + (1.0 if hit else 0.0)) and bool((flags == int(hit)).all())
    x = _copies_inputs()
    out = torch.zeros(x.shape, device="cuda")
    replicated_any[(1,)](torch.from_numpy(x).cuda(), out, LIMIT=1.0, num_warps=4)
    np.testing.assert_array_equal(out.cpu().numpy(), _copies_expected(x))
