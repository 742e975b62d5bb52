"""Warp specialization by default (pipeline_tma_warp_specialize.default_split_loop): the
kernel's one top-level descriptor dot loop is split into producer and consumers when its
tl.range says nothing about warp_specialize and its ring is too large for two CTAs per SM
(DEFAULT_SPLIT_RING_BYTES; lowered to 0 here so that small tiles, which the emulator runs
quickly, are split too); `warp_specialize=False` keeps one partition;
where the default cannot apply (two dot loops, a nested loop, pointer loads, an epilogue
reading a tensor loaded before the loop) the kernel compiles as before, without a warning.
The split kernels run on the CPU emulator (partitions interleaved, race and deadlock
checks, shuffled TMA completions) against numpy float64 over hypothesis-drawn tiles,
stages, warps and tails."""

import dataclasses
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import TmaAsyncCopyGlobalToShared, WarpSpecialize
from weft.compiler.passes import pipeline_tma_warp_specialize

from weft.runtime.emulator import emulate

from .test_warp_specialize_tma import described, random, run, signature

torch = pytest.importorskip("torch")  # host arrays

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


@tl.jit
def default_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """C = A @ B from host descriptors; the loop says nothing about warp specialization."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def plain_range_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The same with Python's range: stages from the launch, split by default too."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def refused_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """warp_specialize=False: one partition."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=False):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


@tl.jit
def two_loops(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """Two dot loops: which one to split is not obvious, so neither is."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    c_desc.store([0, 0], acc.to(c_desc.dtype))


@tl.jit
def persistent(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The dot loop nested in a tile loop: partitions do not nest."""
    for tile in range(tl.program_id(0), 2, tl.num_programs(0)):
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            acc = tl.dot(a_desc.load([tile * BLOCK_M, k]), b_desc.load([k, 0]), acc)
        c_desc.store([tile * BLOCK_M, 0], acc.to(c_desc.dtype))


@tl.jit
def loaded_before_the_loop(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The epilogue reads a box loaded before the loop: it could not join the consumers."""
    bias = c_desc.load([0, 0])
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        acc = tl.dot(a_desc.load([0, k]), b_desc.load([k, 0]), acc)
    c_desc.store([0, 0], (acc + bias.to(tl.float32)).to(c_desc.dtype))


@tl.jit
def pointer_matmul(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
    """Pointer loads: cp.async rings, which the split does not take."""
    offs = tl.arange(0, BLOCK)
    a_ptrs = a_ptr + offs[:, None] * K + offs[None, :]
    b_ptrs = b_ptr + offs[:, None] * BLOCK + offs[None, :]
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for _ in tl.range(0, K, BLOCK, num_stages=3):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
        a_ptrs += BLOCK
        b_ptrs += BLOCK * BLOCK
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)


def prepared(fn, block, stages: int, num_warps: int = 4, launch_stages=None):
    """`fn` through the highlevel passes, failing on any CompilationWarning."""
    constexprs = dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages)
    kernel = build_kernel(fn, signature(block), constexprs, num_warps, {}, language="highlevel")
    kernel = dataclasses.replace(kernel, num_stages=launch_stages)  # the launch option
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        return pipeline.prepare_for_emulator(kernel)


def is_split(kernel) -> bool:
    return any(isinstance(op, WarpSpecialize) for op in kernel.walk())


@pytest.fixture
def small_rings_split(monkeypatch):
    monkeypatch.setattr(pipeline_tma_warp_specialize, "DEFAULT_SPLIT_RING_BYTES", 0)


@pytest.mark.parametrize("block, num_warps, stages, split", [
    ((128, 256, 64), 8, 3, True), ((128, 128, 64), 4, 4, True),  # one CTA per SM by shared memory anyway
    ((128, 128, 64), 8, 3, False), ((64, 64, 32), 4, 3, False)])  # two or more fit: the split would cost them
def test_the_default_splits_only_rings_that_leave_room_for_one_cta(block, num_warps, stages, split):
    assert is_split(prepared(default_matmul, block, stages, num_warps)) == split


def test_a_loop_that_says_nothing_is_split_and_one_that_says_false_is_not(small_rings_split):
    block = (64, 64, 32)
    split = prepared(default_matmul, block, 3)
    assert is_split(split)
    (worker,) = [op for op in split.walk() if isinstance(op, WarpSpecialize)]
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in worker.workers[0].walk()) == 2
    assert not is_split(prepared(refused_matmul, block, 3))
    run(split, block, 100, 72, 416)


@pytest.mark.parametrize("fn", [two_loops, persistent, loaded_before_the_loop])
def test_where_the_default_cannot_apply_the_kernel_keeps_one_partition_silently(small_rings_split, fn):
    kernel = prepared(fn, (64, 64, 32), 3)
    assert not is_split(kernel)
    assert any(isinstance(op, TmaAsyncCopyGlobalToShared) for op in kernel.walk())  # still ringed


def test_a_pointer_loop_is_not_split_and_not_warned_about(small_rings_split):
    signature_ = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)
        kernel = pipeline.prepare_for_emulator(build_kernel(pointer_matmul, signature_, {"BLOCK": 64}, 4, {},
                                                            language="highlevel"))
    assert not is_split(kernel)


def test_the_epilogue_reading_a_box_from_before_the_loop_still_matches_numpy(small_rings_split):
    block = (64, 64, 32)
    kernel = prepared(loaded_before_the_loop, block, 2)
    a, b = random(64, 96), random(96, 64)
    c = random(64, 64)
    expected = a.double().numpy() @ b.double().numpy() + c.double().numpy()
    emulate(kernel, (1,), (described(a, block[::2]), described(b, block[2:0:-1]), described(c, block[:2]), 96))
    assert np.allclose(c.double().numpy(), expected, rtol=2e-3, atol=2e-2)


TILES = [(64, 64, 32), (64, 128, 16), (64, 32, 64)]


@settings(max_examples=100 if DEEP else 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(block=st.sampled_from(TILES), stages=st.integers(2, 4), num_warps=st.sampled_from([4, 8]),
       k_blocks=st.integers(0, 5), remainders=st.tuples(*(st.integers(0, 15) for _ in range(3))),
       shuffle=st.sampled_from([None, 3]), plain_range=st.booleans())
def test_default_split_matmul_property(monkeypatch, small_rings_split, block, stages, num_warps, k_blocks,
                                       remainders, shuffle, plain_range):
    """Any tile, stage count (from tl.range or from the launch), warp count, tails and TMA
    completion order: the default-split kernel is split, and the emulator (races,
    deadlocks, partitions interleaved) agrees with numpy."""
    if num_warps == 8:
        block = (128,) + block[1:]  # 8 warps stack two warpgroups along M
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    if plain_range:
        kernel = prepared(plain_range_matmul, block, 0, num_warps, launch_stages=stages)
    else:
        kernel = prepared(default_matmul, block, stages, num_warps)
    assert is_split(kernel)
    m, n = (max(1, b - r) for b, r in zip(block[:2], remainders))
    k = max(0, k_blocks * block[2] - 16 * (remainders[2] % 2))
    run(kernel, block, m, n, k)
