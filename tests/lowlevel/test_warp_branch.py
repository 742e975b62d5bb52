"""`ll.warp_any` and the branch each warp takes on its own (`if ll.warp_any(mask):`), in
the frontend's checks, the backend (vote.sync and a branch), the emulator and on the GPU,
against numpy on random inputs."""

import re

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel

# 32 x 16 over 4 warps: warp w holds rows 8w .. 8w + 7, each lane 4 elements of a row.
TILE = ll.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
ROW = ll.SliceLayout(1, TILE)
ROWS, COLS = 32, 16
SIGNATURE = {"x_ptr": "*fp32", "bound_ptr": "*fp32", "out_ptr": "*fp32", "voted_ptr": "*i32"}


@ll.jit
def tile_and_bounds(x_ptr, bound_ptr):
    """The row indices, the element offsets, the [ROWS, COLS] tile and its rows' bounds."""
    rows = ll.arange(0, ROWS, ROW)
    offs = rows[:, None] * COLS + ll.arange(0, COLS, ll.SliceLayout(0, TILE))[None, :]
    return rows, offs, ll.load(x_ptr + offs), ll.load(bound_ptr + rows)


@ll.jit
def rescale_grown_rows(x_ptr, bound_ptr, out_ptr, voted_ptr):
    """Flash attention's rescale in small: each warp any of whose rows has its maximum
    above its bound raises every bound of its own to the row's maximum (if larger) and
    divides the row by it; other warps keep rows and bounds as they are."""
    rows, offs, x, bound = tile_and_bounds(x_ptr, bound_ptr)
    row_max = ll.max(x, axis=1)
    grew = ll.warp_any(row_max > bound)
    ll.store(voted_ptr + rows, ll.where(grew, 1, 0))
    if grew:
        bound = ll.maximum(bound, row_max)
        x = x / bound[:, None]
    ll.store(out_ptr + offs, x)
    ll.store(bound_ptr + rows, bound)


@ll.jit
def rescale_grown_rows_reducing_in_branch(x_ptr, bound_ptr, out_ptr, voted_ptr):
    """rescale_grown_rows with the row maxima reduced inside the branch: a reduction along
    rows, which each warp holds whole (lane shuffles within the warp), may run there, so
    only the warps that take the branch pay for it."""
    rows, offs, x, bound = tile_and_bounds(x_ptr, bound_ptr)
    grew = ll.warp_any(x > bound[:, None])
    ll.store(voted_ptr + rows, ll.max(ll.where(grew, 1, 0), axis=1))
    if grew:
        bound = ll.maximum(bound, ll.max(x, axis=1))
        x = x / bound[:, None]
    ll.store(out_ptr + offs, x)
    ll.store(bound_ptr + rows, bound)


@ll.jit
def rescale_grown_rows_in_halves(x_ptr, bound_ptr, out_ptr, voted_ptr):
    """rescale_grown_rows with each row's maximum taken over its two halves inside the
    branch: a reshape (and a permute), which only rename a thread's registers, and
    reductions within the warp may run there."""
    rows, offs, x, bound = tile_and_bounds(x_ptr, bound_ptr)
    grew = ll.warp_any(x > bound[:, None])
    ll.store(voted_ptr + rows, ll.max(ll.where(grew, 1, 0), axis=1))
    if grew:
        halves = ll.max(ll.reshape(x, [ROWS, 2, COLS // 2]).permute((0, 2, 1)), axis=1)
        bound = ll.maximum(bound, ll.convert_layout(ll.max(halves, axis=1), ROW))
        x = x / bound[:, None]
    ll.store(out_ptr + offs, x)
    ll.store(bound_ptr + rows, bound)


KERNELS = [rescale_grown_rows, rescale_grown_rows_reducing_in_branch, rescale_grown_rows_in_halves]


def reference(x: np.ndarray, bound: np.ndarray):
    """(out, bound, voted) per warp, in float64."""
    out, bound, voted = x.astype(np.float64), bound.astype(np.float64), np.zeros(ROWS, np.int32)
    for warp in range(4):
        rows = slice(8 * warp, 8 * warp + 8)
        if (x[rows].max(axis=1) > bound[rows]).any():
            voted[rows] = 1
            bound[rows] = np.maximum(bound[rows], x[rows].max(axis=1))
            out[rows] /= bound[rows, None]
    return out, bound, voted


def inputs(seed: int):
    """Random rows whose bounds the row maxima pass in a random subset of warps only."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, COLS)).astype(np.float32)
    bound = (x.max(axis=1) + rng.uniform(0.1, 3.0, ROWS)).astype(np.float32)  # no row passes
    for warp in np.flatnonzero(rng.random(4) < 0.5):
        row = 8 * warp + rng.integers(8)
        bound[row] = x[row].max() - 0.5  # one row of this warp passes
    return x, bound


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("seed", range(4))
def test_each_warp_takes_the_branch_on_its_own_in_the_emulator(seed, kernel):
    x, bound = inputs(seed)
    out, new_bound = np.zeros_like(x), bound.copy()
    voted = np.zeros(ROWS, np.int32)
    kernel[(1,)](x, new_bound, out, voted)
    want_out, want_bound, want_voted = reference(x, bound)
    np.testing.assert_array_equal(voted, want_voted)
    np.testing.assert_allclose(out, want_out, rtol=1e-6)
    np.testing.assert_allclose(new_bound, want_bound, rtol=1e-6)


def test_some_warps_take_the_branch_and_some_do_not():
    """The inputs the tests use exercise both sides: otherwise the branch is untested."""
    voted = np.concatenate([reference(*inputs(seed))[2] for seed in range(4)]).reshape(-1, 8)
    assert voted.any(axis=1).any() and not voted.any(axis=1).all()


def test_the_backend_votes_once_and_branches():
    compiled = rescale_grown_rows.compile(signature=SIGNATURE)
    ptx = compiled.asm["ptx"]
    assert len(re.findall(r"vote\.sync\.any\.pred", ptx)) == 1
    assert re.search(r"@%p\d+ bra", ptx)
    assert "per_warp=True" in compiled.asm["layout"]


def test_a_reduction_in_the_branch_shuffles_within_the_warp():
    """Its lanes combine by shuffles after the branch instruction, with no shared memory
    and no barrier, which the warps that skip the branch would leave short."""
    ptx = rescale_grown_rows_reducing_in_branch.compile(signature=SIGNATURE).asm["ptx"]
    branch = re.search(r"@%p\d+ bra", ptx).start()
    assert "shfl.sync.bfly" in ptx[branch:]
    assert "bar.sync" not in ptx and "st.shared" not in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("seed", range(2))
def test_warp_branch_on_the_gpu(seed, kernel):
    torch = pytest.importorskip("torch")
    x, bound = inputs(seed)
    out = torch.zeros(ROWS, COLS, device="cuda")
    new_bound = torch.from_numpy(bound).cuda()
    voted = torch.zeros(ROWS, dtype=torch.int32, device="cuda")
    kernel[(1,)](torch.from_numpy(x).cuda(), new_bound, out, voted)
    want_out, want_bound, want_voted = reference(x, bound)
    np.testing.assert_array_equal(voted.cpu().numpy(), want_voted)
    np.testing.assert_allclose(out.cpu().numpy(), want_out, rtol=1e-6)
    np.testing.assert_allclose(new_bound.cpu().numpy(), want_bound, rtol=1e-6)


# ------------------------------------------------------------------ errors at the user's line
@ll.jit
def store_in_branch(x_ptr, bound_ptr, out_ptr, voted_ptr):
    rows = ll.arange(0, ROWS, ROW)
    bound = ll.load(bound_ptr + rows)
    if ll.warp_any(bound > 0.0):
        ll.store(out_ptr + rows, bound)


@ll.jit
def reduce_in_branch(x_ptr, bound_ptr, out_ptr, voted_ptr):
    rows = ll.arange(0, ROWS, ROW)
    bound = ll.load(bound_ptr + rows)
    total = 0.0
    if ll.warp_any(bound > 0.0):
        bound = bound + ll.sum(bound, axis=0)
    ll.store(out_ptr + rows, bound + total)


@ll.jit
def scalar_in_branch(x_ptr, bound_ptr, out_ptr, voted_ptr):
    rows = ll.arange(0, ROWS, ROW)
    bound = ll.load(bound_ptr + rows)
    scale = ll.load(bound_ptr)
    if ll.warp_any(bound > 0.0):
        scale = 2.0 * scale
    ll.store(out_ptr + rows, bound * scale)


@ll.jit
def tensor_condition(x_ptr, bound_ptr, out_ptr, voted_ptr):
    rows = ll.arange(0, ROWS, ROW)
    bound = ll.load(bound_ptr + rows)
    if bound > 0.0:
        bound = bound * 2.0
    ll.store(out_ptr + rows, bound)


@ll.jit
def vote_on_floats(x_ptr, bound_ptr, out_ptr, voted_ptr):
    rows = ll.arange(0, ROWS, ROW)
    ll.store(voted_ptr + rows, ll.where(ll.warp_any(ll.load(bound_ptr + rows)), 1, 0))


@pytest.mark.parametrize("kernel, message, line", [
    (store_in_branch, "`store` in a branch taken warp by warp", "ll.store(out_ptr + rows, bound)"),
    (reduce_in_branch, "`reduce` in a branch taken warp by warp", "ll.sum(bound, axis=0)"),
    (scalar_in_branch, "'scale' is a scalar assigned in a branch taken warp by warp", "if ll.warp_any"),
    (tensor_condition, "the condition of `if` must be a scalar", "if bound > 0.0"),
    (vote_on_floats, "warp_any needs a boolean tensor", "ll.warp_any(ll.load"),
])
def test_a_bad_warp_branch_is_refused_at_the_users_line(kernel, message, line):
    with pytest.raises(CompilationError, match=re.escape(message)) as info:
        kernel.compile(signature=SIGNATURE)
    assert line in str(info.value)
    if kernel is tensor_condition:
        assert "if ll.warp_any(mask):" in str(info.value)


def test_the_verifier_refuses_a_barrier_in_a_per_warp_branch():
    """A pass must not move a barrier into a branch some warps skip."""
    from weft.compiler.verifier import VerificationError, verify

    kernel = build_kernel(rescale_grown_rows, SIGNATURE, {}, 4)
    (branch,) = [op for op in kernel.walk() if isinstance(op, ir.If)]
    verify(kernel)
    body = branch.then_body
    object.__setattr__(branch, "then_body", ir.Block(body.args, (ir.Barrier(),) + body.ops))
    with pytest.raises(VerificationError, match=r"per-warp if, which holds register arithmetic \(and in-warp reductions\) only"):
        verify(kernel)
