"""Reductions, broadcasts and conversions over random distributed layouts.

A guard for the hole of issue 38's reduction bug: every legal distributed layout drawn by
`weft.layouts.strategies` (mixed bases such as (1, 1), duplicate registers, broadcast
lanes and warps) must reduce, broadcast and convert to the numpy answer on the emulator,
and compile through the backend into PTX that ptxas assembles (that part is skipped when
ptxas is missing). The default profile draws a few examples; HYPOTHESIS_PROFILE=deep
draws many more.

The inputs are small integers in fp32, so sums are exact and the comparison is exact.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import lowlevel as ll
from weft.compiler.errors import CompilationError
from weft.layouts.strategies import distributed_layouts, shapes
from weft.compiler.backend import ptxas

HAS_PTXAS = ptxas.find_ptxas() is not None
# Each example builds, emulates (or assembles) one kernel: a fraction of a second.
EXAMPLES = 2000 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 60


@ll.jit
def reduce_and_broadcast(x_ptr, col_sum_ptr, row_sum_ptr, col_max_ptr, row_max_ptr, centered_ptr,
                         converted_ptr, SRC: ll.constexpr, DST: ll.constexpr,
                         ROWS: ll.constexpr, COLS: ll.constexpr):
    rows = ll.arange(0, ROWS, layout=ll.SliceLayout(1, SRC))
    cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, SRC))
    offsets = rows[:, None] * COLS + cols[None, :]  # expand_dims and broadcast into SRC
    x = ll.load(x_ptr + offsets)
    ll.store(col_sum_ptr + cols, ll.sum(x, 0))
    ll.store(row_sum_ptr + rows, ll.sum(x, 1))
    ll.store(col_max_ptr + cols, ll.max(x, 0))
    ll.store(row_max_ptr + rows, ll.max(x, 1))
    # The reductions' results broadcast back over the operand's layout.
    centered = x * 4.0 - ll.expand_dims(ll.sum(x, 1), 1) - ll.expand_dims(ll.max(x, 0), 0)
    ll.store(centered_ptr + offsets, centered)
    dst_rows = ll.arange(0, ROWS, layout=ll.SliceLayout(1, DST))
    dst_cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, DST))
    ll.store(converted_ptr + dst_rows[:, None] * COLS + dst_cols[None, :], ll.convert_layout(x, DST))


SIGNATURE = {name: "*fp32" for name in ("x_ptr", "col_sum_ptr", "row_sum_ptr", "col_max_ptr",
                                         "row_max_ptr", "centered_ptr", "converted_ptr")}


@st.composite
def layout_pairs(draw):
    """(num_warps, source layout, destination layout) of one random 2-D shape."""
    # From 64 elements up, so that threads hold several registers whose slices may be
    # dependent (issue 38); dense mixing draws bases such as (1, 1), (2, 2), (0, 3).
    shape = draw(shapes(rank=2, max_elements=512, min_elements=64))
    num_warps = draw(st.sampled_from([1, 2, 4]))
    src = draw(distributed_layouts(shape=shape, num_warps=num_warps, dense_mixing=True))
    dst = draw(distributed_layouts(shape=shape, num_warps=num_warps, dense_mixing=True))
    return num_warps, ll.LinearDistributedLayout.from_linear(src), ll.LinearDistributedLayout.from_linear(dst)


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"col_sum": x.sum(0), "row_sum": x.sum(1), "col_max": x.max(0), "row_max": x.max(1),
            "centered": x * 4 - x.sum(1, keepdims=True) - x.max(0, keepdims=True), "converted": x}


def check_on_emulator(num_warps: int, src, dst, seed: int = 0) -> None:
    rows, cols = src.shape
    x = np.random.default_rng(seed).integers(-8, 9, size=(rows, cols)).astype(np.float32)
    expected = _expected(x)
    outputs = {name: np.full_like(value, np.nan) for name, value in expected.items()}
    reduce_and_broadcast[(1,)](x, *outputs.values(), SRC=src, DST=dst, ROWS=rows, COLS=cols,
                               num_warps=num_warps)
    for name, value in expected.items():
        np.testing.assert_array_equal(outputs[name], value, err_msg=f"{name} over {src} -> {dst}")


def check_through_ptxas(num_warps: int, src, dst) -> None:
    rows, cols = src.shape
    compiled = reduce_and_broadcast.compile(SIGNATURE, num_warps=num_warps, constexprs={
        "SRC": src, "DST": dst, "ROWS": rows, "COLS": cols})
    assert ".entry" in compiled.asm["ptx"]
    if HAS_PTXAS:
        assert compiled.asm.get("cubin"), "ptxas was found but produced no cubin"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs(), st.integers(0, 2**16))
def test_random_layouts_on_the_emulator(pair, seed):
    check_on_emulator(*pair, seed=seed)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs())
def test_random_layouts_through_ptxas(pair):
    check_through_ptxas(*pair)


# Issue 38: `ll.sum(x, 0)` in this layout raised ValueError on the emulator (the slice
# rule kept a result register (3) = (1) ^ (2), so register groups had uneven sizes) and
# RecursionError in the backend.
ISSUE_38 = ll.LinearDistributedLayout(
    reg_bases=[[1, 1], [2, 2], [0, 3]], lane_bases=[[4, 0], [0, 4], [1, 0], [0, 0], [0, 0]],
    warp_bases=[], block_bases=[], shape=[8, 8])


@ll.jit
def column_sums(x_ptr, out_ptr, LAYOUT: ll.constexpr):
    rows = ll.arange(0, 8, layout=ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, 8, layout=ll.SliceLayout(0, LAYOUT))
    x = ll.load(x_ptr + rows[:, None] * 8 + cols[None, :])
    ll.store(out_ptr + cols, ll.sum(x, 0))


def test_issue_38_column_sums_on_the_emulator():
    x = np.random.default_rng(38).standard_normal((8, 8)).astype(np.float32)
    out = np.zeros(8, np.float32)
    column_sums[(1,)](x, out, LAYOUT=ISSUE_38, num_warps=1)
    np.testing.assert_allclose(out, x.sum(0), rtol=1e-6, atol=1e-6)


def test_issue_38_column_sums_compile():
    compiled = column_sums.compile({"x_ptr": "*fp32", "out_ptr": "*fp32"}, constexprs={"LAYOUT": ISSUE_38},
                                   num_warps=1)
    # Two lane steps (lanes 1 and 4 move along dim0 only), no shared memory.
    assert compiled.asm["ptx"].count("shfl.sync.bfly") == 2 * 4  # for each of four result registers
    if HAS_PTXAS:
        assert compiled.asm.get("cubin")


def test_issue_38_layout_reduces_broadcasts_and_converts_on_the_emulator():
    check_on_emulator(1, ISSUE_38, ISSUE_38)
    check_on_emulator(1, ISSUE_38, ll.LinearDistributedLayout.from_linear(
        ll.BlockedLayout([1, 1], [4, 8], [1, 1], [1, 0]).to_linear([8, 8])))


def test_issue_38_layout_compiles():
    check_through_ptxas(1, ISSUE_38, ISSUE_38)


def test_a_reduction_across_the_ctas_of_a_cluster_is_refused_at_the_users_line():
    # Block bases are not reduced (that needs distributed shared memory); before, they were
    # ignored and each CTA kept its partial sum.
    across_ctas = ll.LinearDistributedLayout(
        reg_bases=[[0, 1], [0, 2], [1, 0]], lane_bases=[[0, 4], [2, 0], [0, 0], [0, 0], [0, 0]],
        warp_bases=[], block_bases=[[4, 0]], shape=[8, 8])
    with pytest.raises(CompilationError, match=r"(?s)test_random_layouts.py:\d+.*CTAs of the cluster.*dim0"):
        column_sums.compile({"x_ptr": "*fp32", "out_ptr": "*fp32"}, constexprs={"LAYOUT": across_ctas},
                            num_warps=1)


def check_on_gpu(num_warps: int, src, dst, seed: int = 0) -> None:
    """The same kernel on the GPU: the butterfly and cross-warp paths the emulator models
    must hold on the hardware too (they are only assembled, not run, without a GPU)."""
    torch = pytest.importorskip("torch")
    rows, cols = src.shape
    x = np.random.default_rng(seed).integers(-8, 9, size=(rows, cols)).astype(np.float32)
    expected = _expected(x)
    outputs = {name: torch.full(value.shape, float("nan"), device="cuda") for name, value in expected.items()}
    reduce_and_broadcast[(1,)](torch.from_numpy(x).cuda(), *outputs.values(), SRC=src, DST=dst,
                               ROWS=rows, COLS=cols, num_warps=num_warps)
    for name, value in expected.items():
        np.testing.assert_array_equal(outputs[name].cpu().numpy(), value, err_msg=f"{name} over {src} -> {dst}")


@pytest.mark.gpu
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs(), st.integers(0, 2**16))
def test_random_layouts_on_the_gpu(pair, seed):
    check_on_gpu(*pair, seed=seed)


@pytest.mark.gpu
def test_issue_38_layout_on_the_gpu():
    check_on_gpu(1, ISSUE_38, ISSUE_38)
